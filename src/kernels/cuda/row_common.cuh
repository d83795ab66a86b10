// What the row kernels of cuda share (softmax, log_softmax and their backward ops, layer_norm,
// rms_norm and their backward ops, cross_entropy and its backward): a group of threads per row
// (a warp for rows of up to 1024 elements, four rows to a block; a block of 256 threads for longer
// rows), 16-byte vectorized loads and stores where every row pointer allows, reductions of the
// group through warp shuffles and shared memory in a fixed order (deterministic), accumulation in
// float for 16-bit inputs. Rows are read from global memory in each pass (no row is staged in shared
// memory), so rows of any length run; the second pass mostly hits L2.
//
// Also: the column-sum kernel (norm_weight_grad, bias_add_grad, sum_to_like: out[j] = sum over
// rows r of f(r, j), split into row chunks whose partial sums are added in a fixed order), and the
// index check of the gather/scatter kernels (a bad index is recorded on the device and raised as
// IndexError naming the op once the stream reaches it; no kernel reads or writes through it).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "runtime/cuda/elementwise.cuh"
#include "runtime/cuda/reduce.cuh"
#include "runtime/runtime.h"

namespace opforge::kernels::cuda::rows {

using ::opforge::cuda::check;
using ::opforge::cuda::current_stream;
using ::opforge::cuda::DeviceGuard;

// ---------------------------------------------------------------------------- math in C

template <typename C>
__device__ __forceinline__ C exp_(C v) {
  if constexpr (std::is_same_v<C, float>) return ::expf(v);
  else return ::exp(v);
}
// exp for rows stored in 16 bits (T: Half, BFloat16; computed in float): the hardware's ex2 of
// v * log2(e) (__expf: at most 2 + 1.173|v| ulp of float, 1.3e-5 relative for the v = x - max >= -88
// that do not underflow, against a 16-bit result's half ulp of 4.9e-4 (float16) or 3.9e-3
// (bfloat16)), two instructions where expf takes about ten; the same NaN, infinities and zeros;
// results below float's normal range flush to 0 (bfloat16's subnormal softmax outputs, under
// 1.2e-38, become 0). Other types: exp_.
template <typename T, typename C>
__device__ __forceinline__ C exp_row(C v) {
  if constexpr (sizeof(T) == 2 && std::is_same_v<C, float>) return __expf(v);
  else return exp_(v);
}
template <typename C>
__device__ __forceinline__ C log_(C v) {
  if constexpr (std::is_same_v<C, float>) return ::logf(v);
  else return ::log(v);
}
template <typename C>
__device__ __forceinline__ C sqrt_(C v) {
  if constexpr (std::is_same_v<C, float>) return ::sqrtf(v);
  else return ::sqrt(v);
}
template <typename C>
__device__ __forceinline__ C neg_inf() { return -std::numeric_limits<C>::infinity(); }

// ---------------------------------------------------------------------------- reduced values

// A running log-sum-exp: the max m and the sum s of exp(x - m); m is -inf while nothing counts.
template <typename C>
struct Lse {
  C m, s;
};
template <typename C>
__device__ __forceinline__ Lse<C> lse_add(Lse<C> p, C v) {
  if (v != v) return {v, p.s};                 // NaN wins
  if (!(v > p.m)) return {p.m, p.s + (v == neg_inf<C>() ? C(0) : exp_(v - p.m))};
  return {v, p.s * exp_(p.m - v) + C(1)};      // (p.s is 0 while p.m is -inf)
}
struct LseCombine {
  template <typename C>
  __device__ __forceinline__ Lse<C> operator()(const Lse<C>& a, const Lse<C>& b) const {
    if (a.m != a.m) return a;
    if (b.m != b.m) return b;
    if (a.m == neg_inf<C>()) return b;
    if (b.m == neg_inf<C>()) return a;
    return a.m >= b.m ? Lse<C>{a.m, a.s + b.s * exp_(b.m - a.m)} : Lse<C>{b.m, b.s + a.s * exp_(a.m - b.m)};
  }
};
// The row's (m, s) as the cpu computes it: a +inf element makes every exp(x - m) term NaN or 0,
// and the cpu's sum then NaN; an all -inf row keeps m = -inf (x - m is NaN downstream).
template <typename C>
__device__ __forceinline__ Lse<C> lse_final(Lse<C> p) {
  if (p.m == std::numeric_limits<C>::infinity()) p.s = std::numeric_limits<C>::quiet_NaN();
  return p;
}

template <typename C>
struct Sum2 {
  C a, b;
};
template <typename C>
__device__ __forceinline__ Sum2<C>& operator+=(Sum2<C>& x, const Sum2<C>& y) {
  x.a += y.a;
  x.b += y.b;
  return x;
}
struct Sum2Add {
  template <typename C>
  __device__ __forceinline__ Sum2<C> operator()(const Sum2<C>& x, const Sum2<C>& y) const {
    return {x.a + y.a, x.b + y.b};
  }
};
struct Add {
  template <typename C>
  __device__ __forceinline__ C operator()(C x, C y) const { return x + y; }
};
// The larger, NaN winning (the cpu's max_nan).
template <typename C>
__device__ __forceinline__ C max_nan(C a, C b) { return (b > a || b != b) ? b : a; }
struct MaxNan {
  template <typename C>
  __device__ __forceinline__ C operator()(C x, C y) const { return max_nan(x, y); }
};

// Welford's running count, mean and sum of squared deviations; merged as Chan et al.
template <typename C>
struct Welford {
  C n, mean, m2;
};
struct WelfordCombine {
  template <typename C>
  __device__ __forceinline__ Welford<C> operator()(const Welford<C>& a, const Welford<C>& b) const {
    if (b.n == C(0)) return a;  // (an empty side: no d * d, which overflows for huge means, times 0)
    if (a.n == C(0)) return b;
    // the operands in one order whichever side holds which: the lanes of a warp reduce in
    // mirrored pairs (combine(x, y) on one, combine(y, x) on the other) and must agree bit for bit
    const bool flip = b.n < a.n || (b.n == a.n && (b.mean < a.mean || (b.mean == a.mean && b.m2 < a.m2)));
    const Welford<C>& p = flip ? b : a;
    const Welford<C>& q = flip ? a : b;
    const C n = p.n + q.n;
    const C d = q.mean - p.mean, fq = q.n / n;
    return {n, p.mean + d * fq, p.m2 + q.m2 + d * d * p.n * fq};
  }
};

// Warp shuffles of the reduced values, field by field.
__device__ __forceinline__ float shfl_xor(float v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }
__device__ __forceinline__ double shfl_xor(double v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }
template <typename C>
__device__ __forceinline__ Lse<C> shfl_xor(Lse<C> v, int o) { return {shfl_xor(v.m, o), shfl_xor(v.s, o)}; }
template <typename C>
__device__ __forceinline__ Sum2<C> shfl_xor(Sum2<C> v, int o) { return {shfl_xor(v.a, o), shfl_xor(v.b, o)}; }
template <typename C>
__device__ __forceinline__ Welford<C> shfl_xor(Welford<C> v, int o) {
  return {shfl_xor(v.n, o), shfl_xor(v.mean, o), shfl_xor(v.m2, o)};
}

// ---------------------------------------------------------------------------- groups

constexpr int kWarp = 32;
constexpr int kLongThreads = 256;   // threads of a block that owns one long row (two blocks per SM)
constexpr int kShortRows = 4;       // rows (warps) per block of short rows
constexpr int64_t kShortRow = 1024; // rows up to this length get a warp

// The reduction of v over the G threads of a row's group, in the same order on every run; every
// thread of the group gets the result. G == 32: one warp; G > 32: the whole block (every thread
// of the block must call it).
template <int G, typename V, typename Op>
__device__ __forceinline__ V group_reduce(V v, Op op) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) v = op(v, shfl_xor(v, o));
  if constexpr (G == kWarp) {
    return v;
  } else {
    static_assert(G % kWarp == 0 && G / kWarp <= kWarp, "a block of whole warps");
    __shared__ V part[G / kWarp];
    __syncthreads();  // (a previous reduction's readers are done with part)
    if (threadIdx.x % kWarp == 0) part[threadIdx.x / kWarp] = v;
    __syncthreads();
    V r = part[0];
#pragma unroll
    for (int w = 1; w < G / kWarp; ++w) r = op(r, part[w]);
    return r;
  }
}

template <typename T>
constexpr int kPack = 16 / sizeof(T);  // elements of one 16-byte load

template <typename T>
struct alignas(16) Pack {
  T v[kPack<T>];
};

// f(i, x_0[k], ..., x_j[k]) on element k of each input's pack, in compute types.
template <typename F, typename... P, size_t... I>
__device__ __forceinline__ auto apply_k(F& f, int64_t i, int k, const std::tuple<Pack<P>...>& t,
                                        std::index_sequence<I...>) {
  return f(i, convert<compute_t<P>>(std::get<I>(t).v[k])...);
}

// f(i, v..., c_0[k], ..., c_m[k]): a row's values v then element k of each column pack.
template <typename F, typename... P, size_t... J, typename... V>
__device__ __forceinline__ auto apply_cols(F& f, int64_t i, int k, const std::tuple<Pack<P>...>& cols,
                                           std::index_sequence<J...>, V... v) {
  return f(i, v..., convert<compute_t<P>>(std::get<J>(cols).v[k])...);
}

// f(i, x_0[i], ..., x_k[i]) (values in compute types) for the elements i of an n-element row that
// thread `lane` of a G-thread group owns; 16-byte loads when vec (every pointer 16-byte aligned
// and n a multiple of the pack; the inputs share one element size).
template <int G, typename T, typename F, typename... P>
__device__ __forceinline__ void visit(int64_t n, int lane, bool vec, F&& f, const P*... x) {
  if (vec) {
    constexpr int K = kPack<T>;
    for (int64_t c = lane; c < n / K; c += G) {
      const std::tuple<Pack<P>...> packs{reinterpret_cast<const Pack<P>*>(x)[c]...};
#pragma unroll
      for (int k = 0; k < K; ++k) apply_k(f, c * K + k, k, packs, std::index_sequence_for<P...>{});
    }
  } else {
    for (int64_t i = lane; i < n; i += G) f(i, convert<compute_t<P>>(x[i])...);
  }
}

// y[i] = f(i, x_0[i], ..., x_k[i]) over the row, as visit() walks it (y aligned like the inputs).
template <int G, typename T, typename F, typename... P>
__device__ __forceinline__ void map(T* y, int64_t n, int lane, bool vec, F&& f, const P*... x) {
  if (vec) {
    constexpr int K = kPack<T>;
    for (int64_t c = lane; c < n / K; c += G) {
      const std::tuple<Pack<P>...> packs{reinterpret_cast<const Pack<P>*>(x)[c]...};
      Pack<T> out;
#pragma unroll
      for (int k = 0; k < K; ++k) out.v[k] = convert<T>(apply_k(f, c * K + k, k, packs, std::index_sequence_for<P...>{}));
      reinterpret_cast<Pack<T>*>(y)[c] = out;
    }
  } else {
    for (int64_t i = lane; i < n; i += G) y[i] = convert<T>(f(i, convert<compute_t<P>>(x[i])...));
  }
}

// ---- a row seen by one group: held in registers, or streamed from memory
//
// with_row() hands a row body one of two views of the same N inputs (n elements each, one dtype):
// Held, when every thread's share fits kHeld registers per input (rows of up to G * kHeld
// elements: the row is read from memory once), else Streamed (each pass reads the row again,
// mostly from L2). Both offer each(f) (f(i, x_0[i], ...) on this thread's elements, values in
// compute types) and store(y, f) (y[i] = f(i, x_0[i], ...)), with 16-byte accesses when vec;
// each(f, c...) and store(y, f, c...) also pass f element i of column inputs c after the row's:
// arrays of n elements every row shares (a norm's weight and bias), loaded as the row is (16
// bytes at a time when vec: every c then 16-byte aligned too). Held also update(f) (its values replaced in
// place). View::kHeld tells them apart: on held rows
// the bodies make independent passes over the registers (the max, then the exponentials; the
// mean, then the squared deviations), where a streamed row takes one online pass (each pass
// over it is a pass over memory).

template <typename T>
constexpr int kHeld = sizeof(compute_t<T>) == 8 ? 16 : 32;  // elements per thread and input (a multiple of kPack)

template <int G, typename T, int N>
struct Streamed {
  static constexpr bool kHeld = false;
  const T* x[N];
  int64_t n;
  int lane;
  bool vec;
  template <typename F, typename... Cols>
  __device__ __forceinline__ void each(F&& f, const Cols*... cols) const {
    each_(f, std::make_index_sequence<N>{}, cols...);
  }
  template <typename F, typename... Cols>
  __device__ __forceinline__ void store(T* y, F&& f, const Cols*... cols) const {
    store_(y, f, std::make_index_sequence<N>{}, cols...);
  }

 private:
  template <typename F, size_t... I, typename... Cols>
  __device__ __forceinline__ void each_(F& f, std::index_sequence<I...>, const Cols*... cols) const {
    visit<G, T>(n, lane, vec, f, x[I]..., cols...);
  }
  template <typename F, size_t... I, typename... Cols>
  __device__ __forceinline__ void store_(T* y, F& f, std::index_sequence<I...>, const Cols*... cols) const {
    map<G>(y, n, lane, vec, f, x[I]..., cols...);
  }
};

template <int G, typename T, int N, int Slots = kHeld<T>>
struct Held {
  using C = compute_t<T>;
  static constexpr bool kHeld = true;
  static constexpr int K = kPack<T>, S = Slots;
  static_assert(S % K == 0, "a thread's slots are whole 16-byte packs");
  C v[N][S];
  int64_t n;
  int lane;
  bool vec;

  __device__ __forceinline__ Held(const T* const (&x)[N], int64_t n_, int lane_, bool vec_) : n(n_), lane(lane_), vec(vec_) {
    if (vec) {
#pragma unroll
      for (int j = 0; j < S / K; ++j) {
        const int64_t c = lane + int64_t(j) * G;
        if (c < n / K) {
#pragma unroll
          for (int q = 0; q < N; ++q) {
            const Pack<T> p = reinterpret_cast<const Pack<T>*>(x[q])[c];
#pragma unroll
            for (int k = 0; k < K; ++k) v[q][j * K + k] = convert<C>(p.v[k]);
          }
        }
      }
    } else {
#pragma unroll
      for (int s = 0; s < S; ++s) {
        const int64_t i = lane + int64_t(s) * G;
#pragma unroll
        for (int q = 0; q < N; ++q) v[q][s] = i < n ? convert<C>(x[q][i]) : C(0);
      }
    }
  }
  template <typename F, typename... Cols>
  __device__ __forceinline__ void each(F&& f, const Cols*... cols) const {
    each_(f, std::make_index_sequence<N>{}, cols...);
  }
  template <typename F, typename... Cols>
  __device__ __forceinline__ void store(T* y, F&& f, const Cols*... cols) const {
    store_(y, f, std::make_index_sequence<N>{}, cols...);
  }
  // the first input's held values replaced by f(value) (each slot independent: no chain)
  template <typename F>
  __device__ __forceinline__ void update(F&& f) {
#pragma unroll
    for (int s = 0; s < S; ++s) v[0][s] = f(v[0][s]);
  }

 private:
  // (the columns' packs are loaded where the row's were: once per pack, not per element)
  template <typename F, size_t... I, typename... Cols>
  __device__ __forceinline__ void each_(F& f, std::index_sequence<I...>, const Cols*... cols) const {
    if (vec) {
#pragma unroll
      for (int j = 0; j < S / K; ++j) {
        const int64_t c = lane + int64_t(j) * G;
        if (c < n / K) {
          const std::tuple<Pack<Cols>...> packs{reinterpret_cast<const Pack<Cols>*>(cols)[c]...};
#pragma unroll
          for (int k = 0; k < K; ++k) {
            apply_cols(f, c * K + k, k, packs, std::index_sequence_for<Cols...>{}, v[I][j * K + k]...);
          }
        }
      }
    } else {
#pragma unroll
      for (int s = 0; s < S; ++s) {
        const int64_t i = lane + int64_t(s) * G;
        if (i < n) f(i, v[I][s]..., convert<compute_t<Cols>>(cols[i])...);
      }
    }
  }
  template <typename F, size_t... I, typename... Cols>
  __device__ __forceinline__ void store_(T* y, F& f, std::index_sequence<I...>, const Cols*... cols) const {
    if (vec) {
#pragma unroll
      for (int j = 0; j < S / K; ++j) {
        const int64_t c = lane + int64_t(j) * G;
        if (c < n / K) {
          const std::tuple<Pack<Cols>...> packs{reinterpret_cast<const Pack<Cols>*>(cols)[c]...};
          Pack<T> out;
#pragma unroll
          for (int k = 0; k < K; ++k) {
            out.v[k] = convert<T>(apply_cols(f, c * K + k, k, packs, std::index_sequence_for<Cols...>{}, v[I][j * K + k]...));
          }
          reinterpret_cast<Pack<T>*>(y)[c] = out;
        }
      }
    } else {
#pragma unroll
      for (int s = 0; s < S; ++s) {
        const int64_t i = lane + int64_t(s) * G;
        if (i < n) y[i] = convert<T>(f(i, v[I][s]..., convert<compute_t<Cols>>(cols[i])...));
      }
    }
  }
};

// Which of with_row's views a kernel compiles: a kernel's registers are those of its hungriest
// path, taken or not, so launch_rows launches a kernel for rows that fit in registers (Held) and
// another for longer ones (Streamed); Any decides per row (the tune harness, a base tree's way).
// A warp's row is at most kShortRow elements, which a warp holds for every type but 8-byte ones:
// held only, whatever the path. Static effect (nvcc 13.0, sm_90): float32 softmax warp rows 162 ->
// 124 registers (3 -> 4 blocks per SM); bfloat16 softmax block rows at 3 blocks per SM: a 112-byte
// spill -> 16 bytes, layer_norm's 56 -> 0.
enum class RowPath { Any, Held, Streamed };
#define OPFORGE_ROW_PATHS 1  // (benchmarks/cuda_rows_tune.cu: this tree has RowPath)

// body(view) on the row's N inputs, held in registers when they fit (see above).
template <int G, typename T, int N, RowPath P = RowPath::Any, typename Body>
__device__ __forceinline__ void with_row(const T* const (&x)[N], int64_t n, int lane, bool vec, Body&& body) {
  const auto held = [&] {
    Held<G, T, N> view(x, n, lane, vec);
    body(view);
  };
  const auto streamed = [&] {
    Streamed<G, T, N> view{{}, n, lane, vec};
#pragma unroll
    for (int q = 0; q < N; ++q) view.x[q] = x[q];
    body(view);
  };
  if constexpr (P == RowPath::Held || (G == kWarp && int64_t(kWarp) * kHeld<T> >= kShortRow)) {
    held();
  } else if constexpr (P == RowPath::Streamed) {
    streamed();
  } else if (n <= int64_t(G) * kHeld<T>) {
    held();
  } else {
    streamed();
  }
}

// ---- rows too long to hold, reduced tile by tile
//
// A streamed row's statistics from an online update per element (lse_add, Welford's update) make every
// element's exp and rescale (or division) wait for the last one's. Instead each thread takes the
// row in tiles of G * kTileHeld elements held in registers (its share loaded at once: kTileHeld /
// kPack 16-byte loads in flight; half a held row's registers, which a kernel holding rows also
// needs), reduces the tile as a held row is reduced (the max, then independent
// exponentials; the mean, then the squared deviations) and merges the tile's result into its own
// once per tile. The group's reduction follows as before.

template <typename T>
constexpr int kTileHeld = kHeld<T> / 2;

// (A tile's view indexes its elements from the tile's start: no column inputs through it.)
// This thread's (m, s) over its elements of the n-element row x (any n; one tile when it fits):
// what lse_add over those elements gives (NaN wins, a +inf max left to lse_final, -inf counts
// nothing), summed in another order.
template <int G, typename T>
__device__ __forceinline__ Lse<compute_t<T>> thread_lse(const T* x, int64_t n, int lane, bool vec) {
  using C = compute_t<T>;
  constexpr int64_t kTile = int64_t(G) * kTileHeld<T>;
  Lse<C> p{neg_inf<C>(), C(0)};
  for (int64_t t0 = 0; t0 < n; t0 += kTile) {
    const T* const in[1] = {x + t0};
    const Held<G, T, 1, kTileHeld<T>> tile(in, n - t0 < kTile ? n - t0 : kTile, lane, vec);
    C m = neg_inf<C>();
    tile.each([&](int64_t, C v) { m = max_nan(m, v); });
    C sum = C(0);
    if (m != neg_inf<C>()) tile.each([&](int64_t, C v) { sum += exp_row<T>(v - m); });
    p = LseCombine{}(p, Lse<C>{m, sum});
  }
  return p;
}

// This thread's Welford (count, mean, m2) over its elements of the n-element row x, tile by tile.
template <int G, typename T>
__device__ __forceinline__ Welford<compute_t<T>> thread_welford(const T* x, int64_t n, int lane, bool vec) {
  using C = compute_t<T>;
  constexpr int64_t kTile = int64_t(G) * kTileHeld<T>;
  Welford<C> w{C(0), C(0), C(0)};
  for (int64_t t0 = 0; t0 < n; t0 += kTile) {
    const T* const in[1] = {x + t0};
    const Held<G, T, 1, kTileHeld<T>> tile(in, n - t0 < kTile ? n - t0 : kTile, lane, vec);
    C count = C(0), sum = C(0);
    tile.each([&](int64_t, C v) {
      count += C(1);
      sum += v;
    });
    if (count == C(0)) continue;
    const C mean = sum / count;
    C m2 = C(0);
    tile.each([&](int64_t, C v) { m2 += (v - mean) * (v - mean); });
    w = WelfordCombine{}(w, Welford<C>{count, mean, m2});
  }
  return w;
}

// Whether rows of n elements of T starting at each pointer (null: absent, ignored) can use
// visit()/map()'s 16-byte path.
template <typename T>
inline bool vec_ok(int64_t n, std::initializer_list<const void*> ptrs) {
  if ((n * static_cast<int64_t>(sizeof(T))) % 16 != 0) return false;
  for (const void* p : ptrs) {
    if (p && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

// The blocks per SM that row_kernel's launch bounds ask for (ptxas then caps each thread's
// registers at what that many blocks leave it). Every op launched by launch_rows declares its
// element type (`using row_value = T`) and how many blocks its 16-bit rows take: kWarpBlocks16
// for warp rows (blocks of 128 threads), kBlockBlocks16 for block rows (256 threads). 16-bit rows
// stream half the bytes per register of float32 rows and need more rows in flight; the figures
// are each op's fastest shapes as tools/gpu_run.sh tune measured them on an H200 (bfloat16
// (65536, 1024) and (8192, 8192), 2026-11-27; benchmarks/results/cuda.md). Other element types
// keep 1 and 2 (float32 rows were as fast or faster with them).
#define OPFORGE_ROW_MIN_BLOCKS 1  // (benchmarks/cuda_rows_tune.cu: this tree has RowMinBlocks)
template <int G, typename Op>
struct RowMinBlocks {
  static constexpr bool k16 = sizeof(typename Op::row_value) == 2;
  static constexpr int value = G == kWarp ? (k16 ? Op::kWarpBlocks16 : 1) : (k16 ? Op::kBlockBlocks16 : 2);
};

// Runs op.template row<G, P>(r, lane) for every row r, a group of G threads to a row.
template <int G, RowPath P, typename Op>
__global__ void __launch_bounds__(G == kWarp ? kWarp * kShortRows : G, (RowMinBlocks<G, Op>::value))
    row_kernel(int64_t rows, Op op) {
  constexpr int kPerBlock = G == kWarp ? kShortRows : 1;
  const int lane = static_cast<int>(threadIdx.x % G);
  for (int64_t r = int64_t(blockIdx.x) * kPerBlock + threadIdx.x / G; r < rows;
       r += int64_t(gridDim.x) * kPerBlock) {
    op.template row<G, P>(r, lane);
  }
}

// An op whose rows take one path whatever their length (`static constexpr bool kOnePath = true`:
// cross_entropy's online log-sum-exp) gets one block-row kernel, not two identical ones.
template <typename Op, typename = void>
struct OnePath : std::false_type {};
template <typename Op>
struct OnePath<Op, std::void_t<decltype(Op::kOnePath)>> : std::bool_constant<Op::kOnePath> {};

// Launches op over `rows` rows of n elements on device's current stream: a warp per row for short
// rows, a block per row for long ones, held in registers when they fit (RowPath).
template <typename Op>
void launch_rows(const char* op_name, Device device, int64_t rows, int64_t n, const Op& op) {
  if (rows == 0) return;
  DeviceGuard guard(op_name, device.index);
  const cudaStream_t stream = current_stream(op_name, device);
  constexpr int64_t kMaxBlocks = int64_t(1) << 20;
  if (n <= kShortRow) {
    const auto blocks = static_cast<unsigned>(std::min(kMaxBlocks, (rows + kShortRows - 1) / kShortRows));
    row_kernel<kWarp, RowPath::Any, Op><<<blocks, kWarp * kShortRows, 0, stream>>>(rows, op);
  } else {
    const auto blocks = static_cast<unsigned>(std::min(kMaxBlocks, rows));
    if constexpr (OnePath<Op>::value) {
      row_kernel<kLongThreads, RowPath::Any, Op><<<blocks, kLongThreads, 0, stream>>>(rows, op);
    } else if (n <= int64_t(kLongThreads) * kHeld<typename Op::row_value>) {
      row_kernel<kLongThreads, RowPath::Held, Op><<<blocks, kLongThreads, 0, stream>>>(rows, op);
    } else {
      row_kernel<kLongThreads, RowPath::Streamed, Op><<<blocks, kLongThreads, 0, stream>>>(rows, op);
    }
  }
  check(op_name, cudaGetLastError());
}

// Runs op.col(o, j) for every lane (o, j) of a strided axis (outer x inner lanes), a thread each.
template <typename Op>
__global__ void lane_kernel(int64_t outer, int64_t inner, Op op) {
  const int64_t lanes = outer * inner;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < lanes; t += int64_t(gridDim.x) * blockDim.x) {
    op.col(t / inner, t % inner);
  }
}

template <typename Op>
void launch_lanes(const char* op_name, Device device, int64_t outer, int64_t inner, const Op& op) {
  if (outer * inner == 0) return;
  DeviceGuard guard(op_name, device.index);
  lane_kernel<Op><<<::opforge::cuda::detail::blocks_for(outer * inner), ::opforge::cuda::kThreads, 0,
                    current_stream(op_name, device)>>>(outer, inner, op);
  check(op_name, cudaGetLastError());
}

// ---------------------------------------------------------------------------- column sums

// The type column sums of T accumulate in on the device: float for 16-bit floats, int64 for
// integers, else T.
template <typename T>
using acc_t = std::conditional_t<std::is_integral_v<T>, int64_t, compute_t<T>>;

constexpr int kColTile = 32;  // columns per block (one warp across them)
constexpr int kColRows = 8;   // warps per block, each on its own rows

// part[chunk, j] = sum of f(r, j) over the rows r of chunk `blockIdx.y` (chunk rows each).
template <typename A, typename F>
__global__ void col_partial_kernel(int64_t R, int64_t N, int64_t chunk, F f, A* part) {
  __shared__ A tile[kColRows][kColTile + 1];
  const int64_t j = int64_t(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t r0 = int64_t(blockIdx.y) * chunk, r1 = std::min<int64_t>(R, r0 + chunk);
  A acc{};
  if (j < N) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kColRows) acc += f(r, j);
  }
  tile[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && j < N) {
    A s = tile[0][threadIdx.x];
#pragma unroll
    for (int k = 1; k < kColRows; ++k) s += tile[k][threadIdx.x];
    part[int64_t(blockIdx.y) * N + j] = s;
  }
}

template <typename A>
struct ReadPart {
  const A* p;
  int64_t N;
  __device__ __forceinline__ A operator()(int64_t r, int64_t j) const { return p[r * N + j]; }
};

template <typename T, typename A>
__global__ void store_cols(int64_t N, const A* s, T* out) {
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < N; j += int64_t(gridDim.x) * blockDim.x) {
    out[j] = convert<T>(s[j]);
  }
}

// Column sums' final store through a functor: store(j, sum of column j).
template <typename A, typename Store>
__global__ void store_cols_with(int64_t N, const A* s, Store store) {
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < N; j += int64_t(gridDim.x) * blockDim.x) {
    store(j, s[j]);
  }
}

// Stores a Sum2 column's sums (two per column from one pass: norm_affine_grad's weight and bias
// gradients) into two outputs of dtype T.
template <typename T, typename A>
struct StoreSum2 {
  T *a, *b;
  __device__ __forceinline__ void operator()(int64_t j, const Sum2<A>& s) const {
    a[j] = convert<T>(s.a);
    b[j] = convert<T>(s.b);
  }
};

// store(j, s) with s the sum over r < R of f(r, j) (values of A), for each column j < N, on
// device's current stream: rows split into chunks so that the device is busy, the chunks' partial
// sums then summed in chunk order. The same inputs give the same bits on every run.
template <typename A, typename F, typename Store>
void col_sums_with(const char* op, Device device, int64_t R, int64_t N, const F& f, const Store& store) {
  if (N == 0) return;
  DeviceGuard guard(op, device.index);
  const cudaStream_t stream = current_stream(op, device);
  const int64_t col_blocks = (N + kColTile - 1) / kColTile;
  // about 4 blocks per SM of an H100 in all, each with at least 64 rows per warp
  const int64_t want = std::max<int64_t>(1, 512 / col_blocks);
  const int64_t chunks = std::clamp<int64_t>((R + kColRows * 64 - 1) / (kColRows * 64), 1, std::min<int64_t>(want, 65535));
  const int64_t chunk = R == 0 ? 1 : (R + chunks - 1) / chunks;
  const TensorPtr part = ::opforge::cuda::scratch(device, static_cast<size_t>(chunks * N) * sizeof(A));
  A* pp = static_cast<A*>(part->raw_data());
  const dim3 block(kColTile, kColRows);
  col_partial_kernel<A, F><<<dim3(static_cast<unsigned>(col_blocks), static_cast<unsigned>(chunks)), block, 0, stream>>>(
      R, N, chunk, f, pp);
  check(op, cudaGetLastError());
  const A* sums = pp;
  TensorPtr total;
  if (chunks > 1) {
    total = ::opforge::cuda::scratch(device, static_cast<size_t>(N) * sizeof(A));
    A* tp = static_cast<A*>(total->raw_data());
    col_partial_kernel<A, ReadPart<A>><<<dim3(static_cast<unsigned>(col_blocks), 1), block, 0, stream>>>(
        chunks, N, chunks, ReadPart<A>{pp, N}, tp);
    check(op, cudaGetLastError());
    sums = tp;
  }
  store_cols_with<A, Store><<<::opforge::cuda::detail::blocks_for(N), ::opforge::cuda::kThreads, 0, stream>>>(
      N, sums, store);
  check(op, cudaGetLastError());
}

template <typename T, typename A>
struct StoreAs {
  T* out;
  __device__ __forceinline__ void operator()(int64_t j, const A& s) const { out[j] = convert<T>(s); }
};

// out[j] (N elements of T) = the sum over r < R of f(r, j) (values of A), as col_sums_with.
template <typename T, typename A, typename F>
void col_sums(const char* op, Device device, int64_t R, int64_t N, const F& f, T* out) {
  col_sums_with<A>(op, device, R, N, f, StoreAs<T, A>{out});
}

// ---------------------------------------------------------------------------- index checks

// Records the first (lowest) position whose index lies outside [0, limit): kernels call bad(i)
// and skip the element; raise_if_bad() then waits for the stream and raises IndexError naming the
// op with the index. While the stream is being captured into a CUDA graph nothing may wait for
// it, and with sync_index_checks() off (opforge.cuda.set_index_checks(False)) nothing should: the
// check is skipped there (the kernels still never touch memory through a bad index; the affected
// outputs hold zeros or NaN). Off, nothing is recorded either: flag() is null.
class IndexCheck {
 public:
  IndexCheck(const char* op, Device device) : op_(op), device_(device), on_(sync_index_checks()) {
    if (!on_) return;
    flag_ = ::opforge::cuda::scratch(device, sizeof(unsigned long long));
    DeviceGuard guard(op, device.index);
    stream_ = current_stream(op, device);
    check(op, cudaMemsetAsync(flag_->raw_data(), 0xff, sizeof(unsigned long long), stream_));
  }
  unsigned long long* flag() const { return on_ ? static_cast<unsigned long long*>(flag_->raw_data()) : nullptr; }

  // IndexError "index I is out of range for <what>" (label for cross_entropy's wording) when a
  // kernel recorded a position of `indices`.
  void raise_if_bad(const int64_t* indices, const std::string& what, const char* word = "index") const {
    if (!on_) return;
    DeviceGuard guard(op_, device_.index);
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    check(op_, cudaStreamIsCapturing(stream_, &capturing));
    if (capturing != cudaStreamCaptureStatusNone) return;
    unsigned long long pos = 0;
    check(op_, cudaMemcpyAsync(&pos, flag(), sizeof(pos), cudaMemcpyDeviceToHost, stream_));
    check(op_, cudaStreamSynchronize(stream_));
    if (pos == ~0ull) return;
    int64_t value = 0;
    check(op_, cudaMemcpy(&value, indices + pos, sizeof(value), cudaMemcpyDeviceToHost));
    fail<IndexError>(op_, word, " ", value, " is out of range for ", what);
  }

 private:
  const char* op_;
  Device device_;
  bool on_;
  TensorPtr flag_;
  cudaStream_t stream_ = nullptr;
};

// In a kernel: whether idx lies in [0, limit); if not, position i is recorded in flag.
// (flag null: checks off, nothing recorded)
__device__ __forceinline__ bool index_ok(int64_t idx, int64_t limit, int64_t i, unsigned long long* flag) {
  if (static_cast<uint64_t>(idx) < static_cast<uint64_t>(limit)) return true;
  if (flag) atomicMin(flag, static_cast<unsigned long long>(i));
  return false;
}

// Every index of idx[0, n) checked against [0, limit) (a call with no element to check it at: a
// table of empty rows, an axis of size 0). (A template: one kernel however many files include this.)
template <typename Index = int64_t>
__global__ void check_indices(int64_t n, int64_t limit, const Index* idx, unsigned long long* bad) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    index_ok(idx[i], limit, i, bad);
  }
}

// *count += the number of idx[0, n) other than skip (cross_entropy's rows kept: labels that are
// not ignore_index); integer atomics, the same count on every run. Blocks of whole warps.
template <typename Index = int64_t>
__global__ void count_other(int64_t n, const Index* idx, Index skip, unsigned long long* count) {
  unsigned int c = 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    c += idx[i] != skip;
  }
#pragma unroll
  for (int o = kWarp / 2; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
  if (threadIdx.x % kWarp == 0 && c != 0) atomicAdd(count, static_cast<unsigned long long>(c));
}

// The rows of labels[0, rows) whose label is not ignore, counted on the device into a scratch
// (stream-ordered, no host wait: capturable).
inline TensorPtr kept_rows(const char* op, Device device, const int64_t* labels, int64_t rows, int64_t ignore) {
  TensorPtr kept = ::opforge::cuda::scratch(device, sizeof(unsigned long long));
  DeviceGuard guard(op, device.index);
  const cudaStream_t stream = current_stream(op, device);
  auto* k = static_cast<unsigned long long*>(kept->raw_data());
  check(op, cudaMemsetAsync(k, 0, sizeof(unsigned long long), stream));
  if (rows > 0) {
    count_other<<<::opforge::cuda::detail::blocks_for(rows), ::opforge::cuda::kThreads, 0, stream>>>(rows, labels,
                                                                                                    ignore, k);
    check(op, cudaGetLastError());
  }
  return kept;
}

// In a kernel: the first place in sorted keys[0, n) whose key is not below key.
__device__ __forceinline__ int64_t lower_bound(const int64_t* keys, int64_t n, int64_t key) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (keys[mid] < key) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

}  // namespace opforge::kernels::cuda::rows
