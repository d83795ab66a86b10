// Kernel of op `rms_norm_affine_backward` on cuda: rms_norm's dx and dweight. Fast path (trailing
// axes, weight of the normalized shape, rows held in registers): norm_rows.cuh's fused rows, each
// row of dy and x read once for its dx (rms_norm_backward's arithmetic) and its terms of dweight
// (per-thread column accumulators in shared memory, the blocks' sums added in order). Longer rows
// and other shapes run rms_norm_backward and norm_weight_grad.
#include "rms_norm_affine_backward.h"

#include "norm_rows.cuh"
#include "norm_weight_grad.h"
#include "rms_norm_backward.h"

namespace opforge::kernels::cuda {

template <typename T>
void rms_norm_affine_backward(const TensorPtr& dy, const TensorPtr& x, const TensorPtr& rstd, const TensorPtr& drstd,
                              const TensorPtr& weight, const TensorPtr& dx, const TensorPtr& dweight,
                              const RmsNormAffineBackwardAttrs& attrs) {
  constexpr const char* op = "rms_norm_affine_backward";
  using namespace norm;
  const Shape& xs = x->shape();
  const Axes axes(attrs.axis);
  check_norm_backward(op, dy, x, {{"rstd", &rstd}, {"drstd", &drstd}}, weight, axes);
  if (const auto [rows, R, N] = norm_rows(op, xs, axes, {&weight}); rows) {
    if (N == 0) return;
    const AffineBackwardRow<T, true> row{
        dy->data<T>(), x->data<T>(), weight->data<T>(), nullptr, rstd->data<T>(), nullptr, drstd->data<T>(),
        dx->data<T>(), N, vec_ok<T>(N, {dy->raw_data(), x->raw_data(), dx->raw_data(), weight->raw_data()})};
    if (affine_backward(op, x->device(), R, N, row, dweight->data<T>(), static_cast<T*>(nullptr))) return;
  }
  rms_norm_backward<T>(dy, x, rstd, drstd, weight, dx, RmsNormBackwardAttrs{attrs.axis});
  norm_weight_grad<T>(dy, x, rstd, weight, nullptr, dweight, NormWeightGradAttrs{});
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_RMS_NORM_AFFINE_BACKWARD_CUDA
