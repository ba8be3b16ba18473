// The one register-blocked micro-kernel behind all seven matmuls of the forward and backward pass.
//
//   C[m][0..15] (=, += or compensated C alpha +) sum_{r < R} A[m*sam + r*sar] * B[r*ldb + 0..15],   m in [0, M)
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
// with vzero, vset1, vload, vstore, vfma, NR_F / NR_D and kVecRegBytes (the vector register file).
#pragma once
#include "params.hpp"

namespace qkv_native {
inline namespace QKV_NS {

template <class C>
struct VecOf;
template <>
struct VecOf<float> {
  using V = VF;
  static constexpr int NR = NR_F;
};
template <>
struct VecOf<double> {
  using V = VD;
  static constexpr int NR = NR_D;
};

// What a block does with its sums: STORE (C =), ACC (C +=), or KAHAN: C = C alpha + sum, compensated,
// the carry in K (same layout as C) rescaled along; alpha is one vector for every row m, or the
// scalar am[m] per row when am is given. A block's sum starts from zero, so a long reduction done
// as tiles meeting here errs like one tile's sum instead of growing with the number of tiles (a
// plain running sum of 2^24 equal keys with v = 3 returned 3.667). Needs IEEE order (no
// -ffast-math, which CMakeLists.txt never sets).
enum MkMode { STORE, ACC, KAHAN };

template <class V, class C>
static inline __attribute__((always_inline)) void kahan_add(C* __restrict c, C* __restrict k, V t, V alpha) {
  const V a = vmul(vload(c), alpha);
  const V y = vsub(t, vmul(vload(k), alpha));
  const V s = vadd(a, y);
  vstore(k, vsub(vsub(s, a), y));
  vstore(c, s);
}

// Reductions of more than kChain terms (STORE, ACC) are summed in chains of kChain, each added to C
// in turn: a two-level sum, whose rounding grows as ~kChain + n / kChain instead of one chain's ~n
// over the reduction (Higham, "Accuracy and Stability of Numerical Algorithms", ch. 4). torch's
// float32 matmul splits its reductions too: one chain over Dk = 59 features measured 1.7x its RMS
// score error (Dk = 256: ~2x), and on flash-attn's softcap / window case (|q| x 12.5, 1-3 keys a
// row) 4.5x its output error (tests/test_accumulation.py); chains of 16 measured torch's error.
// Up to kChain terms (a reduction over 16 features, keys or rows) it is one chain.
// KAHAN blocks keep their one chain: their reduction is one tile's keys or rows, added
// compensated.
constexpr int64_t kChain = 16;
constexpr int64_t kOneChainMax = 32;
static inline int64_t chain_of(int64_t R) { return R <= kOneChainMax ? (R > 0 ? R : 1) : kChain; }

// Where chains are several, their running totals stay in registers beside the chain's
// accumulators, so a chain's end is NRm adds instead of a load, add and store of each C row
// (through memory, chains of 16 over Dk = 64-128 cost the dense forward 4-10%, measured on Zen 4).
// The sums and their order are the same either way, bit for bit. That doubles the registers a
// block needs, so a block with totals keeps fewer rows: as many as kVecRegBytes (the ISA's
// vector register file, from the including kernels_<isa>.cpp) holds beside the operands
// (NG lane groups: NG accumulators and NG totals a row, NG operand vectors and the broadcast).
// Where that is under 2/3 of the usual rows, the FMA latency would no longer be covered and the
// totals go through memory instead.
template <class V, int NG, int NR>
struct ChainRows {
  static constexpr int regs = kVecRegBytes / int(sizeof(V));
  static constexpr int fit = (regs - NG - 1) / (2 * NG);
  static constexpr int value = fit >= NR ? NR : (3 * fit >= 2 * NR ? fit : 0);
};

template <class V, int NRm, int MODE, bool REGS = false, class C>
static inline __attribute__((always_inline)) void mk_block(C* __restrict Cp, int64_t ldc, const C* __restrict A,
                                                           int64_t sam, int64_t sar, const C* __restrict Bp,
                                                           int64_t ldb, int64_t R, C* __restrict Kp, V alpha,
                                                           const C* am) {
  V acc[NRm];
  if constexpr (MODE == KAHAN) {
#pragma GCC unroll 16
    for (int m = 0; m < NRm; ++m) acc[m] = vzero<V>();
    for (int64_t r = 0; r < R; ++r) {
      const V b = vload(Bp + r * ldb);
      const C* a = A + r * sar;
#pragma GCC unroll 16
      for (int m = 0; m < NRm; ++m) acc[m] = vfma(vset1<V>(a[m * sam]), b, acc[m]);
    }
#pragma GCC unroll 16
    for (int m = 0; m < NRm; ++m) kahan_add(Cp + m * ldc, Kp + m * ldc, acc[m], am ? vset1<V>(am[m]) : alpha);
  } else {
    V tot[REGS ? NRm : 1];
    const int64_t chain = chain_of(R);
    for (int64_t r0 = 0; r0 < R || r0 == 0; r0 += chain) {
      const int64_t r1 = R < r0 + chain ? R : r0 + chain;
      const bool from_c = MODE == ACC && r0 == 0;  // the first chain continues C's sum
#pragma GCC unroll 16
      for (int m = 0; m < NRm; ++m) acc[m] = from_c ? vload(Cp + m * ldc) : vzero<V>();
      for (int64_t r = r0; r < r1; ++r) {
        const V b = vload(Bp + r * ldb);
        const C* a = A + r * sar;
#pragma GCC unroll 16
        for (int m = 0; m < NRm; ++m) acc[m] = vfma(vset1<V>(a[m * sam]), b, acc[m]);
      }
      const bool add = r0 > 0;
      if constexpr (REGS) {
#pragma GCC unroll 16
        for (int m = 0; m < NRm; ++m) tot[m] = add ? vadd(tot[m], acc[m]) : acc[m];
      } else {
#pragma GCC unroll 16
        for (int m = 0; m < NRm; ++m) vstore(Cp + m * ldc, add ? vadd(vload(Cp + m * ldc), acc[m]) : acc[m]);
      }
    }
    if constexpr (REGS) {
#pragma GCC unroll 16
      for (int m = 0; m < NRm; ++m) vstore(Cp + m * ldc, tot[m]);
    }
  }
}

template <class V, int K, int MODE, bool REGS = false, class C>
static inline void mk_tail(int rem, C* Cp, int64_t ldc, const C* A, int64_t sam, int64_t sar, const C* Bp, int64_t ldb,
                           int64_t R, C* Kp, V alpha, const C* am) {
  if constexpr (K >= 1) {
    if (rem == K) {
      mk_block<V, K, MODE, REGS>(Cp, ldc, A, sam, sar, Bp, ldb, R, Kp, alpha, am);
      return;
    }
    mk_tail<V, K - 1, MODE, REGS>(rem, Cp, ldc, A, sam, sar, Bp, ldb, R, Kp, alpha, am);
  }
}

template <int MODE, int NR, bool REGS, class C>
static void gemm16m_rows(C* Cp, int64_t ldc, const C* A, int64_t sam, int64_t sar, const C* Bp, int64_t ldb, int64_t M,
                         int64_t R, C* Kp, typename VecOf<C>::V alpha, const C* am) {
  using V = typename VecOf<C>::V;
  int64_t m = 0;
  for (; m + NR <= M; m += NR)
    mk_block<V, NR, MODE, REGS>(Cp + m * ldc, ldc, A + m * sam, sam, sar, Bp, ldb, R, Kp ? Kp + m * ldc : nullptr,
                                alpha, am ? am + m : nullptr);
  if (m < M)
    mk_tail<V, NR - 1, MODE, REGS>(int(M - m), Cp + m * ldc, ldc, A + m * sam, sam, sar, Bp, ldb, R,
                                   Kp ? Kp + m * ldc : nullptr, alpha, am ? am + m : nullptr);
}

template <int MODE, class C>
static void gemm16m(C* Cp, int64_t ldc, const C* A, int64_t sam, int64_t sar, const C* Bp, int64_t ldb, int64_t M,
                    int64_t R, C* Kp, typename VecOf<C>::V alpha, const C* am) {
  using V = typename VecOf<C>::V;
  constexpr int NR = VecOf<C>::NR;
  constexpr int NRc = ChainRows<V, 1, NR>::value;
  if constexpr (MODE != KAHAN && NRc > 0)
    if (R > kOneChainMax) return gemm16m_rows<MODE, NRc, true>(Cp, ldc, A, sam, sar, Bp, ldb, M, R, Kp, alpha, am);
  gemm16m_rows<MODE, NR, false>(Cp, ldc, A, sam, sar, Bp, ldb, M, R, Kp, alpha, am);
}

// C = (or +=) A B
template <bool ACCUMULATE, class C>
static void gemm16(C* Cp, int64_t ldc, const C* A, int64_t sam, int64_t sar, const C* Bp, int64_t ldb, int64_t M,
                   int64_t R) {
  gemm16m<ACCUMULATE ? ACC : STORE>(Cp, ldc, A, sam, sar, Bp, ldb, M, R, static_cast<C*>(nullptr),
                                    vzero<typename VecOf<C>::V>(), static_cast<const C*>(nullptr));
}

// C = C alpha + A B, compensated (carry K); alpha per lane, or am[m] per row m when am is given
template <class C>
static void gemm16_kahan(C* Cp, C* Kp, int64_t ldc, const C* A, int64_t sam, int64_t sar, const C* Bp, int64_t ldb,
                         int64_t M, int64_t R, typename VecOf<C>::V alpha, const C* am = nullptr) {
  gemm16m<KAHAN>(Cp, ldc, A, sam, sar, Bp, ldb, M, R, Kp, alpha, am);
}

// Two lane groups against the same A rows (the same keys of K or V): one broadcast of A feeds two
// FMAs, so a step loads 2 + NR2 vectors for 2 NR2 FMAs instead of 1 + NR for NR (the 12 x 16
// block above is load-bound as much as FMA-bound on a core with two of each). vLLM's CPU
// attention register-blocks its Q K^T the same way, several query rows per loaded key vector.
//   C0[m] (=, or KAHAN with alpha0) sum_r A[m*sam + r*sar] * B0[r*ldb]; C1 likewise with B1, alpha1.
template <class C>
struct Nr2 {
  static constexpr int NR = VecOf<C>::NR;
  static constexpr int value = NR >= 12 ? 10 : (NR / 2 > 0 ? NR / 2 : 1);
};

template <class V, int NRm, int MODE, bool REGS = false, class C>
static inline __attribute__((always_inline)) void mk_block2(C* __restrict C0, C* __restrict C1, int64_t ldc,
                                                            const C* __restrict A, int64_t sam, int64_t sar,
                                                            const C* __restrict B0, const C* __restrict B1, int64_t ldb,
                                                            int64_t R, C* __restrict K0, C* __restrict K1, V alpha0,
                                                            V alpha1) {
  V acc0[NRm], acc1[NRm];
  V tot0[REGS ? NRm : 1], tot1[REGS ? NRm : 1];
  const int64_t chain = MODE == KAHAN ? (R > 0 ? R : 1) : chain_of(R);  // chains of kChain (mk_block)
  for (int64_t r0 = 0; r0 < R || r0 == 0; r0 += chain) {
    const int64_t r1 = R < r0 + chain ? R : r0 + chain;
#pragma GCC unroll 16
    for (int m = 0; m < NRm; ++m) acc0[m] = acc1[m] = vzero<V>();
    for (int64_t r = r0; r < r1; ++r) {
      const V b0 = vload(B0 + r * ldb), b1 = vload(B1 + r * ldb);
      const C* a = A + r * sar;
#pragma GCC unroll 16
      for (int m = 0; m < NRm; ++m) {
        const V x = vset1<V>(a[m * sam]);
        acc0[m] = vfma(x, b0, acc0[m]);
        acc1[m] = vfma(x, b1, acc1[m]);
      }
    }
    if constexpr (MODE == KAHAN) {
#pragma GCC unroll 16
      for (int m = 0; m < NRm; ++m) {
        kahan_add(C0 + m * ldc, K0 + m * ldc, acc0[m], alpha0);
        kahan_add(C1 + m * ldc, K1 + m * ldc, acc1[m], alpha1);
      }
    } else if constexpr (REGS) {
      const bool add = r0 > 0;
#pragma GCC unroll 16
      for (int m = 0; m < NRm; ++m) {
        tot0[m] = add ? vadd(tot0[m], acc0[m]) : acc0[m];
        tot1[m] = add ? vadd(tot1[m], acc1[m]) : acc1[m];
      }
    } else {
      const bool add = r0 > 0;
#pragma GCC unroll 16
      for (int m = 0; m < NRm; ++m) {
        vstore(C0 + m * ldc, add ? vadd(vload(C0 + m * ldc), acc0[m]) : acc0[m]);
        vstore(C1 + m * ldc, add ? vadd(vload(C1 + m * ldc), acc1[m]) : acc1[m]);
      }
    }
  }
  if constexpr (REGS && MODE != KAHAN) {
#pragma GCC unroll 16
    for (int m = 0; m < NRm; ++m) {
      vstore(C0 + m * ldc, tot0[m]);
      vstore(C1 + m * ldc, tot1[m]);
    }
  }
}

template <class V, int K, int MODE, bool REGS = false, class C>
static inline void mk_tail2(int rem, C* C0, C* C1, int64_t ldc, const C* A, int64_t sam, int64_t sar, const C* B0,
                            const C* B1, int64_t ldb, int64_t R, C* K0, C* K1, V alpha0, V alpha1) {
  if constexpr (K >= 1) {
    if (rem == K) {
      mk_block2<V, K, MODE, REGS>(C0, C1, ldc, A, sam, sar, B0, B1, ldb, R, K0, K1, alpha0, alpha1);
      return;
    }
    mk_tail2<V, K - 1, MODE, REGS>(rem, C0, C1, ldc, A, sam, sar, B0, B1, ldb, R, K0, K1, alpha0, alpha1);
  }
}

template <int MODE, int NR, bool REGS, class C>
static void gemm16x2m_rows(C* C0, C* C1, int64_t ldc, const C* A, int64_t sam, int64_t sar, const C* B0, const C* B1,
                           int64_t ldb, int64_t M, int64_t R, C* K0, C* K1, typename VecOf<C>::V alpha0,
                           typename VecOf<C>::V alpha1) {
  using V = typename VecOf<C>::V;
  int64_t m = 0;
  for (; m + NR <= M; m += NR)
    mk_block2<V, NR, MODE, REGS>(C0 + m * ldc, C1 + m * ldc, ldc, A + m * sam, sam, sar, B0, B1, ldb, R,
                                 K0 ? K0 + m * ldc : nullptr, K1 ? K1 + m * ldc : nullptr, alpha0, alpha1);
  if (m < M)
    mk_tail2<V, NR - 1, MODE, REGS>(int(M - m), C0 + m * ldc, C1 + m * ldc, ldc, A + m * sam, sam, sar, B0, B1, ldb, R,
                                    K0 ? K0 + m * ldc : nullptr, K1 ? K1 + m * ldc : nullptr, alpha0, alpha1);
}

template <int MODE, class C>
static void gemm16x2m(C* C0, C* C1, int64_t ldc, const C* A, int64_t sam, int64_t sar, const C* B0, const C* B1,
                      int64_t ldb, int64_t M, int64_t R, C* K0, C* K1, typename VecOf<C>::V alpha0,
                      typename VecOf<C>::V alpha1) {
  using V = typename VecOf<C>::V;
  constexpr int NR = Nr2<C>::value;
  constexpr int NRc = ChainRows<V, 2, NR>::value;
  if constexpr (MODE != KAHAN && NRc > 0)
    if (R > kOneChainMax)
      return gemm16x2m_rows<MODE, NRc, true>(C0, C1, ldc, A, sam, sar, B0, B1, ldb, M, R, K0, K1, alpha0, alpha1);
  gemm16x2m_rows<MODE, NR, false>(C0, C1, ldc, A, sam, sar, B0, B1, ldb, M, R, K0, K1, alpha0, alpha1);
}

// C0 = A B0 and C1 = A B1
template <class C>
static void gemm16x2(C* C0, C* C1, int64_t ldc, const C* A, int64_t sam, int64_t sar, const C* B0, const C* B1,
                     int64_t ldb, int64_t M, int64_t R) {
  using V = typename VecOf<C>::V;
  gemm16x2m<STORE>(C0, C1, ldc, A, sam, sar, B0, B1, ldb, M, R, static_cast<C*>(nullptr), static_cast<C*>(nullptr),
                   vzero<V>(), vzero<V>());
}

// C0 = C0 alpha0 + A B0 and C1 = C1 alpha1 + A B1, compensated (carries K0, K1)
template <class C>
static void gemm16x2_kahan(C* C0, C* K0, C* C1, C* K1, int64_t ldc, const C* A, int64_t sam, int64_t sar, const C* B0,
                           const C* B1, int64_t ldb, int64_t M, int64_t R, typename VecOf<C>::V alpha0,
                           typename VecOf<C>::V alpha1) {
  gemm16x2m<KAHAN>(C0, C1, ldc, A, sam, sar, B0, B1, ldb, M, R, K0, K1, alpha0, alpha1);
}

}  // namespace QKV_NS
}  // namespace qkv_native
