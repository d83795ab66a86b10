// Kernel of op `sum` on cpu: the runtime's sum-over-axes loop.
#include "sum.h"

namespace opforge::kernels::cpu {

template <typename T>
void sum(const TensorPtr& x, const TensorPtr& out, const SumAttrs& attrs) {
  sum_into("sum", x, attrs.axis, out);
}

}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_SUM_CPU
