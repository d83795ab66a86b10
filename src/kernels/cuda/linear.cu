// Kernel of op `linear` on cuda: y = x @ weight^T + bias as one GEMM over all rows of x (its batch
// dims flattened); with a bias, cuBLASLt adds it in the GEMM's epilogue (linalg_common.cuh).
#include "linear.h"

#include "kernels/cuda/linalg_common.cuh"

namespace opforge::kernels::cuda {

template <typename T>
void linear(const TensorPtr& x, const TensorPtr& weight, const TensorPtr& bias, const TensorPtr& out,
            const LinearAttrs&) {
  constexpr const char* op = "linear";
  const int64_t n_out = weight->shape()[0], n_in = weight->shape()[1];
  const int64_t rows = shape_numel(Shape(x->shape().begin(), x->shape().end() - 1));
  if (rows == 0 || n_out == 0) return;
  if (n_in == 0) {  // an empty product: the bias alone
    if (bias) copy_into(out, bias);  // (broadcast over the rows on the device)
    else linalg::fill_zero(op, out);
    return;
  }
  const linalg::Blas blas(op, out->device());
  if (bias && linalg::linear_bias_lt<T>(blas, rows, n_out, n_in, x->data<T>(), weight->data<T>(), bias->data<T>(),
                                        out->data<T>())) {
    return;
  }
  if (bias) copy_into(out, bias);  // no cuBLASLt algorithm: the bias first, then y += x @ weight^T
  // (rows x in) @ (out x in)^T
  linalg::gemm<T, T>(blas, false, true, rows, n_out, n_in, x->data<T>(), 0, weight->data<T>(), 0, bias != nullptr,
                     out->data<T>(), 0, 1);
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_LINEAR_CUDA
