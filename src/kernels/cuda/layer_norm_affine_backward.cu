// Kernel of op `layer_norm_affine_backward` on cuda: layer_norm's dx, dweight and dbias. Fast path
// (trailing axes, weight and bias of the normalized shape, rows held in registers as
// row_common.cuh's with_row holds them): each row of dy and x is read once, for its dx (the
// arithmetic of layer_norm_backward's rows) and for its terms of dweight and dbias,
// which each thread adds into its own columns' accumulators in shared memory (no atomics). The grid
// is as many blocks as the device holds at once, each taking rows in turn; each block writes its
// column sums to a scratch row, and row_common.cuh's column sums add those rows in block order
// (deterministic on a given device). Longer rows and other shapes run layer_norm_backward and
// norm_affine_grad.
#include "layer_norm_affine_backward.h"

#include "layer_norm_backward.h"
#include "norm_affine_grad.h"
#include "norm_rows.cuh"

namespace opforge::kernels::cuda {

namespace {

using namespace norm;

// A column's two accumulators in shared memory, aligned so that one access moves both.
template <typename C>
struct alignas(2 * sizeof(C)) Pair {
  C w, b;
};

// One row's dx, and its terms added into the group's accumulators acc: n pairs of C, (the weight's
// term dy * (x - mean) * rstd, the bias's dy) by column, one 8-byte (16 for double) shared-memory
// load and store per element. On the 16-byte path column i = c * K + k is kept at k * (n / K) + c,
// so that a warp's lanes (consecutive c) hit consecutive pairs.
template <typename T>
struct AffineBackwardRow {
  const T *dy, *x, *w, *mean, *rstd, *dmean, *drstd;
  T* dx;
  int64_t n;
  bool vec;
  template <int G>
  __device__ __forceinline__ void row(int64_t r, int lane, Pair<compute_t<T>>* acc) const {
    using C = compute_t<T>;
    constexpr int64_t K = kPack<T>;
    const T* const in[2] = {dy + r * n, x + r * n};
    const C mu = convert<C>(mean[r]), rs = convert<C>(rstd[r]);
    const Held<G, T, 2> src(in, n, lane, vec);
    Sum2<C> s{C(0), C(0)};
    src.each([&](int64_t, C d, C v, C wv) {
      const C g = d * wv;
      s.a += g;
      s.b += g * ((v - mu) * rs);
    }, w);
    s = group_reduce<G>(s, Sum2Add{});
    const C inv_n = C(1) / C(n);
    const C a = s.a * inv_n, b = s.b * inv_n;
    const C dm = convert<C>(dmean[r]), ds = convert<C>(drstd[r]);
    const int64_t q = n / K;
    src.store(dx + r * n, [&](int64_t i, C d, C v, C wv) {
      const C xh = (v - mu) * rs;
      const int64_t p = vec ? (i % K) * q + i / K : i;
      Pair<C> a2 = acc[p];
      a2.w += d * xh;
      a2.b += d;
      acc[p] = a2;
      return rs * (d * wv - a - xh * b) + (dm - ds * rs * rs * xh) * inv_n;
    }, w);
  }
};

// Rows r, r + gridDim.x * groups, ... for each group of G threads; then the block's accumulators,
// its groups' added in order, into part[blockIdx.x] (2 * n values: weight's, then bias's).
template <int G, typename T>
__global__ void __launch_bounds__(G == kWarp ? kWarp * kShortRows : G, G == kWarp ? 1 : 2)
    affine_backward_kernel(int64_t rows, AffineBackwardRow<T> op, compute_t<T>* part) {
  using C = compute_t<T>;
  constexpr int kGroups = G == kWarp ? kShortRows : 1;
  constexpr int64_t K = kPack<T>;
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  Pair<C>* smem = reinterpret_cast<Pair<C>*>(smem_bytes);
  const int64_t n = op.n;
  for (int64_t j = threadIdx.x; j < kGroups * n; j += blockDim.x) smem[j] = Pair<C>{C(0), C(0)};
  __syncthreads();
  const int group = static_cast<int>(threadIdx.x / G), lane = static_cast<int>(threadIdx.x % G);
  for (int64_t r = int64_t(blockIdx.x) * kGroups + group; r < rows; r += int64_t(gridDim.x) * kGroups) {
    op.template row<G>(r, lane, smem + group * n);
  }
  __syncthreads();
  const int64_t q = n / K;
  C* out = part + int64_t(blockIdx.x) * 2 * n;
  for (int64_t p = threadIdx.x; p < n; p += blockDim.x) {
    Pair<C> s = smem[p];
#pragma unroll
    for (int g = 1; g < kGroups; ++g) {
      s.w += smem[g * n + p].w;
      s.b += smem[g * n + p].b;
    }
    const int64_t i = op.vec ? (p % q) * K + p / q : p;
    out[i] = s.w;
    out[n + i] = s.b;
  }
}

// (part's rows as the column sums' terms: (weight's, bias's) at (block r, column j))
template <typename C>
struct PartTerm {
  const C* part;
  int64_t n;
  __device__ __forceinline__ Sum2<C> operator()(int64_t r, int64_t j) const {
    return {part[r * 2 * n + j], part[r * 2 * n + n + j]};
  }
};

// The fused path over R rows of n (held in registers by groups of G threads); false when the
// device cannot hold a block of it (its shared memory), and nothing ran.
template <int G, typename T>
bool fused(const char* op, Device dev, int64_t R, int64_t n, const AffineBackwardRow<T>& row, T* dw, T* db) {
  using C = compute_t<T>;
  constexpr int kThreads = G == kWarp ? kWarp * kShortRows : G;
  constexpr int kGroups = G == kWarp ? kShortRows : 1;
  const size_t smem = static_cast<size_t>(kGroups) * static_cast<size_t>(n) * sizeof(Pair<C>);
  DeviceGuard guard(op, dev.index);
  const cudaStream_t stream = current_stream(op, dev);
  const auto kernel = affine_backward_kernel<G, T>;
  if (smem > 48 * 1024) {
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)) !=
        cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
  }
  int per_sm = 0, sms = 0;
  check(op, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem));
  check(op, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev.index));
  if (per_sm < 1) return false;
  const int64_t grid = std::clamp<int64_t>(int64_t(sms) * per_sm, 1, (R + kGroups - 1) / kGroups);
  const TensorPtr part = ::opforge::cuda::scratch(dev, static_cast<size_t>(grid * 2 * n) * sizeof(C));
  C* pp = static_cast<C*>(part->raw_data());
  kernel<<<static_cast<unsigned>(grid), kThreads, smem, stream>>>(R, row, pp);
  check(op, cudaGetLastError());
  col_sums_with<Sum2<C>>(op, dev, grid, n, PartTerm<C>{pp, n}, StoreSum2<T, C>{dw, db});
  return true;
}

}  // namespace

template <typename T>
void layer_norm_affine_backward(const TensorPtr& dy, const TensorPtr& x, const TensorPtr& mean, const TensorPtr& rstd,
                                const TensorPtr& dmean, const TensorPtr& drstd, const TensorPtr& weight,
                                const TensorPtr& bias, const TensorPtr& dx, const TensorPtr& dweight,
                                const TensorPtr& dbias, const LayerNormAffineBackwardAttrs& attrs) {
  constexpr const char* op = "layer_norm_affine_backward";
  const Shape& xs = x->shape();
  const Device dev = x->device();
  const Axes axes(attrs.axis);
  check_norm_backward(op, dy, x, {{"mean", &mean}, {"rstd", &rstd}, {"dmean", &dmean}, {"drstd", &drstd}}, weight,
                      axes);
  check_broadcasts_to(op, "bias", bias, x, "x");
  const auto ax = normalize_axes(op, axes, x->dim());
  const int64_t k = trailing_start(ax, x->dim());
  if (k >= 0 && row_shaped(weight, xs, k) && row_shaped(bias, xs, k)) {
    const int64_t R = prod(xs, 0, static_cast<size_t>(k)), N = prod(xs, static_cast<size_t>(k), xs.size());
    if (N == 0) return;
    const AffineBackwardRow<T> row{dy->data<T>(), x->data<T>(), weight->data<T>(), mean->data<T>(),
                                   rstd->data<T>(), dmean->data<T>(), drstd->data<T>(), dx->data<T>(), N,
                                   vec_ok<T>(N, {dy->raw_data(), x->raw_data(), dx->raw_data(), weight->raw_data()})};
    T* dw = dweight->data<T>();
    T* db = dbias->data<T>();
    // (the groups launch_rows would give these rows, as layer_norm_backward's)
    if (R > 0 && N <= kShortRow && N <= int64_t(kWarp) * kHeld<T>) {
      if (fused<kWarp, T>(op, dev, R, N, row, dw, db)) return;
    } else if (R > 0 && N > kShortRow && N <= int64_t(kLongThreads) * kHeld<T>) {
      if (fused<kLongThreads, T>(op, dev, R, N, row, dw, db)) return;
    }
  }
  layer_norm_backward<T>(dy, x, mean, rstd, dmean, drstd, weight, dx, LayerNormBackwardAttrs{attrs.axis});
  norm_affine_grad<T>(dy, x, rstd, weight, bias, mean, dweight, dbias, NormAffineGradAttrs{});
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_LAYER_NORM_AFFINE_BACKWARD_CUDA
