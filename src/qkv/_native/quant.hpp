// A quantized K/V cache (Params::kv_format): int8 or float8 codes with a float32 scale per
// (batch, kv head, key); value = code x scale. The kernels read the codes in place and dequantise
// in registers (decode.hpp's thin path) or into the tile's widened copy (every other path), so a
// long-context decode step reads one byte per element where a bfloat16 cache reads two.
//
// Codes and their "units": a vector load of 16 codes gives 16 floats that are the values divided by
// kUnit<E> (exact: every code is exact in float32), so the per-key factor is kUnit<E> x scale and
// the conversions stay cheap:
//   int8 (i8_t)          the integer itself (kUnit 1);
//   float8 E5M2 (e5m2_t) the high byte of a float16 with the same sign, exponent (bias 15) and top
//                        mantissa bits: code << 8 read as float16 is the value (kUnit 1), inf and
//                        NaN included;
//   float8 E4M3 (e4m3_t) "fn" (OCP FP8: no infinities, S.1111.111 is NaN, max 448): the 7 magnitude
//                        bits shifted into a float16's exponent and mantissa give the value / 2^8
//                        (bias 7 read with float16's 15), subnormals included (kUnit 256). The NaN
//                        pattern reads as 1.875 there: a byte scan of each tile read in place
//                        (e4m3_tile_clean) flags the rows that attended it; the widened copy
//                        reads it as NaN.
// A non-finite scale or value follows the non-finite rule of finite.hpp: the copies are scanned and
// cleaned as a float tile is; the in-place reads see it in the scores or in the output row.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "dtypes.hpp"

namespace qkv_native {
inline namespace QKV_NS {

struct i8_t {
  int8_t bits;
};
struct e4m3_t {
  uint8_t bits;
};
struct e5m2_t {
  uint8_t bits;
};

template <class E>
struct IsCode : std::false_type {};
template <>
struct IsCode<i8_t> : std::true_type {};
template <>
struct IsCode<e4m3_t> : std::true_type {};
template <>
struct IsCode<e5m2_t> : std::true_type {};

template <class E>
inline constexpr float kUnit = 1.0f;
template <>
inline constexpr float kUnit<e4m3_t> = 256.0f;

// One code as its value / kUnit (exact).
static inline float code_unit(i8_t x) { return float(x.bits); }
static inline float code_unit(e5m2_t x) { return half_to_float(uint16_t(uint16_t(x.bits) << 8)); }
static inline float code_unit(e4m3_t x) {
  if ((x.bits & 0x7fu) == 0x7fu) return NAN;
  return half_to_float(uint16_t(((uint16_t(x.bits) & 0x80u) << 8) | ((uint16_t(x.bits) & 0x7fu) << 7)));
}

// Whether a code is a finite number (int8 always; E4M3 all but its NaN; E5M2 all but exponent 11111).
static inline bool code_finite(i8_t) { return true; }
static inline bool code_finite(e4m3_t x) { return (x.bits & 0x7fu) != 0x7fu; }
static inline bool code_finite(e5m2_t x) { return (x.bits & 0x7cu) != 0x7cu; }

template <class E>
static inline bool codes_finite(const E* p, int64_t n) {
  bool ok = true;
  for (int64_t i = 0; i < n; ++i) ok = ok && code_finite(p[i]);
  return ok;
}

// Whether none of n E4M3 codes is the NaN pattern (S.1111.111 | 0x80 == 0xff). Generic version; the
// x86 units define non-template overloads (an OR and a compare per 32 or 64 bytes).
template <class U>
static inline bool e4m3_nan_free(const U* p, int64_t n) {
  uint8_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad |= uint8_t((uint8_t(p[i]) | 0x80u) == 0xffu);
  return bad == 0;
}

// The same over rows [0, jn) x [0, D) of a tile (row stride ld): one run when the rows are contiguous.
static inline bool e4m3_tile_clean(const e4m3_t* x, int64_t ld, int64_t jn, int64_t D) {
  const uint8_t* u = reinterpret_cast<const uint8_t*>(x);
  if (ld == D) return e4m3_nan_free(u, jn * D);
  for (int64_t j = 0; j < jn; ++j)
    if (!e4m3_nan_free(u + j * ld, D)) return false;
  return true;
}

// The scale of key j of (b, g): Strided over (B, Hkv, Nk), float32.
static inline float kv_scale(const Strided& s, int64_t b, int64_t g, int64_t j) {
  return static_cast<const float*>(s.data)[b * s.s0 + g * s.s1 + j * s.s2];
}

// Dequantised rows [j0, j0 + jn) of a (b, g) slice of codes into buf (row stride ld_buf): value =
// code x scale in the compute type (code_unit x kUnit is the code, exactly): one rounding in
// float32, exact in float64 (a code has at most 8 significant bits, a scale 24).
template <class E, class C>
static inline void dequant_rows(const Strided& x, const Strided& s, int64_t b, int64_t g, int64_t j0, int64_t jn,
                                int64_t D, C* buf, int64_t ld_buf) {
  const E* base = static_cast<const E*>(x.data) + b * x.s0 + g * x.s1 + j0 * x.s2;
  for (int64_t jj = 0; jj < jn; ++jj) {
    const E* row = base + jj * x.s2;
    const C f = C(kv_scale(s, b, g, j0 + jj));
    C* dst = buf + jj * ld_buf;
    for (int64_t d = 0; d < D; ++d) dst[d] = C(code_unit(row[d]) * kUnit<E>) * f;
  }
}

// The format's dequantising copy of a tile of K or V (runtime format; the in-place reads are
// templates on the code type).
template <class C>
static inline void dequant_tile(KvFormat f, const Strided& x, const Strided& s, int64_t b, int64_t g, int64_t j0,
                                int64_t jn, int64_t D, C* buf, int64_t ld_buf) {
  switch (f) {
    case KvFormat::i8:
      return dequant_rows<i8_t, C>(x, s, b, g, j0, jn, D, buf, ld_buf);
    case KvFormat::e4m3:
      return dequant_rows<e4m3_t, C>(x, s, b, g, j0, jn, D, buf, ld_buf);
    default:
      return dequant_rows<e5m2_t, C>(x, s, b, g, j0, jn, D, buf, ld_buf);
  }
}

// Whether key j of (b, g) reads as finite numbers in K and V: its codes and its two scales.
template <class E>
static inline bool kv_key_finite_t(const Params& P, int64_t b, int64_t g, int64_t j) {
  const E* k = static_cast<const E*>(P.k.data) + b * P.k.s0 + g * P.k.s1 + j * P.k.s2;
  const E* v = static_cast<const E*>(P.v.data) + b * P.v.s0 + g * P.v.s1 + j * P.v.s2;
  return std::isfinite(kv_scale(P.k_scale, b, g, j)) && std::isfinite(kv_scale(P.v_scale, b, g, j)) &&
         codes_finite(k, P.Dk) && codes_finite(v, P.Dv);
}
static inline bool kv_key_finite(const Params& P, int64_t b, int64_t g, int64_t j) {
  switch (P.kv_format) {
    case KvFormat::i8:
      return kv_key_finite_t<i8_t>(P, b, g, j);
    case KvFormat::e4m3:
      return kv_key_finite_t<e4m3_t>(P, b, g, j);
    default:
      return kv_key_finite_t<e5m2_t>(P, b, g, j);
  }
}

}  // namespace QKV_NS
}  // namespace qkv_native
