// Kernel of op `transpose` on cuda: the last two dims swapped as a tiled copy (32 x 32 tiles staged
// in shared memory, so that both the reads and the writes are coalesced), leading dims as a batch.
#include "transpose.h"

#include "runtime/cuda/elementwise.cuh"

namespace opforge::kernels::cuda {

namespace {

constexpr int kTile = 32, kRowsPerPass = 8;

// out[b, j, i] = x[b, i, j] for x of shape (batch, M, N)
template <typename T>
__global__ void transpose_tiles(int64_t batch, int64_t M, int64_t N, const T* x, T* out) {
  __shared__ T tile[kTile][kTile + 1];
  const int64_t tiles_m = (M + kTile - 1) / kTile;
  for (int64_t b = blockIdx.z; b < batch; b += gridDim.z) {
    const T* xb = x + b * M * N;
    T* ob = out + b * M * N;
    for (int64_t tm = blockIdx.y; tm < tiles_m; tm += gridDim.y) {
      const int64_t i0 = tm * kTile, j0 = int64_t(blockIdx.x) * kTile;
      for (int r = threadIdx.y; r < kTile; r += kRowsPerPass) {
        const int64_t i = i0 + r, j = j0 + threadIdx.x;
        if (i < M && j < N) tile[r][threadIdx.x] = xb[i * N + j];
      }
      __syncthreads();
      for (int r = threadIdx.y; r < kTile; r += kRowsPerPass) {
        const int64_t j = j0 + r, i = i0 + threadIdx.x;
        if (i < M && j < N) ob[j * M + i] = tile[threadIdx.x][r];
      }
      __syncthreads();
    }
  }
}

}  // namespace

// Elements move as their bits (16-bit floats have constructors that shared memory may not run).
template <size_t N> struct Bits;
template <> struct Bits<1> { using type = uint8_t; };
template <> struct Bits<2> { using type = uint16_t; };
template <> struct Bits<4> { using type = uint32_t; };
template <> struct Bits<8> { using type = uint64_t; };

template <typename T>
void transpose(const TensorPtr& x, const TensorPtr& out, const TransposeAttrs& attrs) {
  using B = typename Bits<sizeof(T)>::type;
  (void)attrs;
  constexpr const char* op = "transpose";
  const Shape& s = x->shape();
  if (s.size() < 2) fail<ValueError>(op, "x must have rank >= 2 (the last two dims are swapped), got shape ", shape_str(s));
  const int64_t M = s[s.size() - 2], N = s.back();
  if (x->numel() == 0) return;
  const int64_t batch = x->numel() / (M * N);
  const Device dev = x->device();
  ::opforge::cuda::DeviceGuard guard(op, dev.index);
  const dim3 grid(static_cast<unsigned>((N + kTile - 1) / kTile),  // (at most 2^31 - 1: N < 2^36)
                  static_cast<unsigned>(std::min<int64_t>((M + kTile - 1) / kTile, 65535)),
                  static_cast<unsigned>(std::min<int64_t>(batch, 65535)));
  transpose_tiles<B><<<grid, dim3(kTile, kRowsPerPass), 0, ::opforge::cuda::current_stream(op, dev)>>>(
      batch, M, N, static_cast<const B*>(x->raw_data()), static_cast<B*>(out->raw_data()));
  ::opforge::cuda::check(op, cudaGetLastError());
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_TRANSPOSE_CUDA
