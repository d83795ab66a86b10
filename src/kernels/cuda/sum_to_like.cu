// Kernel of op `sum_to_like` on cuda: x summed down to like's shape (norm_rows.cuh's sum_to_shape:
// column sums when the kept dims are x's trailing block, else the runtime's reduction).
#include "sum_to_like.h"

#include "norm_rows.cuh"

namespace opforge::kernels::cuda {

template <typename T>
void sum_to_like(const TensorPtr& x, const TensorPtr& like, const TensorPtr& out, const SumToLikeAttrs& attrs) {
  (void)attrs;
  norm::check_broadcasts_to("sum_to_like", "like", like, x->shape(), "x");
  norm::sum_to_shape<T, T>("sum_to_like", x, like->shape(), out);
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_SUM_TO_LIKE_CUDA
