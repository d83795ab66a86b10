// Kernel of op `min` on cuda: the arg-reduction of reduce_common.cuh (CUB), values and first index.
#include "min.h"

#include "reduce_common.cuh"

namespace opforge::kernels::cuda {

template <typename T>
void min(const TensorPtr& x, const TensorPtr& values, const TensorPtr& indices, const MinAttrs& attrs) {
  arg_reduce<false, T>("min", x, values, indices, attrs.axis);
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_MIN_CUDA
