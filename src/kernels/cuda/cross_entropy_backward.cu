// Kernel of op `cross_entropy_backward` on cuda: per row w = dy (or dy[i]) / (for mean: the rows
// kept, counted on the device by row_common.cuh's kept_rows), then dlogits = w * softmax(logits)
// (softmax_rows.cuh's online row) - e w / C (e the label_smoothing) with (1 - e) w subtracted at
// the label; a row whose label is ignore_index is 0. Labels are checked on the device as in
// cross_entropy (a bad label subtracts nothing and the call raises IndexError naming the op).
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
  const unsigned long long* kept;  // mean: the rows kept (else null)
  const T* x;
  const int64_t* labels;
  T* dx;
  int64_t classes;
  int64_t ignore;
  double smoothing;
  bool vec;
  unsigned long long* bad;
  template <int G, rows::RowPath P = rows::RowPath::Any>
  __device__ __forceinline__ void row(int64_t r, int lane) const {
    using C = compute_t<T>;
    const int64_t l = labels[r];
    if (l == ignore) {  // (the whole group returns: every lane read the same label)
      for (int64_t i = lane; i < classes; i += G) dx[r * classes + i] = convert<T>(0.0);
      return;
    }
    const T* const in[1] = {x + r * classes};
    const double wd = convert<double>(dy[one ? 0 : r]) * (kept ? 1.0 / static_cast<double>(*kept) : 1.0);
    const C w = static_cast<C>(wd * (1 - smoothing));                          // at the label (w for e = 0)
    const C u = static_cast<C>(wd * smoothing / static_cast<double>(classes));  // everywhere (0 for e = 0)
    if (lane == 0) rows::index_ok(l, classes, r, bad);
    rows::with_row<G, T, 1, P>(in, classes, lane, vec, [&](auto& src) {
      C m, f;
      if constexpr (std::decay_t<decltype(src)>::kHeld) {  // held: the max, then independent exponentials
        m = rows::neg_inf<C>();
        src.each([&](int64_t, C v) { m = rows::max_nan(m, v); });
        m = rows::group_reduce<G>(m, rows::MaxNan{});
        C s = C(0);
        src.each([&](int64_t, C v) { s += rows::exp_row<T>(v - m); });
        f = static_cast<C>(wd) / rows::group_reduce<G>(s, rows::Add{});
      } else {  // streamed: (m, s) tile by tile
        const rows::Lse<C> p = smx::row_lse<G>(x + r * classes, classes, lane, vec);
        m = p.m;
        f = static_cast<C>(wd) / p.s;
      }
      src.store(dx + r * classes, [&](int64_t i, C v) {
        const C o = rows::exp_row<T>(v - m) * f - u;
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
  const TensorPtr kept = attrs.reduction == "mean"
                             ? rows::kept_rows(op, dev, labels->data<int64_t>(), rows, attrs.ignore_index)
                             : nullptr;
  rows::launch_rows(op, dev, rows, classes,
                    GradRow<T>{dy->data<T>(), dy->numel() == 1,
                               kept ? static_cast<const unsigned long long*>(kept->raw_data()) : nullptr,
                               logits->data<T>(), labels->data<int64_t>(), dlogits->data<T>(), classes,
                               attrs.ignore_index, attrs.label_smoothing,
                               rows::vec_ok<T>(classes, {logits->raw_data(), dlogits->raw_data()}), chk.flag()});
  chk.raise_if_bad(labels->data<int64_t>(), std::to_string(classes) + " classes", "label");
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_CROSS_ENTROPY_BACKWARD_CUDA
