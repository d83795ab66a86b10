// Kernel of op `matmul_backward_b` on cuda: a^T @ grad (1-D operands promoted as in matmul),
// summed over the batch dims b was broadcast along, by cuBLAS GEMMs (linalg_common.cuh); a sum over
// trailing batch dims is one GEMM whose inner dimension spans them.
#include "matmul_backward_b.h"

#include "kernels/cuda/linalg_common.cuh"

namespace opforge::kernels::cuda {

template <typename T>
void matmul_backward_b(const TensorPtr& grad, const TensorPtr& a, const TensorPtr& b, const TensorPtr& out,
                       const MatmulBackwardBAttrs&) {
  constexpr const char* op = "matmul_backward_b";
  const auto l = linalg::matmul_layout(op, a->shape(), b->shape());
  if (grad->shape() != l.out_shape) {
    fail<ValueError>(op, "grad has shape ", shape_str(grad->shape()), ", matmul(a, b) has shape ",
                     shape_str(l.out_shape), ": a ", shape_str(a->shape()), ", b ", shape_str(b->shape()));
  }
  // (m x k)^T @ (m x n) per batch index, into b's (k x n) matrices
  linalg::batched_gemm<T>(op, l.batch, l.k, l.n, l.m, {a->data<T>(), true, l.a_st}, {grad->data<T>(), false, l.out_st},
                          out, l.b_st);
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_MATMUL_BACKWARD_B_CUDA
