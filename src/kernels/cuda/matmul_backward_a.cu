// Kernel of op `matmul_backward_a` on cuda: grad @ b^T (1-D operands promoted as in matmul),
// summed over the batch dims a was broadcast along, by cuBLAS GEMMs (linalg_common.cuh).
#include "matmul_backward_a.h"

#include "kernels/cuda/linalg_common.cuh"

namespace opforge::kernels::cuda {

template <typename T>
void matmul_backward_a(const TensorPtr& grad, const TensorPtr& b, const TensorPtr& a, const TensorPtr& out,
                       const MatmulBackwardAAttrs&) {
  constexpr const char* op = "matmul_backward_a";
  const auto l = linalg::matmul_layout(op, a->shape(), b->shape());
  if (grad->shape() != l.out_shape) {
    fail<ValueError>(op, "grad has shape ", shape_str(grad->shape()), ", matmul(a, b) has shape ",
                     shape_str(l.out_shape), ": a ", shape_str(a->shape()), ", b ", shape_str(b->shape()));
  }
  // (m x n) @ (k x n)^T per batch index, into a's (m x k) matrices
  linalg::batched_gemm<T>(op, l.batch, l.m, l.k, l.n, {grad->data<T>(), false, l.out_st}, {b->data<T>(), true, l.b_st},
                          out, l.a_st);
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_MATMUL_BACKWARD_A_CUDA
