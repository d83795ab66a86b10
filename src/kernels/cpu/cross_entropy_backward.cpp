// Kernel of op `cross_entropy_backward` on cpu: per row w = dy (or dy[i]) / (the rows kept for
// mean), then dlogits = w * softmax(logits) (the online softmax row of softmax_common.h),
// dlogits[label] -= (1 - e) w and, for a label_smoothing e > 0, every element -= e w / C. A row
// whose label is ignore_index is 0. Shapes and labels are checked before any row is read.
#include "cross_entropy_backward.h"

#include "softmax_common.h"

namespace opforge::kernels::cpu {

template <typename T>
void cross_entropy_backward(const TensorPtr& dy, const TensorPtr& logits, const TensorPtr& labels,
                            const TensorPtr& dlogits, const CrossEntropyBackwardAttrs& attrs) {
  using E = compute_t<T>;
  constexpr bool kConvert = !std::is_same_v<T, E>;
  constexpr const char* kOp = "cross_entropy_backward";
  smx::check_logits_labels(kOp, logits, labels);
  const int64_t rows = logits->shape()[0], classes = logits->shape()[1];
  smx::check_loss_grad(kOp, dy, rows);
  const smx::CheckedLabels owned = smx::checked_labels(kOp, labels, classes, attrs.ignore_index);
  const int64_t* lab = owned.values.data();
  const int64_t ignore = attrs.ignore_index;
  const double eps = attrs.label_smoothing;
  const double scale = smx::reduction_scale(attrs.reduction, owned.kept);
  const T* g = dy->data<T>();
  const bool one = dy->numel() == 1;
  const T* x = logits->data<T>();
  T* dx = dlogits->data<T>();
  const smx::Prims<E>& P = smx::prims<E>();
  smx::advise_huge_pages(dx, rows * classes * static_cast<int64_t>(sizeof(T)));
  const int64_t grab = smx::rows_per_grab(classes);
#pragma omp parallel if (smx::parallel_worth(rows * classes, rows))
  {
    std::vector<E> buf(kConvert ? 2 * classes : 0);
    std::vector<E> scratch(classes / smx::kChunk + 2);
#pragma omp for schedule(dynamic, grab)
    for (int64_t i = 0; i < rows; ++i) {
      if (lab[i] == ignore) {
        std::fill(dx + i * classes, dx + (i + 1) * classes, convert<T>(0.0));
        continue;
      }
      const double wd = convert<double>(g[one ? 0 : i]) * scale;
      const E w = static_cast<E>(wd);
      const E *row, *next;
      E* y;
      if constexpr (kConvert) {
        smx::load_row(x + i * classes, buf.data(), classes);
        row = next = buf.data();
        y = buf.data() + classes;
      } else {
        row = x + i * classes;
        next = x + (i + 1 < rows ? i + 1 : i) * classes;
        y = dx + i * classes;
      }
      smx::softmax_row(P, row, y, classes, scratch.data(), next, w);
      if (eps > 0) {
        const E u = static_cast<E>(wd * eps / static_cast<double>(classes));
        for (int64_t c = 0; c < classes; ++c) y[c] -= u;
        y[lab[i]] -= static_cast<E>(wd * (1 - eps));
      } else {
        y[lab[i]] -= w;
      }
      if constexpr (kConvert) smx::store_row(y, dx + i * classes, classes);
    }
  }
}

}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_CROSS_ENTROPY_BACKWARD_CPU
