// The one register-blocked micro-kernel behind all seven matmuls of the forward and backward pass.
//
//   C[m][0..15] (= or +=) sum_{r < R} A[m*sam + r*sar] * B[r*ldb + 0..15],   m in [0, M)
//
// One element of A is broadcast, one 16-wide row of B is loaded, NR rows of C stay in registers
// for the whole reduction (NR = 6 for AVX2: 6 x 2 ymm = 12 accumulators, enough independent FMAs
// to cover the 4-cycle FMA latency on two FMA ports, leaving 4 registers for loads/broadcasts).
// The strides (sam, sar) pick the operand layout:
//   S^T = K Q^T     m = key, r = d:   A = K tile (sam = ldk, sar = 1),  B = Q^T [Dk][16]
//   O^T += V^T P^T  m = d,   r = key: A = V tile (sam = 1, sar = ldv),  B = P^T [BK][16]
//   dV += P^T dO    m = key, r = query (lanes over Dv): A = P^T, B = dO rows
// which is why the scores are kept transposed (keys x 16 queries): the softmax statistics of the
// 16 queries are then plain vertical vector operations.
// Expects, from the including kernels_<isa>.cpp: vector types VF / VD (16 float / double lanes),
// with vzero, vset1, vload, vstore, vfma and NR_F / NR_D.
#pragma once
#include "params.hpp"

namespace qkv_native {
inline namespace QKV_NS {

template <class C> struct VecOf;
template <> struct VecOf<float> { using V = VF; static constexpr int NR = NR_F; };
template <> struct VecOf<double> { using V = VD; static constexpr int NR = NR_D; };

template <class V, int NRm, bool ACC, class C>
static inline __attribute__((always_inline)) void mk_block(C* __restrict Cp, int64_t ldc, const C* __restrict A,
                                                           int64_t sam, int64_t sar, const C* __restrict Bp,
                                                           int64_t ldb, int64_t R) {
  V acc[NRm];
#pragma GCC unroll 16
  for (int m = 0; m < NRm; ++m) acc[m] = ACC ? vload(Cp + m * ldc) : vzero<V>();
  for (int64_t r = 0; r < R; ++r) {
    const V b = vload(Bp + r * ldb);
    const C* a = A + r * sar;
#pragma GCC unroll 16
    for (int m = 0; m < NRm; ++m) acc[m] = vfma(vset1<V>(a[m * sam]), b, acc[m]);
  }
#pragma GCC unroll 16
  for (int m = 0; m < NRm; ++m) vstore(Cp + m * ldc, acc[m]);
}

template <class V, int K, bool ACC, class C>
static inline void mk_tail(int rem, C* Cp, int64_t ldc, const C* A, int64_t sam, int64_t sar, const C* Bp,
                           int64_t ldb, int64_t R) {
  if constexpr (K >= 1) {
    if (rem == K) { mk_block<V, K, ACC>(Cp, ldc, A, sam, sar, Bp, ldb, R); return; }
    mk_tail<V, K - 1, ACC>(rem, Cp, ldc, A, sam, sar, Bp, ldb, R);
  }
}

template <bool ACC, class C>
static void gemm16(C* Cp, int64_t ldc, const C* A, int64_t sam, int64_t sar, const C* Bp, int64_t ldb,
                   int64_t M, int64_t R) {
  using V = typename VecOf<C>::V;
  constexpr int NR = VecOf<C>::NR;
  int64_t m = 0;
  for (; m + NR <= M; m += NR) mk_block<V, NR, ACC>(Cp + m * ldc, ldc, A + m * sam, sam, sar, Bp, ldb, R);
  if (m < M) mk_tail<V, NR - 1, ACC>(int(M - m), Cp + m * ldc, ldc, A + m * sam, sam, sar, Bp, ldb, R);
}

// acc = acc * alpha + t over n vectors, compensated (Kahan, with the carry comp rescaled along):
// each gemm16 above sums one tile (at most BK keys or 64 query rows) from zero, and the tiles meet
// here, so over N keys a float32 result errs by ~the error of one tile's sum instead of growing with
// N / BK (a plain running sum of 2^24 equal keys with v = 3 returned 3.667). Needs IEEE order
// (no -ffast-math, which CMakeLists.txt never sets).
template <class V, class C>
static inline void add_tile(C* __restrict acc, C* __restrict comp, const C* __restrict t, int64_t n, V alpha) {
  for (int64_t i = 0; i < n; ++i) {
    const V a = vmul(vload(acc + i * kLanes), alpha);
    const V y = vsub(vload(t + i * kLanes), vmul(vload(comp + i * kLanes), alpha));
    const V s = vadd(a, y);
    vstore(comp + i * kLanes, vsub(vsub(s, a), y));
    vstore(acc + i * kLanes, s);
  }
}

}  // namespace QKV_NS
}  // namespace qkv_native
