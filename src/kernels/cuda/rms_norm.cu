// Kernel of op `rms_norm` on cuda: norm_rows.cuh's fused rows when the normalized axes are the
// trailing dims and weight is absent or of the normalized shape; otherwise the cpu's general path
// (the mean square by the runtime's reduction, the scaling by broadcasting), in float (or double).
#include "rms_norm.h"

#include "norm_rows.cuh"

namespace opforge::kernels::cuda {

template <typename T>
void rms_norm(const TensorPtr& x, const TensorPtr& weight, const TensorPtr& y, const TensorPtr& rstd,
              const RmsNormAttrs& attrs) {
  using C = compute_t<T>;
  constexpr DType kC = dtype_of<C>::value;
  constexpr const char* op = "rms_norm";
  using namespace norm;
  const Shape& xs = x->shape();
  const Device dev = x->device();
  check_broadcasts_to(op, "weight", weight, x, "x");
  const auto ax = normalize_axes(op, Axes(attrs.axis), x->dim());
  const int64_t k = trailing_start(ax, x->dim());
  if (k >= 0 && row_shaped(weight, xs, k)) {
    const int64_t R = prod(xs, 0, static_cast<size_t>(k)), N = prod(xs, static_cast<size_t>(k), xs.size());
    const T* w = weight ? weight->data<T>() : nullptr;
    launch_rows(op, dev, R, N,
                RmsNormRow<T>{x->data<T>(), w, y->data<T>(), rstd->data<T>(), N, static_cast<C>(attrs.eps),
                              vec_ok<T>(N, {x->raw_data(), y->raw_data(), w})});
    return;
  }

  CurrentOpScope scope(op);
  const double n = rstd->numel() ? static_cast<double>(x->numel()) / static_cast<double>(rstd->numel()) : 0.0;
  auto squares = empty(kC, xs, Format::Default, dev);
  ::opforge::cuda::elementwise<C, T>(*squares, Square{}, {x.get()});
  auto rstd_c = empty(kC, rstd->shape(), Format::Default, dev);
  sum_into(op, squares, Axes(attrs.axis), rstd_c, n > 0 ? 1.0 / n : std::nan(""));
  ::opforge::cuda::elementwise<C, C>(*rstd_c, RsqrtEps<C>{static_cast<C>(attrs.eps)}, {rstd_c.get()});
  if (weight) ::opforge::cuda::elementwise<T, T, C, T>(*y, Mul{}, {x.get(), rstd_c.get(), weight.get()});
  else ::opforge::cuda::elementwise<T, T, C>(*y, Mul{}, {x.get(), rstd_c.get()});
  ::opforge::cuda::elementwise<T, C>(*rstd, Same{}, {rstd_c.get()});
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_RMS_NORM_CUDA
