// Kernel of op `cross_entropy` on cpu: per row of logits (N, C) the online max / sum of exp
// (softmax_common.h), loss = (max - (1 - e) logits[label]) + log(sum) - e mean(row) (e the
// label_smoothing; its term only when e > 0), then the reduction in double: mean over the rows
// kept. A row whose label is ignore_index is not read (loss 0). Labels are checked before any row is read.
#include "cross_entropy.h"

#include "softmax_common.h"

namespace opforge::kernels::cpu {

template <typename T>
void cross_entropy(const TensorPtr& logits, const TensorPtr& labels, const TensorPtr& out,
                   const CrossEntropyAttrs& attrs) {
  using E = compute_t<T>;
  constexpr bool kConvert = !std::is_same_v<T, E>;
  smx::check_logits_labels("cross_entropy", logits, labels);
  const int64_t rows = logits->shape()[0], classes = logits->shape()[1];
  const smx::CheckedLabels owned = smx::checked_labels("cross_entropy", labels, classes, attrs.ignore_index);
  const int64_t* lab = owned.values.data();
  const int64_t ignore = attrs.ignore_index;
  const double eps = attrs.label_smoothing;
  const T* x = logits->data<T>();
  const smx::Prims<E>& P = smx::prims<E>();
  std::vector<double> loss(static_cast<size_t>(rows));
  const int64_t grab = smx::rows_per_grab(classes);
#pragma omp parallel if (smx::parallel_worth(rows * classes, rows))
  {
    std::vector<E> buf(kConvert ? classes : 0);
#pragma omp for schedule(dynamic, grab)
    for (int64_t i = 0; i < rows; ++i) {
      if (lab[i] == ignore) {
        loss[i] = 0;
        continue;
      }
      const E *row, *next;
      if constexpr (kConvert) {
        smx::load_row(x + i * classes, buf.data(), classes);
        row = next = buf.data();
      } else {
        row = x + i * classes;
        next = x + (i + 1 < rows ? i + 1 : i) * classes;
      }
      const auto [m, s] = smx::row_lse_parts(P, row, classes, next);
      const double picked = (1 - eps) * static_cast<double>(row[lab[i]]);  // (exact for e = 0)
      const double md = static_cast<double>(m);
      loss[i] = std::isinf(md) ? md - picked : (md - picked) + std::log(static_cast<double>(s));
      if (eps > 0) {
        double total = 0;
        for (int64_t c = 0; c < classes; ++c) total += static_cast<double>(row[c]);
        loss[i] -= eps * (total / static_cast<double>(classes));
      }
    }
  }
  T* o = out->data<T>();
  if (attrs.reduction == "none") {
    for (int64_t i = 0; i < rows; ++i) o[i] = convert<T>(loss[i]);
    return;
  }
  double total = 0;
  for (int64_t i = 0; i < rows; ++i) total += loss[i];
  if (attrs.reduction == "mean") total /= static_cast<double>(owned.kept);  // none kept: NaN, as torch
  o[0] = convert<T>(total);
}

}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_CROSS_ENTROPY_CPU
