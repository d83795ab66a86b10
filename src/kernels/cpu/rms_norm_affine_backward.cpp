// Kernel of op `rms_norm_affine_backward` on cpu: rms_norm's dx and dweight. Fast path (trailing
// axes, weight of the normalized shape): one read of each row of dy and x for its dx and its terms
// of the weight's column sums (norm_rows.inc), the same bits as rms_norm_backward and
// norm_weight_grad. Otherwise those two ops' kernels, one after the other.
#include "rms_norm_affine_backward.h"

#include "norm_common.h"
#include "norm_weight_grad.h"
#include "rms_norm_backward.h"

namespace opforge::kernels::cpu {

template <typename T>
void rms_norm_affine_backward(const TensorPtr& dy, const TensorPtr& x, const TensorPtr& rstd, const TensorPtr& drstd,
                              const TensorPtr& weight, const TensorPtr& dx, const TensorPtr& dweight,
                              const RmsNormAffineBackwardAttrs& attrs) {
  constexpr const char* op = "rms_norm_affine_backward";
  const Shape& xs = x->shape();
  const Axes axes(attrs.axis);
  layout::check_norm_backward(op, dy, x, {{"rstd", &rstd}, {"drstd", &drstd}}, weight, axes);
  if (const auto [rows, R, N] = layout::norm_rows(op, xs, axes, {&weight}); rows) {
    if (N == 0) return;
    norm::hint_huge_pages(dx);
    OPFORGE_NORM_DISPATCH(rms_norm_affine_backward_rows<T>, dy->data<T>(), x->data<T>(), weight->data<T>(),
                          rstd->data<T>(), drstd->data<T>(), dx->data<T>(), dweight->data<T>(), R, N);
    return;
  }
  rms_norm_backward<T>(dy, x, rstd, drstd, weight, dx, RmsNormBackwardAttrs{attrs.axis});
  norm_weight_grad<T>(dy, x, rstd, weight, nullptr, dweight, NormWeightGradAttrs{});
}

}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_RMS_NORM_AFFINE_BACKWARD_CPU
