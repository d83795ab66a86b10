// Kernel of op `linear_backward_weight` on cuda: grad^T @ x over all rows (batch dims flattened),
// one cuBLAS GEMM whose inner dimension is the row count (linalg_common.cuh).
#include "linear_backward_weight.h"

#include "kernels/cuda/linalg_common.cuh"

namespace opforge::kernels::cuda {

template <typename T>
void linear_backward_weight(const TensorPtr& grad, const TensorPtr& x, const TensorPtr& out,
                            const LinearBackwardWeightAttrs&) {
  constexpr const char* op = "linear_backward_weight";
  const int64_t n_out = out->shape()[0], n_in = out->shape()[1];
  const int64_t rows = shape_numel(Shape(x->shape().begin(), x->shape().end() - 1));
  if (n_out == 0 || n_in == 0) return;
  if (rows == 0) {  // an empty sum
    linalg::fill_zero(op, out);
    return;
  }
  const linalg::Blas blas(op, out->device());
  // (rows x out)^T @ (rows x in)
  linalg::gemm<T, T>(blas, true, false, n_out, n_in, rows, grad->data<T>(), 0, x->data<T>(), 0, false,
                     out->data<T>(), 0, 1);
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_LINEAR_BACKWARD_WEIGHT_CUDA
