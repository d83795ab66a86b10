// Kernel of op `log_softmax_backward` on cuda: softmax_rows.cuh's rows (a contiguous axis) or lanes (a strided one).
#include "log_softmax_backward.h"

#include "softmax_rows.cuh"

namespace opforge::kernels::cuda {

template <typename T>
void log_softmax_backward(const TensorPtr& dout, const TensorPtr& y, const TensorPtr& dx, const LogSoftmaxBackwardAttrs& attrs) {
  smx::backward<T, smx::Kind::LogSoftmax>("log_softmax_backward", dout, y, dx, attrs.axis);
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_LOG_SOFTMAX_BACKWARD_CUDA
