// Kernel of op `bias_add_grad` on cuda: dy summed over every axis but the channel axis (NHWC, or
// rank 2: row_common.cuh's column sums; NCHW: the runtime's reduction).
#include "bias_add_grad.h"

#include "norm_rows.cuh"

namespace opforge::kernels::cuda {

template <typename T>
void bias_add_grad(const TensorPtr& dy, const TensorPtr& out, const BiasAddGradAttrs& attrs) {
  constexpr const char* op = "bias_add_grad";
  using namespace norm;
  check_tag(op, "dy", dy, attrs.format);
  const Shape& s = dy->shape();
  const int64_t c = channel_axis(op, "dy", s, attrs.format);
  Shape target(s.size() - static_cast<size_t>(c), 1);
  target[0] = s[static_cast<size_t>(c)];
  sum_to_shape<T, T>(op, dy, target, out);
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_BIAS_ADD_GRAD_CUDA
