// Kernel of op `matmul_backward_a` on cpu: grad @ b^T (1-D operands promoted as in matmul),
// summed over the batch dims a was broadcast along, by batched BLAS GEMMs (linalg_common.h).
#include "matmul_backward_a.h"

#include "kernels/cpu/linalg_common.h"

namespace opforge::kernels::cpu {

template <typename T>
void matmul_backward_a(const TensorPtr& grad, const TensorPtr& b, const TensorPtr& a, const TensorPtr& out,
                       const MatmulBackwardAAttrs&) {
  constexpr const char* op = "matmul_backward_a";
  const auto l = linalg::matmul_layout(op, a->shape(), b->shape());
  if (grad->shape() != l.out_shape) {
    fail<ValueError>(op, "grad has shape ", shape_str(grad->shape()), ", matmul(a, b) has shape ",
                     shape_str(l.out_shape), ": a ", shape_str(a->shape()), ", b ", shape_str(b->shape()));
  }
  const linalg::GemmIn<T> pd(grad), pb(b);
  linalg::GemmOut<T> po(out);
  // (m x n) @ (k x n)^T per batch index, into a's (m x k) matrices
  linalg::batched_gemm<compute_t<T>>(op, l.batch, l.m, l.k, l.n, {pd.p, false, l.out_st}, {pb.p, true, l.b_st},
                                     po.p, l.a_st, out->numel());
  po.finish();
}

}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_MATMUL_BACKWARD_A_CPU
