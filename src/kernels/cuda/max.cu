// Kernel of op `max` on cuda: the arg-reduction of reduce_common.cuh (CUB), values and first index.
#include "max.h"

#include "reduce_common.cuh"

namespace opforge::kernels::cuda {

template <typename T>
void max(const TensorPtr& x, const TensorPtr& values, const TensorPtr& indices, const MaxAttrs& attrs) {
  arg_reduce<true, T>("max", x, values, indices, attrs.axis);
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_MAX_CUDA
