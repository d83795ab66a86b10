// Kernel of op `log_softmax` on cuda: softmax_rows.cuh's rows (a contiguous axis) or lanes (a strided one).
#include "log_softmax.h"

#include "softmax_rows.cuh"

namespace opforge::kernels::cuda {

template <typename T>
void log_softmax(const TensorPtr& x, const TensorPtr& out, const LogSoftmaxAttrs& attrs) {
  smx::forward<T, smx::Kind::LogSoftmax>("log_softmax", x, out, attrs.axis);
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_LOG_SOFTMAX_CUDA
