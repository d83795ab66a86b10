// Kernel of op `layer_norm_affine_backward` on cuda: layer_norm's dx, dweight and dbias. Fast path
// (trailing axes, weight and bias of the normalized shape, rows held in registers): norm_rows.cuh's
// fused rows, each row of dy and x read once for its dx (layer_norm_backward's arithmetic) and its
// terms of dweight and dbias (per-thread column accumulators in shared memory, the blocks' sums
// added in order). Longer rows and other shapes run layer_norm_backward and norm_affine_grad.
#include "layer_norm_affine_backward.h"

#include "layer_norm_backward.h"
#include "norm_affine_grad.h"
#include "norm_rows.cuh"

namespace opforge::kernels::cuda {

template <typename T>
void layer_norm_affine_backward(const TensorPtr& dy, const TensorPtr& x, const TensorPtr& mean, const TensorPtr& rstd,
                                const TensorPtr& dmean, const TensorPtr& drstd, const TensorPtr& weight,
                                const TensorPtr& bias, const TensorPtr& dx, const TensorPtr& dweight,
                                const TensorPtr& dbias, const LayerNormAffineBackwardAttrs& attrs) {
  constexpr const char* op = "layer_norm_affine_backward";
  using namespace norm;
  const Shape& xs = x->shape();
  const Axes axes(attrs.axis);
  check_norm_backward(op, dy, x, {{"mean", &mean}, {"rstd", &rstd}, {"dmean", &dmean}, {"drstd", &drstd}}, weight,
                      axes);
  check_broadcasts_to(op, "bias", bias, x, "x");
  if (const auto [rows, R, N] = norm_rows(op, xs, axes, {&weight, &bias}); rows) {
    if (N == 0) return;
    const AffineBackwardRow<T, false> row{
        dy->data<T>(), x->data<T>(), weight->data<T>(), mean->data<T>(), rstd->data<T>(), dmean->data<T>(),
        drstd->data<T>(), dx->data<T>(), N,
        vec_ok<T>(N, {dy->raw_data(), x->raw_data(), dx->raw_data(), weight->raw_data()})};
    if (affine_backward(op, x->device(), R, N, row, dweight->data<T>(), dbias->data<T>())) return;
  }
  layer_norm_backward<T>(dy, x, mean, rstd, dmean, drstd, weight, dx, LayerNormBackwardAttrs{attrs.axis});
  norm_affine_grad<T>(dy, x, rstd, weight, bias, mean, dweight, dbias, NormAffineGradAttrs{});
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_LAYER_NORM_AFFINE_BACKWARD_CUDA
