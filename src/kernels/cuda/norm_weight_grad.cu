// Kernel of op `norm_weight_grad` on cuda: dy * (x - mean) * rstd summed down to weight's shape.
// Fast path (dy and x of one shape, rstd/mean one value per leading row, weight the trailing
// block): row_common.cuh's column sums with the product fused in (deterministic). Otherwise the
// product by broadcasting, then the sum down to weight's shape.
#include "norm_weight_grad.h"

#include "norm_rows.cuh"

namespace opforge::kernels::cuda {

namespace {

// dy[r, j] * (x[r, j] - mean[r]) * rstd[r] (no mean: x[r, j] * rstd[r]) in the sum's type
template <typename T>
struct WeightGradTerm {
  const T *dy, *x, *rstd, *mean;
  int64_t N;
  __device__ __forceinline__ compute_t<T> operator()(int64_t r, int64_t j) const {
    using C = compute_t<T>;
    const C v = convert<C>(x[r * N + j]) - (mean ? convert<C>(mean[r]) : C(0));
    return convert<C>(dy[r * N + j]) * (v * convert<C>(rstd[r]));
  }
};

}  // namespace

template <typename T>
void norm_weight_grad(const TensorPtr& dy, const TensorPtr& x, const TensorPtr& rstd, const TensorPtr& weight,
                      const TensorPtr& mean, const TensorPtr& out, const NormWeightGradAttrs& attrs) {
  (void)attrs;
  using C = compute_t<T>;
  constexpr DType kC = dtype_of<C>::value;
  constexpr const char* op = "norm_weight_grad";
  using namespace norm;
  std::vector<const Tensor*> ins{dy.get(), x.get(), rstd.get()};
  std::vector<const char*> names{"dy", "x", "rstd"};
  if (mean) {
    ins.push_back(mean.get());
    names.push_back("mean");
  }
  const Shape full = broadcast_shapes(op, ins, names);
  check_broadcasts_to(op, "weight", weight, full, "dy * (x - mean) * rstd");
  const Shape& xs = x->shape();
  if (dy->shape() == xs && full == xs) {
    const Shape pw = padded(weight->shape(), xs.size());
    int64_t k = 0;
    while (k < static_cast<int64_t>(xs.size()) && pw[static_cast<size_t>(k)] == 1) ++k;
    if (row_shaped(weight, xs, k) && kept_shaped(rstd, xs, k) && kept_shaped(mean, xs, k)) {
      const int64_t R = prod(xs, 0, static_cast<size_t>(k)), N = prod(xs, static_cast<size_t>(k), xs.size());
      col_sums<T, C>(op, x->device(), R, N,
                     WeightGradTerm<T>{dy->data<T>(), x->data<T>(), rstd->data<T>(),
                                       mean ? mean->data<T>() : nullptr, N},
                     out->data<T>());
      return;
    }
  }
  CurrentOpScope scope(op);
  auto p = empty(kC, full, Format::Default, x->device());
  if (mean) ::opforge::cuda::elementwise<C, T, T, T, T>(*p, MulSubMul{}, {dy.get(), x.get(), mean.get(), rstd.get()});
  else ::opforge::cuda::elementwise<C, T, T, T>(*p, Mul{}, {dy.get(), x.get(), rstd.get()});
  sum_to_shape<T, C>(op, p, weight->shape(), out);
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_NORM_WEIGHT_GRAD_CUDA
