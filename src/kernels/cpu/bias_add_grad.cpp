// Kernel of op `bias_add_grad` on cpu: dy summed over every axis but the channel axis, as the
// parallel, vectorized (A, C, K) reduction of norm_rows.inc.
#include "bias_add_grad.h"

#include "norm_common.h"

namespace opforge::kernels::cpu {

template <typename T>
void bias_add_grad(const TensorPtr& dy, const TensorPtr& out, const BiasAddGradAttrs& attrs) {
  const Shape& s = dy->shape();
  if (dy->format() != Format::Default && attrs.format != format_name(dy->format())) {
    fail<ValueError>("bias_add_grad", "dy is tagged ", format_name(dy->format()), " but format is ", attrs.format,
                     "; pass format=\"", format_name(dy->format()), "\"");
  }
  const size_t c = attrs.format == "NHWC" ? s.size() - 1 : 1;
  OPFORGE_NORM_DISPATCH(reduce_abc<T>, dy->data<T>(), norm::prod(s, 0, c), s[c], norm::prod(s, c + 1, s.size()),
                        out->data<T>());
}

}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_BIAS_ADD_GRAD_CPU
