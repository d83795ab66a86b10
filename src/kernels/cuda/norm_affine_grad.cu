// Kernel of op `norm_affine_grad` on cuda: layer_norm's weight gradient dy * (x - mean) * rstd and
// bias gradient dy, each summed down to its parameter's shape. Fast path (dy and x of one shape,
// rstd/mean one value per leading row, weight and bias both the trailing block): one pass of
// row_common.cuh's column sums over dy and x accumulating both (a Sum2 per column;
// deterministic). Otherwise norm_weight_grad's paths for the weight and sum_to_like's for the bias.
#include "norm_affine_grad.h"

#include "norm_rows.cuh"

namespace opforge::kernels::cuda {

namespace {

// (dy * (x - mean) * rstd, dy) at (r, j), in compute type C
template <typename T>
struct AffineGradTerm {
  const T *dy, *x, *rstd, *mean;
  int64_t N;
  __device__ __forceinline__ rows::Sum2<compute_t<T>> operator()(int64_t r, int64_t j) const {
    using C = compute_t<T>;
    const C g = convert<C>(dy[r * N + j]);
    const C v = convert<C>(x[r * N + j]) - (mean ? convert<C>(mean[r]) : C(0));
    return {g * (v * convert<C>(rstd[r])), g};
  }
};

}  // namespace

template <typename T>
void norm_affine_grad(const TensorPtr& dy, const TensorPtr& x, const TensorPtr& rstd, const TensorPtr& weight,
                      const TensorPtr& bias, const TensorPtr& mean, const TensorPtr& dweight, const TensorPtr& dbias,
                      const NormAffineGradAttrs& attrs) {
  (void)attrs;
  using C = compute_t<T>;
  constexpr const char* op = "norm_affine_grad";
  using namespace norm;
  const WeightGradShape w = weight_grad_shape(op, dy, x, rstd, weight, mean);
  check_broadcasts_to(op, "bias", bias, dy->shape(), "dy");
  const T* m = mean ? mean->data<T>() : nullptr;
  if (w.rows && row_shaped(bias, x->shape(), w.k)) {
    col_sums_with<Sum2<C>>(op, x->device(), w.R, w.N,
                           AffineGradTerm<T>{dy->data<T>(), x->data<T>(), rstd->data<T>(), m, w.N},
                           StoreSum2<T, C>{dweight->data<T>(), dbias->data<T>()});
    return;
  }
  if (w.rows) {
    col_sums<T, C>(op, x->device(), w.R, w.N, WeightGradTerm<T>{dy->data<T>(), x->data<T>(), rstd->data<T>(), m, w.N},
                   dweight->data<T>());
  } else {
    weight_grad_by_broadcast<T>(op, dy, x, rstd, mean, w.full, dweight);
  }
  sum_to_shape<T, T>(op, dy, bias->shape(), dbias);
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_NORM_AFFINE_GRAD_CUDA
