// Kernel of op `matmul` on cpu: NumPy matmul semantics as batched BLAS GEMMs (linalg_common.h);
// float16/bfloat16 are computed by sgemm in float32.
#include "matmul.h"

#include "kernels/cpu/linalg_common.h"

namespace opforge::kernels::cpu {

template <typename T>
void matmul(const TensorPtr& a, const TensorPtr& b, const TensorPtr& out, const MatmulAttrs&) {
  const auto l = linalg::matmul_layout("matmul", a->shape(), b->shape());
  const linalg::GemmIn<T> pa(a), pb(b);
  linalg::GemmOut<T> po(out);
  linalg::batched_gemm<compute_t<T>>("matmul", l.batch, l.m, l.n, l.k, {pa.p, false, l.a_st}, {pb.p, false, l.b_st},
                                     po.p, l.out_st, out->numel());
  po.finish();
}

}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_MATMUL_CPU
