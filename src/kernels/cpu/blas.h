// The BLAS that linalg kernels call: OpenBLAS from the PyPI package scipy-openblas32 (found by
// meson.build, loaded at run time by `import scipy_openblas32` in opforge/__init__.py).
//
// Symbols: that build prefixes every exported name with `scipy_` (scipy_cblas_sgemm, ...) so it
// never clashes with another BLAS in the process (NumPy's scipy_openblas64, torch's MKL, ...); its
// cblas.h declares the prefixed names. OPFORGE_BLAS(cblas_sgemm) spells a symbol; another
// OpenBLAS build can be used by defining OPFORGE_BLAS_PREFIX (empty for an unprefixed one).
// Integers are 32-bit (`blasint`): callers check dimensions with blas::fits().
//
// Threading: OpenBLAS is set to one thread; gemm() splits large products over row blocks in
// opforge's OpenMP threads (see split_gemm), so there is a single thread pool.
#pragma once

#include <cblas.h>

#ifdef _OPENMP
#include <omp.h>
#endif

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

// OpenBLAS runs single-threaded; large products are split over row blocks of C in opforge's own
// OpenMP threads instead. One thread pool: OpenBLAS's pthreads and OpenMP threads spin-waiting
// for each other made a small MLP training step 10x slower (and torch's libgomp, when torch is
// imported first, serves our OpenMP regions with its own wait policy).
inline void single_threaded_blas() {
  static const bool done = [] {
    OPFORGE_BLAS(openblas_set_num_threads)(1);
    return true;
  }();
  (void)done;
}

template <typename T, typename Gemm>
inline void split_gemm(Gemm call, bool ta, blasint m, blasint n, blasint k, const T* a, blasint lda, T* c,
                       blasint ldc) {
  single_threaded_blas();
#ifdef _OPENMP
  const int threads = omp_get_max_threads();
  if (threads > 1 && int64_t(m) * n * k >= kSingleThreadedGemm * 16 && m >= 8 * threads) {
#pragma omp parallel num_threads(threads)
    {
      const blasint t = omp_get_thread_num(), nt = omp_get_num_threads();
      const blasint chunk = (m + nt - 1) / nt, i0 = std::min(m, t * chunk), i1 = std::min(m, i0 + chunk);
      // rows i0..i1 of op(A) and of C; a transposed A keeps them as columns
      if (i0 < i1) call(i1 - i0, ta ? a + i0 : a + int64_t(i0) * lda, c + int64_t(i0) * ldc);
    }
    return;
  }
#endif
  call(m, a, c);
}

inline void gemm(bool ta, bool tb, blasint m, blasint n, blasint k, float alpha, const float* a, blasint lda,
                 const float* b, blasint ldb, float beta, float* c, blasint ldc) {
  split_gemm<float>([&](blasint rows, const float* ap, float* cp) {
    OPFORGE_BLAS(cblas_sgemm)(CblasRowMajor, tr(ta), tr(tb), rows, n, k, alpha, ap, lda, b, ldb, beta, cp, ldc);
  }, ta, m, n, k, a, lda, c, ldc);
}
inline void gemm(bool ta, bool tb, blasint m, blasint n, blasint k, double alpha, const double* a, blasint lda,
                 const double* b, blasint ldb, double beta, double* c, blasint ldc) {
  split_gemm<double>([&](blasint rows, const double* ap, double* cp) {
    OPFORGE_BLAS(cblas_dgemm)(CblasRowMajor, tr(ta), tr(tb), rows, n, k, alpha, ap, lda, b, ldb, beta, cp, ldc);
  }, ta, m, n, k, a, lda, c, ldc);
}
inline void gemv(bool ta, blasint rows, blasint cols, float alpha, const float* a, blasint lda, const float* x,
                 float beta, float* y) {
  single_threaded_blas();
  OPFORGE_BLAS(cblas_sgemv)(CblasRowMajor, tr(ta), rows, cols, alpha, a, lda, x, 1, beta, y, 1);
}
inline void gemv(bool ta, blasint rows, blasint cols, double alpha, const double* a, blasint lda, const double* x,
                 double beta, double* y) {
  single_threaded_blas();
  OPFORGE_BLAS(cblas_dgemv)(CblasRowMajor, tr(ta), rows, cols, alpha, a, lda, x, 1, beta, y, 1);
}

}  // namespace opforge::blas
