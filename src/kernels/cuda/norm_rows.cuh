// The normalization group on cuda (layer_norm, rms_norm, their backward ops and whole backward ops
// (layer_norm_affine_backward, rms_norm_affine_backward), norm_weight_grad, sum_to_like,
// bias_add_grad). Fast path, as on the cpu (kernels/layout.h decides): the
// normalized axes are the trailing dims and the parameters have the normalized shape; then each
// row is one group of threads (row_common.cuh): one pass for the statistics (Welford's mean and
// variance, merged across the group in a fixed order), one pass writing the row. Otherwise the
// general path: the cpu's formulas by the device's broadcasting loop (runtime/cuda/elementwise.cuh)
// and the runtime's reduction, in float (or double). Sums down to a shape run the column-sum
// kernel when the kept dims are the trailing block, else the runtime's reduction.
#pragma once

#include <atomic>
#include <vector>

#include "kernels/layout.h"
#include "row_common.cuh"

namespace opforge::kernels::cuda::norm {

using namespace ::opforge::kernels::cuda::rows;
using namespace ::opforge::kernels::layout;

// ---------------------------------------------------------------------------- fused rows

template <typename T>
struct LayerNormRow {
  using row_value = T;  // 16-bit rows: blocks per SM (rows::RowMinBlocks)
  static constexpr int kWarpBlocks16 = 4, kBlockBlocks16 = 3;
  const T *x, *w, *b;
  T *y, *mean, *rstd;
  int64_t n;
  compute_t<T> eps;
  bool vec;
  template <int G, RowPath P = RowPath::Any>
  __device__ __forceinline__ void row(int64_t r, int lane) const {
    using C = compute_t<T>;
    const T* const in[1] = {x + r * n};
    with_row<G, T, 1, P>(in, n, lane, vec, [&](auto& src) {
      const C nan = std::numeric_limits<C>::quiet_NaN();
      C mu, var;
      if constexpr (std::decay_t<decltype(src)>::kHeld) {  // held: the mean, then the squared deviations
        C sum = C(0);
        src.each([&](int64_t, C v) { sum += v; });
        mu = group_reduce<G>(sum, Add{}) / C(n);
        C dev = C(0);
        src.each([&](int64_t, C v) { dev += (v - mu) * (v - mu); });
        var = group_reduce<G>(dev, Add{}) / C(n);
      } else {  // streamed: Welford's statistics tile by tile
        const Welford<C> s = group_reduce<G>(thread_welford<G>(x + r * n, n, lane, vec), WelfordCombine{});
        mu = s.mean;
        var = s.m2 / C(n);
      }
      if (!n) mu = nan;
      const C rs = n ? C(1) / sqrt_(var + eps) : nan;
      if (lane == 0) {
        mean[r] = convert<T>(mu);
        rstd[r] = convert<T>(rs);
      }
      // (weight and bias: column inputs, loaded 16 bytes at a time with the row where it is)
      T* out = y + r * n;
      if (w && b) {
        src.store(out, [&](int64_t, C v, C wv, C bv) {
          C o = (v - mu) * rs;
          o *= wv;
          o += bv;
          return o;
        }, w, b);
      } else if (w) {
        src.store(out, [&](int64_t, C v, C wv) {
          C o = (v - mu) * rs;
          o *= wv;
          return o;
        }, w);
      } else if (b) {
        src.store(out, [&](int64_t, C v, C bv) {
          C o = (v - mu) * rs;
          o += bv;
          return o;
        }, b);
      } else {
        src.store(out, [&](int64_t, C v) { return (v - mu) * rs; });
      }
    });
  }
};

template <typename T>
struct RmsNormRow {
  using row_value = T;  // 16-bit rows: blocks per SM (rows::RowMinBlocks)
  static constexpr int kWarpBlocks16 = 8, kBlockBlocks16 = 4;
  const T *x, *w;
  T *y, *rstd;
  int64_t n;
  compute_t<T> eps;
  bool vec;
  template <int G, RowPath P = RowPath::Any>
  __device__ __forceinline__ void row(int64_t r, int lane) const {
    using C = compute_t<T>;
    const T* const in[1] = {x + r * n};
    with_row<G, T, 1, P>(in, n, lane, vec, [&](auto& src) {
      C ss = C(0);
      src.each([&](int64_t, C v) { ss += v * v; });
      ss = group_reduce<G>(ss, Add{});
      const C rs = C(1) / sqrt_(ss / C(n) + eps);  // (n == 0: NaN, a mean of nothing)
      if (lane == 0) rstd[r] = convert<T>(rs);
      if (w) {
        src.store(y + r * n, [&](int64_t, C v, C wv) { return v * rs * wv; }, w);
      } else {
        src.store(y + r * n, [&](int64_t, C v) { return v * rs; });
      }
    });
  }
};

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) + (dmean - drstd * rstd^2 * xhat) / n, with
// g = dy * weight and xhat = (x - mean) * rstd; rms_norm (kRms): no mean, no mean(g), no dmean.
template <typename T, bool kRms>
struct NormBackwardRow {
  using row_value = T;  // 16-bit rows: blocks per SM (rows::RowMinBlocks)
  static constexpr int kWarpBlocks16 = 4, kBlockBlocks16 = 2;
  const T *dy, *x, *w, *mean, *rstd, *dmean, *drstd;
  T* dx;
  int64_t n;
  bool vec;
  template <int G, RowPath P = RowPath::Any>
  __device__ __forceinline__ void row(int64_t r, int lane) const {
    using C = compute_t<T>;
    const T* const in[2] = {dy + r * n, x + r * n};
    const C mu = kRms ? C(0) : convert<C>(mean[r]), rs = convert<C>(rstd[r]);
    with_row<G, T, 2, P>(in, n, lane, vec, [&](auto& src) {
      // (the weight: a column input, loaded 16 bytes at a time with the row where it is)
      Sum2<C> s{C(0), C(0)};
      auto add = [&](C g, C v) {
        s.a += g;
        s.b += g * ((v - mu) * rs);
      };
      if (w) {
        src.each([&](int64_t, C d, C v, C wv) { add(d * wv, v); }, w);
      } else {
        src.each([&](int64_t, C d, C v) { add(d, v); });
      }
      s = group_reduce<G>(s, Sum2Add{});
      const C inv_n = C(1) / C(n);
      const C a = kRms ? C(0) : s.a * inv_n, b = s.b * inv_n;
      const C dm = kRms ? C(0) : convert<C>(dmean[r]), ds = convert<C>(drstd[r]);
      auto grad = [&](C g, C v) {
        const C xh = (v - mu) * rs;
        return rs * (g - a - xh * b) + (dm - ds * rs * rs * xh) * inv_n;
      };
      if (w) {
        src.store(dx + r * n, [&](int64_t, C d, C v, C wv) { return grad(d * wv, v); }, w);
      } else {
        src.store(dx + r * n, [&](int64_t, C d, C v) { return grad(d, v); });
      }
    });
  }
};

// ---------------------------------------------------------------------------- whole backward, fused

// layer_norm_affine_backward and rms_norm_affine_backward (kRms): each row of dy and x read once,
// for its dx (NormBackwardRow's arithmetic) and its terms of the weight's column sums, dy * (x -
// mean) * rstd (rms: dy * x * rstd), and of the bias's, dy (layer_norm only). Rows are held in
// registers (with_row's Held); each thread adds its own columns' terms into the accumulators of its
// group in shared memory (no atomics). The grid is as many blocks as the device holds at once, each
// taking rows in turn; each block writes its column sums to a scratch row, and the column-sum kernel
// adds those rows in block order (deterministic on a given device).

// A column's two accumulators (weight's, bias's), aligned so that one access moves both.
template <typename C>
struct alignas(2 * sizeof(C)) Pair {
  C w, b;
};

template <typename T, bool kRms>
using affine_acc_t = std::conditional_t<kRms, compute_t<T>, Pair<compute_t<T>>>;

// One row's dx, and its terms added into its group's n accumulators acc, by column; on the 16-byte
// path column i = c * K + k is kept at k * (n / K) + c, so that a warp's lanes (consecutive c) hit
// consecutive accumulators. (kRms: mean and dmean unused.)
template <typename T, bool kRms>
struct AffineBackwardRow {
  const T *dy, *x, *w, *mean, *rstd, *dmean, *drstd;
  T* dx;
  int64_t n;
  bool vec;
  template <int G>
  __device__ __forceinline__ void row(int64_t r, int lane, affine_acc_t<T, kRms>* acc) const {
    using C = compute_t<T>;
    constexpr int64_t K = kPack<T>;
    const T* const in[2] = {dy + r * n, x + r * n};
    const C mu = kRms ? C(0) : convert<C>(mean[r]), rs = convert<C>(rstd[r]);
    const Held<G, T, 2> src(in, n, lane, vec);
    Sum2<C> s{C(0), C(0)};
    src.each([&](int64_t, C d, C v, C wv) {
      const C g = d * wv;
      s.a += g;
      s.b += g * ((v - mu) * rs);
    }, w);
    s = group_reduce<G>(s, Sum2Add{});
    const C inv_n = C(1) / C(n);
    const C a = kRms ? C(0) : s.a * inv_n, b = s.b * inv_n;
    const C dm = kRms ? C(0) : convert<C>(dmean[r]), ds = convert<C>(drstd[r]);
    const int64_t q = n / K;
    src.store(dx + r * n, [&](int64_t i, C d, C v, C wv) {
      const C xh = (v - mu) * rs;
      const int64_t p = vec ? (i % K) * q + i / K : i;
      if constexpr (kRms) {
        acc[p] += d * xh;
      } else {
        Pair<C> a2 = acc[p];
        a2.w += d * xh;
        a2.b += d;
        acc[p] = a2;
      }
      return rs * (d * wv - a - xh * b) + (dm - ds * rs * rs * xh) * inv_n;
    }, w);
  }
};

// Rows r, r + gridDim.x * groups, ... for each group of G threads; then the block's accumulators,
// its groups' added in order, into part[blockIdx.x]: n weight sums (then n bias sums).
template <int G, typename T, bool kRms>
__global__ void __launch_bounds__(G == kWarp ? kWarp * kShortRows : G, G == kWarp ? 1 : 2)
    affine_backward_kernel(int64_t rows, AffineBackwardRow<T, kRms> op, compute_t<T>* part) {
  using C = compute_t<T>;
  using Acc = affine_acc_t<T, kRms>;
  constexpr int kGroups = G == kWarp ? kShortRows : 1;
  constexpr int64_t K = kPack<T>;
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  Acc* smem = reinterpret_cast<Acc*>(smem_bytes);
  const int64_t n = op.n;
  for (int64_t j = threadIdx.x; j < kGroups * n; j += blockDim.x) smem[j] = Acc{};
  __syncthreads();
  const int group = static_cast<int>(threadIdx.x / G), lane = static_cast<int>(threadIdx.x % G);
  for (int64_t r = int64_t(blockIdx.x) * kGroups + group; r < rows; r += int64_t(gridDim.x) * kGroups) {
    op.template row<G>(r, lane, smem + group * n);
  }
  __syncthreads();
  const int64_t q = n / K;
  C* out = part + int64_t(blockIdx.x) * (kRms ? 1 : 2) * n;
  for (int64_t p = threadIdx.x; p < n; p += blockDim.x) {
    Acc s = smem[p];
#pragma unroll
    for (int g = 1; g < kGroups; ++g) {
      if constexpr (kRms) {
        s += smem[g * n + p];
      } else {
        s.w += smem[g * n + p].w;
        s.b += smem[g * n + p].b;
      }
    }
    const int64_t i = op.vec ? (p % q) * K + p / q : p;
    if constexpr (kRms) {
      out[i] = s;
    } else {
      out[i] = s.w;
      out[n + i] = s.b;
    }
  }
}

// (part's rows as the column sums' terms: (weight's, bias's) at (block r, column j))
template <typename C>
struct PairPart {
  const C* part;
  int64_t n;
  __device__ __forceinline__ Sum2<C> operator()(int64_t r, int64_t j) const {
    return {part[r * 2 * n + j], part[r * 2 * n + n + j]};
  }
};

// The fused rows with groups of G threads; false when the device cannot hold a block of it (its
// shared memory), and nothing ran.
template <int G, typename T, bool kRms>
bool affine_backward_groups(const char* op, Device dev, int64_t R, int64_t n, const AffineBackwardRow<T, kRms>& row,
                            T* dw, T* db) {
  using C = compute_t<T>;
  constexpr int kThreads = G == kWarp ? kWarp * kShortRows : G;
  constexpr int kGroups = G == kWarp ? kShortRows : 1;
  const size_t smem = static_cast<size_t>(kGroups) * static_cast<size_t>(n) * sizeof(affine_acc_t<T, kRms>);
  DeviceGuard guard(op, dev.index);
  const cudaStream_t stream = current_stream(op, dev);
  const auto kernel = affine_backward_kernel<G, T, kRms>;
  // The block rows opt in to more than 48 KB of shared memory (static and dynamic together: their
  // group_reduce has static shared memory too), once per device, for the largest n they take.
  if constexpr (G != kWarp) {
    constexpr int kDevices = 64;
    static std::atomic<bool> opted[kDevices] = {};
    const size_t most = static_cast<size_t>(kGroups) * G * kHeld<T> * sizeof(affine_acc_t<T, kRms>);
    if (dev.index < 0 || dev.index >= kDevices || smem > most) return false;
    if (!opted[dev.index].load(std::memory_order_acquire)) {
      if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(most)) !=
          cudaSuccess) {
        (void)cudaGetLastError();
        return false;
      }
      opted[dev.index].store(true, std::memory_order_release);
    }
  }
  int per_sm = 0, sms = 0;
  check(op, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem));
  check(op, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev.index));
  if (per_sm < 1) return false;
  const int64_t grid = std::clamp<int64_t>(int64_t(sms) * per_sm, 1, (R + kGroups - 1) / kGroups);
  const int64_t width = (kRms ? 1 : 2) * n;
  const TensorPtr part = ::opforge::cuda::scratch(dev, static_cast<size_t>(grid * width) * sizeof(C));
  C* pp = static_cast<C*>(part->raw_data());
  kernel<<<static_cast<unsigned>(grid), kThreads, smem, stream>>>(R, row, pp);
  check(op, cudaGetLastError());
  if constexpr (kRms) {
    col_sums<T, C>(op, dev, grid, n, ReadPart<C>{pp, n}, dw);
  } else {
    col_sums_with<Sum2<C>>(op, dev, grid, n, PairPart<C>{pp, n}, StoreSum2<T, C>{dw, db});
  }
  return true;
}

// The fused rows over R > 0 rows of n > 0 when they are held in registers (in the groups that
// launch_rows gives them, as layer_norm_backward's and rms_norm_backward's); false when they are
// not, and nothing ran.
template <typename T, bool kRms>
bool affine_backward(const char* op, Device dev, int64_t R, int64_t n, const AffineBackwardRow<T, kRms>& row, T* dw,
                     T* db) {
  if (R <= 0 || n <= 0) return false;
  if (n <= kShortRow) return n <= int64_t(kWarp) * kHeld<T> && affine_backward_groups<kWarp>(op, dev, R, n, row, dw, db);
  return n <= int64_t(kLongThreads) * kHeld<T> && affine_backward_groups<kLongThreads>(op, dev, R, n, row, dw, db);
}

// ---------------------------------------------------------------------------- general path

struct Sub {
  template <typename A, typename B>
  OPFORGE_HD OPFORGE_INLINE auto operator()(A a, B b) const { return a - b; }
};
struct Square {
  template <typename A>
  OPFORGE_HD OPFORGE_INLINE A operator()(A a) const { return a * a; }
};
struct Mul {
  template <typename A, typename B>
  OPFORGE_HD OPFORGE_INLINE auto operator()(A a, B b) const { return a * b; }
  template <typename A, typename B, typename D>
  OPFORGE_HD OPFORGE_INLINE auto operator()(A a, B b, D c) const { return a * b * c; }
};
struct MulAdd {  // a * b (* c) + d
  template <typename A, typename B, typename D>
  OPFORGE_HD OPFORGE_INLINE auto operator()(A a, B b, D d) const { return a * b + d; }
  template <typename A, typename B, typename C, typename D>
  OPFORGE_HD OPFORGE_INLINE auto operator()(A a, B b, C c, D d) const { return a * b * c + d; }
};
struct Same {
  template <typename A>
  OPFORGE_HD OPFORGE_INLINE A operator()(A a) const { return a; }
};
template <typename C>
struct RsqrtEps {
  C eps;
  OPFORGE_HD OPFORGE_INLINE C operator()(C v) const { return C(1) / sqrt(v + eps); }
};
struct SubMul {  // (a - b) * c
  template <typename A, typename B, typename C>
  OPFORGE_HD OPFORGE_INLINE auto operator()(A a, B b, C c) const { return (a - b) * c; }
};
struct MulSubMul {  // a * ((b - c) * d)
  template <typename A, typename B, typename C, typename D>
  OPFORGE_HD OPFORGE_INLINE auto operator()(A a, B b, C c, D d) const { return a * ((b - c) * d); }
};
template <typename C>
struct LayerNormDx {
  C inv_n;
  OPFORGE_HD OPFORGE_INLINE C operator()(C r, C g, C a, C xh, C b, C dm, C ds) const {
    return r * (g - a - xh * b) + (dm - ds * r * r * xh) * inv_n;
  }
};
template <typename C>
struct RmsNormDx {
  C inv_n;
  OPFORGE_HD OPFORGE_INLINE C operator()(C r, C g, C xh, C b, C ds) const {
    return r * (g - xh * b) - ds * r * r * xh * inv_n;
  }
};

// ---------------------------------------------------------------------------- sums to a shape

template <typename P, typename A>
struct ReadAt {
  const P* p;
  int64_t N;
  __device__ __forceinline__ A operator()(int64_t r, int64_t j) const { return static_cast<A>(convert<compute_t<P>>(p[r * N + j])); }
};

// out (target's shape, dtype T) = p (contiguous, dtype P) summed down to `target`, which the
// caller checked broadcasts to p's shape: the column sums when the kept dims are p's trailing
// block, else the runtime's reduction.
template <typename T, typename P>
void sum_to_shape(const char* op, const TensorPtr& p, const Shape& target, const TensorPtr& out) {
  const Shape& ps = p->shape();
  const size_t nd = ps.size();
  const Shape t = padded(target, nd);
  std::vector<int64_t> axes;
  size_t first_kept = nd;
  bool trailing = true;  // every reduced dim lies before every kept one
  for (size_t d = 0; d < nd; ++d) {
    if (ps[d] == 1) continue;
    if (t[d] == ps[d]) {
      first_kept = std::min(first_kept, d);
    } else {
      axes.push_back(static_cast<int64_t>(d));
      if (first_kept < d) trailing = false;
    }
  }
  if (!trailing) {
    sum_into(op, p, axes, out);
    return;
  }
  const int64_t R = prod(ps, 0, first_kept), N = prod(ps, first_kept, nd);
  if (R == 0 || p->numel() == 0) {
    sum_into(op, p, axes, out);  // (zeros)
    return;
  }
  using A = acc_t<T>;
  col_sums<T, A>(op, p->device(), R, N, ReadAt<P, A>{p->data<P>(), N}, out->data<T>());
}

// out (weight's shape) = dy * (x - mean) * rstd (mean absent: dy * x * rstd) by broadcasting to
// `full`, then summed down to out's shape: the weight gradient where the column sums do not apply.
template <typename T>
void weight_grad_by_broadcast(const char* op, const TensorPtr& dy, const TensorPtr& x, const TensorPtr& rstd,
                              const TensorPtr& mean, const Shape& full, const TensorPtr& out) {
  using C = compute_t<T>;
  CurrentOpScope scope(op);
  auto p = empty(dtype_of<C>::value, full, Format::Default, x->device());
  if (mean) ::opforge::cuda::elementwise<C, T, T, T, T>(*p, MulSubMul{}, {dy.get(), x.get(), mean.get(), rstd.get()});
  else ::opforge::cuda::elementwise<C, T, T, T>(*p, Mul{}, {dy.get(), x.get(), rstd.get()});
  sum_to_shape<T, C>(op, p, out->shape(), out);
}

// dy[r, j] * (x[r, j] - mean[r]) * rstd[r] (no mean: x[r, j] * rstd[r]) in compute type C: the
// weight gradient's term of the column sums.
template <typename T>
struct WeightGradTerm {
  const T *dy, *x, *rstd, *mean;
  int64_t N;
  __device__ __forceinline__ compute_t<T> operator()(int64_t r, int64_t j) const {
    using C = compute_t<T>;
    const C v = convert<C>(x[r * N + j]) - (mean ? convert<C>(mean[r]) : C(0));
    return convert<C>(dy[r * N + j]) * (v * convert<C>(rstd[r]));
  }
};

}  // namespace opforge::kernels::cuda::norm
