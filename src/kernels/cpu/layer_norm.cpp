// Kernel of op `layer_norm` on cpu: mean and variance over the normalized axes, then the
// affine transform, computed in float (or double) whatever the storage dtype.
#include "layer_norm.h"

namespace opforge::kernels::cpu {

template <typename T>
void layer_norm(const TensorPtr& x, const TensorPtr& weight, const TensorPtr& bias, const TensorPtr& y,
                const TensorPtr& mean, const TensorPtr& rstd, const LayerNormAttrs& attrs) {
  using C = compute_t<T>;
  constexpr DType kC = dtype_of<C>::value;
  for (const auto& [name, p] : {std::pair<const char*, const TensorPtr*>{"weight", &weight}, {"bias", &bias}}) {
    if (*p && broadcast_shapes("layer_norm", {x.get(), p->get()}, {"x", name}) != x->shape()) {
      fail<ValueError>("layer_norm", name, " of shape ", shape_str((*p)->shape()),
                       " does not broadcast to x of shape ", shape_str(x->shape()));
    }
  }
  const Axes axes(attrs.axis);
  const double n = mean->numel() ? static_cast<double>(x->numel()) / static_cast<double>(mean->numel()) : 0.0;
  const double inv_n = n > 0 ? 1.0 / n : std::nan("");

  auto mean_c = empty(kC, mean->shape());
  sum_into("layer_norm", x, axes, mean_c, inv_n);
  auto centered = empty(kC, x->shape());
  elementwise<C, T, C>(*centered, [](auto a, auto m) { return a - m; }, {x.get(), mean_c.get()});
  auto squares = empty(kC, x->shape());
  elementwise<C, C>(*squares, [](auto c) { return c * c; }, {centered.get()});
  auto rstd_c = empty(kC, mean->shape());
  sum_into("layer_norm", squares, axes, rstd_c, inv_n);
  const C eps = static_cast<C>(attrs.eps);
  elementwise<C, C>(*rstd_c, [eps](auto var) { return C(1) / std::sqrt(var + eps); }, {rstd_c.get()});

  const auto norm = [](auto c, auto r) { return c * r; };
  if (weight && bias) {
    elementwise<T, C, C, T, T>(*y, [](auto c, auto r, auto w, auto b) { return c * r * w + b; },
                               {centered.get(), rstd_c.get(), weight.get(), bias.get()});
  } else if (weight) {
    elementwise<T, C, C, T>(*y, [](auto c, auto r, auto w) { return c * r * w; },
                            {centered.get(), rstd_c.get(), weight.get()});
  } else if (bias) {
    elementwise<T, C, C, T>(*y, [](auto c, auto r, auto b) { return c * r + b; },
                            {centered.get(), rstd_c.get(), bias.get()});
  } else {
    elementwise<T, C, C>(*y, norm, {centered.get(), rstd_c.get()});
  }
  copy_into(mean, mean_c);
  copy_into(rstd, rstd_c);
}

}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_LAYER_NORM_CPU
