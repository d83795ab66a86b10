// Kernel of op `linear_backward_weight` on cpu: grad^T @ x over all rows (batch dims flattened),
// one BLAS GEMM whose inner dimension is the row count.
#include "linear_backward_weight.h"

#include "kernels/cpu/linalg_common.h"

namespace opforge::kernels::cpu {

template <typename T>
void linear_backward_weight(const TensorPtr& grad, const TensorPtr& x, const TensorPtr& out,
                            const LinearBackwardWeightAttrs&) {
  const int64_t n_out = out->shape()[0], n_in = out->shape()[1];
  const int64_t rows = shape_numel(Shape(x->shape().begin(), x->shape().end() - 1));
  const linalg::GemmIn<T> pd(grad), px(x);
  linalg::GemmOut<T> po(out);
  // (rows x out)^T @ (rows x in)
  linalg::batched_gemm<compute_t<T>>("linear_backward_weight", {}, n_out, n_in, rows, {pd.p, true, {}},
                                     {px.p, false, {}}, po.p, {}, out->numel());
  po.finish();
}

}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_LINEAR_BACKWARD_WEIGHT_CPU
