// Storage types and scalar conversions. Half inputs are widened to float32 on load and every sum
// is float32 (float64 for float64 inputs); outputs are rounded once, to nearest even.
// `static inline` everywhere: each ISA translation unit keeps its own copy (see philox.hpp).
#pragma once
#include <cmath>
#include <cstdint>

#include "params.hpp"
#include <cstring>
#include <type_traits>

namespace qkv_native {
inline namespace QKV_NS {

struct f16_t {
  uint16_t bits;
};
struct bf16_t {
  uint16_t bits;
};

static inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
static inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

static inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {  // zero or subnormal: m * 2^-24, exact in float
    const float f = float(m) * 5.9604644775390625e-08f;
    return sign ? -f : f;
  }
  if (e == 31) return bits_to_float(sign | 0x7f800000u | (m << 13));
  return bits_to_float(sign | ((e + 112u) << 23) | (m << 13));
}

static inline uint16_t float_to_half(float f) {  // round to nearest even
  const uint32_t x = float_to_bits(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return uint16_t(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
  if (ax >= 0x477ff000u) return uint16_t(sign | 0x7c00u);      // >= 65520 rounds to inf
  if (ax < 0x38800000u) {                                      // < 2^-14: subnormal half
    const float scaled = bits_to_float(ax) * 16777216.0f;      // exact: units of 2^-24
    return uint16_t(sign | uint32_t(std::nearbyint(scaled)));  // 1024 carries into the exponent
  }
  uint32_t r = ax - 0x38000000u;  // rebias 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);
  return uint16_t(sign | (r >> 13));
}

static inline float bf16_to_float(uint16_t h) { return bits_to_float(uint32_t(h) << 16); }
static inline uint16_t float_to_bf16(float f) {
  uint32_t x = float_to_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return uint16_t(x >> 16);
}

// scalar widening / narrowing, by storage type
template <class C>
static inline C to_c(float x) {
  return C(x);
}
template <class C>
static inline C to_c(double x) {
  return C(x);
}
template <class C>
static inline C to_c(f16_t x) {
  return C(half_to_float(x.bits));
}
template <class C>
static inline C to_c(bf16_t x) {
  return C(bf16_to_float(x.bits));
}

template <class T>
struct Narrow;
template <>
struct Narrow<float> {
  static inline float from(float x) { return x; }
};
template <>
struct Narrow<double> {
  static inline double from(double x) { return x; }
};
template <>
struct Narrow<f16_t> {
  static inline f16_t from(float x) { return f16_t{float_to_half(x)}; }
};
template <>
struct Narrow<bf16_t> {
  static inline bf16_t from(float x) { return bf16_t{float_to_bf16(x)}; }
};

// The compute type of a storage type: float64 stays float64, everything else computes in float32.
template <class T>
struct Compute {
  using type = float;
};
template <>
struct Compute<double> {
  using type = double;
};

static inline double load_any(const void* base, int64_t off, DType dt) {
  switch (dt) {
    case DType::f32:
      return double(static_cast<const float*>(base)[off]);
    case DType::f64:
      return static_cast<const double*>(base)[off];
    case DType::f16:
      return double(half_to_float(static_cast<const uint16_t*>(base)[off]));
    default:
      return double(bf16_to_float(static_cast<const uint16_t*>(base)[off]));
  }
}

static inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

}  // namespace QKV_NS
}  // namespace qkv_native
