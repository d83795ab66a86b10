// Kernel of op `rms_norm` on cpu. Fast path: the normalized axes are the trailing dims and
// weight is absent or has the normalized shape; then each row is one fused loop pair over the
// row in cache (norm_rows.inc), rows in parallel. Otherwise the general path: the mean square
// by the runtime's reduction, the scaling by broadcasting, in float (or double).
#include "rms_norm.h"

#include "norm_common.h"

namespace opforge::kernels::cpu {

template <typename T>
void rms_norm(const TensorPtr& x, const TensorPtr& weight, const TensorPtr& y, const TensorPtr& rstd,
              const RmsNormAttrs& attrs) {
  using C = compute_t<T>;
  constexpr DType kC = dtype_of<C>::value;
  const Shape& xs = x->shape();
  norm::hint_huge_pages(y);
  norm::check_broadcasts_to("rms_norm", "weight", weight, x, "x");
  const auto ax = normalize_axes("rms_norm", Axes(attrs.axis), x->dim());
  const int64_t k = norm::trailing_start(ax, x->dim());
  if (k >= 0 && norm::row_shaped(weight, xs, k)) {
    const int64_t R = norm::prod(xs, 0, static_cast<size_t>(k)), N = norm::prod(xs, static_cast<size_t>(k), xs.size());
    OPFORGE_NORM_DISPATCH(rms_norm_rows<T>, x->data<T>(), weight ? weight->data<T>() : nullptr, y->data<T>(),
                          rstd->data<T>(), R, N, attrs.eps);
    return;
  }

  const double n = rstd->numel() ? static_cast<double>(x->numel()) / static_cast<double>(rstd->numel()) : 0.0;
  auto squares = empty(kC, xs);
  elementwise<C, T>(*squares, [](auto v) { return v * v; }, {x.get()});
  auto rstd_c = empty(kC, rstd->shape());
  sum_into("rms_norm", squares, Axes(attrs.axis), rstd_c, n > 0 ? 1.0 / n : std::nan(""));
  const C eps = static_cast<C>(attrs.eps);
  elementwise<C, C>(*rstd_c, [eps](auto ms) { return C(1) / std::sqrt(ms + eps); }, {rstd_c.get()});
  if (weight) {
    elementwise<T, T, C, T>(*y, [](auto v, auto r, auto w) { return v * r * w; },
                            {x.get(), rstd_c.get(), weight.get()});
  } else {
    elementwise<T, T, C>(*y, [](auto v, auto r) { return v * r; }, {x.get(), rstd_c.get()});
  }
  copy_into(rstd, rstd_c);
}

}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_RMS_NORM_CPU
