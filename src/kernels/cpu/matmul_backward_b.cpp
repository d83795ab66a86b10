// Kernel of op `matmul_backward_b` on cpu: a^T @ grad (1-D operands promoted as in matmul),
// summed over the batch dims b was broadcast along, by batched BLAS GEMMs (linalg_common.h).
#include "matmul_backward_b.h"

#include "kernels/cpu/linalg_common.h"

namespace opforge::kernels::cpu {

template <typename T>
void matmul_backward_b(const TensorPtr& grad, const TensorPtr& a, const TensorPtr& b, const TensorPtr& out,
                       const MatmulBackwardBAttrs&) {
  constexpr const char* op = "matmul_backward_b";
  const auto l = linalg::matmul_layout(op, a->shape(), b->shape());
  if (grad->shape() != l.out_shape) {
    fail<ValueError>(op, "grad has shape ", shape_str(grad->shape()), ", matmul(a, b) has shape ",
                     shape_str(l.out_shape), ": a ", shape_str(a->shape()), ", b ", shape_str(b->shape()));
  }
  const linalg::GemmIn<T> pd(grad), pa(a);
  linalg::GemmOut<T> po(out);
  // (m x k)^T @ (m x n) per batch index, into b's (k x n) matrices
  linalg::batched_gemm<compute_t<T>>(op, l.batch, l.k, l.n, l.m, {pa.p, true, l.a_st}, {pd.p, false, l.out_st},
                                     po.p, l.b_st, out->numel());
  po.finish();
}

}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_MATMUL_BACKWARD_B_CPU
