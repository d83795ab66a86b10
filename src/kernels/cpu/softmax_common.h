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

#include "runtime/runtime.h"

namespace opforge::kernels::cpu::smx {

// GCC vector types of W lanes of E (unaligned, may alias E) and the matching integer lanes.
template <typename E, int W>
struct Vec {
  using I = std::conditional_t<sizeof(E) == 4, int32_t, int64_t>;
  typedef E v __attribute__((vector_size(sizeof(E) * W)));
  typedef E vu __attribute__((vector_size(sizeof(E) * W), aligned(sizeof(E)), may_alias));
  typedef I vi __attribute__((vector_size(sizeof(E) * W)));
};

// Vectorized primitives over contiguous arrays of E (float or double). Rows: n elements of one
// row; columns (col_*): element-wise over n adjacent columns, one row of a strided axis at a time.
template <typename E>
struct Prims {
  E (*max)(const E* x, int64_t n);                                  // NaN-propagating max, -inf if n == 0
  E (*exp_sum_store)(const E* x, int64_t n, E m, E* out);           // out = exp(x - m); returns its sum
  E (*exp_sum)(const E* x, int64_t n, E m);                         // sum of exp(x - m)
  void (*scale)(E* y, int64_t n, E f);                              // y *= f
  void (*sub)(const E* x, int64_t n, E c, E* out);                  // out = x - c
  E (*dot)(const E* a, const E* b, int64_t n);                      // sum of a * b
  E (*sum)(const E* a, int64_t n);                                  // sum of a
  void (*softmax_bwd)(const E* g, const E* y, int64_t n, E d, E* dx);      // dx = y * (g - d)
  void (*log_softmax_bwd)(const E* g, const E* y, int64_t n, E s, E* dx);  // dx = g - exp(y) * s
  void (*col_max)(E* m, const E* x, int64_t n);                     // m = max(m, x)
  void (*col_exp_acc)(const E* x, const E* m, int64_t n, E* s, E* out);  // out = exp(x - m); s += out
  void (*col_exp_add)(const E* x, const E* m, int64_t n, E* s);     // s += exp(x - m)
  void (*col_mul)(E* y, const E* r, int64_t n);                     // y *= r
  void (*col_sub)(const E* x, const E* c, int64_t n, E* out);       // out = x - c
  void (*col_fma)(E* acc, const E* a, const E* b, int64_t n);       // acc += a * b
  void (*col_add)(E* acc, const E* a, int64_t n);                   // acc += a
  void (*col_softmax_bwd)(const E* g, const E* y, const E* d, int64_t n, E* dx);
  void (*col_log_softmax_bwd)(const E* g, const E* y, const E* s, int64_t n, E* dx);
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

constexpr int64_t kChunk = 2048;        // row chunk of the online max/sum (elements, stays in L1)
constexpr int64_t kTileElems = 32768;   // column tiles: rows x width elements per input

template <typename E>
constexpr E kNegInf = -std::numeric_limits<E>::infinity();

template <typename E>
inline E max_nan(E a, E b) { return (b > a || b != b) ? b : a; }

// log(sum(exp(x))) from its max m and the sum s of exp(x - m): exactly m when m is infinite
// (all -inf, an empty reduction or a +inf element), NaN when m is NaN.
template <typename E>
inline E lse_finish(E m, E s) { return std::isinf(m) ? m : m + std::log(s); }

// Online max and sum of exp(x - max) over a row, chunk by chunk (each chunk is read once from
// memory, then from L1): returns {m, s}. A chunk of only -inf adds nothing.
template <typename E>
inline std::pair<E, E> row_lse_parts(const Prims<E>& P, const E* x, int64_t n) {
  if (n <= kChunk) {
    const E m = P.max(x, n);
    return {m, n ? P.exp_sum(x, n, m) : E(0)};
  }
  E M = kNegInf<E>, S = 0;
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t len = std::min(kChunk, n - i);
    const E mk = P.max(x + i, len);
    if (mk == kNegInf<E>) continue;
    const E sk = P.exp_sum(x + i, len, mk);
    const E Mn = max_nan(M, mk);
    S = (M == kNegInf<E> ? E(0) : S * std::exp(M - Mn)) + sk * std::exp(mk - Mn);
    M = Mn;
  }
  if (M == kNegInf<E>) S = n ? std::numeric_limits<E>::quiet_NaN() : E(0);  // all -inf: NaN like x - max
  return {M, S};
}

// y = mult * softmax(x) over a row, online: per chunk the max, then exp(x - max) stored and
// summed; then each chunk scaled by exp(chunk max - row max) * mult / sum. cm: n / kChunk + 1.
template <typename E>
inline void softmax_row(const Prims<E>& P, const E* x, E* y, int64_t n, E* cm, E mult = E(1)) {
  if (n <= kChunk) {
    const E m = P.max(x, n);
    const E s = P.exp_sum_store(x, n, m, y);
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
    const E sk = P.exp_sum_store(x + i, len, mk, y + i);
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

template <typename T, typename E>
inline void load_row(const T* src, E* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = convert<E>(src[i]);
}
template <typename T, typename E>
inline void store_row(const E* src, T* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = convert<T>(src[i]);
}

// The tensor's shape as outer x n x inner around `axis` (validated like sum's axes; a 0-d
// tensor is one element, axis 0 or -1).
struct AxisView {
  int64_t outer = 1, n = 1, inner = 1;
};
inline AxisView axis_view(const char* op, const Shape& s, int64_t axis) {
  const auto ax = normalize_axes(op, std::vector<int64_t>{axis}, static_cast<int64_t>(s.size()));
  AxisView v;
  if (s.empty()) return v;
  const size_t a = static_cast<size_t>(ax[0]);
  for (size_t i = 0; i < s.size(); ++i) {
    if (i < a) v.outer *= s[i];
    else if (i > a) v.inner *= s[i];
  }
  v.n = s[a];
  return v;
}

inline bool parallel_worth(int64_t elems, int64_t tasks) { return elems >= kParallelThreshold && tasks > 1; }

// Column tile width for a strided axis of length n: tiles of about kTileElems elements.
inline int64_t tile_width(int64_t n, int64_t inner) {
  int64_t w = kTileElems / std::max<int64_t>(n, 1);
  w = std::max<int64_t>(16, std::min<int64_t>(w, 1024)) & ~int64_t(15);
  return std::min(w, inner);
}

// Maps NIn same-shaped inputs to one output of that shape along an axis, in the compute type
// E of T. row(x, y, n, scratch) handles one contiguous row (x: NIn pointers); col(x, ldx, y, ldy,
// n, w, scratch) one tile of w adjacent columns across the n rows of a strided axis (row r of
// input k at x[k] + r * ldx). Rows and tiles of 16-bit floats go through float buffers. The
// scratch holds max(n / kChunk + 2, 2 * w) elements.
template <typename T, size_t NIn, typename RowFn, typename ColFn>
void map_axis(const std::array<const T*, NIn>& in, T* out, const AxisView& v, const RowFn& row,
              const ColFn& col) {
  using E = compute_t<T>;
  constexpr bool kConvert = !std::is_same_v<T, E>;
  const int64_t n = v.n;
  if (v.outer * v.n * v.inner == 0) return;
  if (v.inner == 1) {
    const int64_t rows = v.outer;
#pragma omp parallel if (parallel_worth(rows * n, rows))
    {
      std::vector<E> buf(kConvert ? (NIn + 1) * n : 0);
      std::vector<E> scratch(n / kChunk + 2);
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        std::array<const E*, NIn> x;
        E* y;
        if constexpr (kConvert) {
          for (size_t k = 0; k < NIn; ++k) {
            load_row(in[k] + r * n, buf.data() + k * n, n);
            x[k] = buf.data() + k * n;
          }
          y = buf.data() + NIn * n;
        } else {
          for (size_t k = 0; k < NIn; ++k) x[k] = in[k] + r * n;
          y = out + r * n;
        }
        row(x, y, n, scratch.data());
        if constexpr (kConvert) store_row(y, out + r * n, n);
      }
    }
    return;
  }
  const int64_t inner = v.inner;
  const int64_t w = tile_width(n, inner);
  const int64_t tiles = (inner + w - 1) / w;
  const int64_t tasks = v.outer * tiles;
#pragma omp parallel if (parallel_worth(v.outer * n * inner, tasks))
  {
    std::vector<E> buf(kConvert ? (NIn + 1) * n * w : 0);
    std::vector<E> scratch(std::max<int64_t>(n / kChunk + 2, 2 * w));
#pragma omp for schedule(static)
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

// Checks that two inputs have the same shape.
inline void check_same_shape(const char* op, const char* a, const TensorPtr& x, const char* b, const TensorPtr& y) {
  if (x->shape() != y->shape()) {
    fail<ValueError>(op, a, " of shape ", shape_str(x->shape()), " and ", b, " of shape ", shape_str(y->shape()),
                     " must have the same shape");
  }
}

// Cross-entropy inputs: logits (N, C), labels (N,) with every label in [0, C).
inline void check_logits_labels(const char* op, const TensorPtr& logits, const TensorPtr& labels) {
  if (logits->dim() != 2) {
    fail<ValueError>(op, "logits must have shape (N, C), got ", shape_str(logits->shape()));
  }
  if (labels->dim() != 1 || labels->shape()[0] != logits->shape()[0]) {
    fail<ValueError>(op, "labels must have shape (N,) = (", logits->shape()[0], ",) to match logits ",
                     shape_str(logits->shape()), ", got ", shape_str(labels->shape()));
  }
}
inline void check_label_values(const char* op, const int64_t* labels, int64_t n, int64_t classes) {
  for (int64_t i = 0; i < n; ++i) {
    if (labels[i] < 0 || labels[i] >= classes) {
      fail<IndexError>(op, "label ", labels[i], " is out of range for ", classes, " classes");
    }
  }
}
// dy of a cross-entropy gradient: shape () or (1,) (one value for all rows) or (N,).
inline void check_loss_grad(const char* op, const TensorPtr& dy, int64_t rows) {
  const bool one = dy->dim() == 0 || (dy->dim() == 1 && dy->shape()[0] == 1);
  if (!one && !(dy->dim() == 1 && dy->shape()[0] == rows)) {
    fail<ValueError>(op, "dy must have shape () or (N,) = (", rows, ",), got ", shape_str(dy->shape()));
  }
}
// The factor of each row's gradient: 1 / N for reduction mean, else 1.
inline double reduction_scale(const std::string& reduction, int64_t rows) {
  return reduction == "mean" ? 1.0 / static_cast<double>(rows) : 1.0;
}

}  // namespace opforge::kernels::cpu::smx
