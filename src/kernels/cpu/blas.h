// The BLAS that linalg kernels call: OpenBLAS from the PyPI package scipy-openblas32 (found by
// meson.build, loaded at run time by `import scipy_openblas32` in opforge/__init__.py).
//
// Symbols: that build prefixes every exported name with `scipy_` (scipy_cblas_sgemm, ...) so it
// never clashes with another BLAS in the process (NumPy's scipy_openblas64, torch's MKL, ...); its
// cblas.h declares the prefixed names. OPFORGE_BLAS(cblas_sgemm) spells a symbol; another
// OpenBLAS build can be used by defining OPFORGE_BLAS_PREFIX (empty for an unprefixed one).
// Integers are 32-bit (`blasint`): callers check dimensions with blas::fits().
//
// Threading: OpenBLAS uses its own pthreads pool for one large GEMM/GEMV (all cores by default;
// OPENBLAS_NUM_THREADS, else OMP_NUM_THREADS, sets its size), and runs small products
// (m*n*k <= kSingleThreadedGemm, m*n <= kSingleThreadedGemv) in the calling thread. opforge's
// OpenMP loops only ever call BLAS with such small products (many small matrices of a batch,
// one per OpenMP thread), so the two pools never run at the same time and never nest.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>

#ifndef OPFORGE_BLAS_PREFIX
#define OPFORGE_BLAS_PREFIX scipy_
#endif
#define OPFORGE_BLAS_CAT2_(a, b) a##b
#define OPFORGE_BLAS_CAT_(a, b) OPFORGE_BLAS_CAT2_(a, b)
#define OPFORGE_BLAS(name) OPFORGE_BLAS_CAT_(OPFORGE_BLAS_PREFIX, name)

namespace opforge::blas {

// OpenBLAS's own limits (interface/gemm.c, interface/gemv.c: SMP_THRESHOLD_MIN *
// GEMM_MULTITHREAD_THRESHOLD and 2304 * GEMM_MULTITHREAD_THRESHOLD) below which it stays in the
// calling thread.
constexpr int64_t kSingleThreadedGemm = int64_t(65536) * 4;
constexpr int64_t kSingleThreadedGemv = int64_t(2304) * 4;

inline bool fits(int64_t n) { return n >= 0 && n <= INT_MAX; }

inline CBLAS_TRANSPOSE tr(bool t) { return t ? CblasTrans : CblasNoTrans; }

inline void gemm(bool ta, bool tb, blasint m, blasint n, blasint k, float alpha, const float* a, blasint lda,
                 const float* b, blasint ldb, float beta, float* c, blasint ldc) {
  OPFORGE_BLAS(cblas_sgemm)(CblasRowMajor, tr(ta), tr(tb), m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
inline void gemm(bool ta, bool tb, blasint m, blasint n, blasint k, double alpha, const double* a, blasint lda,
                 const double* b, blasint ldb, double beta, double* c, blasint ldc) {
  OPFORGE_BLAS(cblas_dgemm)(CblasRowMajor, tr(ta), tr(tb), m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
inline void gemv(bool ta, blasint rows, blasint cols, float alpha, const float* a, blasint lda, const float* x,
                 float beta, float* y) {
  OPFORGE_BLAS(cblas_sgemv)(CblasRowMajor, tr(ta), rows, cols, alpha, a, lda, x, 1, beta, y, 1);
}
inline void gemv(bool ta, blasint rows, blasint cols, double alpha, const double* a, blasint lda, const double* x,
                 double beta, double* y) {
  OPFORGE_BLAS(cblas_dgemv)(CblasRowMajor, tr(ta), rows, cols, alpha, a, lda, x, 1, beta, y, 1);
}

}  // namespace opforge::blas
