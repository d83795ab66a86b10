// Kernel of op `cross_entropy_grad_scale` on cpu: row i of out (N, C) is dy (or dy[i]), divided
// by N for reduction mean.
#include "cross_entropy_grad_scale.h"

#include "softmax_common.h"

namespace opforge::kernels::cpu {

template <typename T>
void cross_entropy_grad_scale(const TensorPtr& dy, const TensorPtr& logits, const TensorPtr& out,
                              const CrossEntropyGradScaleAttrs& attrs) {
  constexpr const char* kOp = "cross_entropy_grad_scale";
  if (logits->dim() != 2) fail<ValueError>(kOp, "logits must have shape (N, C), got ", shape_str(logits->shape()));
  const int64_t rows = logits->shape()[0], classes = logits->shape()[1];
  smx::check_loss_grad(kOp, dy, rows);
  const double scale = smx::reduction_scale(attrs.reduction, rows);
  const T* g = dy->data<T>();
  const bool one = dy->numel() == 1;
  T* o = out->data<T>();
  smx::advise_huge_pages(o, rows * classes * static_cast<int64_t>(sizeof(T)));
  const int64_t grab = smx::rows_per_grab(classes);
#pragma omp parallel for if (smx::parallel_worth(rows * classes, rows)) schedule(dynamic, grab)
  for (int64_t i = 0; i < rows; ++i) {
    const T w = convert<T>(convert<double>(g[one ? 0 : i]) * scale);
    std::fill(o + i * classes, o + (i + 1) * classes, w);
  }
}

}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_CROSS_ENTROPY_GRAD_SCALE_CPU
