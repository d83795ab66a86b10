// Kernel of op `softmax_backward` on cuda: softmax_rows.cuh's rows (a contiguous axis) or lanes (a strided one).
#include "softmax_backward.h"

#include "softmax_rows.cuh"

namespace opforge::kernels::cuda {

template <typename T>
void softmax_backward(const TensorPtr& dout, const TensorPtr& y, const TensorPtr& dx, const SoftmaxBackwardAttrs& attrs) {
  smx::backward<T, smx::Kind::Softmax>("softmax_backward", dout, y, dx, attrs.axis);
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_SOFTMAX_BACKWARD_CUDA
