// Shared helpers of the `elem` group's cpp kernels (embedding, max/min, take/scatter along an
// axis): index validation before any read or write, and the (outer, size, inner) view of a
// tensor around one axis.
#pragma once

#include <cstdint>
#include <algorithm>
#include <climits>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "runtime/runtime.h"

namespace opforge::kernels::cpu::elem {

// x viewed as (outer, size, inner) around axis `axis` (already normalized).
struct AxisView {
  int64_t outer = 1, size = 1, inner = 1;
  AxisView(const Shape& shape, int64_t axis) {
    for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
      if (d < axis) outer *= shape[d];
      else if (d == axis) size = shape[d];
      else inner *= shape[d];
    }
  }
};

// The one int axis of an op, normalized against rank ndim (IndexError naming op when out of
// range). A 0-d tensor (axis 0 or -1, as the runtime's reduce rule allows) gives -1: no axis,
// read as one of size 1.
inline int64_t single_axis(const char* op, int64_t axis, int64_t ndim) {
  const auto ax = normalize_axes(op, std::vector<int64_t>{axis}, ndim);
  return ax.empty() ? -1 : ax[0];
}

// Raises IndexError naming op unless every index lies in [0, limit): `what` completes
// "index I is out of range for <what>". Runs before any kernel reads through the indices.
inline void check_indices(const char* op, const int64_t* idx, int64_t n, int64_t limit, const std::string& what) {
  const uint64_t lim = static_cast<uint64_t>(limit < 0 ? 0 : limit);
  int bad = 0;  // branch-free scan (vectorizes); a negative index wraps to a huge unsigned value
#pragma omp parallel for reduction(| : bad) if (n >= kParallelThreshold) schedule(static)
  for (int64_t i = 0; i < n; ++i) bad |= static_cast<uint64_t>(idx[i]) >= lim;
  if (!bad) return;
  for (int64_t i = 0; i < n; ++i) {
    if (static_cast<uint64_t>(idx[i]) >= lim) fail<IndexError>(op, "index ", idx[i], " is out of range for ", what);
  }
}

// Index tensors may be zero-copy views of arrays that another thread writes while a kernel runs
// with the GIL released: a kernel whose memory safety rests on index values reads each value
// once, into this private copy, checks the copy and indexes only through it.
inline std::vector<int64_t> checked_indices(const char* op, const TensorPtr& indices, int64_t limit,
                                            const std::string& what) {
  const int64_t* src = indices->data<int64_t>();
  std::vector<int64_t> idx(src, src + indices->numel());
  check_indices(op, idx.data(), indices->numel(), limit, what);
  return idx;
}

// Shape with the axis removed (keepdims false) or kept.
inline Shape reduced_shape(const Shape& shape, int64_t axis, bool keepdims, int64_t kept = 1) {
  Shape s = shape;
  if (axis < 0) return s;
  if (keepdims) s[axis] = kept;
  else s.erase(s.begin() + axis);
  return s;
}

// Checks indices against x for take_along_axis / scatter_add_along_axis and returns the number of
// positions per lane along the axis (k): with keepdims, indices has x's shape except along axis;
// without, x's shape with the axis removed (k = 1).
inline int64_t lanes_k(const char* op, const Shape& x, const Shape& indices, int64_t axis, bool keepdims) {
  if (axis < 0) {  // 0-d x: one position, 0-d indices
    if (!indices.empty()) {
      fail<ValueError>(op, "indices of shape ", shape_str(indices), " do not fit a 0-d x: give 0-d indices");
    }
    return 1;
  }
  const bool ok = keepdims ? (indices.size() == x.size() && reduced_shape(x, axis, true, indices[axis]) == indices)
                           : (indices.size() + 1 == x.size() && reduced_shape(x, axis, false) == indices);
  if (!ok) {
    fail<ValueError>(op, "indices of shape ", shape_str(indices), " do not fit x of shape ", shape_str(x),
                     " along axis ", axis, keepdims ? " (keepdims=True: same rank, equal sizes on the other axes)"
                                                    : " (keepdims=False: x's shape without the axis)");
  }
  return keepdims ? indices[axis] : 1;
}

// The type sums of T are accumulated in: float for 16-bit floats, else T itself.
template <typename T> using sum_t = compute_t<T>;

// max / min along one axis with the index of the first extremum; NaN beats any number and the
// first NaN wins (numpy.argmax / argmin). values copies the chosen element of x exactly.
//
// Both paths scan a block of independent lanes at once with branch-free selects, so the inner
// loop vectorizes: strided axes (inner > 1) use adjacent lanes; a contiguous axis is read as
// kLanes interleaved sub-rows whose winners are merged at the end.
template <bool kMax, typename C>
OPFORGE_INLINE bool arg_better(C c, C best) {  // c replaces best: strictly better, or the first NaN
  return (kMax ? c > best : c < best) | ((c != c) & (best == best));
}

template <bool kMax, typename T>
void arg_reduce(const char* op, const TensorPtr& x, const TensorPtr& values, const TensorPtr& indices, int64_t axis_attr) {
  using C = compute_t<T>;
  const int64_t axis = single_axis(op, axis_attr, x->dim());
  const AxisView v(x->shape(), axis);
  if (v.size == 0) {
    fail<ValueError>(op, "cannot take the ", kMax ? "max" : "min", " over axis ", axis_attr, " of size 0");
  }
  const T* xp = x->data<T>();
  T* vals = values->data<T>();
  int64_t* idx = indices->data<int64_t>();
  const bool parallel = x->numel() >= kParallelThreshold;
  // positions along the axis are counted in int32 in the vector loops when they fit
  if (v.inner == 1) {
    constexpr int64_t kLanes = 16;
    const int64_t rounds = v.size / kLanes;
#pragma omp parallel for if (parallel) schedule(static)
    for (int64_t o = 0; o < v.outer; ++o) {
      const T* row = xp + o * v.size;
      C bv = static_cast<C>(row[0]);
      int64_t bp = 0;
      int64_t i0 = 1;
      if (rounds >= 2 && rounds <= INT32_MAX) {
        C best[kLanes];
        int32_t br[kLanes];  // the round of each lane's best: position br * kLanes + lane
        for (int64_t j = 0; j < kLanes; ++j) {
          best[j] = static_cast<C>(row[j]);
          br[j] = 0;
        }
        for (int64_t r = 1; r < rounds; ++r) {
          const T* chunk = row + r * kLanes;
          for (int64_t j = 0; j < kLanes; ++j) {
            const C c = static_cast<C>(chunk[j]);
            const bool b = arg_better<kMax>(c, best[j]);
            best[j] = b ? c : best[j];
            br[j] = b ? static_cast<int32_t>(r) : br[j];
          }
        }
        bv = best[0];
        bp = int64_t(br[0]) * kLanes;
        for (int64_t j = 1; j < kLanes; ++j) {  // merge: better, or as good at an earlier position
          const int64_t p = int64_t(br[j]) * kLanes + j;
          const bool tie = (best[j] == bv) | ((best[j] != best[j]) & (bv != bv));
          if (arg_better<kMax>(best[j], bv) || (tie && p < bp)) {
            bv = best[j];
            bp = p;
          }
        }
        i0 = rounds * kLanes;
      }
      for (int64_t i = i0; i < v.size; ++i) {  // the tail, or short rows
        const C c = static_cast<C>(row[i]);
        if (arg_better<kMax>(c, bv)) {
          bv = c;
          bp = i;
        }
      }
      vals[o] = row[bp];
      idx[o] = bp;
    }
    return;
  }
  // strided lanes: scan the axis for a block of adjacent lanes at once
  constexpr int64_t kBlock = 256;
  const int64_t blocks = (v.inner + kBlock - 1) / kBlock;
#pragma omp parallel for if (parallel) schedule(static)
  for (int64_t ob = 0; ob < v.outer * blocks; ++ob) {
    const int64_t o = ob / blocks, j0 = (ob % blocks) * kBlock;
    const int64_t len = std::min(kBlock, v.inner - j0);
    C best[kBlock];
    int64_t bi[kBlock];
    const T* base = xp + o * v.size * v.inner + j0;
    for (int64_t j = 0; j < len; ++j) {
      best[j] = static_cast<C>(base[j]);
      bi[j] = 0;
    }
    for (int64_t i = 1; i < v.size; ++i) {
      const T* row = base + i * v.inner;
      for (int64_t j = 0; j < len; ++j) {
        const C c = static_cast<C>(row[j]);
        const bool b = arg_better<kMax>(c, best[j]);
        best[j] = b ? c : best[j];
        bi[j] = b ? i : bi[j];
      }
    }
    T* vo = vals + o * v.inner + j0;
    int64_t* io = idx + o * v.inner + j0;
    for (int64_t j = 0; j < len; ++j) {
      vo[j] = base[bi[j] * v.inner + j];
      io[j] = bi[j];
    }
  }
}

}  // namespace opforge::kernels::cpu::elem
