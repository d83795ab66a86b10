// Kernel of op `sum` on cuda: the runtime's sum over axes, which reduces rows on the device through
// CUB (runtime/cuda/reduce.cuh).
#include "sum.h"

namespace opforge::kernels::cuda {

template <typename T>
void sum(const TensorPtr& x, const TensorPtr& out, const SumAttrs& attrs) {
  sum_into("sum", x, attrs.axis, out);
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_SUM_CUDA
