// Kernel of op `norm_weight_grad` on cpu: dy * (x - mean) * rstd summed down to weight's shape.
// Fast path (dy and x of one shape, rstd/mean one value per leading row, weight the trailing
// block): a parallel, vectorized column sum with the product fused in (norm_rows.inc).
// Otherwise the product by broadcasting, then the sum down to weight's shape.
#include "norm_weight_grad.h"

#include "norm_common.h"

namespace opforge::kernels::cpu {

template <typename T>
void norm_weight_grad(const TensorPtr& dy, const TensorPtr& x, const TensorPtr& rstd, const TensorPtr& weight,
                      const TensorPtr& mean, const TensorPtr& out, const NormWeightGradAttrs& attrs) {
  (void)attrs;
  constexpr const char* op = "norm_weight_grad";
  const norm::WeightGradShape w = norm::weight_grad_shape(op, dy, x, rstd, weight, mean);
  if (w.rows) {
    OPFORGE_NORM_DISPATCH(weight_grad_rows<T>, dy->data<T>(), x->data<T>(), rstd->data<T>(),
                          mean ? mean->data<T>() : nullptr, out->data<T>(), w.R, w.N);
    return;
  }
  norm::weight_grad_by_broadcast<T>(op, dy, x, rstd, mean, w.full, out);
}

}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_NORM_WEIGHT_GRAD_CPU
