// Kernel of op `min` on cpu: the shared arg-reduction of elem_common.h (values and first index).
#include "min.h"

#include "elem_common.h"

namespace opforge::kernels::cpu {

template <typename T>
void min(const TensorPtr& x, const TensorPtr& values, const TensorPtr& indices, const MinAttrs& attrs) {
  elem::arg_reduce<false, T>("min", x, values, indices, attrs.axis);
}

}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_MIN_CPU
