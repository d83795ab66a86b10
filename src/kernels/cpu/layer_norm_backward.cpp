// Kernel of op `layer_norm_backward` on cpu: dx of layer_norm. Fast path (trailing axes, weight
// absent or of the normalized shape): per row, one pass for sum(g) and sum(g * (x - mean)),
// one pass writing dx, the row in cache, rows in parallel (norm_rows.inc). Otherwise the
// general path: the same formula by broadcasting and the runtime's reduction, in float (or double).
#include "layer_norm_backward.h"

#include "norm_common.h"

namespace opforge::kernels::cpu {

template <typename T>
void layer_norm_backward(const TensorPtr& dy, const TensorPtr& x, const TensorPtr& mean, const TensorPtr& rstd,
                         const TensorPtr& dmean, const TensorPtr& drstd, const TensorPtr& weight, const TensorPtr& dx,
                         const LayerNormBackwardAttrs& attrs) {
  using C = compute_t<T>;
  constexpr DType kC = dtype_of<C>::value;
  constexpr const char* op = "layer_norm_backward";
  const Shape& xs = x->shape();
  norm::hint_huge_pages(dx);
  const Axes axes(attrs.axis);
  const Shape kept = layout::check_norm_backward(op, dy, x, {{"mean", &mean}, {"rstd", &rstd}, {"dmean", &dmean},
                                                             {"drstd", &drstd}}, weight, axes);
  const auto ax = normalize_axes(op, axes, x->dim());
  const int64_t k = norm::trailing_start(ax, x->dim());
  if (k >= 0 && norm::row_shaped(weight, xs, k)) {
    const int64_t R = norm::prod(xs, 0, static_cast<size_t>(k)), N = norm::prod(xs, static_cast<size_t>(k), xs.size());
    if (N == 0) return;
    OPFORGE_NORM_DISPATCH(layer_norm_backward_rows<T>, dy->data<T>(), x->data<T>(),
                          weight ? weight->data<T>() : nullptr, mean->data<T>(), rstd->data<T>(), dmean->data<T>(),
                          drstd->data<T>(), dx->data<T>(), R, N);
    return;
  }

  const double n = mean->numel() ? static_cast<double>(x->numel()) / static_cast<double>(mean->numel()) : 0.0;
  const double inv_n = n > 0 ? 1.0 / n : std::nan("");
  auto g = empty(kC, xs);
  if (weight) elementwise<C, T, T>(*g, [](auto d, auto w) { return d * w; }, {dy.get(), weight.get()});
  else elementwise<C, T>(*g, [](auto d) { return d; }, {dy.get()});
  auto xhat = empty(kC, xs);
  elementwise<C, T, T, T>(*xhat, [](auto v, auto m, auto r) { return (v - m) * r; },
                          {x.get(), mean.get(), rstd.get()});
  auto a = empty(kC, kept);
  sum_into(op, g, axes, a, inv_n);
  auto gx = empty(kC, xs);
  elementwise<C, C, C>(*gx, [](auto u, auto v) { return u * v; }, {g.get(), xhat.get()});
  auto b = empty(kC, kept);
  sum_into(op, gx, axes, b, inv_n);
  const C cn = static_cast<C>(inv_n);
  elementwise<T, T, C, C, C, C, T, T>(
      *dx,
      [cn](auto r, auto gv, auto av, auto xh, auto bv, auto dm, auto ds) {
        return r * (gv - av - xh * bv) + (dm - ds * r * r * xh) * cn;
      },
      {rstd.get(), g.get(), a.get(), xhat.get(), b.get(), dmean.get(), drstd.get()});
}

}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_LAYER_NORM_BACKWARD_CPU
