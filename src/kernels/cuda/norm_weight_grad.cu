// Kernel of op `norm_weight_grad` on cuda: dy * (x - mean) * rstd summed down to weight's shape.
// Fast path (dy and x of one shape, rstd/mean one value per leading row, weight the trailing
// block): row_common.cuh's column sums with the product fused in (deterministic). Otherwise the
// product by broadcasting, then the sum down to weight's shape.
#include "norm_weight_grad.h"

#include "norm_rows.cuh"

namespace opforge::kernels::cuda {

template <typename T>
void norm_weight_grad(const TensorPtr& dy, const TensorPtr& x, const TensorPtr& rstd, const TensorPtr& weight,
                      const TensorPtr& mean, const TensorPtr& out, const NormWeightGradAttrs& attrs) {
  (void)attrs;
  constexpr const char* op = "norm_weight_grad";
  using namespace norm;
  const WeightGradShape w = weight_grad_shape(op, dy, x, rstd, weight, mean);
  if (w.rows) {
    col_sums<T, compute_t<T>>(op, x->device(), w.R, w.N,
                              WeightGradTerm<T>{dy->data<T>(), x->data<T>(), rstd->data<T>(),
                                                mean ? mean->data<T>() : nullptr, w.N},
                              out->data<T>());
    return;
  }
  weight_grad_by_broadcast<T>(op, dy, x, rstd, mean, w.full, out);
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_NORM_WEIGHT_GRAD_CUDA
