// Kernel of op `softmax` on cuda: softmax_rows.cuh's rows (a contiguous axis) or lanes (a strided one).
#include "softmax.h"

#include "softmax_rows.cuh"

namespace opforge::kernels::cuda {

template <typename T>
void softmax(const TensorPtr& x, const TensorPtr& out, const SoftmaxAttrs& attrs) {
  smx::forward<T, smx::Kind::Softmax>("softmax", x, out, attrs.axis);
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_SOFTMAX_CUDA
