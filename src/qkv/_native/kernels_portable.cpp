// Portable path: plain C++ (no intrinsics), compiles anywhere (arm64 included). 16 lanes as
// fixed-size arrays; the compiler vectorises the loops with whatever the baseline ISA has (SSE2 on
// x86-64, NEON on arm64). It is also the reference the SIMD paths are tested against.
#define QKV_NS portable
#define QKV_DECODE_ONE_CHUNK  // decode.hpp: the reference path keeps the build short
#include <cmath>
#include <cstdint>

#include "params.hpp"

namespace qkv_native {
inline namespace QKV_NS {

struct VF {
  float v[16];
};
struct VD {
  double v[16];
};
struct MF {
  bool v[16];
};
struct MD {
  bool v[16];
};
constexpr int NR_F = 4;
constexpr int NR_D = 2;
constexpr int kVecRegBytes = 16 * 16;  // xmm0-15 of baseline x86-64; aarch64 has more, unused here

#define QKV_LANES for (int i = 0; i < 16; ++i)
template <class V>
static inline V vzero();
template <class V, class S>
static inline V vset1(S x);
template <>
inline VF vzero<VF>() {
  VF r;
  QKV_LANES r.v[i] = 0.0f;
  return r;
}
template <>
inline VD vzero<VD>() {
  VD r;
  QKV_LANES r.v[i] = 0.0;
  return r;
}
template <>
inline VF vset1<VF, float>(float x) {
  VF r;
  QKV_LANES r.v[i] = x;
  return r;
}
template <>
inline VD vset1<VD, double>(double x) {
  VD r;
  QKV_LANES r.v[i] = x;
  return r;
}

// NOLINTBEGIN(bugprone-macro-parentheses): V, M and S are type names (no parentheses there)
// x * y + z rounded once, as the SIMD paths' FMA rounds it: two floats' product is exact in double,
// so the float sum is rounded from it (twice, double then float; a tie between them is the only
// case it can differ from a fused one). Rounded twice in float (the baseline x86-64 has no FMA), a
// score summed over Dk = 256 features measured 2-3x the SIMD paths' error, and the gradients of
// nearly one-hot rows up to 6.5x torch's float32 error (tests/test_accumulation.py).
static inline float fused(float x, float y, float z) { return float(double(x) * double(y) + double(z)); }
static inline double fused(double x, double y, double z) { return x * y + z; }

#define QKV_VOPS(V, M, S)                                           \
  static inline V vload(const S* p) {                               \
    V r;                                                            \
    QKV_LANES r.v[i] = p[i];                                        \
    return r;                                                       \
  }                                                                 \
  static inline void vstore(S* p, V x) { QKV_LANES p[i] = x.v[i]; } \
  static inline V vadd(V x, V y) {                                  \
    V r;                                                            \
    QKV_LANES r.v[i] = x.v[i] + y.v[i];                             \
    return r;                                                       \
  }                                                                 \
  static inline V vsub(V x, V y) {                                  \
    V r;                                                            \
    QKV_LANES r.v[i] = x.v[i] - y.v[i];                             \
    return r;                                                       \
  }                                                                 \
  static inline V vmul(V x, V y) {                                  \
    V r;                                                            \
    QKV_LANES r.v[i] = x.v[i] * y.v[i];                             \
    return r;                                                       \
  }                                                                 \
  static inline V vmax(V x, V y) {                                  \
    V r;                                                            \
    QKV_LANES r.v[i] = x.v[i] > y.v[i] ? x.v[i] : y.v[i];           \
    return r;                                                       \
  }                                                                 \
  static inline V vfma(V x, V y, V z) {                             \
    V r;                                                            \
    QKV_LANES r.v[i] = fused(x.v[i], y.v[i], z.v[i]);               \
    return r;                                                       \
  }                                                                 \
  static inline M vlt(V x, V y) {                                   \
    M r;                                                            \
    QKV_LANES r.v[i] = x.v[i] < y.v[i];                             \
    return r;                                                       \
  }                                                                 \
  static inline M vle(V x, V y) {                                   \
    M r;                                                            \
    QKV_LANES r.v[i] = x.v[i] <= y.v[i];                            \
    return r;                                                       \
  }                                                                 \
  static inline M veq(V x, V y) {                                   \
    M r;                                                            \
    QKV_LANES r.v[i] = x.v[i] == y.v[i];                            \
    return r;                                                       \
  }                                                                 \
  static inline M vand(M x, M y) {                                  \
    M r;                                                            \
    QKV_LANES r.v[i] = x.v[i] && y.v[i];                            \
    return r;                                                       \
  }                                                                 \
  static inline V vsel(M m, V x, V y) {                             \
    V r;                                                            \
    QKV_LANES r.v[i] = m.v[i] ? x.v[i] : y.v[i];                    \
    return r;                                                       \
  }                                                                 \
  static inline V vexp2(V x) {                                      \
    V r;                                                            \
    QKV_LANES r.v[i] = std::exp2(x.v[i]);                           \
    return r;                                                       \
  }
QKV_VOPS(VF, MF, float)
QKV_VOPS(VD, MD, double)
#undef QKV_VOPS
// NOLINTEND(bugprone-macro-parentheses)
#undef QKV_LANES

}  // namespace QKV_NS
}  // namespace qkv_native

#include "dtypes.hpp"

namespace qkv_native {
inline namespace QKV_NS {
static inline void cvt_f16_row(const uint16_t* s, float* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = half_to_float(s[i]);
}
}  // namespace QKV_NS
}  // namespace qkv_native

#include "kernels_impl.hpp"

namespace qkv_native {
extern const KernelTable kTablePortable = {"portable", &portable::forward_entry, &portable::backward_entry,
                                           &portable::microbench};
}
