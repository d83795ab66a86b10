// Kernel of op `norm_affine_grad` on cpu: layer_norm's weight gradient dy * (x - mean) * rstd and
// bias gradient dy, each summed down to its parameter's shape. Fast path (dy and x of one shape,
// rstd/mean one value per leading row, weight and bias both the trailing block): one parallel,
// vectorized column sum over dy and x accumulating both (norm_rows.inc). Otherwise
// norm_weight_grad's paths for the weight and sum_to_like's for the bias.
#include "norm_affine_grad.h"

#include "norm_common.h"

namespace opforge::kernels::cpu {

template <typename T>
void norm_affine_grad(const TensorPtr& dy, const TensorPtr& x, const TensorPtr& rstd, const TensorPtr& weight,
                      const TensorPtr& bias, const TensorPtr& mean, const TensorPtr& dweight, const TensorPtr& dbias,
                      const NormAffineGradAttrs& attrs) {
  (void)attrs;
  constexpr const char* op = "norm_affine_grad";
  const norm::WeightGradShape w = norm::weight_grad_shape(op, dy, x, rstd, weight, mean);
  norm::check_broadcasts_to(op, "bias", bias, dy->shape(), "dy");
  const T* m = mean ? mean->data<T>() : nullptr;
  if (w.rows && norm::row_shaped(bias, x->shape(), w.k)) {
    OPFORGE_NORM_DISPATCH(affine_grad_rows<T>, dy->data<T>(), x->data<T>(), rstd->data<T>(), m,
                          dweight->data<T>(), dbias->data<T>(), w.R, w.N);
    return;
  }
  if (w.rows) {
    OPFORGE_NORM_DISPATCH(weight_grad_rows<T>, dy->data<T>(), x->data<T>(), rstd->data<T>(), m, dweight->data<T>(),
                          w.R, w.N);
  } else {
    norm::weight_grad_by_broadcast<T>(op, dy, x, rstd, mean, w.full, dweight);
  }
  norm::sum_to_shape<T, T>(op, dy, bias->shape(), dbias);
}

}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_NORM_AFFINE_GRAD_CPU
