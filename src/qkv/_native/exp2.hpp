// The float32 exp2 of every vector path (kernels_avx2.cpp, simd_avx512.hpp, kernels_neon.cpp),
// written once over the path's vector type: x = n + f with n = round(x), |f| <= 1/2; 2^f by a
// degree-6 polynomial fitted for relative error on [-1/2, 1/2] (max 1.7e-8 in float64 evaluation,
// below float32 rounding); each path scales by 2^n its own way (an add to the exponent field, or
// scalef). x is first clamped to [kExp2Lo, kExp2Hi]: below kExp2Lo (-inf included, the masked
// scores) the path returns exactly 0, never a denormal; NaN stays NaN, for finite.hpp reads a NaN
// row sum (each path's max / min return x when it is NaN).
#pragma once

namespace qkv_native {

constexpr float kExp2Lo = -125.0f, kExp2Hi = 127.0f;

// The polynomial's coefficients, highest degree first (Horner's order).
constexpr float kExp2Poly[] = {0.00015332507609855384f,
                               0.0013394701527431607f,
                               0.009618490934371948f,
                               0.055503424257040024f,
                               0.24022647738456726f,
                               0.6931471824645996f,
                               1.0f};

// 2^f for |f| <= 1/2 on a vector type V: fma(a, b, c) = a b + c, set1(x) a vector of x.
template <class V, class Fma, class Set1>
static inline V exp2_poly(V f, Fma fma, Set1 set1) {
  V p = set1(kExp2Poly[0]);
#pragma GCC unroll 8
  for (int i = 1; i < int(sizeof(kExp2Poly) / sizeof(float)); ++i) p = fma(p, f, set1(kExp2Poly[i]));
  return p;
}

}  // namespace qkv_native
