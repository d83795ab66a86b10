// Kernel of op `max` on cpu: the shared arg-reduction of elem_common.h (values and first index).
#include "max.h"

#include "elem_common.h"

namespace opforge::kernels::cpu {

template <typename T>
void max(const TensorPtr& x, const TensorPtr& values, const TensorPtr& indices, const MaxAttrs& attrs) {
  elem::arg_reduce<true, T>("max", x, values, indices, attrs.axis);
}

}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_MAX_CPU
