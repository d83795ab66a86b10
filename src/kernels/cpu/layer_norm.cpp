// Kernel of op `layer_norm` on cpu. Fast path: the normalized axes are the trailing dims and
// weight/bias are absent or have the normalized shape; then each row is normalized in one
// fused two-pass loop over the row in cache (norm_rows.inc), rows in parallel. Otherwise the
// general path: mean and variance by the runtime's reduction, the affine transform by
// broadcasting, all in float (or double) whatever the storage dtype.
#include "layer_norm.h"

#include "norm_common.h"

namespace opforge::kernels::cpu {

template <typename T>
void layer_norm(const TensorPtr& x, const TensorPtr& weight, const TensorPtr& bias, const TensorPtr& y,
                const TensorPtr& mean, const TensorPtr& rstd, const LayerNormAttrs& attrs) {
  using C = compute_t<T>;
  constexpr DType kC = dtype_of<C>::value;
  const Shape& xs = x->shape();
  norm::hint_huge_pages(y);
  norm::check_broadcasts_to("layer_norm", "weight", weight, x, "x");
  norm::check_broadcasts_to("layer_norm", "bias", bias, x, "x");
  const auto ax = normalize_axes("layer_norm", Axes(attrs.axis), x->dim());
  const int64_t k = norm::trailing_start(ax, x->dim());
  if (k >= 0 && norm::row_shaped(weight, xs, k) && norm::row_shaped(bias, xs, k)) {
    const int64_t R = norm::prod(xs, 0, static_cast<size_t>(k)), N = norm::prod(xs, static_cast<size_t>(k), xs.size());
    OPFORGE_NORM_DISPATCH(layer_norm_rows<T>, x->data<T>(), weight ? weight->data<T>() : nullptr,
                          bias ? bias->data<T>() : nullptr, y->data<T>(), mean->data<T>(), rstd->data<T>(), R, N,
                          attrs.eps);
    return;
  }

  const Axes axes(attrs.axis);
  const double n = mean->numel() ? static_cast<double>(x->numel()) / static_cast<double>(mean->numel()) : 0.0;
  const double inv_n = n > 0 ? 1.0 / n : std::nan("");
  auto mean_c = empty(kC, mean->shape());
  sum_into("layer_norm", x, axes, mean_c, inv_n);
  auto centered = empty(kC, xs);
  elementwise<C, T, C>(*centered, [](auto a, auto m) { return a - m; }, {x.get(), mean_c.get()});
  auto squares = empty(kC, xs);
  elementwise<C, C>(*squares, [](auto c) { return c * c; }, {centered.get()});
  auto rstd_c = empty(kC, mean->shape());
  sum_into("layer_norm", squares, axes, rstd_c, inv_n);
  const C eps = static_cast<C>(attrs.eps);
  elementwise<C, C>(*rstd_c, [eps](auto var) { return C(1) / std::sqrt(var + eps); }, {rstd_c.get()});

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
    elementwise<T, C, C>(*y, [](auto c, auto r) { return c * r; }, {centered.get(), rstd_c.get()});
  }
  copy_into(mean, mean_c);
  copy_into(rstd, rstd_c);
}

}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_LAYER_NORM_CPU
