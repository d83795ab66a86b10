// Kernel of op `bias_add` on cpu: bias (C,) added along the channel axis named by the format
// attr (NCHW: axis 1, NHWC: the last), one contiguous loop per channel run (norm_rows.inc).
#include "bias_add.h"

#include "norm_common.h"

namespace opforge::kernels::cpu {

template <typename T>
void bias_add(const TensorPtr& x, const TensorPtr& bias, const TensorPtr& out, const BiasAddAttrs& attrs) {
  constexpr const char* op = "bias_add";
  const Shape& xs = x->shape();
  norm::hint_huge_pages(out);
  const int64_t ca = norm::channel_axis(op, "x", xs, attrs.format);
  norm::check_tag(op, "x", x, attrs.format);
  norm::check_tag(op, "bias", bias, attrs.format);
  const size_t c = static_cast<size_t>(ca);
  if (bias->shape() != Shape{xs[c]}) {
    fail<ValueError>(op, "bias of shape ", shape_str(bias->shape()), " must have shape ", shape_str(Shape{xs[c]}),
                     ": one value per channel of x (shape ", shape_str(xs), ", format ", attrs.format,
                     ", channel axis ", ca, ")");
  }
  OPFORGE_NORM_DISPATCH(bias_add_rows<T>, x->data<T>(), bias->data<T>(), out->data<T>(), norm::prod(xs, 0, c), xs[c],
                        norm::prod(xs, c + 1, xs.size()));
}

}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_BIAS_ADD_CPU
