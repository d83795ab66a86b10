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
#include <utility>

#include "runtime/tensor.h"

#if defined(__CUDACC__)
#define OPFORGE_INLINE __forceinline__
#elif defined(__GNUC__)
#define OPFORGE_INLINE inline __attribute__((always_inline))
#else
#define OPFORGE_INLINE inline
#endif

namespace opforge {

// Scalar functions for `impl.expr` formulas; arguments are compute types (float, double, ints).
// Host and device (OPFORGE_HD): CUDA's <cmath> overloads serve std:: in device code.
namespace fn {
template <typename T> OPFORGE_HD OPFORGE_INLINE auto exp(T x) { return std::exp(x); }
template <typename T> OPFORGE_HD OPFORGE_INLINE auto log(T x) { return std::log(x); }
template <typename T> OPFORGE_HD OPFORGE_INLINE auto log1p(T x) { return std::log1p(x); }
template <typename T> OPFORGE_HD OPFORGE_INLINE auto expm1(T x) { return std::expm1(x); }
template <typename T> OPFORGE_HD OPFORGE_INLINE auto sqrt(T x) { return std::sqrt(x); }
template <typename T> OPFORGE_HD OPFORGE_INLINE auto rsqrt(T x) { return T(1) / std::sqrt(x); }
template <typename T> OPFORGE_HD OPFORGE_INLINE auto tanh(T x) { return std::tanh(x); }
template <typename T> OPFORGE_HD OPFORGE_INLINE auto sin(T x) { return std::sin(x); }
template <typename T> OPFORGE_HD OPFORGE_INLINE auto cos(T x) { return std::cos(x); }
template <typename T> OPFORGE_HD OPFORGE_INLINE auto erf(T x) { return std::erf(x); }
template <typename T> OPFORGE_HD OPFORGE_INLINE auto floor(T x) { return std::floor(x); }
template <typename T> OPFORGE_HD OPFORGE_INLINE auto ceil(T x) { return std::ceil(x); }
template <typename T> OPFORGE_HD OPFORGE_INLINE auto pow(T x, T y) { return std::pow(x, y); }
template <typename T> OPFORGE_HD OPFORGE_INLINE T abs(T x) {
  if constexpr (std::is_unsigned_v<T> || std::is_same_v<T, bool>) return x;
  else if constexpr (std::is_floating_point_v<T>) return std::fabs(x);  // (abs(-0.0) is +0.0)
  else return x < T(0) ? T(-x) : x;
}
// NaN-propagating, like numpy.maximum / numpy.minimum.
template <typename A, typename B> OPFORGE_HD OPFORGE_INLINE auto maximum(A a, B b) {
  using R = std::common_type_t<A, B>;
  return (R(a) != R(a) || R(a) > R(b)) ? R(a) : R(b);
}
template <typename A, typename B> OPFORGE_HD OPFORGE_INLINE auto minimum(A a, B b) {
  using R = std::common_type_t<A, B>;
  return (R(a) != R(a) || R(a) < R(b)) ? R(a) : R(b);
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
  template <typename R>
  OPFORGE_INLINE void put(int64_t i, const R& r) const {
    if constexpr (sizeof...(Out) == 1) {
      ((std::get<K>(p)[i] = convert<Out>(r)), ...);
    } else {
      ((std::get<K>(p)[i] = convert<Out>(std::get<K>(r))), ...);
    }
  }
};

template <typename Outs, typename... In, typename F, size_t... I>
void elementwise_impl(const std::array<const Tensor*, std::tuple_size_v<Outs>>& outs, const F& f,
                      const std::array<const Tensor*, sizeof...(In)>& ins, std::index_sequence<I...>) {
  // every output has the first one's shape (an expr op's outputs share one shape rule) ...
  const Shape& shape = outs[0]->shape();
  for (size_t k = 1; k < outs.size(); ++k) {
    if (outs[k]->shape() != shape) fail<RuntimeError>(current_op(), "elementwise output ", k, " has another shape");
  }
  // ... and every input must broadcast to it: the loops below read inputs through that assumption
  // (a user kernel or an op whose shape rule left an input out must not read past its view)
  (check_input(I, *ins[I], shape), ...);
  const int64_t n = outs[0]->numel();
  if (n == 0) return;
  const Sink<Outs> o = Sink<Outs>::of(outs);
  const std::tuple<const In*...> p{ins[I]->template data<In>()...};
  const bool same = ((ins[I]->numel() == n && ins[I]->is_contiguous()) && ... && true);
  if (same) {
    parallel_for(n, kParallelThreshold, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) o.put(i, f(load<In>(std::get<I>(p) + i)...));
    });
    return;
  }
  const bool flat = (((ins[I]->numel() == n && ins[I]->is_contiguous()) || ins[I]->numel() == 1) && ... && true);
  if (flat) {
    const std::array<int64_t, sizeof...(In)> s{(ins[I]->numel() == n ? int64_t(1) : int64_t(0))...};
    parallel_for(n, kParallelThreshold, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) o.put(i, f(load<In>(std::get<I>(p) + i * s[I])...));
    });
    return;
  }
  // General case: broadcasting and/or strided inputs. Iterate rows of the last dimension.
  const int64_t nd = static_cast<int64_t>(shape.size());
  const std::array<Shape, sizeof...(In)> st{broadcast_strides(*ins[I], shape)...};
  const int64_t inner = shape[nd - 1];
  const int64_t rows = n / inner;
  const std::array<int64_t, sizeof...(In)> inner_st{st[I][nd - 1]...};
  parallel_for(rows, std::max<int64_t>(1, kParallelThreshold / std::max<int64_t>(inner, 1)),
               [&](int64_t row_begin, int64_t row_end) {
  for (int64_t r = row_begin; r < row_end; ++r) {
    std::array<int64_t, sizeof...(In)> base{};
    int64_t rem = r;
    for (int64_t d = nd - 2; d >= 0; --d) {
      const int64_t idx = rem % shape[d];
      rem /= shape[d];
      ((base[I] += idx * st[I][d]), ...);
    }
    const int64_t row = r * inner;
    for (int64_t j = 0; j < inner; ++j) {
      o.put(row + j, f(load<In>(std::get<I>(p) + base[I] + j * inner_st[I])...));
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
