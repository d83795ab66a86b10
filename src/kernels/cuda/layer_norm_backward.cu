// Kernel of op `layer_norm_backward` on cuda: dx of layer_norm. Fast path (trailing axes, weight
// absent or of the normalized shape): norm_rows.cuh's rows, one pass for sum(g) and
// sum(g * xhat), one pass writing dx. Otherwise the cpu's general path by broadcasting and the
// runtime's reduction, in float (or double).
#include "layer_norm_backward.h"

#include "norm_rows.cuh"

namespace opforge::kernels::cuda {

template <typename T>
void layer_norm_backward(const TensorPtr& dy, const TensorPtr& x, const TensorPtr& mean, const TensorPtr& rstd,
                         const TensorPtr& dmean, const TensorPtr& drstd, const TensorPtr& weight, const TensorPtr& dx,
                         const LayerNormBackwardAttrs& attrs) {
  using C = compute_t<T>;
  constexpr DType kC = dtype_of<C>::value;
  constexpr const char* op = "layer_norm_backward";
  using namespace norm;
  const Shape& xs = x->shape();
  const Device dev = x->device();
  const Axes axes(attrs.axis);
  const Shape kept = layout::check_norm_backward(op, dy, x, {{"mean", &mean}, {"rstd", &rstd}, {"dmean", &dmean},
                                                             {"drstd", &drstd}}, weight, axes);
  const auto ax = normalize_axes(op, axes, x->dim());
  const int64_t k = trailing_start(ax, x->dim());
  if (k >= 0 && row_shaped(weight, xs, k)) {
    const int64_t R = prod(xs, 0, static_cast<size_t>(k)), N = prod(xs, static_cast<size_t>(k), xs.size());
    if (N == 0) return;
    const T* w = weight ? weight->data<T>() : nullptr;
    launch_rows(op, dev, R, N,
                NormBackwardRow<T, false>{dy->data<T>(), x->data<T>(), w, mean->data<T>(), rstd->data<T>(),
                                          dmean->data<T>(), drstd->data<T>(), dx->data<T>(), N,
                                          vec_ok<T>(N, {dy->raw_data(), x->raw_data(), dx->raw_data(), w})});
    return;
  }

  CurrentOpScope scope(op);
  const double n = mean->numel() ? static_cast<double>(x->numel()) / static_cast<double>(mean->numel()) : 0.0;
  const double inv_n = n > 0 ? 1.0 / n : std::nan("");
  auto g = empty(kC, xs, Format::Default, dev);
  if (weight) ::opforge::cuda::elementwise<C, T, T>(*g, Mul{}, {dy.get(), weight.get()});
  else ::opforge::cuda::elementwise<C, T>(*g, Same{}, {dy.get()});
  auto xhat = empty(kC, xs, Format::Default, dev);
  ::opforge::cuda::elementwise<C, T, T, T>(*xhat, SubMul{}, {x.get(), mean.get(), rstd.get()});
  auto a = empty(kC, kept, Format::Default, dev);
  sum_into(op, g, axes, a, inv_n);
  auto gx = empty(kC, xs, Format::Default, dev);
  ::opforge::cuda::elementwise<C, C, C>(*gx, Mul{}, {g.get(), xhat.get()});
  auto b = empty(kC, kept, Format::Default, dev);
  sum_into(op, gx, axes, b, inv_n);
  ::opforge::cuda::elementwise<T, T, C, C, C, C, T, T>(*dx, LayerNormDx<C>{static_cast<C>(inv_n)},
                                      {rstd.get(), g.get(), a.get(), xhat.get(), b.get(), dmean.get(), drstd.get()});
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_LAYER_NORM_BACKWARD_CUDA
