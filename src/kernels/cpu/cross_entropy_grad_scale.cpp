// Kernel of op `cross_entropy_grad_scale` on cpu: row i of out (N, C) is dy (or dy[i]), divided
// for reduction mean by the rows kept; 0 where labels[i] is ignore_index (only that is read of
// the labels: an out-of-range label is cross_entropy_backward's to refuse).
#include "cross_entropy_grad_scale.h"

#include "softmax_common.h"

namespace opforge::kernels::cpu {

template <typename T>
void cross_entropy_grad_scale(const TensorPtr& dy, const TensorPtr& logits, const TensorPtr& labels,
                              const TensorPtr& out, const CrossEntropyGradScaleAttrs& attrs) {
  constexpr const char* kOp = "cross_entropy_grad_scale";
  if (logits->dim() != 2) fail<ValueError>(kOp, "logits must have shape (N, C), got ", shape_str(logits->shape()));
  const int64_t rows = logits->shape()[0], classes = logits->shape()[1];
  smx::check_loss_grad(kOp, dy, rows);
  if (labels->dim() != 1 || labels->shape()[0] != rows) {
    fail<ValueError>(kOp, "labels must have shape (N,) = (", rows, ",) to match logits ",
                     shape_str(logits->shape()), ", got ", shape_str(labels->shape()));
  }
  // whether each row is kept, read once (another thread may write the labels meanwhile)
  const int64_t* src = labels->data<int64_t>();
  std::vector<char> kept(static_cast<size_t>(rows));
  int64_t n_kept = 0;
  for (int64_t i = 0; i < rows; ++i) n_kept += kept[i] = src[i] != attrs.ignore_index;
  const double scale = smx::reduction_scale(attrs.reduction, n_kept);
  const T* g = dy->data<T>();
  const bool one = dy->numel() == 1;
  T* o = out->data<T>();
  smx::advise_huge_pages(o, rows * classes * static_cast<int64_t>(sizeof(T)));
  const int64_t grab = smx::rows_per_grab(classes);
#pragma omp parallel for if (smx::parallel_worth(rows * classes, rows)) schedule(dynamic, grab)
  for (int64_t i = 0; i < rows; ++i) {
    const T w = kept[i] ? convert<T>(convert<double>(g[one ? 0 : i]) * scale) : convert<T>(0.0);
    std::fill(o + i * classes, o + (i + 1) * classes, w);
  }
}

}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_CROSS_ENTROPY_GRAD_SCALE_CPU
