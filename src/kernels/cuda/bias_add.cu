// Kernel of op `bias_add` on cuda: bias (C,) read as a (C, 1, ..., 1) view broadcast along x's
// channel axis (NCHW: axis 1, NHWC: the last), added by the device's elementwise loop.
#include "bias_add.h"

#include "norm_rows.cuh"

namespace opforge::kernels::cuda {

namespace {

struct AddBias {  // (integers wrap around, as NumPy's: fn::add)
  template <typename C>
  __device__ __forceinline__ C operator()(C x, C b) const { return fn::add(x, b); }
};

}  // namespace

template <typename T>
void bias_add(const TensorPtr& x, const TensorPtr& bias, const TensorPtr& out, const BiasAddAttrs& attrs) {
  constexpr const char* op = "bias_add";
  using namespace norm;
  const Shape& xs = x->shape();
  const int64_t ca = channel_axis(op, "x", xs, attrs.format);
  check_tag(op, "x", x, attrs.format);
  check_tag(op, "bias", bias, attrs.format);
  const size_t c = static_cast<size_t>(ca);
  if (bias->shape() != Shape{xs[c]}) {
    fail<ValueError>(op, "bias of shape ", shape_str(bias->shape()), " must have shape ", shape_str(Shape{xs[c]}),
                     ": one value per channel of x (shape ", shape_str(xs), ", format ", attrs.format,
                     ", channel axis ", ca, ")");
  }
  Shape shape(xs.size() - c, 1);
  shape[0] = xs[c];
  const auto view = std::make_shared<Tensor>(bias->storage(), bias->dtype(), shape, contiguous_strides(shape),
                                             bias->offset(), Format::Default);
  CurrentOpScope scope(op);
  ::opforge::cuda::elementwise<T, T, T>(*out, AddBias{}, {x.get(), view.get()});
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_BIAS_ADD_CUDA
