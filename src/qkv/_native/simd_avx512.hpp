// The AVX-512 F/BW/DQ/VL vector types and operations of microkernel.hpp and the tile loops, shared
// by kernels_avx512.cpp and kernels_avx512bf16.cpp (each includes it inside its own QKV_NS).
// 16 lanes = one zmm for float, two for double; masks are k-registers.
#pragma once
#include <immintrin.h>

#include <cmath>

#include "exp2.hpp"
#include "params.hpp"

namespace qkv_native {
inline namespace QKV_NS {

struct VF {
  __m512 a;
};
struct MF {
  __mmask16 a;
};
struct VD {
  __m512d a, b;
};
struct MD {
  __mmask8 a, b;
};
// 12 rows x 1 zmm = 12 float accumulators (the broadcast folds into the FMA as {1to16});
// 6 rows x 2 zmm = 12 for double.
constexpr int NR_F = 12;
constexpr int NR_D = 6;
constexpr int kVecRegBytes = 32 * 64;  // zmm0-31

template <class V>
static inline V vzero();
template <class V, class S>
static inline V vset1(S x);
template <>
inline VF vzero<VF>() {
  return {_mm512_setzero_ps()};
}
template <>
inline VF vset1<VF, float>(float x) {
  return {_mm512_set1_ps(x)};
}
template <>
inline VD vzero<VD>() {
  return {_mm512_setzero_pd(), _mm512_setzero_pd()};
}
template <>
inline VD vset1<VD, double>(double x) {
  const __m512d v = _mm512_set1_pd(x);
  return {v, v};
}

static inline VF vload(const float* p) { return {_mm512_loadu_ps(p)}; }
static inline void vstore(float* p, VF x) { _mm512_storeu_ps(p, x.a); }
static inline VF vadd(VF x, VF y) { return {_mm512_add_ps(x.a, y.a)}; }
static inline VF vsub(VF x, VF y) { return {_mm512_sub_ps(x.a, y.a)}; }
static inline VF vmul(VF x, VF y) { return {_mm512_mul_ps(x.a, y.a)}; }
static inline VF vmax(VF x, VF y) { return {_mm512_max_ps(x.a, y.a)}; }
static inline VF vfma(VF x, VF y, VF z) { return {_mm512_fmadd_ps(x.a, y.a, z.a)}; }
static inline MF vlt(VF x, VF y) { return {_mm512_cmp_ps_mask(x.a, y.a, _CMP_LT_OQ)}; }
static inline MF vle(VF x, VF y) { return {_mm512_cmp_ps_mask(x.a, y.a, _CMP_LE_OQ)}; }
static inline MF veq(VF x, VF y) { return {_mm512_cmp_ps_mask(x.a, y.a, _CMP_EQ_OQ)}; }
static inline MF vand(MF x, MF y) { return {__mmask16(x.a & y.a)}; }
static inline VF vsel(MF m, VF x, VF y) { return {_mm512_mask_blend_ps(m.a, y.a, x.a)}; }

// Decode (decode.hpp): lane j = the sum of a[j]'s 16 lanes, by a transposing tree (pairs of
// vectors interleaved and added at 32-bit, 64-bit, then twice at 128-bit granularity): 15 adds
// and 30 shuffles for 16 sums.
static inline VF vsum16(const VF* a) {
  __m512 s1[8], s2[4];
  for (int i = 0; i < 8; ++i)
    s1[i] =
        _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i].a, a[2 * i + 1].a), _mm512_unpackhi_ps(a[2 * i].a, a[2 * i + 1].a));
  for (int i = 0; i < 4; ++i) {
    const __m512d x = _mm512_castps_pd(s1[2 * i]), y = _mm512_castps_pd(s1[2 * i + 1]);
    s2[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  const __m512 t0 = _mm512_add_ps(_mm512_shuffle_f32x4(s2[0], s2[1], 0x88), _mm512_shuffle_f32x4(s2[0], s2[1], 0xdd));
  const __m512 t1 = _mm512_add_ps(_mm512_shuffle_f32x4(s2[2], s2[3], 0x88), _mm512_shuffle_f32x4(s2[2], s2[3], 0xdd));
  return {_mm512_add_ps(_mm512_shuffle_f32x4(t0, t1, 0x88), _mm512_shuffle_f32x4(t0, t1, 0xdd))};
}
// 16 bfloat16 / float16 values widened in registers (bf16 = the top half of a float32)
static inline VF vload_bf16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))};
}
static inline VF vload_f16(const uint16_t* p) {
  return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
}
// 16 codes of a quantized cache as their values / kUnit (quant.hpp): int8 sign-extended and
// converted; E5M2 as the high byte of a float16; E4M3's magnitude bits shifted into a float16
// (sign-extended bytes << 7 leave the sign in bits 14 and 15: the mask keeps bit 15).
static inline VF vload_i8(const int8_t* p) {
  return {_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))))};
}
static inline VF vload_e5m2(const uint8_t* p) {
  // the 16 bytes in both 128-bit lanes (a broadcast load), each moved to the high byte of its
  // word by one in-lane shuffle (zero low bytes): one operation fewer than a widening and a shift
  const __m256i x = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256i to_high = _mm256_setr_epi8(-128, 0, -128, 1, -128, 2, -128, 3, -128, 4, -128, 5, -128, 6, -128, 7, -128,
                                           8, -128, 9, -128, 10, -128, 11, -128, 12, -128, 13, -128, 14, -128, 15);
  return {_mm512_cvtph_ps(_mm256_shuffle_epi8(x, to_high))};
}
static inline bool e4m3_nan_free(const uint8_t* p, int64_t n) {  // quant.hpp
  const __m512i top = _mm512_set1_epi8(char(0x80)), ones = _mm512_set1_epi8(char(0xff));
  __mmask64 bad = 0;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) bad |= _mm512_cmpeq_epi8_mask(_mm512_or_si512(_mm512_loadu_si512(p + i), top), ones);
  if (i < n) {
    const __mmask64 m = __mmask64(~uint64_t(0) >> (64 - (n - i)));
    bad |= _mm512_mask_cmpeq_epi8_mask(m, _mm512_or_si512(_mm512_maskz_loadu_epi8(m, p + i), top), ones);
  }
  return bad == 0;
}
static inline VF vload_e4m3(const uint8_t* p) {
  const __m256i h = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return {_mm512_cvtph_ps(_mm256_and_si256(_mm256_slli_epi16(h, 7), _mm256_set1_epi16(short(0xbf80))))};
}
#ifdef __AVX512BF16__
// The unit built with AVX512-BF16 (kernels_avx512bf16.cpp): decode's scores of a bfloat16 cache
// against bfloat16 q as vdpbf16ps over pairs along Dk (decode.hpp, dec_scores_b16).
#define QKV_DECODE_BF16_DOT 1
using VB = __m512i;  // 32 bf16
static inline VB vload_b32(const uint16_t* p) { return _mm512_loadu_si512(p); }
static inline VF vdot_b32(VF acc, VB a, VB b) {
  return {_mm512_dpbf16_ps(acc.a, reinterpret_cast<__m512bh>(a), reinterpret_cast<__m512bh>(b))};
}
#endif

// 2^x (exp2.hpp), with scalef for the 2^n factor. The compare is unordered-true and max / min
// return their second operand, x, when it is NaN.
static inline VF vexp2(VF v) {
  const __m512 lo = _mm512_set1_ps(kExp2Lo);
  const __mmask16 ok = _mm512_cmp_ps_mask(v.a, lo, _CMP_NLT_UQ);
  const __m512 x = _mm512_min_ps(_mm512_set1_ps(kExp2Hi), _mm512_max_ps(lo, v.a));
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 p = exp2_poly(
      _mm512_sub_ps(x, n), [](__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); },
      [](float c) { return _mm512_set1_ps(c); });
  return {_mm512_maskz_scalef_ps(ok, p, n)};
}

static inline VD vload(const double* p) { return {_mm512_loadu_pd(p), _mm512_loadu_pd(p + 8)}; }
static inline void vstore(double* p, VD x) {
  _mm512_storeu_pd(p, x.a);
  _mm512_storeu_pd(p + 8, x.b);
}
static inline VD vadd(VD x, VD y) { return {_mm512_add_pd(x.a, y.a), _mm512_add_pd(x.b, y.b)}; }
static inline VD vsub(VD x, VD y) { return {_mm512_sub_pd(x.a, y.a), _mm512_sub_pd(x.b, y.b)}; }
static inline VD vmul(VD x, VD y) { return {_mm512_mul_pd(x.a, y.a), _mm512_mul_pd(x.b, y.b)}; }
static inline VD vmax(VD x, VD y) { return {_mm512_max_pd(x.a, y.a), _mm512_max_pd(x.b, y.b)}; }
static inline VD vfma(VD x, VD y, VD z) { return {_mm512_fmadd_pd(x.a, y.a, z.a), _mm512_fmadd_pd(x.b, y.b, z.b)}; }
static inline MD vlt(VD x, VD y) {
  return {_mm512_cmp_pd_mask(x.a, y.a, _CMP_LT_OQ), _mm512_cmp_pd_mask(x.b, y.b, _CMP_LT_OQ)};
}
static inline MD vle(VD x, VD y) {
  return {_mm512_cmp_pd_mask(x.a, y.a, _CMP_LE_OQ), _mm512_cmp_pd_mask(x.b, y.b, _CMP_LE_OQ)};
}
static inline MD veq(VD x, VD y) {
  return {_mm512_cmp_pd_mask(x.a, y.a, _CMP_EQ_OQ), _mm512_cmp_pd_mask(x.b, y.b, _CMP_EQ_OQ)};
}
static inline MD vand(MD x, MD y) { return {__mmask8(x.a & y.a), __mmask8(x.b & y.b)}; }
static inline VD vsel(MD m, VD x, VD y) {
  return {_mm512_mask_blend_pd(m.a, y.a, x.a), _mm512_mask_blend_pd(m.b, y.b, x.b)};
}
static inline VD vexp2(VD x) {  // float64: correctness over speed
  alignas(64) double t[16];
  vstore(t, x);
  for (int i = 0; i < 16; ++i) t[i] = std::exp2(t[i]);
  return vload(t);
}

static inline void cvt_f16_row(const uint16_t* s, float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i))));
  for (; i < n; ++i) d[i] = _cvtsh_ss(s[i]);
}

}  // namespace QKV_NS
}  // namespace qkv_native
