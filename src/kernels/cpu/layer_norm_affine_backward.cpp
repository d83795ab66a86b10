// Kernel of op `layer_norm_affine_backward` on cpu: layer_norm's dx, dweight and dbias. Fast path
// (trailing axes, weight and bias of the normalized shape): one read of each row of dy and x for
// its dx and its terms of the column sums (norm_rows.inc), the same bits as layer_norm_backward and
// norm_affine_grad. Otherwise those two ops' kernels, one after the other.
#include "layer_norm_affine_backward.h"

#include "layer_norm_backward.h"
#include "norm_affine_grad.h"
#include "norm_common.h"

namespace opforge::kernels::cpu {

template <typename T>
void layer_norm_affine_backward(const TensorPtr& dy, const TensorPtr& x, const TensorPtr& mean, const TensorPtr& rstd,
                                const TensorPtr& dmean, const TensorPtr& drstd, const TensorPtr& weight,
                                const TensorPtr& bias, const TensorPtr& dx, const TensorPtr& dweight,
                                const TensorPtr& dbias, const LayerNormAffineBackwardAttrs& attrs) {
  constexpr const char* op = "layer_norm_affine_backward";
  const Shape& xs = x->shape();
  const Axes axes(attrs.axis);
  layout::check_norm_backward(op, dy, x, {{"mean", &mean}, {"rstd", &rstd}, {"dmean", &dmean}, {"drstd", &drstd}},
                              weight, axes);
  norm::check_broadcasts_to(op, "bias", bias, x, "x");
  if (const auto [rows, R, N] = layout::norm_rows(op, xs, axes, {&weight, &bias}); rows) {
    if (N == 0) return;
    norm::hint_huge_pages(dx);
    OPFORGE_NORM_DISPATCH(layer_norm_affine_backward_rows<T>, dy->data<T>(), x->data<T>(), weight->data<T>(),
                          mean->data<T>(), rstd->data<T>(), dmean->data<T>(), drstd->data<T>(), dx->data<T>(),
                          dweight->data<T>(), dbias->data<T>(), R, N);
    return;
  }
  layer_norm_backward<T>(dy, x, mean, rstd, dmean, drstd, weight, dx, LayerNormBackwardAttrs{attrs.axis});
  norm_affine_grad<T>(dy, x, rstd, weight, bias, mean, dweight, dbias, NormAffineGradAttrs{});
}

}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_LAYER_NORM_AFFINE_BACKWARD_CPU
