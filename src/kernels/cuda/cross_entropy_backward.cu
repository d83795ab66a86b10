// Kernel of op `cross_entropy_backward` on cuda: per row w = dy (or dy[i]) / (N for mean), then
// dlogits = w * softmax(logits) (softmax_rows.cuh's online row) with w subtracted at the label.
// Labels are checked on the device as in cross_entropy (a bad label subtracts nothing and the call
// raises IndexError naming the op).
#include "cross_entropy_backward.h"

#include "softmax_rows.cuh"

namespace opforge::kernels::cuda {

namespace {

template <typename T>
struct GradRow {
  using row_value = T;  // 16-bit rows: blocks per SM (rows::RowMinBlocks; not tuned)
  static constexpr int kWarpBlocks16 = 1, kBlockBlocks16 = 2;
  const T* dy;
  bool one;
  double scale;
  const T* x;
  const int64_t* labels;
  T* dx;
  int64_t classes;
  bool vec;
  unsigned long long* bad;
  template <int G, rows::RowPath P = rows::RowPath::Any>
  __device__ __forceinline__ void row(int64_t r, int lane) const {
    using C = compute_t<T>;
    const T* const in[1] = {x + r * classes};
    const C w = static_cast<C>(convert<double>(dy[one ? 0 : r]) * scale);
    const int64_t l = labels[r];
    if (lane == 0) rows::index_ok(l, classes, r, bad);
    rows::with_row<G, T, 1, P>(in, classes, lane, vec, [&](auto& src) {
      C m, f;
      if constexpr (std::decay_t<decltype(src)>::kHeld) {  // held: the max, then independent exponentials
        m = rows::neg_inf<C>();
        src.each([&](int64_t, C v) { m = rows::max_nan(m, v); });
        m = rows::group_reduce<G>(m, rows::MaxNan{});
        C s = C(0);
        src.each([&](int64_t, C v) { s += rows::exp_row<T>(v - m); });
        f = w / rows::group_reduce<G>(s, rows::Add{});
      } else {  // streamed: (m, s) tile by tile
        const rows::Lse<C> p = smx::row_lse<G>(x + r * classes, classes, lane, vec);
        m = p.m;
        f = w / p.s;
      }
      src.store(dx + r * classes, [&](int64_t i, C v) {
        const C o = rows::exp_row<T>(v - m) * f;
        return i == l ? o - w : o;  // (a bad label matches no i)
      });
    });
  }
};

}  // namespace

template <typename T>
void cross_entropy_backward(const TensorPtr& dy, const TensorPtr& logits, const TensorPtr& labels,
                            const TensorPtr& dlogits, const CrossEntropyBackwardAttrs& attrs) {
  constexpr const char* op = "cross_entropy_backward";
  layout::check_logits_labels(op, logits, labels);
  const int64_t rows = logits->shape()[0], classes = logits->shape()[1];
  layout::check_loss_grad(op, dy, rows);
  const Device dev = logits->device();
  if (labels->device() != dev) {
    fail<ValueError>(op, "labels are on ", labels->device().str(), " but logits on ", dev.str());
  }
  const rows::IndexCheck chk(op, dev);
  rows::launch_rows(op, dev, rows, classes,
                    GradRow<T>{dy->data<T>(), dy->numel() == 1, layout::reduction_scale(attrs.reduction, rows),
                               logits->data<T>(), labels->data<int64_t>(), dlogits->data<T>(), classes,
                               rows::vec_ok<T>(classes, {logits->raw_data(), dlogits->raw_data()}), chk.flag()});
  chk.raise_if_bad(labels->data<int64_t>(), std::to_string(classes) + " classes", "label");
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_CROSS_ENTROPY_BACKWARD_CUDA
