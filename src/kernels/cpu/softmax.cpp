// Kernel of op `softmax` on cpu, and the softmax group's SIMD primitives (softmax_common.h):
// softmax_simd.inc compiled once per instruction set, the best one picked at first use.
#include "softmax.h"

#include <cstdlib>
#include <cstring>

#include "softmax_common.h"

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define OPF_X86 1
#include <immintrin.h>
#endif

// Vector arguments of another instruction set's width are fine here: each inclusion is
// self-contained and only reached through Prims' function pointers. (GCC 12 also reports its own
// AVX-512 conversion intrinsics as maybe-uninitialized.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace opforge::kernels::cpu::smx {

namespace simd_base {
#define OPF_WF 4
#include "softmax_simd.inc"
#undef OPF_WF
}  // namespace simd_base

#ifdef OPF_X86
#pragma GCC push_options
#pragma GCC target("avx2,avx,fma,f16c")
namespace simd_avx2 {
#define OPF_WF 8
#include "softmax_simd.inc"
#undef OPF_WF
}  // namespace simd_avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx2,avx,fma,f16c")
namespace simd_avx512 {
#define OPF_WF 16
#include "softmax_simd.inc"
#undef OPF_WF
}  // namespace simd_avx512
#pragma GCC pop_options
#endif

namespace {

// 2 = AVX-512, 1 = AVX2, 0 = baseline; OPFORGE_SOFTMAX_SIMD=avx2|sse2 caps it (for tests).
int detect_level() {
  int level = 0;
#ifdef OPF_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) level = 1;
  if (level == 1 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")) {
    level = 2;
  }
#endif
  if (const char* cap = std::getenv("OPFORGE_SOFTMAX_SIMD")) {
    if (std::strcmp(cap, "sse2") == 0) level = 0;
    else if (std::strcmp(cap, "avx2") == 0) level = std::min(level, 1);
  }
  return level;
}

int level() {
  static const int l = detect_level();
  return l;
}

}  // namespace

const Prims<float>& prims_f32() {
  static const Prims<float> p = [] {
#ifdef OPF_X86
    if (level() == 2) return simd_avx512::make_prims_f32();
    if (level() == 1) return simd_avx2::make_prims_f32();
#endif
    return simd_base::make_prims_f32();
  }();
  return p;
}

const Prims<double>& prims_f64() {
  static const Prims<double> p = [] {
#ifdef OPF_X86
    if (level() == 2) return simd_avx512::make_prims_f64();
    if (level() == 1) return simd_avx2::make_prims_f64();
#endif
    return simd_base::make_prims_f64();
  }();
  return p;
}

const char* simd_level() {
  static const char* names[] = {"sse2", "avx2", "avx512"};
  return names[level()];
}

}  // namespace opforge::kernels::cpu::smx

#pragma GCC diagnostic pop

namespace opforge::kernels::cpu {

template <typename T>
void softmax(const TensorPtr& x, const TensorPtr& out, const SoftmaxAttrs& attrs) {
  using E = compute_t<T>;
  const smx::AxisView v = smx::axis_view("softmax", x->shape(), attrs.axis);
  const smx::Prims<E>& P = smx::prims<E>();
  smx::map_axis<T, 1>(
      {x->data<T>()}, out->data<T>(), v,
      [&P](const std::array<const E*, 1>& in, E* y, int64_t n, E* scratch, const std::array<const E*, 1>& next) {
        smx::softmax_row(P, in[0], y, n, scratch, next[0]);
      },
      [&P](const std::array<const E*, 1>& in, int64_t ldx, E* y, int64_t ldy, int64_t n, int64_t w, E* scratch) {
        E* m = scratch;
        E* s = scratch + w;
        smx::col_lse_parts(P, in[0], ldx, n, w, m, s, scratch + 2 * w, scratch + 3 * w);
        for (int64_t j = 0; j < w; ++j) s[j] = E(1) / s[j];
        for (int64_t r = 0; r < n; ++r) P.col_exp_scale(in[0] + r * ldx, m, s, w, y + r * ldy);
      });
}

}  // namespace opforge::kernels::cpu

OPFORGE_INSTANTIATE_SOFTMAX_CPU
