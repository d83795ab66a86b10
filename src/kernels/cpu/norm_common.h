// Shared pieces of the normalization kernels (layer_norm, rms_norm, their fused backward ops,
// norm_weight_grad, sum_to_like, bias_add, bias_add_grad):
//  - layout checks that pick the fused row path (normalized axes = trailing dims, per-row
//    statistics, parameters of the normalized shape) over the general broadcasting path;
//  - the row and column loops, compiled twice from norm_rows.inc (baseline, and with GCC on x86
//    AVX2+FMA, picked once at run time from the CPU);
//  - reductions "sum down to a shape" (a contiguous block of kept dims: parallel and
//    vectorized; anything else: the runtime's sum_into).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "kernels/layout.h"
#include "runtime/runtime.h"

namespace opforge::kernels::cpu::norm {

inline int thread_num() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

// Asks the OS to back a large, freshly allocated output with transparent huge pages before the
// kernel first writes it (as NumPy does for its arrays): a 64 MiB output then takes 32 page
// faults instead of 16384, which otherwise cost more than the kernel's own work. Only a hint;
// failure is harmless. (This belongs in the runtime's allocator, for every op.)
inline void hint_huge_pages(const TensorPtr& t) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  if (!t || t->storage()->external) return;
  const uintptr_t nbytes = static_cast<uintptr_t>(t->numel()) * itemsize(t->dtype());
  if (nbytes < 2 * kHuge) return;
  const uintptr_t b = reinterpret_cast<uintptr_t>(t->raw_data());
  const uintptr_t lo = (b + kHuge - 1) & ~(kHuge - 1), hi = (b + nbytes) & ~(kHuge - 1);
  if (hi > lo) (void)madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);
#else
  (void)t;
#endif
}

// The layout checks (padded, prod, trailing_start, row_shaped, kept_shaped, check_broadcasts_to,
// check_shape) are kernels/layout.h's, shared with the cuda kernels.
using namespace ::opforge::kernels::layout;

// ---------------------------------------------------------------------------- ISA variants

enum class Isa { Base, Avx2 };
inline Isa isa() {
#if defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
  static const Isa v = (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) ? Isa::Avx2 : Isa::Base;
  return v;
#else
  return Isa::Base;
#endif
}

#define OPFORGE_NORM_VEC_BYTES 16
namespace base {
#include "norm_rows.inc"
}  // namespace base
#undef OPFORGE_NORM_VEC_BYTES

#if defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
#define OPFORGE_NORM_HAVE_AVX2 1
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define OPFORGE_NORM_VEC_BYTES 32
namespace avx2 {
#include "norm_rows.inc"
}  // namespace avx2
#undef OPFORGE_NORM_VEC_BYTES
#pragma GCC pop_options
#endif

// Calls fn<...>(args...) from the variant compiled for this CPU.
#ifdef OPFORGE_NORM_HAVE_AVX2
#define OPFORGE_NORM_DISPATCH(fn, ...)                                                     \
  (::opforge::kernels::cpu::norm::isa() == ::opforge::kernels::cpu::norm::Isa::Avx2        \
       ? ::opforge::kernels::cpu::norm::avx2::fn(__VA_ARGS__)                              \
       : ::opforge::kernels::cpu::norm::base::fn(__VA_ARGS__))
#else
#define OPFORGE_NORM_DISPATCH(fn, ...) (::opforge::kernels::cpu::norm::base::fn(__VA_ARGS__))
#endif

// ---------------------------------------------------------------------------- sum to a shape

// out (target's shape, dtype T, contiguous) = p (contiguous, dtype P) summed down to `target`,
// the gradient of broadcasting a target-shaped tensor to p's shape. The caller has checked that
// target broadcasts to p's shape.
template <typename T, typename P>
void sum_to_shape(const char* op, const TensorPtr& p, const Shape& target, const TensorPtr& out) {
  const Shape& ps = p->shape();
  const size_t nd = ps.size();
  const Shape t = padded(target, nd);
  // kept dims: target has p's size there (dims where p has size 1 are neither kept nor reduced)
  std::vector<int64_t> kept, axes;
  for (size_t d = 0; d < nd; ++d) {
    if (ps[d] == 1) continue;
    (t[d] == ps[d] ? kept : axes).push_back(static_cast<int64_t>(d));
  }
  const int64_t first = kept.empty() ? -1 : kept.front(), last = kept.empty() ? -1 : kept.back();
  const bool block = kept.empty() || last - first + 1 == static_cast<int64_t>(kept.size()) ||
                     std::none_of(axes.begin(), axes.end(), [&](int64_t a) { return a > first && a < last; });
  if (!block) {
    sum_into(op, p, axes, out);  // reduced dims between kept ones: the runtime's general loop
    return;
  }
  const int64_t A = first < 0 ? p->numel() : prod(ps, 0, static_cast<size_t>(first));
  const int64_t B = first < 0 ? 1 : prod(ps, static_cast<size_t>(first), static_cast<size_t>(last + 1));
  const int64_t C = first < 0 ? 1 : prod(ps, static_cast<size_t>(last + 1), nd);
  OPFORGE_NORM_DISPATCH(reduce_abc<T>, p->data<P>(), A, B, C, out->data<T>());
}

// out (weight's shape) = dy * (x - mean) * rstd (mean absent: dy * x * rstd) by broadcasting to
// `full`, then summed down to out's shape: the weight gradient where no fused loop applies.
template <typename T>
void weight_grad_by_broadcast(const char* op, const TensorPtr& dy, const TensorPtr& x, const TensorPtr& rstd,
                              const TensorPtr& mean, const Shape& full, const TensorPtr& out) {
  using C = compute_t<T>;
  auto p = empty(dtype_of<C>::value, full);
  if (mean) {
    elementwise<C, T, T, T, T>(*p, [](auto d, auto v, auto r, auto m) { return d * ((v - m) * r); },
                               {dy.get(), x.get(), rstd.get(), mean.get()});
  } else {
    elementwise<C, T, T, T>(*p, [](auto d, auto v, auto r) { return d * (v * r); }, {dy.get(), x.get(), rstd.get()});
  }
  sum_to_shape<T, C>(op, p, out->shape(), out);
}

}  // namespace opforge::kernels::cpu::norm
