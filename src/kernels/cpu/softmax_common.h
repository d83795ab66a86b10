// Shared code of the softmax group (softmax, log_softmax, their backward ops, logsumexp,
// cross_entropy and its backward): vectorized row/column primitives chosen once per process for
// the CPU (AVX-512, AVX2 or SSE2; defined in softmax.cpp from softmax_simd.inc), and the drivers
// that walk an axis as rows (contiguous axis) or as column tiles (strided axis), convert 16-bit
// floats to float per row/tile, and spread rows over OpenMP threads for large inputs.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/layout.h"
#include "runtime/runtime.h"

namespace opforge::kernels::cpu::smx {

// GCC vector types of W lanes of E (unaligned, may alias E) and the matching integer lanes.
template <typename E, int W>
struct Vec {
  using I = std::conditional_t<sizeof(E) == 8, int64_t, std::conditional_t<sizeof(E) == 4, int32_t, int16_t>>;
  typedef E v __attribute__((vector_size(sizeof(E) * W)));
  typedef E vu __attribute__((vector_size(sizeof(E) * W), aligned(sizeof(E)), may_alias));
  typedef I vi __attribute__((vector_size(sizeof(E) * W)));
};

// Vectorized primitives over contiguous arrays of E (float or double). Rows: n elements of one
// row; columns (col_*): element-wise over n adjacent columns, one row of a strided axis at a time.
template <typename E>
struct Prims {
  E (*max)(const E* x, int64_t n);                                  // NaN-propagating max, -inf if n == 0
  // pf, pg, py: the next row (or this one), prefetched while this row computes
  E (*exp_sum_store)(const E* x, int64_t n, E m, E* out, const E* pf);  // out = exp(x - m); returns its sum
  E (*exp_sum)(const E* x, int64_t n, E m, const E* pf);                // sum of exp(x - m)
  void (*scale)(E* y, int64_t n, E f);                              // y *= f
  void (*sub)(const E* x, int64_t n, E m, E l, E* out);             // out = (x - m) - l
  E (*dot)(const E* a, const E* b, int64_t n);                      // sum of a * b
  E (*sum)(const E* a, int64_t n);                                  // sum of a
  void (*softmax_bwd)(const E* g, const E* y, int64_t n, E d, E* dx, const E* pg, const E* py);  // y * (g - d)
  void (*log_softmax_bwd)(const E* g, const E* y, int64_t n, E s, E* dx, const E* pg, const E* py);  // g - exp(y) s
  void (*col_max)(E* m, const E* x, int64_t n);                     // m = max(m, x)
  void (*col_exp_add)(const E* x, const E* m, int64_t n, E* s);     // s += exp(x - m) (0 where m is -inf)
  void (*col_rescale)(E* s, const E* m, const E* mn, int64_t n);    // s *= exp(m - mn) (1 where m == mn)
  void (*col_exp_scale)(const E* x, const E* m, const E* r, int64_t n, E* out);  // out = exp(x - m) * r
  void (*col_sub)(const E* x, const E* m, const E* l, int64_t n, E* out);  // out = (x - m) - l
  void (*col_fma)(E* acc, const E* a, const E* b, int64_t n);       // acc += a * b
  void (*col_add)(E* acc, const E* a, int64_t n);                   // acc += a
  void (*col_softmax_bwd)(const E* g, const E* y, const E* d, int64_t n, E* dx);
  void (*col_log_softmax_bwd)(const E* g, const E* y, const E* s, int64_t n, E* dx);
  // float only: 16-bit floats (their bits) to float and back, rounding to nearest even
  void (*from_f16)(const uint16_t* src, float* dst, int64_t n) = nullptr;
  void (*to_f16)(const float* src, uint16_t* dst, int64_t n) = nullptr;
  void (*from_bf16)(const uint16_t* src, float* dst, int64_t n) = nullptr;
  void (*to_bf16)(const float* src, uint16_t* dst, int64_t n) = nullptr;
};

// The primitives for this CPU (defined in softmax.cpp).
const Prims<float>& prims_f32();
const Prims<double>& prims_f64();
template <typename E>
inline const Prims<E>& prims() {
  if constexpr (std::is_same_v<E, float>) return prims_f32();
  else return prims_f64();
}
// The instruction set the primitives use: "avx512", "avx2" or "sse2".
const char* simd_level();

constexpr int64_t kChunk = 16384;       // row chunk of the online max/sum (elements, stays in L2)
constexpr int64_t kBlockElems = 16384;  // column tiles: rows per block of the online max/sum
constexpr int64_t kMaxTile = 4096;      // column tiles: widest tile (elements)
constexpr int64_t kConvertElems = int64_t(1) << 20;  // column tiles of 16-bit floats: float buffer size

template <typename E>
constexpr E kNegInf = -std::numeric_limits<E>::infinity();

template <typename E>
inline E max_nan(E a, E b) { return (b > a || b != b) ? b : a; }

// log(sum(exp(x))) from its max m and the sum s of exp(x - m): exactly m when m is infinite
// (all -inf, an empty reduction or a +inf element), NaN when m is NaN.
template <typename E>
inline E lse_finish(E m, E s) { return std::isinf(m) ? m : m + std::log(s); }

// Online max and sum of exp(x - max) over a row, chunk by chunk (each chunk is read once from
// memory, then from cache): returns {m, s}. A chunk of only -inf adds nothing. pf: the next row
// (or this one), prefetched during the exp pass.
template <typename E>
inline std::pair<E, E> row_lse_parts(const Prims<E>& P, const E* x, int64_t n, const E* pf) {
  if (n <= kChunk) {
    const E m = P.max(x, n);
    return {m, n ? P.exp_sum(x, n, m, pf) : E(0)};
  }
  E M = kNegInf<E>, S = 0;
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t len = std::min(kChunk, n - i);
    const E mk = P.max(x + i, len);
    if (mk == kNegInf<E>) continue;
    const E sk = P.exp_sum(x + i, len, mk, pf + i);
    const E Mn = max_nan(M, mk);
    S = (M == kNegInf<E> ? E(0) : S * std::exp(M - Mn)) + sk * std::exp(mk - Mn);
    M = Mn;
  }
  if (M == kNegInf<E>) S = n ? std::numeric_limits<E>::quiet_NaN() : E(0);  // all -inf: NaN like x - max
  return {M, S};
}

// y = mult * softmax(x) over a row, online: per chunk the max, then exp(x - max) stored and
// summed; then each chunk scaled by exp(chunk max - row max) * mult / sum. cm: n / kChunk + 1.
// pf: the next row (or this one), prefetched during the exp pass.
template <typename E>
inline void softmax_row(const Prims<E>& P, const E* x, E* y, int64_t n, E* cm, const E* pf, E mult = E(1)) {
  if (n <= kChunk) {
    const E m = P.max(x, n);
    const E s = P.exp_sum_store(x, n, m, y, pf);
    P.scale(y, n, mult / s);
    return;
  }
  E M = kNegInf<E>, S = 0;
  int64_t k = 0;
  for (int64_t i = 0; i < n; i += kChunk, ++k) {
    const int64_t len = std::min(kChunk, n - i);
    const E mk = P.max(x + i, len);
    cm[k] = mk;
    if (mk == kNegInf<E>) continue;  // its terms are 0 (written below)
    const E sk = P.exp_sum_store(x + i, len, mk, y + i, pf + i);
    const E Mn = max_nan(M, mk);
    S = (M == kNegInf<E> ? E(0) : S * std::exp(M - Mn)) + sk * std::exp(mk - Mn);
    M = Mn;
  }
  k = 0;
  for (int64_t i = 0; i < n; i += kChunk, ++k) {
    const int64_t len = std::min(kChunk, n - i);
    if (M == kNegInf<E>) {
      std::fill(y + i, y + i + len, std::numeric_limits<E>::quiet_NaN());  // all -inf, as x - max gives
    } else if (cm[k] == kNegInf<E>) {
      std::fill(y + i, y + i + len, E(0));
    } else {
      P.scale(y + i, len, std::exp(cm[k] - M) * mult / S);
    }
  }
}

// Rows of T to E and back (16-bit floats through the vectorized conversions).
template <typename T, typename E>
inline void load_row(const T* src, E* dst, int64_t n) {
  static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2, "16-bit floats are their bits");
  if constexpr (std::is_same_v<T, Half> && std::is_same_v<E, float>) {
    prims_f32().from_f16(reinterpret_cast<const uint16_t*>(src), dst, n);
  } else if constexpr (std::is_same_v<T, BFloat16> && std::is_same_v<E, float>) {
    prims_f32().from_bf16(reinterpret_cast<const uint16_t*>(src), dst, n);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = convert<E>(src[i]);
  }
}
template <typename T, typename E>
inline void store_row(const E* src, T* dst, int64_t n) {
  if constexpr (std::is_same_v<T, Half> && std::is_same_v<E, float>) {
    prims_f32().to_f16(src, reinterpret_cast<uint16_t*>(dst), n);
  } else if constexpr (std::is_same_v<T, BFloat16> && std::is_same_v<E, float>) {
    prims_f32().to_bf16(src, reinterpret_cast<uint16_t*>(dst), n);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = convert<T>(src[i]);
  }
}

// AxisView, axis_view and the cross-entropy checks are kernels/layout.h's, shared with the cuda kernels.
using namespace ::opforge::kernels::layout;

inline bool parallel_worth(int64_t elems, int64_t tasks) { return elems >= kParallelThreshold && tasks > 1; }

// Rows handed to a thread at a time (schedule(dynamic)): about 64K elements, so that a thread
// that the OS runs late takes little work with it, while the atomic hand-out stays negligible.
inline int64_t rows_per_grab(int64_t n) { return std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(n, 1)); }

// Column tiles of a strided axis (outer x n x inner): w adjacent columns of all n rows, whole rows
// (w = inner) up to kMaxTile so that rows stream from memory, narrower when there would be fewer
// tiles than threads, and narrower still when the tile is converted into a float buffer of
// `copies` x n x w elements.
inline int64_t tile_width(int64_t outer, int64_t n, int64_t inner, int64_t copies) {
  int64_t w = std::min(inner, kMaxTile);
#ifdef _OPENMP
  const int64_t threads = omp_get_max_threads();
  while (w > 256 && outer * ((inner + w - 1) / w) < threads) w = (w / 2 + 15) & ~int64_t(15);
#endif
  if (copies > 0) w = std::min(w, std::max<int64_t>(1, kConvertElems / (copies * std::max<int64_t>(n, 1))));
  return w;
}

// Online max m and sum s of exp(x - m) down each of w columns of n rows (row r at x + r * ld):
// a block of rows at a time, its max first, then the block's exp terms (re-read from cache),
// summed kSumRows rows at a time before they join s (for accuracy over long columns).
// m, s, scratch: w elements each; scratch2: w elements.
constexpr int64_t kSumRows = 32;
template <typename E>
inline void col_lse_parts(const Prims<E>& P, const E* x, int64_t ld, int64_t n, int64_t w, E* m, E* s, E* scratch,
                          E* scratch2) {
  const int64_t block = std::max<int64_t>(kSumRows, kBlockElems / std::max<int64_t>(w, 1)) / kSumRows * kSumRows;
  std::fill(m, m + w, kNegInf<E>);
  std::fill(s, s + w, E(0));
  for (int64_t r0 = 0; r0 < n; r0 += block) {
    const int64_t r1 = std::min(n, r0 + block);
    std::copy(m, m + w, scratch);
    for (int64_t r = r0; r < r1; ++r) P.col_max(scratch, x + r * ld, w);
    P.col_rescale(s, m, scratch, w);
    std::copy(scratch, scratch + w, m);
    for (int64_t q = r0; q < r1; q += kSumRows) {
      std::fill(scratch2, scratch2 + w, E(0));
      for (int64_t r = q; r < std::min(r1, q + kSumRows); ++r) P.col_exp_add(x + r * ld, m, w, scratch2);
      P.col_add(s, scratch2, w);
    }
  }
}

// Column sums down n rows (row r at x + r * ld) into s (w elements), kSumRows rows at a time.
template <typename E>
inline void col_sum_rows(const Prims<E>& P, const E* x, int64_t ld, int64_t n, int64_t w, E* s, E* scratch) {
  std::fill(s, s + w, E(0));
  for (int64_t q = 0; q < n; q += kSumRows) {
    std::fill(scratch, scratch + w, E(0));
    for (int64_t r = q; r < std::min(n, q + kSumRows); ++r) P.col_add(scratch, x + r * ld, w);
    P.col_add(s, scratch, w);
  }
}

// Column dot products down n rows of a and b into d (w elements), kSumRows rows at a time.
template <typename E>
inline void col_dot_rows(const Prims<E>& P, const E* a, const E* b, int64_t ld, int64_t n, int64_t w, E* d,
                         E* scratch) {
  std::fill(d, d + w, E(0));
  for (int64_t q = 0; q < n; q += kSumRows) {
    std::fill(scratch, scratch + w, E(0));
    for (int64_t r = q; r < std::min(n, q + kSumRows); ++r) P.col_fma(scratch, a + r * ld, b + r * ld, w);
    P.col_add(d, scratch, w);
  }
}

// Asks the OS for transparent huge pages under a large fresh output before it is first written,
// as NumPy does for its arrays: far fewer page faults (a hint; nothing changes where unsupported).
inline void advise_huge_pages(void* p, int64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t(1) << 21;
  if (bytes < int64_t(4) << 20) return;
  const uintptr_t a = (reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes)) & ~(kHuge - 1);
  if (e > a) madvise(reinterpret_cast<void*>(a), e - a, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

// Maps NIn same-shaped inputs to one output of that shape along an axis, in the compute type
// E of T. row(x, y, n, scratch, next) handles one contiguous row (x: NIn pointers; next: the
// inputs' next rows to prefetch, or this row's when converted or last); col(x, ldx, y, ldy,
// n, w, scratch) one tile of w adjacent columns across the n rows of a strided axis (row r of
// input k at x[k] + r * ldx). Rows and tiles of 16-bit floats go through float buffers. The
// scratch holds n / kChunk + 2 elements for rows, 4 * w for tiles.
template <typename T, size_t NIn, typename RowFn, typename ColFn>
void map_axis(const std::array<const T*, NIn>& in, T* out, const AxisView& v, const RowFn& row,
              const ColFn& col) {
  using E = compute_t<T>;
  constexpr bool kConvert = !std::is_same_v<T, E>;
  const int64_t n = v.n;
  if (v.outer * v.n * v.inner == 0) return;
  advise_huge_pages(out, v.outer * n * v.inner * static_cast<int64_t>(sizeof(T)));
  if (v.inner == 1) {
    const int64_t rows = v.outer;
    const int64_t grab = rows_per_grab(n);
#pragma omp parallel if (parallel_worth(rows * n, rows))
    {
      std::vector<E> buf(kConvert ? (NIn + 1) * n : 0);
      std::vector<E> scratch(n / kChunk + 2);
#pragma omp for schedule(dynamic, grab)
      for (int64_t r = 0; r < rows; ++r) {
        std::array<const E*, NIn> x, next;
        E* y;
        if constexpr (kConvert) {
          for (size_t k = 0; k < NIn; ++k) {
            load_row(in[k] + r * n, buf.data() + k * n, n);
            x[k] = next[k] = buf.data() + k * n;
          }
          y = buf.data() + NIn * n;
        } else {
          const int64_t rn = r + 1 < rows ? r + 1 : r;
          for (size_t k = 0; k < NIn; ++k) {
            x[k] = in[k] + r * n;
            next[k] = in[k] + rn * n;
          }
          y = out + r * n;
        }
        row(x, y, n, scratch.data(), next);
        if constexpr (kConvert) store_row(y, out + r * n, n);
      }
    }
    return;
  }
  const int64_t inner = v.inner;
  const int64_t w = tile_width(v.outer, n, inner, kConvert ? NIn + 1 : 0);
  const int64_t tiles = (inner + w - 1) / w;
  const int64_t tasks = v.outer * tiles;
#pragma omp parallel if (parallel_worth(v.outer * n * inner, tasks))
  {
    std::vector<E> buf(kConvert ? (NIn + 1) * n * w : 0);
    std::vector<E> scratch(4 * w);
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t o = t / tiles, j0 = (t % tiles) * w, wj = std::min(w, inner - j0);
      const int64_t base = o * n * inner + j0;
      std::array<const E*, NIn> x;
      E* y;
      int64_t ld;
      if constexpr (kConvert) {
        for (size_t k = 0; k < NIn; ++k) {
          E* b = buf.data() + k * n * w;
          for (int64_t r = 0; r < n; ++r) load_row(in[k] + base + r * inner, b + r * w, wj);
          x[k] = b;
        }
        y = buf.data() + NIn * n * w;
        ld = w;
      } else {
        for (size_t k = 0; k < NIn; ++k) x[k] = in[k] + base;
        y = out + base;
        ld = inner;
      }
      col(x, ld, y, ld, n, wj, scratch.data());
      if constexpr (kConvert) {
        for (int64_t r = 0; r < n; ++r) store_row(y + r * w, out + base + r * inner, wj);
      }
    }
  }
}

// The labels copied once into memory of this call and checked (another thread may write the
// caller's array while the kernel runs with the GIL released: see elem::checked_indices): each in
// [0, classes) or `ignore` (a row left out, as torch's ignore_index); kept counts the others.
struct CheckedLabels {
  std::vector<int64_t> values;
  int64_t kept = 0;
};
inline CheckedLabels checked_labels(const char* op, const TensorPtr& labels, int64_t classes, int64_t ignore) {
  const int64_t* src = labels->data<int64_t>();
  CheckedLabels lab{std::vector<int64_t>(src, src + labels->numel()), 0};
  for (const int64_t l : lab.values) {
    if (l == ignore) continue;
    if (l < 0 || l >= classes) fail<IndexError>(op, "label ", l, " is out of range for ", classes, " classes");
    ++lab.kept;
  }
  return lab;
}

}  // namespace opforge::kernels::cpu::smx
