// Shared by the linalg kernels (matmul, matmul_backward_a/b, linear, linear_backward_weight):
// batched products through BLAS (src/kernels/cpu/blas.h) over NumPy matmul layouts (the device-neutral
// src/kernels/linalg_layout.h, shared with the cuda kernels) and the float32 staging of
// float16/bfloat16 data. No hand-written multiply loops: every product is a BLAS call.
#pragma once

#include <algorithm>
#include <type_traits>
#include <vector>

#include "kernels/cpu/blas.h"
#include "kernels/linalg_layout.h"
#include "runtime/runtime.h"

namespace opforge::kernels::cpu::linalg {

using ::opforge::kernels::linalg::batch_strides;
using ::opforge::kernels::linalg::matmul_layout;
using ::opforge::kernels::linalg::MatmulLayout;
using ::opforge::kernels::linalg::Operand;

// C (m x n, ldc = n) = beta * C + op(A) @ op(B); A is stored m x k (k x m when ta), B k x n (n x k
// when tb), all dense row-major. Dimensions must fit blasint (checked by batched_gemm).
// One row or one column goes to GEMV. With k == 0 the product is zero.
template <typename G>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const G* a, const G* b, G beta, G* c) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (beta == G(0)) std::fill(c, c + m * n, G(0));
    return;  // beta is 0 or 1 here
  }
  // BLAS may compute 0 * C for beta = 0 (NaN from uninitialized memory): zero vectors first
  if (n == 1) {  // c = op(A) b
    if (beta == G(0)) std::fill(c, c + m, G(0));
    blas::gemv(ta, static_cast<blasint>(ta ? k : m), static_cast<blasint>(ta ? m : k), G(1), a,
               static_cast<blasint>(ta ? m : k), b, beta, c);
  } else if (m == 1) {  // c = op(B)^T a
    if (beta == G(0)) std::fill(c, c + n, G(0));
    blas::gemv(!tb, static_cast<blasint>(tb ? n : k), static_cast<blasint>(tb ? k : n), G(1), b,
               static_cast<blasint>(tb ? k : n), a, beta, c);
  } else {
    blas::gemm(ta, tb, static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), G(1), a,
               static_cast<blasint>(ta ? m : k), b, static_cast<blasint>(tb ? k : n), beta, c,
               static_cast<blasint>(n));
  }
}

// For every index i of `batch`: C_i (m x n) = op(A_i) @ op(B_i), where output matrices shared by
// several i (C stride 0 on a dim of size > 1) receive the sum of their products, and every C
// matrix starts from zero (from its current content when accumulate). c_numel: C's elements.
// Batches fold into one large GEMM where the layout allows (batch rows of A with a shared B;
// a reduction of dense A^T @ B over the batch); otherwise one GEMM per matrix, spread over
// OpenMP threads when the products are small enough for OpenBLAS to keep them single-threaded.
template <typename G>
void batched_gemm(const char* op, const Shape& batch, int64_t m, int64_t n, int64_t k, const Operand<G>& A,
                  const Operand<G>& B, G* c, const Shape& cst, int64_t c_numel, bool accumulate = false) {
  if (c_numel == 0) return;
  const G beta0 = accumulate ? G(1) : G(0);
  const int64_t nb = shape_numel(batch);
  if (nb == 0 || k == 0) {  // empty sums
    if (!accumulate) std::fill(c, c + c_numel, G(0));
    return;
  }
  if (!blas::fits(m) || !blas::fits(n) || !blas::fits(k)) {
    fail<ValueError>(op, "matrix dimensions (", m, " x ", k, ") @ (", k, " x ", n,
                     ") exceed 2^31 - 1, the limit of the 32-bit BLAS");
  }
  const Shape dense = contiguous_strides(batch);  // in matrices
  const auto is_dense = [&](const Shape& st, int64_t mat) {
    for (size_t d = 0; d < batch.size(); ++d) {
      if (batch[d] > 1 && st[d] != dense[d] * mat) return false;
    }
    return true;
  };
  const auto is_shared = [&](const Shape& st) {
    for (size_t d = 0; d < batch.size(); ++d) {
      if (batch[d] > 1 && st[d] != 0) return false;
    }
    return true;
  };
  // (nb*m x k) @ op(B): the rows of every A_i against one B
  if (!A.trans && is_dense(A.stride, m * k) && is_shared(B.stride) && is_dense(cst, m * n) && blas::fits(nb * m)) {
    gemm(false, B.trans, nb * m, n, k, A.data, B.data, beta0, c);
    return;
  }
  // sum_i A_i^T @ B_i = (nb*k x m)^T @ (nb*k x n): one GEMM over the stacked batch
  if (A.trans && !B.trans && is_dense(A.stride, k * m) && is_dense(B.stride, k * n) && is_shared(cst) &&
      blas::fits(nb * k)) {
    gemm(true, false, m, n, nb * k, A.data, B.data, beta0, c);
    return;
  }
  // General case. Dims C is reduced over (stride 0, size > 1) run innermost and accumulate into
  // one C matrix; the other dims give independent products.
  std::vector<size_t> outer, inner;
  for (size_t d = 0; d < batch.size(); ++d) (batch[d] > 1 && cst[d] == 0 ? inner : outer).push_back(d);
  int64_t n_outer = 1, n_inner = 1;
  for (size_t d : outer) n_outer *= batch[d];
  for (size_t d : inner) n_inner *= batch[d];
  const auto offsets = [&](const std::vector<size_t>& dims, int64_t idx, int64_t& oa, int64_t& ob, int64_t& oc) {
    for (size_t j = dims.size(); j-- > 0;) {
      const size_t d = dims[j];
      const int64_t i = idx % batch[d];
      idx /= batch[d];
      oa += i * A.stride[d];
      ob += i * B.stride[d];
      oc += i * cst[d];
    }
  };
  // Independent products go to OpenMP threads when each is too small for blas::gemm to split
  // it or when there are enough of them to keep every thread busy; inside the loop blas::gemm
  // then stays on its thread.
  const int64_t work = m * n * k;
  const bool parallel = n_outer > 1 && n_outer * work >= (int64_t(1) << 15) &&
                        (work < blas::kSplitGemm || n_outer >= 8 * int64_t(max_threads()));
#pragma omp parallel for if (parallel) schedule(static)
  for (int64_t o = 0; o < n_outer; ++o) {
    int64_t oa = 0, ob = 0, oc = 0;
    offsets(outer, o, oa, ob, oc);
    for (int64_t i = 0; i < n_inner; ++i) {
      int64_t ia = oa, ib = ob, ic = oc;
      offsets(inner, i, ia, ib, ic);
      gemm(A.trans, B.trans, m, n, k, A.data + ia, B.data + ib, i == 0 ? beta0 : G(1), c + ic);
    }
  }
}

// A tensor's data in its BLAS type (compute_t: float for float16/bfloat16), converted once.
template <typename T>
class GemmIn {
 public:
  using G = compute_t<T>;
  explicit GemmIn(const TensorPtr& t) {
    if constexpr (std::is_same_v<T, G>) {
      p = t->data<G>();
    } else {
      buf_ = empty(dtype_of<G>::value, t->shape());
      copy_into(buf_, t);
      p = buf_->data<G>();
    }
  }
  const G* p;

 private:
  TensorPtr buf_;
};

// An output written in its BLAS type: in place, or in a float buffer that finish() converts.
template <typename T>
class GemmOut {
 public:
  using G = compute_t<T>;
  explicit GemmOut(const TensorPtr& out) : out_(out) {
    if constexpr (std::is_same_v<T, G>) {
      p = out->data<G>();
    } else {
      buf_ = empty(dtype_of<G>::value, out->shape());
      p = buf_->data<G>();
    }
  }
  void finish() {
    if (buf_) copy_into(out_, buf_);
  }
  G* p;

 private:
  TensorPtr out_, buf_;
};

}  // namespace opforge::kernels::cpu::linalg
