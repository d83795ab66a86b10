// The BLAS that linalg kernels call: OpenBLAS from the PyPI package scipy-openblas32 (found by
// meson.build, loaded at run time by `import scipy_openblas32` in opforge/__init__.py).
//
// Symbols: that build prefixes every exported name with `scipy_` (scipy_cblas_sgemm, ...) so it
// never clashes with another BLAS in the process (NumPy's scipy_openblas64, torch's MKL, ...); its
// cblas.h declares the prefixed names. OPFORGE_BLAS(cblas_sgemm) spells a symbol; another
// OpenBLAS build can be used by defining OPFORGE_BLAS_PREFIX (empty for an unprefixed one).
// Integers are 32-bit (`blasint`): callers check dimensions with blas::fits().
//
// Threading: OpenBLAS is set to one thread; gemm() splits products over blocks of rows or
// columns in opforge's OpenMP threads (see split_gemm), so there is a single thread pool.
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

// Products of at least this many multiply-adds (m * n * k, about 80^3) are split over opforge's
// OpenMP threads; smaller ones run on the calling thread, where a fork/join costs more than it
// saves (measured on 2 cores: 64^3 runs at 60 GFLOP/s on one thread and 45 split, 96^3 at 64 and
// 75; benchmarks/run.py --groups gemm).
constexpr int64_t kSplitGemm = int64_t(1) << 19;

// A block boundary every kAlign rows or columns keeps every thread's block a whole number of the
// BLAS kernel's register tiles (OpenBLAS's Haswell/Zen sgemm and dgemm tiles are 4..16 wide).
constexpr blasint kAlign = 16;

// C (m x n) = op(A) @ op(B) split into one block of rows or of columns of C per thread, along
// the longer side: call(rows, cols, A block, B block, C block). A row block of C takes rows of
// op(A) and all of op(B); a column block all of op(A) and columns of op(B), so each thread packs
// only its part of the larger operand.
template <typename T, typename Gemm>
inline void split_gemm(Gemm call, bool ta, bool tb, blasint m, blasint n, blasint k, const T* a, blasint lda,
                       const T* b, blasint ldb, T* c, blasint ldc) {
  single_threaded_blas();
#ifdef _OPENMP
  const int threads = omp_get_max_threads();
  const bool by_rows = m >= n;
  const blasint len = by_rows ? m : n;
  if (threads > 1 && !omp_in_parallel() && int64_t(m) * n * k >= kSplitGemm && len >= 2 * kAlign) {
    const blasint blocks = std::min<blasint>(threads, len / kAlign);
    const blasint chunk = ((len + blocks - 1) / blocks + kAlign - 1) / kAlign * kAlign;
#pragma omp parallel num_threads(blocks)
    {
      const blasint t = omp_get_thread_num();
      const blasint i0 = std::min(len, t * chunk), i1 = std::min(len, i0 + chunk);
      if (i0 < i1) {
        if (by_rows) {  // rows i0..i1 of op(A) and of C; a transposed A keeps them as columns
          call(i1 - i0, n, ta ? a + i0 : a + int64_t(i0) * lda, b, c + int64_t(i0) * ldc);
        } else {  // columns i0..i1 of op(B) and of C; a transposed B keeps them as rows
          call(m, i1 - i0, a, tb ? b + int64_t(i0) * ldb : b + i0, c + i0);
        }
      }
    }
    return;
  }
#endif
  call(m, n, a, b, c);
}

inline void gemm(bool ta, bool tb, blasint m, blasint n, blasint k, float alpha, const float* a, blasint lda,
                 const float* b, blasint ldb, float beta, float* c, blasint ldc) {
  split_gemm<float>([&](blasint rows, blasint cols, const float* ap, const float* bp, float* cp) {
    OPFORGE_BLAS(cblas_sgemm)(CblasRowMajor, tr(ta), tr(tb), rows, cols, k, alpha, ap, lda, bp, ldb, beta, cp, ldc);
  }, ta, tb, m, n, k, a, lda, b, ldb, c, ldc);
}
inline void gemm(bool ta, bool tb, blasint m, blasint n, blasint k, double alpha, const double* a, blasint lda,
                 const double* b, blasint ldb, double beta, double* c, blasint ldc) {
  split_gemm<double>([&](blasint rows, blasint cols, const double* ap, const double* bp, double* cp) {
    OPFORGE_BLAS(cblas_dgemm)(CblasRowMajor, tr(ta), tr(tb), rows, cols, k, alpha, ap, lda, bp, ldb, beta, cp, ldc);
  }, ta, tb, m, n, k, a, lda, b, ldb, c, ldc);
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
