// Element types: the DType enum, 16-bit float storage types and the compute type of each.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>

// Functions compiled for the host and, by nvcc, for CUDA devices too: element conversions, the
// scalar math of elementwise expressions and the generated expression functors, so that CPU and
// CUDA kernels run the same arithmetic.
#if defined(__CUDACC__)
#define OPFORGE_HD __host__ __device__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#else
#define OPFORGE_HD
#endif

namespace opforge {

enum class DType : uint8_t {
  Bool, UInt8, Int8, Int16, Int32, Int64, Float16, BFloat16, Float32, Float64,
};
constexpr int kNumDTypes = 10;

enum class Format : uint8_t { Default, NCHW, NHWC };

const char* dtype_name(DType d);
const char* format_name(Format f);
bool dtype_from_name(std::string_view name, DType* out);  // (an entry point's per-call dtype text: no copy)
bool format_from_name(const std::string& name, Format* out);
size_t itemsize(DType d);
inline bool is_floating(DType d) { return d >= DType::Float16; }

OPFORGE_HD inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
OPFORGE_HD inline float bits_f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
OPFORGE_HD inline uint32_t all_if(bool b) { return 0u - uint32_t(b); }  // every bit set where b, else none

// IEEE 754 binary16, stored; arithmetic happens in float.
struct Half {
  uint16_t bits = 0;
  Half() = default;
  OPFORGE_HD Half(float f) : bits(from_float(f)) {}  // NOLINT: implicit like a builtin float type
  OPFORGE_HD operator float() const { return to_float(bits); }

  // On a CUDA device, the conversion instructions (cvt.rn.f16.f32, cvt.f32.f16: one instruction
  // where the bit manipulation below takes a dozen, in every 16-bit kernel's loads and stores);
  // the same IEEE round-to-nearest-even results, NaN as the canonical NaN. On the host, the bits.
  OPFORGE_HD static uint16_t from_float(float f) {
#if defined(__CUDA_ARCH__)
    return __half_as_ushort(__float2half_rn(f));
#else
    // round-to-nearest-even conversion via the float bit pattern (branches: a loop that stores
    // float16 stays scalar either way where its selects are control flow, and the branches cost
    // less there than computing every case; to_float's masks are what let loads vectorize)
    uint32_t x = f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) return uint16_t(sign | (absx > 0x7f800000u ? 0x7e00u : 0x7c00u));
    if (absx >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // overflow to inf
    if (absx < 0x38800000u) {                                  // subnormal or zero
      float v = bits_f32(absx) + 0.5f;                         // align to 2^-24 steps
      return uint16_t(sign | (f32_bits(v) - 0x3f000000u));
    }
    uint32_t mant_odd = (absx >> 13) & 1u;
    absx += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round
    return uint16_t(sign | (absx >> 13));
#endif
  }
  OPFORGE_HD static float to_float(uint16_t h) {
#if defined(__CUDA_ARCH__)
    return __half2float(__ushort_as_half(h));
#else
    // every case computed and one selected by bit masks, without branches or selects GCC keeps as
    // control flow, so that loops reading float16 (sums, norms, conversions) vectorize
    const uint32_t sign = uint32_t(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t mant = h & 0x3ffu;
    const uint32_t special = sign | 0x7f800000u | (mant << 13);                                  // inf or NaN
    const uint32_t subnormal = sign | f32_bits(float(int32_t(mant)) * (1.0f / 16777216.0f));  // mant * 2^-24
    const uint32_t normal = sign | ((exp + 112) << 23) | (mant << 13);
    const uint32_t is_special = all_if(exp == 0x1f), is_subnormal = all_if(exp == 0);
    return bits_f32((special & is_special) | (subnormal & is_subnormal) | (normal & ~(is_special | is_subnormal)));
#endif
  }
};

// bfloat16: the upper half of a float32, rounded to nearest even.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  OPFORGE_HD BFloat16(float f) : bits(from_float(f)) {}  // NOLINT
  OPFORGE_HD operator float() const { return bits_f32(uint32_t(bits) << 16); }
  // (on a CUDA device the instruction, cvt.rn.bf16.f32, as Half's; widening is a shift anywhere)
  OPFORGE_HD static uint16_t from_float(float f) {
#if defined(__CUDA_ARCH__)
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#else
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40);  // quiet NaN
    x += 0x7fffu + ((x >> 16) & 1u);
    return uint16_t(x >> 16);
#endif
  }
};

template <typename T> struct dtype_of;
template <> struct dtype_of<bool> { static constexpr DType value = DType::Bool; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::UInt8; };
template <> struct dtype_of<int8_t> { static constexpr DType value = DType::Int8; };
template <> struct dtype_of<int16_t> { static constexpr DType value = DType::Int16; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::Int32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::Int64; };
template <> struct dtype_of<Half> { static constexpr DType value = DType::Float16; };
template <> struct dtype_of<BFloat16> { static constexpr DType value = DType::BFloat16; };
template <> struct dtype_of<float> { static constexpr DType value = DType::Float32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::Float64; };

// The type arithmetic happens in: float for the 16-bit floats, the type itself otherwise.
template <typename T> struct compute_type { using type = T; };
template <> struct compute_type<Half> { using type = float; };
template <> struct compute_type<BFloat16> { using type = float; };
template <typename T> using compute_t = typename compute_type<T>::type;

// The type reductions accumulate in.
template <typename T> struct acc_type { using type = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>; };
template <> struct acc_type<Half> { using type = double; };
template <> struct acc_type<BFloat16> { using type = double; };
template <typename T> using acc_t = typename acc_type<T>::type;

// A floating-point value as integer type To, defined for every value (C++ leaves one whose
// truncation is out of To's range undefined): truncated toward zero, saturated to To's range, NaN
// 0. What CUDA's conversion instructions do (so the host and the device agree) and XLA's convert;
// NumPy's cast leaves it to the platform (x86 gives INT_MIN for int32 and int64, and int8's 300.7
// wraps to 44).
template <typename To, typename From>
OPFORGE_HD inline To saturate_cast(From v) {
  static_assert(std::is_integral_v<To> && std::is_floating_point_v<From>);
  constexpr From lo = static_cast<From>(std::numeric_limits<To>::min());                     // 0 or -2^(n-1)
  constexpr From hi = static_cast<From>(std::numeric_limits<To>::max() / 2 + 1) * From(2);  // 2^n or 2^(n-1)
  if (!(v == v)) return To(0);
  if (v >= hi) return std::numeric_limits<To>::max();
  if (v <= lo - From(1)) return std::numeric_limits<To>::min();  // (lo when lo - 1 rounds to it)
  return static_cast<To>(v);
}

template <typename To, typename From>
OPFORGE_HD inline To convert(From v) {
  if constexpr (std::is_same_v<To, bool>) {
    if constexpr (std::is_same_v<From, Half> || std::is_same_v<From, BFloat16>) {
      return static_cast<float>(v) != 0.0f;
    } else {
      return v != From(0);
    }
  } else if constexpr (std::is_same_v<To, Half> || std::is_same_v<To, BFloat16>) {
    return To(static_cast<float>(v));
  } else if constexpr (std::is_same_v<From, Half> || std::is_same_v<From, BFloat16>) {
    return convert<To>(static_cast<float>(v));
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<From>) {
    return saturate_cast<To>(v);
  } else {
    return static_cast<To>(v);
  }
}

// Calls f.template operator()<T>() with T the storage type of d.
template <typename F>
decltype(auto) visit_dtype(DType d, F&& f) {
  switch (d) {
    case DType::Bool: return f(bool{});
    case DType::UInt8: return f(uint8_t{});
    case DType::Int8: return f(int8_t{});
    case DType::Int16: return f(int16_t{});
    case DType::Int32: return f(int32_t{});
    case DType::Int64: return f(int64_t{});
    case DType::Float16: return f(Half{});
    case DType::BFloat16: return f(BFloat16{});
    case DType::Float32: return f(float{});
    case DType::Float64: default: return f(double{});
  }
}

}  // namespace opforge
