// Kernel of op `embedding_backward` on cuda, deterministic: the positions sorted by index (CUB's
// stable radix sort of (index, position) pairs), then each table row sums its dout rows in
// ascending position order (a block per table row, found by binary search in the sorted indices;
// float sums for 16-bit floats). No atomics: the same inputs give the same bits on every run.
// Indices are checked on the device (row_common.cuh's IndexCheck): a bad index is never matched to
// a row, and the call raises IndexError naming the op.
#include "embedding_backward.h"

#include "kernels/layout.h"
#include "row_common.cuh"
#include "sort_pairs.cuh"

namespace opforge::kernels::cuda {

namespace {

__global__ void check_and_number(int64_t n, int64_t rows, const int64_t* idx, int64_t* pos, unsigned long long* bad) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    rows::index_ok(idx[i], rows, i, bad);
    pos[i] = i;
  }
}

// grad[r, :] = sum over the sorted positions p with keys[p] == r of dout[pos[p], :], in order
template <typename T>
__global__ void sum_rows(int64_t rows, int64_t dim, int64_t n, const int64_t* keys, const int64_t* pos, const T* dout,
                         T* grad) {
  using A = compute_t<T>;
  __shared__ int64_t span[2];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    __syncthreads();
    if (threadIdx.x < 2) span[threadIdx.x] = rows::lower_bound(keys, n, r + threadIdx.x);
    __syncthreads();
    const int64_t b = span[0], e = span[1];
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
      A acc = A(0);
      for (int64_t p = b; p < e; ++p) acc += convert<A>(dout[pos[p] * dim + j]);
      grad[r * dim + j] = convert<T>(acc);
    }
  }
}

}  // namespace

template <typename T>
void embedding_backward(const TensorPtr& dout, const TensorPtr& indices, const TensorPtr& weight,
                        const TensorPtr& grad_weight, const EmbeddingBackwardAttrs& /*attrs*/) {
  constexpr const char* op = "embedding_backward";
  layout::check_embedding_grad(op, dout, indices, weight);
  const int64_t rows = weight->shape()[0], dim = weight->shape()[1];
  const Device dev = dout->device();
  if (indices->device() != dev) {
    fail<ValueError>(op, "indices are on ", indices->device().str(), " but dout on ", dev.str());
  }
  const int64_t n = indices->numel();
  if (rows == 0 || dim == 0) {
    if (n > 0) {  // (every index is out of range)
      const rows::IndexCheck chk(op, dev);
      ::opforge::cuda::DeviceGuard guard(op, dev.index);
      rows::check_indices<<<::opforge::cuda::detail::blocks_for(n), ::opforge::cuda::kThreads, 0,
                            ::opforge::cuda::current_stream(op, dev)>>>(n, rows, indices->data<int64_t>(), chk.flag());
      ::opforge::cuda::check(op, cudaGetLastError());
      chk.raise_if_bad(indices->data<int64_t>(), "weight with " + std::to_string(rows) + " rows");
    }
    return;
  }
  const rows::IndexCheck chk(op, dev);
  {
    ::opforge::cuda::DeviceGuard guard(op, dev.index);
    const cudaStream_t stream = ::opforge::cuda::current_stream(op, dev);
    const size_t nn = static_cast<size_t>(std::max<int64_t>(n, 1));
    const TensorPtr buf = ::opforge::cuda::scratch(dev, 3 * nn * sizeof(int64_t));
    int64_t* pos_in = static_cast<int64_t*>(buf->raw_data());
    int64_t* keys = pos_in + nn;
    int64_t* pos = keys + nn;
    if (n > 0) {
      check_and_number<<<::opforge::cuda::detail::blocks_for(n), ::opforge::cuda::kThreads, 0, stream>>>(
          n, rows, indices->data<int64_t>(), pos_in, chk.flag());
      ::opforge::cuda::check(op, cudaGetLastError());
      rows::sort_pairs(op, dev, stream, indices->data<int64_t>(), keys, pos_in, pos, n);
    }
    const int threads = static_cast<int>(std::min<int64_t>(256, ((dim + 31) / 32) * 32));
    sum_rows<T><<<static_cast<unsigned>(std::min<int64_t>(rows, int64_t(1) << 20)), threads, 0, stream>>>(
        rows, dim, n, keys, pos, dout->data<T>(), grad_weight->data<T>());
    ::opforge::cuda::check(op, cudaGetLastError());
  }
  chk.raise_if_bad(indices->data<int64_t>(), "weight with " + std::to_string(rows) + " rows");
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_EMBEDDING_BACKWARD_CUDA
