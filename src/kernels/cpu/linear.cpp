// Kernel of op `linear` on cpu: y = x @ weight^T + bias as one BLAS GEMM over all rows of x
// (its batch dims flattened), the bias preloaded into y (beta = 1).
#include "linear.h"

#include "kernels/cpu/linalg_common.h"

namespace opforge::kernels::cpu {

template <typename T>
void linear(const TensorPtr& x, const TensorPtr& weight, const TensorPtr& bias, const TensorPtr& out,
            const LinearAttrs&) {
  using G = compute_t<T>;
  const int64_t n_out = weight->shape()[0], n_in = weight->shape()[1];
  const int64_t rows = n_in ? x->numel() / n_in : shape_numel(Shape(x->shape().begin(), x->shape().end() - 1));
  const linalg::GemmIn<T> px(x), pw(weight);
  linalg::GemmOut<T> po(out);
  if (bias) {
    const linalg::GemmIn<T> pbias(bias);
    const G* bp = pbias.p;
    G* o = po.p;
#pragma omp parallel for if (rows * n_out >= kParallelThreshold) schedule(static)
    for (int64_t r = 0; r < rows; ++r) std::copy(bp, bp + n_out, o + r * n_out);
  }
  // (rows x in) @ (out x in)^T
  linalg::batched_gemm<G>("linear", {}, rows, n_out, n_in, {px.p, false, {}}, {pw.p, true, {}}, po.p, {},
                          out->numel(), bias != nullptr);
  po.finish();
}

}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_LINEAR_CPU
