// Kernel of op `norm_weight_grad` on cpu: dy * (x - mean) * rstd summed down to weight's shape.
// Fast path (dy and x of one shape, rstd/mean one value per leading row, weight the trailing
// block): a parallel, vectorized column sum with the product fused in (norm_rows.inc).
// Otherwise the product by broadcasting, then the sum down to weight's shape.
#include "norm_weight_grad.h"

#include "norm_common.h"

namespace opforge::kernels::cpu {

template <typename T>
void norm_weight_grad(const TensorPtr& dy, const TensorPtr& x, const TensorPtr& rstd, const TensorPtr& weight,
                      const TensorPtr& mean, const TensorPtr& out, const NormWeightGradAttrs& attrs) {
  (void)attrs;
  using C = compute_t<T>;
  constexpr DType kC = dtype_of<C>::value;
  constexpr const char* op = "norm_weight_grad";
  std::vector<const Tensor*> ins{dy.get(), x.get(), rstd.get()};
  std::vector<const char*> names{"dy", "x", "rstd"};
  if (mean) {
    ins.push_back(mean.get());
    names.push_back("mean");
  }
  const Shape full = broadcast_shapes(op, ins, names);
  norm::check_broadcasts_to(op, "weight", weight, full, "dy * (x - mean) * rstd");
  const Shape& xs = x->shape();
  if (dy->shape() == xs && full == xs) {
    const Shape pw = norm::padded(weight->shape(), xs.size());
    int64_t k = 0;
    while (k < static_cast<int64_t>(xs.size()) && pw[static_cast<size_t>(k)] == 1) ++k;
    if (norm::row_shaped(weight, xs, k) && norm::kept_shaped(rstd, xs, k) && norm::kept_shaped(mean, xs, k)) {
      const int64_t R = norm::prod(xs, 0, static_cast<size_t>(k));
      const int64_t N = norm::prod(xs, static_cast<size_t>(k), xs.size());
      OPFORGE_NORM_DISPATCH(weight_grad_rows<T>, dy->data<T>(), x->data<T>(), rstd->data<T>(),
                            mean ? mean->data<T>() : nullptr, out->data<T>(), R, N);
      return;
    }
  }
  auto p = empty(kC, full);
  if (mean) {
    elementwise<C, T, T, T, T>(*p, [](auto d, auto v, auto r, auto m) { return d * ((v - m) * r); },
                               {dy.get(), x.get(), rstd.get(), mean.get()});
  } else {
    elementwise<C, T, T, T>(*p, [](auto d, auto v, auto r) { return d * (v * r); }, {dy.get(), x.get(), rstd.get()});
  }
  norm::sum_to_shape<T, C>(op, p, weight->shape(), out);
}

}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_NORM_WEIGHT_GRAD_CPU
