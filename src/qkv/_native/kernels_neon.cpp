// NEON path (AArch64: Advanced SIMD is part of the base ISA, so no -m flag and no runtime check).
// 16 lanes = four q registers for float (VF), eight for double (VD). Built on aarch64 only;
// tested by scripts/test-aarch64 (cross-compiled, run under qemu-aarch64: correctness only).
#define QKV_NS neon
#include <arm_neon.h>

#include <cmath>

#include "exp2.hpp"
#include "params.hpp"

namespace qkv_native {
inline namespace QKV_NS {

struct VF {
  float32x4_t a, b, c, d;
};
struct MF {
  uint32x4_t a, b, c, d;
};
struct VD {
  float64x2_t v[8];
};
struct MD {
  uint64x2_t v[8];
};
// AArch64 has 32 q registers. fmla's by-element form takes each A element from a register of
// its own, so a row costs 4 accumulators + 1: 5 rows x 5 + 4 for the B row = 29 (6 rows spilled 3
// accumulators to the stack in gcc 12's code); double: 2 rows x (8 + 1) + 8 = 26.
constexpr int NR_F = 5;
constexpr int NR_D = 2;
constexpr int kVecRegBytes = 32 * 16;  // v0-v31

template <class V>
static inline V vzero();
template <class V, class S>
static inline V vset1(S x);
template <>
inline VF vzero<VF>() {
  const float32x4_t z = vdupq_n_f32(0.0f);
  return {z, z, z, z};
}
template <>
inline VF vset1<VF, float>(float x) {
  const float32x4_t v = vdupq_n_f32(x);
  return {v, v, v, v};
}

#define QKV_F4(OP, x, y) {OP((x).a, (y).a), OP((x).b, (y).b), OP((x).c, (y).c), OP((x).d, (y).d)}
static inline VF vload(const float* p) { return {vld1q_f32(p), vld1q_f32(p + 4), vld1q_f32(p + 8), vld1q_f32(p + 12)}; }
static inline void vstore(float* p, VF x) {
  vst1q_f32(p, x.a);
  vst1q_f32(p + 4, x.b);
  vst1q_f32(p + 8, x.c);
  vst1q_f32(p + 12, x.d);
}
static inline VF vadd(VF x, VF y) { return QKV_F4(vaddq_f32, x, y); }
static inline VF vsub(VF x, VF y) { return QKV_F4(vsubq_f32, x, y); }
static inline VF vmul(VF x, VF y) { return QKV_F4(vmulq_f32, x, y); }
// x > y ? x : y, as x86's maxps and the portable path: y when either is NaN (fmax would always
// return the NaN, fmaxnm the number; the tile loops are written for the x86 rule, finite.hpp).
static inline float32x4_t max4(float32x4_t x, float32x4_t y) { return vbslq_f32(vcgtq_f32(x, y), x, y); }
static inline VF vmax(VF x, VF y) { return QKV_F4(max4, x, y); }
// x * y + z, fused (vfmaq_f32(z, x, y) = z + x * y)
static inline VF vfma(VF x, VF y, VF z) {
  return {vfmaq_f32(z.a, x.a, y.a), vfmaq_f32(z.b, x.b, y.b), vfmaq_f32(z.c, x.c, y.c), vfmaq_f32(z.d, x.d, y.d)};
}
static inline MF vlt(VF x, VF y) { return QKV_F4(vcltq_f32, x, y); }
static inline MF vle(VF x, VF y) { return QKV_F4(vcleq_f32, x, y); }
static inline MF veq(VF x, VF y) { return QKV_F4(vceqq_f32, x, y); }
static inline MF vand(MF x, MF y) { return QKV_F4(vandq_u32, x, y); }
static inline VF vsel(MF m, VF x, VF y) {
  return {vbslq_f32(m.a, x.a, y.a), vbslq_f32(m.b, x.b, y.b), vbslq_f32(m.c, x.c, y.c), vbslq_f32(m.d, x.d, y.d)};
}
#undef QKV_F4

// 2^x for 4 floats (exp2.hpp), 2^n added to the exponent field. NaN stays NaN (fmax / fmin
// return it, n converts to 0).
static inline float32x4_t exp2_4(float32x4_t x) {
  const float32x4_t lo = vdupq_n_f32(kExp2Lo);
  const uint32x4_t under = vcltq_f32(x, lo);
  x = vminq_f32(vdupq_n_f32(kExp2Hi), vmaxq_f32(lo, x));
  const float32x4_t n = vrndnq_f32(x);  // to nearest, ties to even, as _mm256_round_ps
  const float32x4_t p = exp2_poly(
      vsubq_f32(x, n), [](float32x4_t a, float32x4_t b, float32x4_t c) { return vfmaq_f32(c, a, b); },
      [](float c) { return vdupq_n_f32(c); });
  const int32x4_t e = vshlq_n_s32(vcvtq_s32_f32(n), 23);  // n is integral: truncation is exact
  const uint32x4_t r = vreinterpretq_u32_s32(vaddq_s32(vreinterpretq_s32_f32(p), e));
  return vreinterpretq_f32_u32(vbicq_u32(r, under));
}
static inline VF vexp2(VF x) { return {exp2_4(x.a), exp2_4(x.b), exp2_4(x.c), exp2_4(x.d)}; }

// ------------------------------------------------------------------ float64: 8 x float64x2_t

#define QKV_D8(EXPR)                           \
  VD r;                                        \
  for (int i = 0; i < 8; ++i) r.v[i] = (EXPR); \
  return r
#define QKV_M8(EXPR)                           \
  MD r;                                        \
  for (int i = 0; i < 8; ++i) r.v[i] = (EXPR); \
  return r
template <>
inline VD vzero<VD>() {
  QKV_D8(vdupq_n_f64(0.0));
}
template <>
inline VD vset1<VD, double>(double x) {
  QKV_D8(vdupq_n_f64(x));
}
static inline VD vload(const double* p) { QKV_D8(vld1q_f64(p + 2 * i)); }
static inline void vstore(double* p, VD x) {
  for (int i = 0; i < 8; ++i) vst1q_f64(p + 2 * i, x.v[i]);
}
static inline VD vadd(VD x, VD y) { QKV_D8(vaddq_f64(x.v[i], y.v[i])); }
static inline VD vsub(VD x, VD y) { QKV_D8(vsubq_f64(x.v[i], y.v[i])); }
static inline VD vmul(VD x, VD y) { QKV_D8(vmulq_f64(x.v[i], y.v[i])); }
static inline VD vmax(VD x, VD y) { QKV_D8(vbslq_f64(vcgtq_f64(x.v[i], y.v[i]), x.v[i], y.v[i])); }
static inline VD vfma(VD x, VD y, VD z) { QKV_D8(vfmaq_f64(z.v[i], x.v[i], y.v[i])); }
static inline MD vlt(VD x, VD y) { QKV_M8(vcltq_f64(x.v[i], y.v[i])); }
static inline MD vle(VD x, VD y) { QKV_M8(vcleq_f64(x.v[i], y.v[i])); }
static inline MD veq(VD x, VD y) { QKV_M8(vceqq_f64(x.v[i], y.v[i])); }
static inline MD vand(MD x, MD y) { QKV_M8(vandq_u64(x.v[i], y.v[i])); }
static inline VD vsel(MD m, VD x, VD y) { QKV_D8(vbslq_f64(m.v[i], x.v[i], y.v[i])); }
#undef QKV_D8
#undef QKV_M8
// float64 path: correctness over speed, libm's exp2 per lane (as the x86 paths)
static inline VD vexp2(VD x) {
  alignas(64) double t[16];
  vstore(t, x);
  for (int i = 0; i < 16; ++i) t[i] = std::exp2(t[i]);
  return vload(t);
}

// float16 -> float32: FCVTL is base AArch64 (no FP16 arithmetic extension needed)
static inline void cvt_f16_row(const uint16_t* s, float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(d + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(s + i))));
  for (; i < n; ++i) {
    const float16x4_t h = vreinterpret_f16_u16(vdup_n_u16(s[i]));
    d[i] = vgetq_lane_f32(vcvt_f32_f16(h), 0);
  }
}

// 16 codes of a quantized cache as their values / kUnit (quant.hpp): int8 widened and converted;
// E5M2 as the high byte of a float16 (SHLL by 8); E4M3's magnitude bits shifted into a float16
// (sign-extended bytes << 7 leave the sign in bits 14 and 15: the mask keeps bit 15).
static inline float32x4_t f16x4(uint16x4_t h) { return vcvt_f32_f16(vreinterpret_f16_u16(h)); }
static inline VF vload_i8(const int8_t* p) {
  const int8x16_t x = vld1q_s8(p);
  const int16x8_t lo = vmovl_s8(vget_low_s8(x)), hi = vmovl_high_s8(x);
  return {vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), vcvtq_f32_s32(vmovl_high_s16(lo)),
          vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), vcvtq_f32_s32(vmovl_high_s16(hi))};
}
static inline VF vload_e5m2(const uint8_t* p) {
  const uint8x16_t x = vld1q_u8(p);
  const uint16x8_t lo = vshll_n_u8(vget_low_u8(x), 8), hi = vshll_high_n_u8(x, 8);
  return {f16x4(vget_low_u16(lo)), f16x4(vget_high_u16(lo)), f16x4(vget_low_u16(hi)), f16x4(vget_high_u16(hi))};
}
static inline VF vload_e4m3(const uint8_t* p) {
  const int8x16_t x = vreinterpretq_s8_u8(vld1q_u8(p));
  const uint16x8_t m = vdupq_n_u16(0xbf80u);
  const uint16x8_t lo = vandq_u16(vreinterpretq_u16_s16(vshlq_n_s16(vmovl_s8(vget_low_s8(x)), 7)), m);
  const uint16x8_t hi = vandq_u16(vreinterpretq_u16_s16(vshlq_n_s16(vmovl_high_s8(x), 7)), m);
  return {f16x4(vget_low_u16(lo)), f16x4(vget_high_u16(lo)), f16x4(vget_low_u16(hi)), f16x4(vget_high_u16(hi))};
}

}  // namespace QKV_NS
}  // namespace qkv_native

#include "kernels_impl.hpp"

namespace qkv_native {
extern const KernelTable kTableNeon = {"neon", &neon::forward_entry, &neon::backward_entry, &neon::microbench};
}
