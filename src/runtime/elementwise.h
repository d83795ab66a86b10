// The broadcasting elementwise loop (contiguous fast path, OpenMP above a size threshold) and
// the scalar functions that elementwise expressions may call.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>

#ifdef _OPENMP
#include <omp.h>
#endif
#include <tuple>
#include <type_traits>
#include <memory>
#include <utility>

#include "runtime/tensor.h"

#if defined(__CUDACC__)
#define OPFORGE_INLINE __forceinline__
#elif defined(__GNUC__)
#define OPFORGE_INLINE inline __attribute__((always_inline))
#else
#define OPFORGE_INLINE inline
#endif

// Vector math (CPU): glibc's libmvec has SIMD variants of libm functions (_ZGVbN4v_expf for SSE,
// _ZGVdN8v_expf for AVX2, ...; since glibc 2.35 for all of these but exp/log/sin/cos/pow, which
// came in 2.22). The declarations below name the libm functions (asm labels) as `simd` and
// `const`, so GCC's vectorizer calls a variant on 4 or 8 lanes where it vectorizes a loop that
// calls them, as glibc's own <math.h> offers only under -ffast-math (whose other effects opforge
// must not have). They are not the builtins: GCC cannot fuse sin and cos into a sincos call,
// which has no such variant. Accuracy: libmvec documents at most 4 ulp; the errors measured per
// function and dtype are in benchmarks/results/ulp.md, bounded by tests/ops/test_vector_math.py.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__) && defined(__x86_64__) && \
    defined(__GLIBC__) && defined(__GLIBC_PREREQ)
#if __GLIBC_PREREQ(2, 35)
#define OPFORGE_VECTOR_MATH 1
#define OPFORGE_MVEC_(R, name, ...) \
  __attribute__((simd("notinbranch"), const)) R opforge_mvec_##name(__VA_ARGS__) noexcept __asm__(#name);
#define OPFORGE_MVEC_FD_(name) OPFORGE_MVEC_(float, name##f, float) OPFORGE_MVEC_(double, name, double)
extern "C" {
OPFORGE_MVEC_FD_(exp)
OPFORGE_MVEC_FD_(log)
OPFORGE_MVEC_FD_(log1p)
OPFORGE_MVEC_FD_(expm1)
OPFORGE_MVEC_FD_(tanh)
OPFORGE_MVEC_FD_(sin)
OPFORGE_MVEC_FD_(cos)
OPFORGE_MVEC_FD_(erf)
OPFORGE_MVEC_(float, powf, float, float)
OPFORGE_MVEC_(double, pow, double, double)
}
#undef OPFORGE_MVEC_FD_
#undef OPFORGE_MVEC_
#endif
#endif
#ifndef OPFORGE_VECTOR_MATH
#define OPFORGE_VECTOR_MATH 0
#endif

namespace opforge {

// Scalar functions for `impl.expr` formulas; arguments are compute types (float, double, ints).
// Host and device (OPFORGE_HD): CUDA's <cmath> overloads serve std:: in device code.
namespace fn {
// float and double go to the vector-math declarations above where they exist, others to <cmath>.
#if OPFORGE_VECTOR_MATH
#define OPFORGE_FN1_(name)                                                          \
  template <typename T> OPFORGE_INLINE auto name(T x) {                              \
    if constexpr (std::is_same_v<T, float>) return opforge_mvec_##name##f(x);        \
    else if constexpr (std::is_same_v<T, double>) return opforge_mvec_##name(x);     \
    else return std::name(x);                                                        \
  }
#else
#define OPFORGE_FN1_(name) \
  template <typename T> OPFORGE_HD OPFORGE_INLINE auto name(T x) { return std::name(x); }
#endif
OPFORGE_FN1_(exp)
OPFORGE_FN1_(log)
OPFORGE_FN1_(log1p)
OPFORGE_FN1_(expm1)
OPFORGE_FN1_(tanh)
OPFORGE_FN1_(sin)
OPFORGE_FN1_(cos)
OPFORGE_FN1_(erf)
#undef OPFORGE_FN1_
// pow of integers (an expr's pow in an integer compute type): exact, wrapping around as NumPy's
// power does (by squaring, in an unsigned type of at least unsigned int's width: the product of
// two promoted uint16 values could overflow int), where <cmath>'s would round through double
// (int64 results past 2^53) and saturate. A negative exponent gives 1 / x truncated, as PyTorch's
// integer pow with a tensor exponent: 1 for x = 1, -1 or 1 by parity for x = -1, 0 otherwise
// (NumPy refuses it; a kernel cannot). bool: x or not y.
template <typename T> OPFORGE_HD OPFORGE_INLINE T int_pow(T x, T y) {
  if constexpr (std::is_same_v<T, bool>) {
    return x || !y;
  } else {
    if constexpr (std::is_signed_v<T>) {
      if (y < 0) return x == T(1) ? T(1) : x == T(-1) ? ((y & T(1)) ? T(-1) : T(1)) : T(0);
    }
    using U = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
    U base = static_cast<U>(x), r = 1;
    for (U e = static_cast<U>(y); e != 0; e >>= 1) {
      if (e & 1u) r *= base;
      base *= base;
    }
    return static_cast<T>(r);
  }
}
#if OPFORGE_VECTOR_MATH
template <typename T> OPFORGE_INLINE auto pow(T x, T y) {
  if constexpr (std::is_same_v<T, float>) return opforge_mvec_powf(x, y);
  else if constexpr (std::is_same_v<T, double>) return opforge_mvec_pow(x, y);
  else if constexpr (std::is_integral_v<T>) return int_pow(x, y);
  else return std::pow(x, y);
}
#else
template <typename T> OPFORGE_HD OPFORGE_INLINE auto pow(T x, T y) {
  if constexpr (std::is_integral_v<T>) return int_pow(x, y);
  else return std::pow(x, y);
}
#endif
template <typename T> OPFORGE_HD OPFORGE_INLINE auto sqrt(T x) { return std::sqrt(x); }
template <typename T> OPFORGE_HD OPFORGE_INLINE auto rsqrt(T x) { return T(1) / std::sqrt(x); }
template <typename T> OPFORGE_HD OPFORGE_INLINE auto floor(T x) { return std::floor(x); }
template <typename T> OPFORGE_HD OPFORGE_INLINE auto ceil(T x) { return std::ceil(x); }
// The arithmetic operators of `impl.expr` (+ - * / and unary -). Floats: the operators. Signed
// integers wrap around in two's complement as NumPy's do (computed in the unsigned type: a signed
// overflow would be undefined behaviour), and division never traps: x / 0 is 0 (NumPy's integer
// division by zero, without its warning), INT_MIN / -1 is INT_MIN, otherwise it truncates as C.
template <typename R> inline constexpr bool kWraps = std::is_integral_v<R> && std::is_signed_v<R>;
template <typename R, typename U = std::make_unsigned_t<R>>
OPFORGE_HD OPFORGE_INLINE U as_unsigned(R x) { return static_cast<U>(x); }
template <typename A, typename B> OPFORGE_HD OPFORGE_INLINE auto add(A a, B b) {
  using R = decltype(a + b);
  if constexpr (kWraps<R>) return static_cast<R>(as_unsigned(R(a)) + as_unsigned(R(b)));
  else return a + b;
}
template <typename A, typename B> OPFORGE_HD OPFORGE_INLINE auto sub(A a, B b) {
  using R = decltype(a - b);
  if constexpr (kWraps<R>) return static_cast<R>(as_unsigned(R(a)) - as_unsigned(R(b)));
  else return a - b;
}
template <typename A, typename B> OPFORGE_HD OPFORGE_INLINE auto mul(A a, B b) {
  using R = decltype(a * b);
  if constexpr (kWraps<R>) return static_cast<R>(as_unsigned(R(a)) * as_unsigned(R(b)));
  else return a * b;
}
template <typename T> OPFORGE_HD OPFORGE_INLINE auto neg(T x) {
  using R = decltype(-x);
  if constexpr (kWraps<R>) return static_cast<R>(0u - as_unsigned(R(x)));
  else return -x;
}
template <typename A, typename B> OPFORGE_HD OPFORGE_INLINE auto div(A a, B b) {
  using R = decltype(a / b);
  if constexpr (std::is_integral_v<R>) {
    if (R(b) == R(0)) return R(0);
    if constexpr (std::is_signed_v<R>) {
      if (R(b) == R(-1)) return neg(R(a));
    }
    return static_cast<R>(R(a) / R(b));
  } else {
    return a / b;
  }
}
template <typename T> OPFORGE_HD OPFORGE_INLINE T abs(T x) {
  if constexpr (std::is_unsigned_v<T> || std::is_same_v<T, bool>) return x;
  else if constexpr (std::is_floating_point_v<T>) return std::fabs(x);  // (abs(-0.0) is +0.0)
  else return x < T(0) ? T(neg(x)) : x;  // (abs(INT_MIN) is INT_MIN, as NumPy's)
}
// NaN-propagating, like numpy.maximum / numpy.minimum (b on ties). Two selects, no `||`: GCC
// compiled the short circuit into a branch per element (4 ms for 2^20 random floats, 60 us as
// selects).
template <typename A, typename B> OPFORGE_HD OPFORGE_INLINE auto maximum(A a, B b) {
  using R = std::common_type_t<A, B>;
  const R x = R(a), y = R(b);
  const R m = x > y ? x : y;  // (y, NaN or not, unless x is greater)
  return x != x ? x : m;
}
template <typename A, typename B> OPFORGE_HD OPFORGE_INLINE auto minimum(A a, B b) {
  using R = std::common_type_t<A, B>;
  const R x = R(a), y = R(b);
  const R m = x < y ? x : y;
  return x != x ? x : m;
}
}  // namespace fn

// An optional attr's value as an expression functor holds it (plain data: copied to the device).
template <typename T>
struct DeviceOptional {
  bool has = false;
  T value{};
  DeviceOptional() = default;
  DeviceOptional(const std::optional<T>& o) : has(o.has_value()), value(o.value_or(T{})) {}  // NOLINT
  OPFORGE_HD explicit operator bool() const { return has; }
  OPFORGE_HD T operator*() const { return value; }
};

// Per-dimension strides (elements) of t read as broadcast to out_shape (0 on broadcast dims).
Shape broadcast_strides(const Tensor& t, const Shape& out_shape);

constexpr int64_t kParallelThreshold = int64_t(1) << 16;

// Threads opforge's OpenMP regions may use (1 without OpenMP).
inline int max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// body(begin, end) over [0, n): in OpenMP threads when n is large, else inline (small calls
// must not pay for entering a parallel region).
template <typename Body>
OPFORGE_INLINE void parallel_for(int64_t n, int64_t grain, const Body& body) {
  if (n < grain) {
    body(int64_t(0), n);
    return;
  }
#pragma omp parallel
  {
#ifdef _OPENMP
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
#else
    const int64_t threads = 1, t = 0;
#endif
    const int64_t chunk = (n + threads - 1) / threads;
    const int64_t begin = std::min(n, t * chunk), end = std::min(n, begin + chunk);
    if (begin < end) body(begin, end);
  }
}

namespace detail {

template <typename In>
OPFORGE_INLINE compute_t<In> load(const In* p) { return convert<compute_t<In>>(*p); }

OPFORGE_INLINE void check_input(size_t index, const Tensor& in, const Shape& out_shape) {
  if (in.shape() != out_shape) check_input_broadcasts(current_op(), index, in.shape(), out_shape);
}

constexpr int64_t kDenseBlock = 16;  // see dense()

// Where an elementwise loop writes: one pointer per output (`Outs` = std::tuple<Out...>). put()
// stores a result at position i: the value itself for one output, else a tuple of one per output.
template <typename Outs, typename K = std::make_index_sequence<std::tuple_size_v<Outs>>>
struct Sink;

template <typename... Out, size_t... K>
struct Sink<std::tuple<Out...>, std::index_sequence<K...>> {
  std::tuple<Out*...> p;

  static Sink of(const std::array<const Tensor*, sizeof...(Out)>& outs) {
    return {std::tuple<Out*...>{outs[K]->template data<Out>()...}};
  }
  // the same outputs from element `offset` on
  Sink shifted(int64_t offset) const { return {std::tuple<Out*...>{(std::get<K>(p) + offset)...}}; }
  // a block of kDenseBlock results per output, staged on the stack
  using Block = std::tuple<std::array<Out, kDenseBlock>...>;
  static Sink of_block(Block& b) { return {std::tuple<Out*...>{std::get<K>(b).data()...}}; }
  void copy_from(const Block& b, int64_t count) const {
    ((std::copy(std::get<K>(b).data(), std::get<K>(b).data() + count, std::get<K>(p))), ...);
  }
  template <typename R>
  OPFORGE_INLINE void put(int64_t i, const R& r) const {
    if constexpr (sizeof...(Out) == 1) {
      ((std::get<K>(p)[i] = convert<Out>(r)), ...);
    } else {
      ((std::get<K>(p)[i] = convert<Out>(std::get<K>(r))), ...);
    }
  }
};

// out[i] = f(in[i]...) over n elements of dense inputs, some of which may be one element read
// for every i ("scalar" inputs: stride 0), written for the vectorizer. Without scalar inputs one
// loop runs over the whole blocks of kDenseBlock elements; with them, the loop runs over spans of
// up to kSpan elements, reading each scalar input from a span of copies, so that every loop reads
// dense memory. The last partial block is computed as a whole one on copies (padded with its
// first element), so that every element goes through the same vector code whatever its position,
// the call's length or the split over threads (libmvec's vector functions and libm's scalar ones
// may round differently: a scalar tail would make exp(x)[i] depend on i).
constexpr int64_t kSpan = 256;

// kSpan elements of T left uninitialized (a std::array in a std::tuple is value-initialized: the
// tuple's default constructor zeroed every span, 2 KiB of stores per dense() call)
template <typename T>
struct RawSpan {
  RawSpan() {}  // NOLINT: user-provided, so that value-initialization leaves raw alone
  T* data() { return reinterpret_cast<T*>(raw); }
  const T* data() const { return reinterpret_cast<const T*>(raw); }
  T& operator[](int64_t j) { return data()[j]; }
  alignas(64) unsigned char raw[sizeof(T) * kSpan];
};

template <typename... In>
using DenseSpans = std::tuple<RawSpan<In>...>;

// The trip count of a loop hidden from the optimizer: a constant one would be unrolled
// completely, and GCC 12 turns an unrolled vector-math call back into scalar libm calls.
OPFORGE_INLINE int64_t opaque(int64_t n) {
  asm("" : "+r"(n));
  return n;
}

template <typename Outs, typename... In, typename F, size_t... I>
OPFORGE_INLINE void dense_run(const Sink<Outs>& o, const std::tuple<const In*...>& p, int64_t n, const F& f,
                              std::index_sequence<I...>) {
  for (int64_t i = 0; i < n; ++i) o.put(i, f(load<In>(std::get<I>(p) + i)...));
}

// Input k's pointer for the elements from b on: into its data, or its span of copies if copied.
template <typename... In, size_t... I>
OPFORGE_INLINE std::tuple<const In*...> dense_at(const std::tuple<const In*...>& p, const DenseSpans<In...>& spans,
                                                 const bool* copied, int64_t b, std::index_sequence<I...>) {
  return {(copied[I] ? std::get<I>(spans).data() : std::get<I>(p) + b)...};
}

// The inputs from element b on (scalar inputs stay as they are).
template <typename... In, size_t... I>
OPFORGE_INLINE std::tuple<const In*...> dense_from(const std::tuple<const In*...>& p, const bool* scalar, int64_t b,
                                                   std::index_sequence<I...>) {
  return {(scalar[I] ? std::get<I>(p) : std::get<I>(p) + b)...};
}

// The first `len` copies of each input: scalar inputs repeated; with `tail`, the others' elements
// b .. b + count - 1, padded with the first of them.
template <typename... In, size_t... I>
OPFORGE_INLINE void dense_copy(DenseSpans<In...>& spans, const std::tuple<const In*...>& p, const bool* scalar,
                               bool tail, int64_t b, int64_t count, int64_t len, std::index_sequence<I...>) {
  for (int64_t j = 0; j < len; ++j) {
    ((scalar[I] ? (void)(std::get<I>(spans)[j] = std::get<I>(p)[0])
                : tail ? (void)(std::get<I>(spans)[j] = std::get<I>(p)[b + (j < count ? j : 0)]) : (void)0),
     ...);
  }
}

template <typename Outs, typename... In, typename F>
OPFORGE_INLINE void dense(const Sink<Outs>& o, const std::tuple<const In*...>& p,
                          const std::array<bool, sizeof...(In)>& scalar, int64_t n, const F& f) {
  constexpr auto idx = std::index_sequence_for<In...>{};
  const int64_t whole = n / kDenseBlock * kDenseBlock;
  DenseSpans<In...> spans;
  const bool any_scalar = std::find(scalar.begin(), scalar.end(), true) != scalar.end();
  if (!any_scalar) {
    dense_run<Outs, In...>(o, p, whole, f, idx);
  } else if (whole > 0) {
    dense_copy<In...>(spans, p, scalar.data(), false, 0, 0, std::min(kSpan, whole), idx);
    for (int64_t b = 0; b < whole; b += kSpan) {
      dense_run<Outs, In...>(o.shifted(b), dense_at<In...>(p, spans, scalar.data(), b, idx),
                             opaque(std::min(kSpan, whole - b)), f, idx);
    }
  }
  const int64_t rest = n - whole;
  if (rest == 0) return;
  dense_copy<In...>(spans, p, scalar.data(), true, whole, rest, kDenseBlock, idx);
  typename Sink<Outs>::Block out;
  std::array<bool, sizeof...(In)> copied;
  copied.fill(true);
  dense_run<Outs, In...>(Sink<Outs>::of_block(out), dense_at<In...>(p, spans, copied.data(), 0, idx),
                         opaque(kDenseBlock), f, idx);
  o.shifted(whole).copy_from(out, rest);
}

#if OPFORGE_VECTOR_MATH
// The same loops compiled for AVX2 (8 float lanes; libmvec's _ZGVdN8v_* variants), chosen at
// run time where the CPU has it. No FMA: the arithmetic rounds as in the scalar code.
template <typename Outs, typename... In, typename F>
__attribute__((target("avx2"), noinline)) void dense_avx2(const Sink<Outs>& o, const std::tuple<const In*...>& p,
                                                         const std::array<bool, sizeof...(In)>& scalar, int64_t n,
                                                         const F& f) {
  dense<Outs, In...>(o, p, scalar, n, f);
}

inline bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}
#endif

// dense() over [0, n) in OpenMP threads when n is large, each thread on its own range.
template <typename Outs, typename... In, typename F>
void dense_parallel(const Sink<Outs>& o, const std::tuple<const In*...>& p,
                    const std::array<bool, sizeof...(In)>& scalar, int64_t n, const F& f) {
  parallel_for(n, kParallelThreshold, [&](int64_t begin, int64_t end) {
    const auto from = dense_from<In...>(p, scalar.data(), begin, std::index_sequence_for<In...>{});
#if OPFORGE_VECTOR_MATH
    if (has_avx2()) {
      dense_avx2<Outs, In...>(o.shifted(begin), from, scalar, end - begin, f);
      return;
    }
#endif
    dense<Outs, In...>(o.shifted(begin), from, scalar, end - begin, f);
  });
}

template <typename Outs, typename... In, typename F, size_t... I>
void elementwise_impl(const std::array<const Tensor*, std::tuple_size_v<Outs>>& outs, const F& f,
                      const std::array<const Tensor*, sizeof...(In)>& ins, std::index_sequence<I...>) {
  // every output has the first one's shape (an expr op's outputs share one shape rule) ...
  const Shape& shape = outs[0]->shape();
  for (size_t k = 0; k < outs.size(); ++k) {
    if (outs[k]->shape() != shape) fail<RuntimeError>(current_op(), "elementwise output ", k, " has another shape");
    // (the loop stores output element i at i: a strided view would be written out of its bounds)
    if (!outs[k]->is_contiguous()) fail<RuntimeError>(current_op(), "elementwise output ", k, " is not contiguous");
  }
  // ... and every input must broadcast to it: the loops below read inputs through that assumption
  // (a user kernel or an op whose shape rule left an input out must not read past its view)
  (check_input(I, *ins[I], shape), ...);
  const int64_t n = outs[0]->numel();
  if (n == 0) return;
  const Sink<Outs> o = Sink<Outs>::of(outs);
  const std::tuple<const In*...> p{ins[I]->template data<In>()...};
  // Dense inputs, some maybe of one element read for every output element.
  const bool flat = (((ins[I]->numel() == n && ins[I]->is_contiguous()) || ins[I]->numel() == 1) && ... && true);
  if (flat) {
    const std::array<bool, sizeof...(In)> scalar{(ins[I]->numel() != n)...};
    dense_parallel<Outs, In...>(o, p, scalar, n, f);
    return;
  }
  // General case: broadcasting and/or strided inputs. Dims are coalesced (size-1 dims dropped,
  // adjacent dims merged where every input steps through them as through one), then the output
  // is written in row chunks of up to kSpan elements through dense(): inputs of inner stride 1 are
  // read in place, of stride 0 as dense()'s scalars, others gathered into a span first, so that
  // every layout runs the vector code. Rows go in groups of kRowGroup, chunk by chunk, so that a
  // transposed input's cache lines (and pages) serve the group's rows together.
  constexpr size_t kIn = sizeof...(In);
  Shape cs;                                // coalesced shape
  std::array<Shape, kIn> cst;              // and each input's strides on it
  {
    const std::array<Shape, kIn> st{broadcast_strides(*ins[I], shape)...};
    for (size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] == 1) continue;
      bool merge = !cs.empty();
      for (size_t k = 0; k < kIn && merge; ++k) merge = cst[k].back() == st[k][d] * shape[d];
      if (merge) {
        cs.back() *= shape[d];
        for (size_t k = 0; k < kIn; ++k) cst[k].back() = st[k][d];
      } else {
        cs.push_back(shape[d]);
        for (size_t k = 0; k < kIn; ++k) cst[k].push_back(st[k][d]);
      }
    }
  }
  if (cs.empty()) {  // (n == 1)
    cs.push_back(1);
    for (size_t k = 0; k < kIn; ++k) cst[k].push_back(0);
  }
  const int64_t nd = static_cast<int64_t>(cs.size());
  const int64_t inner = cs[nd - 1];
  const int64_t rows = n / inner;
  std::array<int64_t, kIn> inner_st{};
  std::array<bool, kIn> scalar{}, gather{};
  bool any_gather = false;
  for (size_t k = 0; k < kIn; ++k) {
    inner_st[k] = cst[k][nd - 1];
    scalar[k] = inner_st[k] == 0;
    gather[k] = inner_st[k] != 0 && inner_st[k] != 1;
    any_gather = any_gather || gather[k];
  }
  constexpr int64_t kRowGroup = 16, kDenseMin = 32;
  if (inner < kDenseMin) {
    // short rows: the output in spans of kSpan elements across rows, every input gathered into a
    // span first (one dense() call per row would cost more than the row), then the vector loop
    const int64_t spans = (n + kSpan - 1) / kSpan;
    parallel_for(spans, std::max<int64_t>(1, kParallelThreshold / kSpan), [&](int64_t s_begin, int64_t s_end) {
      DenseSpans<In...> tiles;  // (on the stack: a small call pays no allocation)
      const std::tuple<const In*...> q{std::get<I>(tiles).data()...};
      const std::array<bool, kIn> dense_in{};  // (every input a span: none read as a scalar)
      // the odometer of the first element's row over cs[0 .. nd-2], its column j, and each input's row offset
      Shape idx(static_cast<size_t>(nd - 1), 0);
      std::array<int64_t, kIn> off{};
      int64_t j = (s_begin * kSpan) % inner;
      {
        int64_t rem = s_begin * kSpan / inner;
        for (int64_t d = nd - 2; d >= 0; --d) {
          idx[d] = rem % cs[d];
          rem /= cs[d];
          for (size_t k = 0; k < kIn; ++k) off[k] += idx[d] * cst[k][d];
        }
      }
      for (int64_t sp = s_begin; sp < s_end; ++sp) {
        const int64_t start = sp * kSpan, len = std::min(kSpan, n - start);
        for (int64_t e = 0; e < len; ++e) {
          ((std::get<I>(tiles)[e] = std::get<I>(p)[off[I] + j * inner_st[I]]), ...);
          if (++j < inner) continue;
          j = 0;
          for (int64_t d = nd - 2; d >= 0; --d) {  // next row
            for (size_t k = 0; k < kIn; ++k) off[k] += cst[k][d];
            if (++idx[d] < cs[d]) break;
            for (size_t k = 0; k < kIn; ++k) off[k] -= cs[d] * cst[k][d];
            idx[d] = 0;
          }
        }
        const Sink<Outs> at = o.shifted(start);
#if OPFORGE_VECTOR_MATH
        if (has_avx2()) {
          dense_avx2<Outs, In...>(at, q, dense_in, len, f);
          continue;
        }
#endif
        dense<Outs, In...>(at, q, dense_in, len, f);
      }
    });
    return;
  }
  const int64_t group = any_gather ? kRowGroup : 1;
  const int64_t groups = (rows + group - 1) / group;
  const int64_t chunk = any_gather ? kSpan : inner;  // (without gathers, one dense() call per row)
  parallel_for(groups, std::max<int64_t>(1, kParallelThreshold / std::max<int64_t>(inner * group, 1)),
               [&](int64_t g_begin, int64_t g_end) {
    // the row index as an odometer over cs[0 .. nd-2], with each input's offset
    Shape idx(static_cast<size_t>(std::max<int64_t>(nd - 1, 0)), 0);
    std::array<int64_t, kIn> off{};
    {
      int64_t rem = g_begin * group;
      for (int64_t d = nd - 2; d >= 0; --d) {
        idx[d] = rem % cs[d];
        rem /= cs[d];
        for (size_t k = 0; k < kIn; ++k) off[k] += idx[d] * cst[k][d];
      }
    }
    std::array<std::array<int64_t, kIn>, kRowGroup> base;
    // a group's gathered chunks, row after row (kSpan apart), for the inputs that are gathered
    std::tuple<std::unique_ptr<In[]>...> tiles{gather[I] ? std::make_unique<In[]>(size_t(kRowGroup * kSpan)) : nullptr...};
    for (int64_t g = g_begin; g < g_end; ++g) {
      const int64_t r0 = g * group, nr = std::min(group, rows - r0);
      for (int64_t i = 0; i < nr; ++i) {
        base[i] = off;
        for (int64_t d = nd - 2; d >= 0; --d) {  // next row
          for (size_t k = 0; k < kIn; ++k) off[k] += cst[k][d];
          if (++idx[d] < cs[d]) break;
          for (size_t k = 0; k < kIn; ++k) off[k] -= cs[d] * cst[k][d];
          idx[d] = 0;
        }
      }
      for (int64_t j0 = 0; j0 < inner; j0 += chunk) {
        const int64_t len = std::min(chunk, inner - j0);
        // gather column by column across the group's rows: a transposed input's rows are adjacent
        // in memory, so each cache line read serves every row of the group at once
        ([&] {
          if (!gather[I]) return;
          auto* t = std::get<I>(tiles).get();
          const auto* src = std::get<I>(p) + j0 * inner_st[I];
          for (int64_t j = 0; j < len; ++j) {
            const auto* col = src + j * inner_st[I];
            for (int64_t i = 0; i < nr; ++i) t[i * kSpan + j] = col[base[i][I]];
          }
        }(), ...);
        for (int64_t i = 0; i < nr; ++i) {
          const std::tuple<const In*...> q{(scalar[I] ? std::get<I>(p) + base[i][I]
                                            : gather[I] ? std::get<I>(tiles).get() + i * kSpan
                                                        : std::get<I>(p) + base[i][I] + j0)...};
          const Sink<Outs> at = o.shifted((r0 + i) * inner + j0);
#if OPFORGE_VECTOR_MATH
          if (has_avx2()) {
            dense_avx2<Outs, In...>(at, q, scalar, len, f);
            continue;
          }
#endif
          dense<Outs, In...>(at, q, scalar, len, f);
        }
      }
    }
  });
}

}  // namespace detail

// out[i] = f(in_0[i], ..., in_k[i]) with NumPy broadcasting; out is fresh and contiguous with the
// broadcast shape. Inputs are read as their storage types `In...` and passed to f as compute types.
template <typename Out, typename... In, typename F>
void elementwise(const Tensor& out, const F& f, const std::array<const Tensor*, sizeof...(In)>& ins) {
  detail::elementwise_impl<std::tuple<Out>, In...>({&out}, f, ins, std::index_sequence_for<In...>{});
}

// The same loop writing several outputs in one pass (`Outs` = std::tuple<Out...>): f returns a
// tuple, one value per output, stored as that output's type. Every output has the same shape.
template <typename Outs, typename... In, typename F>
void elementwise_n(const std::array<const Tensor*, std::tuple_size_v<Outs>>& outs, const F& f,
                   const std::array<const Tensor*, sizeof...(In)>& ins) {
  detail::elementwise_impl<Outs, In...>(outs, f, ins, std::index_sequence_for<In...>{});
}

}  // namespace opforge
