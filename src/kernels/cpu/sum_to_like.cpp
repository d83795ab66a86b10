// Kernel of op `sum_to_like` on cpu: x summed down to like's shape. Kept dims forming one block
// (the usual case: like is a trailing block of x, or one axis) run the parallel, vectorized
// (A, B, C) reduction of norm_rows.inc; others the runtime's sum_into.
#include "sum_to_like.h"

#include "norm_common.h"

namespace opforge::kernels::cpu {

template <typename T>
void sum_to_like(const TensorPtr& x, const TensorPtr& like, const TensorPtr& out, const SumToLikeAttrs& attrs) {
  (void)attrs;
  norm::check_broadcasts_to("sum_to_like", "like", like, x->shape(), "x");
  norm::sum_to_shape<T, T>("sum_to_like", x, like->shape(), out);
}

}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_SUM_TO_LIKE_CPU
