// The softmax group on cuda (softmax, log_softmax, softmax_backward, log_softmax_backward): a
// contiguous axis runs as rows (row_common.cuh: a warp or a block per row; a row held in registers
// takes its max, then independent exponentials; a longer one its max and sum of exponentials tile
// by tile, then one pass writing it); a strided axis runs a
// thread per lane (outer x inner), stepping along the axis. float accumulation for 16-bit inputs;
// NaN, infinities and rows of -inf give what the cpu kernels give.
#pragma once

#include "kernels/layout.h"
#include "row_common.cuh"

namespace opforge::kernels::cuda::smx {

using namespace ::opforge::kernels::cuda::rows;

enum class Kind { Softmax, LogSoftmax };

// One row's (m, s) after the group's reduction (each thread's part tile by tile: thread_lse).
template <int G, typename T>
__device__ __forceinline__ Lse<compute_t<T>> row_lse(const T* x, int64_t n, int lane, bool vec) {
  return lse_final(group_reduce<G>(thread_lse<G>(x, n, lane, vec), LseCombine{}));
}

template <typename T, Kind K>
struct ForwardRow {
  // 16-bit rows: blocks per SM (rows::RowMinBlocks). log_softmax's 6 warp blocks were the tune
  // step's fastest; softmax's were 4 at 127 registers, before exp_row (103 without a cap, 80 at 6
  // blocks with an 8-byte spill: not yet measured)
  using row_value = T;
  static constexpr int kWarpBlocks16 = 6, kBlockBlocks16 = 3;
  const T* x;
  T* y;
  int64_t n;
  bool vec;
  template <int G, RowPath P = RowPath::Any>
  __device__ __forceinline__ void row(int64_t r, int lane) const {
    using C = compute_t<T>;
    const T* const in[1] = {x + r * n};
    T* yr = y + r * n;
    with_row<G, T, 1, P>(in, n, lane, vec, [&](auto& src) {
      if constexpr (std::decay_t<decltype(src)>::kHeld) {
        // held: the max, then independent exponentials (a +inf or NaN max makes every term NaN,
        // and an all -inf row a NaN max - max: the cpu's results)
        C m = neg_inf<C>();
        src.each([&](int64_t, C v) { m = max_nan(m, v); });
        m = group_reduce<G>(m, MaxNan{});
        C s = C(0);
        if constexpr (K == Kind::Softmax) {
          src.update([&](C v) { return exp_row<T>(v - m); });
          src.each([&](int64_t, C e) { s += e; });
          const C inv = C(1) / group_reduce<G>(s, Add{});
          src.store(yr, [&](int64_t, C e) { return e * inv; });
        } else {
          src.each([&](int64_t, C v) { s += exp_row<T>(v - m); });
          const C l = log_(group_reduce<G>(s, Add{}));
          src.store(yr, [&](int64_t, C v) { return (v - m) - l; });
        }
      } else {  // streamed: the row's (m, s) tile by tile, then one pass writing it
        const Lse<C> p = row_lse<G>(x + r * n, n, lane, vec);
        const C m = p.m;
        if constexpr (K == Kind::Softmax) {
          const C inv = C(1) / p.s;
          src.store(yr, [&](int64_t, C v) { return exp_row<T>(v - m) * inv; });
        } else {
          const C l = log_(p.s);
          src.store(yr, [&](int64_t, C v) { return (v - m) - l; });
        }
      }
    });
  }
};

template <typename T, Kind K>
struct ForwardLane {
  const T* x;
  T* y;
  int64_t n, inner;
  __device__ __forceinline__ void col(int64_t o, int64_t j) const {
    using C = compute_t<T>;
    const int64_t base = o * n * inner + j;
    Lse<C> p{neg_inf<C>(), C(0)};
    for (int64_t i = 0; i < n; ++i) p = lse_add(p, convert<C>(x[base + i * inner]));
    p = lse_final(p);
    const C inv = C(1) / p.s, l = log_(p.s);
    for (int64_t i = 0; i < n; ++i) {
      const C v = convert<C>(x[base + i * inner]);
      y[base + i * inner] = convert<T>(K == Kind::Softmax ? exp_(v - p.m) * inv : (v - p.m) - l);
    }
  }
};

// softmax: dx = y * (g - sum(g * y)); log_softmax: dx = g - exp(y) * sum(g).
template <typename T, Kind K>
struct BackwardRow {
  using row_value = T;  // 16-bit rows: blocks per SM (rows::RowMinBlocks)
  static constexpr int kWarpBlocks16 = 4, kBlockBlocks16 = 2;
  const T* g;
  const T* y;
  T* dx;
  int64_t n;
  bool vec;
  template <int G, RowPath P = RowPath::Any>
  __device__ __forceinline__ void row(int64_t r, int lane) const {
    using C = compute_t<T>;
    const T* const in[2] = {g + r * n, y + r * n};
    T* out = dx + r * n;
    with_row<G, T, 2, P>(in, n, lane, vec, [&](auto& src) {
      C d = C(0);
      src.each([&](int64_t, C gv, C yv) { d += K == Kind::Softmax ? gv * yv : gv; });
      d = group_reduce<G>(d, Add{});
      src.store(out, [&](int64_t, C gv, C yv) { return K == Kind::Softmax ? yv * (gv - d) : gv - exp_row<T>(yv) * d; });
    });
  }
};

template <typename T, Kind K>
struct BackwardLane {
  const T* g;
  const T* y;
  T* dx;
  int64_t n, inner;
  __device__ __forceinline__ void col(int64_t o, int64_t j) const {
    using C = compute_t<T>;
    const int64_t base = o * n * inner + j;
    C d = C(0);
    for (int64_t i = 0; i < n; ++i) {
      const C gv = convert<C>(g[base + i * inner]);
      d += K == Kind::Softmax ? gv * convert<C>(y[base + i * inner]) : gv;
    }
    for (int64_t i = 0; i < n; ++i) {
      const C gv = convert<C>(g[base + i * inner]), yv = convert<C>(y[base + i * inner]);
      dx[base + i * inner] = convert<T>(K == Kind::Softmax ? yv * (gv - d) : gv - exp_(yv) * d);
    }
  }
};

template <typename T, Kind K>
void forward(const char* op, const TensorPtr& x, const TensorPtr& y, int64_t axis) {
  const layout::AxisView v = layout::axis_view(op, x->shape(), axis);
  if (x->numel() == 0) return;
  const Device device = x->device();
  if (v.inner == 1) {
    launch_rows(op, device, v.outer, v.n,
                ForwardRow<T, K>{x->data<T>(), y->data<T>(), v.n, vec_ok<T>(v.n, {x->raw_data(), y->raw_data()})});
  } else {
    launch_lanes(op, device, v.outer, v.inner, ForwardLane<T, K>{x->data<T>(), y->data<T>(), v.n, v.inner});
  }
}

template <typename T, Kind K>
void backward(const char* op, const TensorPtr& g, const TensorPtr& y, const TensorPtr& dx, int64_t axis) {
  layout::check_same_shape(op, "dout", g, "y", y);
  const layout::AxisView v = layout::axis_view(op, y->shape(), axis);
  if (y->numel() == 0) return;
  const Device device = y->device();
  if (v.inner == 1) {
    launch_rows(op, device, v.outer, v.n,
                BackwardRow<T, K>{g->data<T>(), y->data<T>(), dx->data<T>(), v.n,
                                  vec_ok<T>(v.n, {g->raw_data(), y->raw_data(), dx->raw_data()})});
  } else {
    launch_lanes(op, device, v.outer, v.inner,
                 BackwardLane<T, K>{g->data<T>(), y->data<T>(), dx->data<T>(), v.n, v.inner});
  }
}

}  // namespace opforge::kernels::cuda::smx
