// Kernel of op `layer_norm` on cuda: norm_rows.cuh's fused rows when the normalized axes are the
// trailing dims and weight/bias are absent or of the normalized shape; otherwise the cpu's general
// path (mean and variance by the runtime's reduction, the affine transform by broadcasting), in
// float (or double) whatever the storage dtype.
#include "layer_norm.h"

#include "norm_rows.cuh"

namespace opforge::kernels::cuda {

template <typename T>
void layer_norm(const TensorPtr& x, const TensorPtr& weight, const TensorPtr& bias, const TensorPtr& y,
                const TensorPtr& mean, const TensorPtr& rstd, const LayerNormAttrs& attrs) {
  using C = compute_t<T>;
  constexpr DType kC = dtype_of<C>::value;
  constexpr const char* op = "layer_norm";
  using namespace norm;
  const Shape& xs = x->shape();
  const Device dev = x->device();
  check_broadcasts_to(op, "weight", weight, x, "x");
  check_broadcasts_to(op, "bias", bias, x, "x");
  const auto ax = normalize_axes(op, Axes(attrs.axis), x->dim());
  const int64_t k = trailing_start(ax, x->dim());
  if (k >= 0 && row_shaped(weight, xs, k) && row_shaped(bias, xs, k)) {
    const int64_t R = prod(xs, 0, static_cast<size_t>(k)), N = prod(xs, static_cast<size_t>(k), xs.size());
    const T* w = weight ? weight->data<T>() : nullptr;
    const T* b = bias ? bias->data<T>() : nullptr;
    launch_rows(op, dev, R, N,
                LayerNormRow<T>{x->data<T>(), w, b, y->data<T>(), mean->data<T>(), rstd->data<T>(), N,
                                static_cast<C>(attrs.eps), vec_ok<T>(N, {x->raw_data(), y->raw_data(), w, b})});
    return;
  }

  CurrentOpScope scope(op);
  const Axes axes(attrs.axis);
  const double n = mean->numel() ? static_cast<double>(x->numel()) / static_cast<double>(mean->numel()) : 0.0;
  const double inv_n = n > 0 ? 1.0 / n : std::nan("");
  auto mean_c = empty(kC, mean->shape(), Format::Default, dev);
  sum_into(op, x, axes, mean_c, inv_n);
  auto centered = empty(kC, xs, Format::Default, dev);
  ::opforge::cuda::elementwise<C, T, C>(*centered, Sub{}, {x.get(), mean_c.get()});
  auto squares = empty(kC, xs, Format::Default, dev);
  ::opforge::cuda::elementwise<C, C>(*squares, Square{}, {centered.get()});
  auto rstd_c = empty(kC, mean->shape(), Format::Default, dev);
  sum_into(op, squares, axes, rstd_c, inv_n);
  ::opforge::cuda::elementwise<C, C>(*rstd_c, RsqrtEps<C>{static_cast<C>(attrs.eps)}, {rstd_c.get()});
  if (weight && bias) {
    ::opforge::cuda::elementwise<T, C, C, T, T>(*y, MulAdd{}, {centered.get(), rstd_c.get(), weight.get(), bias.get()});
  } else if (weight) {
    ::opforge::cuda::elementwise<T, C, C, T>(*y, Mul{}, {centered.get(), rstd_c.get(), weight.get()});
  } else if (bias) {
    ::opforge::cuda::elementwise<T, C, C, T>(*y, MulAdd{}, {centered.get(), rstd_c.get(), bias.get()});
  } else {
    ::opforge::cuda::elementwise<T, C, C>(*y, Mul{}, {centered.get(), rstd_c.get()});
  }
  ::opforge::cuda::elementwise<T, C>(*mean, Same{}, {mean_c.get()});
  ::opforge::cuda::elementwise<T, C>(*rstd, Same{}, {rstd_c.get()});
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_LAYER_NORM_CUDA
