// AVX2 + FMA + F16C path (compiled with -mavx2 -mfma -mf16c, used only if the CPU has all three).
// 16 lanes = two ymm registers for float (VF), four for double (VD).
#define QKV_NS avx2
#include <immintrin.h>

#include <cmath>

#include "exp2.hpp"
#include "params.hpp"

namespace qkv_native {
inline namespace QKV_NS {

struct VF {
  __m256 a, b;
};
struct MF {
  __m256 a, b;
};
struct VD {
  __m256d a, b, c, d;
};
struct MD {
  __m256d a, b, c, d;
};
// Register blocking: 6 rows x 2 ymm = 12 float accumulators; 3 rows x 4 ymm = 12 for double.
constexpr int NR_F = 6;
constexpr int NR_D = 3;
constexpr int kVecRegBytes = 16 * 32;  // ymm0-15

template <class V>
static inline V vzero();
template <class V, class S>
static inline V vset1(S x);
template <>
inline VF vzero<VF>() {
  return {_mm256_setzero_ps(), _mm256_setzero_ps()};
}
template <>
inline VF vset1<VF, float>(float x) {
  const __m256 v = _mm256_set1_ps(x);
  return {v, v};
}
template <>
inline VD vzero<VD>() {
  const __m256d z = _mm256_setzero_pd();
  return {z, z, z, z};
}
template <>
inline VD vset1<VD, double>(double x) {
  const __m256d v = _mm256_set1_pd(x);
  return {v, v, v, v};
}

static inline VF vload(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
static inline void vstore(float* p, VF x) {
  _mm256_storeu_ps(p, x.a);
  _mm256_storeu_ps(p + 8, x.b);
}
static inline VF vadd(VF x, VF y) { return {_mm256_add_ps(x.a, y.a), _mm256_add_ps(x.b, y.b)}; }
static inline VF vsub(VF x, VF y) { return {_mm256_sub_ps(x.a, y.a), _mm256_sub_ps(x.b, y.b)}; }
static inline VF vmul(VF x, VF y) { return {_mm256_mul_ps(x.a, y.a), _mm256_mul_ps(x.b, y.b)}; }
static inline VF vmax(VF x, VF y) { return {_mm256_max_ps(x.a, y.a), _mm256_max_ps(x.b, y.b)}; }
static inline VF vfma(VF x, VF y, VF z) { return {_mm256_fmadd_ps(x.a, y.a, z.a), _mm256_fmadd_ps(x.b, y.b, z.b)}; }
static inline MF vlt(VF x, VF y) { return {_mm256_cmp_ps(x.a, y.a, _CMP_LT_OQ), _mm256_cmp_ps(x.b, y.b, _CMP_LT_OQ)}; }
static inline MF vle(VF x, VF y) { return {_mm256_cmp_ps(x.a, y.a, _CMP_LE_OQ), _mm256_cmp_ps(x.b, y.b, _CMP_LE_OQ)}; }
static inline MF veq(VF x, VF y) { return {_mm256_cmp_ps(x.a, y.a, _CMP_EQ_OQ), _mm256_cmp_ps(x.b, y.b, _CMP_EQ_OQ)}; }
static inline MF vand(MF x, MF y) { return {_mm256_and_ps(x.a, y.a), _mm256_and_ps(x.b, y.b)}; }
static inline VF vsel(MF m, VF x, VF y) { return {_mm256_blendv_ps(y.a, x.a, m.a), _mm256_blendv_ps(y.b, x.b, m.b)}; }

// Decode (decode.hpp): lane j = the sum of z[j]'s 8 lanes, by a transposing tree (pairs
// interleaved and added at 32-bit, 64-bit, then 128-bit granularity); vsum16: the same over 16.
static inline __m256 vsum8(const __m256* z) {
  __m256 s1[4], s2[2];
  for (int i = 0; i < 4; ++i)
    s1[i] = _mm256_add_ps(_mm256_unpacklo_ps(z[2 * i], z[2 * i + 1]), _mm256_unpackhi_ps(z[2 * i], z[2 * i + 1]));
  for (int i = 0; i < 2; ++i) {
    const __m256d x = _mm256_castps_pd(s1[2 * i]), y = _mm256_castps_pd(s1[2 * i + 1]);
    s2[i] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(x, y)), _mm256_castpd_ps(_mm256_unpackhi_pd(x, y)));
  }
  return _mm256_add_ps(_mm256_permute2f128_ps(s2[0], s2[1], 0x20), _mm256_permute2f128_ps(s2[0], s2[1], 0x31));
}
static inline VF vsum16(const VF* a) {
  __m256 z[16];
  for (int i = 0; i < 16; ++i) z[i] = _mm256_add_ps(a[i].a, a[i].b);
  return {vsum8(z), vsum8(z + 8)};
}
// 16 bfloat16 / float16 values widened in registers (bf16 = the top half of a float32)
static inline __m256 bf16x8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
static inline VF vload_bf16(const uint16_t* p) { return {bf16x8(p), bf16x8(p + 8)}; }
static inline VF vload_f16(const uint16_t* p) {
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))};
}
// 16 codes of a quantized cache as their values / kUnit (quant.hpp), as simd_avx512.hpp's.
static inline VF vload_i8(const int8_t* p) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(x)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(x, 8)))};
}
static inline VF vload_e5m2(const uint8_t* p) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), z = _mm_setzero_si128();
  return {_mm256_cvtph_ps(_mm_unpacklo_epi8(z, x)), _mm256_cvtph_ps(_mm_unpackhi_epi8(z, x))};
}
static inline bool e4m3_nan_free(const uint8_t* p, int64_t n) {  // quant.hpp
  const __m256i top = _mm256_set1_epi8(char(0x80)), ones = _mm256_set1_epi8(char(0xff));
  __m256i bad = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    bad = _mm256_or_si256(
        bad,
        _mm256_cmpeq_epi8(_mm256_or_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)), top), ones));
  int tail = 0;
  for (; i < n; ++i) tail |= int((p[i] | 0x80u) == 0xffu);
  return !tail && _mm256_testz_si256(bad, bad);
}
static inline VF vload_e4m3(const uint8_t* p) {
  const __m256i h =
      _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 7),
                       _mm256_set1_epi16(short(0xbf80)));
  return {_mm256_cvtph_ps(_mm256_castsi256_si128(h)), _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1))};
}

// 2^x for 8 floats (exp2.hpp), 2^n by adding n to the exponent field. max / min return their
// second operand, x, when it is NaN.
static inline __m256 exp2_8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(kExp2Lo);
  const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_set1_ps(kExp2Hi), _mm256_max_ps(lo, x));
  const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 p = exp2_poly(
      _mm256_sub_ps(x, n), [](__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); },
      [](float c) { return _mm256_set1_ps(c); });
  const __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
  const __m256 r = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
  return _mm256_andnot_ps(under, r);
}
static inline VF vexp2(VF x) { return {exp2_8(x.a), exp2_8(x.b)}; }

static inline VD vload(const double* p) {
  return {_mm256_loadu_pd(p), _mm256_loadu_pd(p + 4), _mm256_loadu_pd(p + 8), _mm256_loadu_pd(p + 12)};
}
static inline void vstore(double* p, VD x) {
  _mm256_storeu_pd(p, x.a);
  _mm256_storeu_pd(p + 4, x.b);
  _mm256_storeu_pd(p + 8, x.c);
  _mm256_storeu_pd(p + 12, x.d);
}
#define QKV_D4(OP, x, y) {OP((x).a, (y).a), OP((x).b, (y).b), OP((x).c, (y).c), OP((x).d, (y).d)}
static inline VD vadd(VD x, VD y) { return QKV_D4(_mm256_add_pd, x, y); }
static inline VD vsub(VD x, VD y) { return QKV_D4(_mm256_sub_pd, x, y); }
static inline VD vmul(VD x, VD y) { return QKV_D4(_mm256_mul_pd, x, y); }
static inline VD vmax(VD x, VD y) { return QKV_D4(_mm256_max_pd, x, y); }
static inline VD vfma(VD x, VD y, VD z) {
  return {_mm256_fmadd_pd(x.a, y.a, z.a), _mm256_fmadd_pd(x.b, y.b, z.b), _mm256_fmadd_pd(x.c, y.c, z.c),
          _mm256_fmadd_pd(x.d, y.d, z.d)};
}
#define QKV_CMP_LT(x, y) _mm256_cmp_pd(x, y, _CMP_LT_OQ)
#define QKV_CMP_LE(x, y) _mm256_cmp_pd(x, y, _CMP_LE_OQ)
#define QKV_CMP_EQ(x, y) _mm256_cmp_pd(x, y, _CMP_EQ_OQ)
static inline MD vlt(VD x, VD y) { return QKV_D4(QKV_CMP_LT, x, y); }
static inline MD vle(VD x, VD y) { return QKV_D4(QKV_CMP_LE, x, y); }
static inline MD veq(VD x, VD y) { return QKV_D4(QKV_CMP_EQ, x, y); }
static inline MD vand(MD x, MD y) { return QKV_D4(_mm256_and_pd, x, y); }
static inline VD vsel(MD m, VD x, VD y) {
  return {_mm256_blendv_pd(y.a, x.a, m.a), _mm256_blendv_pd(y.b, x.b, m.b), _mm256_blendv_pd(y.c, x.c, m.c),
          _mm256_blendv_pd(y.d, x.d, m.d)};
}
#undef QKV_CMP_LT
#undef QKV_CMP_LE
#undef QKV_CMP_EQ
#undef QKV_D4
// float64 path: correctness over speed, libm's exp2 per lane
static inline VD vexp2(VD x) {
  alignas(64) double t[16];
  vstore(t, x);
  for (int i = 0; i < 16; ++i) t[i] = std::exp2(t[i]);
  return vload(t);
}

static inline void cvt_f16_row(const uint16_t* s, float* d, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
  for (; i < n; ++i) d[i] = _cvtsh_ss(s[i]);
}

}  // namespace QKV_NS
}  // namespace qkv_native

#include "kernels_impl.hpp"

namespace qkv_native {
extern const KernelTable kTableAvx2 = {"avx2", &avx2::forward_entry, &avx2::backward_entry, &avx2::microbench};
}
