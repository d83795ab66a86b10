// Kernel of op `mean` on cuda: the runtime's sum over axes on the device (CUB), scaled by 1 / count.
#include "mean.h"

#include <cmath>

namespace opforge::kernels::cuda {

template <typename T>
void mean(const TensorPtr& x, const TensorPtr& out, const MeanAttrs& attrs) {
  const double count = out->numel() ? static_cast<double>(x->numel()) / static_cast<double>(out->numel()) : 0.0;
  // an empty reduction gives NaN, as in NumPy
  sum_into("mean", x, attrs.axis, out, count > 0 ? 1.0 / count : std::nan(""));
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_MEAN_CUDA
