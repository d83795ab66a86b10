// Kernel of op `matmul` on cuda: NumPy matmul semantics as cuBLAS GEMMs (linalg_common.cuh): one
// GEMM when the batch folds into rows, else strided-batched calls over the broadcast batch.
#include "matmul.h"

#include "kernels/cuda/linalg_common.cuh"

namespace opforge::kernels::cuda {

template <typename T>
void matmul(const TensorPtr& a, const TensorPtr& b, const TensorPtr& out, const MatmulAttrs&) {
  const auto l = linalg::matmul_layout("matmul", a->shape(), b->shape());
  linalg::batched_gemm<T>("matmul", l.batch, l.m, l.n, l.k, {a->data<T>(), false, l.a_st}, {b->data<T>(), false, l.b_st},
                          out, l.out_st);
}

}  // namespace opforge::kernels::cuda

OPFORGE_INSTANTIATE_MATMUL_CUDA
