// AVX-512 with AVX512-BF16 (Cooper Lake, Sapphire Rapids, Zen 4 and 5): the avx512 path, except
// that the bfloat16 forward computes its two matmuls with vdpbf16ps instead of widening K and V to
// float32. Chosen (dispatch.cpp) only where the CPU reports avx512bf16 besides avx512f/bw/dq/vl:
// this is the only unit built with -mavx512bf16.
//
// vdpbf16ps multiplies PAIRS of bf16 and adds both products into a float32 lane, so each matmul
// runs over pairs of its reduction axis, twice the products of a float32 FMA per instruction:
//   S^T = K Q^T   pairs along Dk: one dword of a K row (k[2p], k[2p+1]) broadcast over the lanes,
//                 against Q^T as pairs [Dk/2][16 lanes][2] (q kept in bf16, unscaled: the scale is
//                 applied to the float32 dot products, so no bf16 rounding of q * scale);
//   O^T += V^T P^T  pairs along keys: V packed once per tile as [keys/2][Dv] dwords
//                 (v[2p][d], v[2p+1][d]), P^T as pairs [keys/2][16 lanes][2] rounded to bf16 from
//                 the float32 softmax (as FlashAttention-2 rounds P to the input type before
//                 its P V matmul on GPUs, arXiv:2307.08691), the tile's sum added compensated.
// An odd Dk or an odd key count ends with a half pair whose missing half is 0 in both operands.
// The softmax, its statistics, masks, mods and the output are those of every other path (float32).
// vdpbf16ps treats bf16 subnormals (|x| < 1.2e-38) as zero; the widening path does not. And since
// the scale comes after the dot product, |q.k| beyond float32's range (3.4e38) is reported as an
// overflow (finite.hpp) even where |q.k| * scale would have fitted.
//
// Everything else (float32, float64, float16, the backward pass) is the avx512 path's own code:
// this table forwards those calls to kTableAvx512.
#define QKV_NS avx512bf16
#include "simd_avx512.hpp"

#include "attention_fwd.hpp"

namespace qkv_native {
inline namespace QKV_NS {

static inline __m512 dpbf16(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(a), reinterpret_cast<__m512bh>(b));
}
static inline __m512i bcast_pair(const uint16_t* p) {  // p[0] in the low half: pairs as in memory
  uint32_t u;
  std::memcpy(&u, p, 4);
  return _mm512_set1_epi32(int(u));
}
static inline __m512i bcast_half(uint16_t x) { return _mm512_set1_epi32(int(uint32_t(x))); }  // (x, 0)

// NR rows of C kept in registers (16 accumulators of 32 zmm): whole blocks for the usual 64 / 128
// keys per tile and Dv = 64 / 128. With 12, as the float block, Dv = 64 left a 4-row tail that is
// latency-bound (4 chains): 4% of a dense forward's time for 6% of its P V work (perf, Zen 5).
constexpr int NR_BF = 16;

// st[m][0..15] = f * sum_d k[m][d] q[lane][d], m < NRm: k rows bf16 (stride ldk), qp = Q^T pairs.
template <int NRm>
static inline __attribute__((always_inline)) void score_block(float* __restrict st, const uint16_t* __restrict k,
                                                              int64_t ldk, const uint16_t* __restrict qp, int64_t Dk,
                                                              __m512 f) {
  __m512 acc[NRm];
#pragma GCC unroll 16
  for (int m = 0; m < NRm; ++m) acc[m] = _mm512_setzero_ps();
  const int64_t np = Dk / 2;
  for (int64_t p = 0; p < np; ++p) {
    const __m512i b = _mm512_load_si512(qp + p * 2 * kLanes);
#pragma GCC unroll 16
    for (int m = 0; m < NRm; ++m) acc[m] = dpbf16(acc[m], bcast_pair(k + m * ldk + 2 * p), b);
  }
  if (Dk & 1) {  // the half pair: never read past the row (the next element may be NaN or unmapped)
    const __m512i b = _mm512_load_si512(qp + np * 2 * kLanes);
#pragma GCC unroll 16
    for (int m = 0; m < NRm; ++m) acc[m] = dpbf16(acc[m], bcast_half(k[m * ldk + Dk - 1]), b);
  }
#pragma GCC unroll 16
  for (int m = 0; m < NRm; ++m) _mm512_store_ps(st + m * kLanes, _mm512_mul_ps(acc[m], f));
}

template <int K>
static inline void score_tail(int rem, float* st, const uint16_t* k, int64_t ldk, const uint16_t* qp, int64_t Dk,
                              __m512 f) {
  if constexpr (K >= 1) {
    if (rem == K) return score_block<K>(st, k, ldk, qp, Dk, f);
    score_tail<K - 1>(rem, st, k, ldk, qp, Dk, f);
  }
}

// S^T [jn][16] of one lane group, in the units of q_prescale (mods.hpp), as gemm16 leaves them.
static void scores_bf16(float* st, const uint16_t* k, int64_t ldk, const uint16_t* qp, int64_t jn, int64_t Dk,
                        float f) {
  const __m512 fv = _mm512_set1_ps(f);
  int64_t m = 0;
  for (; m + NR_BF <= jn; m += NR_BF) score_block<NR_BF>(st + m * kLanes, k + m * ldk, ldk, qp, Dk, fv);
  if (m < jn) score_tail<NR_BF - 1>(int(jn - m), st + m * kLanes, k + m * ldk, ldk, qp, Dk, fv);
}

// O^T[d] = O^T[d] alpha + sum_p vp[p][d] . pp[p], d < NRm, compensated (microkernel.hpp's KAHAN).
template <int NRm>
static inline __attribute__((always_inline)) void pv_block(float* __restrict ot, float* __restrict oc,
                                                           const uint32_t* __restrict vp, int64_t Dv,
                                                           const uint16_t* __restrict pp, int64_t np, VF alpha) {
  __m512 acc[NRm];
#pragma GCC unroll 16
  for (int m = 0; m < NRm; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t p = 0; p < np; ++p) {
    const __m512i b = _mm512_load_si512(pp + p * 2 * kLanes);
#pragma GCC unroll 16
    for (int m = 0; m < NRm; ++m) acc[m] = dpbf16(acc[m], _mm512_set1_epi32(int(vp[p * Dv + m])), b);
  }
#pragma GCC unroll 16
  for (int m = 0; m < NRm; ++m) kahan_add(ot + m * kLanes, oc + m * kLanes, VF{acc[m]}, alpha);
}

template <int K>
static inline void pv_tail(int rem, float* ot, float* oc, const uint32_t* vp, int64_t Dv, const uint16_t* pp,
                           int64_t np, VF alpha) {
  if constexpr (K >= 1) {
    if (rem == K) return pv_block<K>(ot, oc, vp, Dv, pp, np, alpha);
    pv_tail<K - 1>(rem, ot, oc, vp, Dv, pp, np, alpha);
  }
}

static void pv_bf16(float* ot, float* oc, const uint32_t* vp, int64_t Dv, const uint16_t* pp, int64_t np, VF alpha) {
  int64_t d = 0;
  for (; d + NR_BF <= Dv; d += NR_BF) pv_block<NR_BF>(ot + d * kLanes, oc + d * kLanes, vp + d, Dv, pp, np, alpha);
  if (d < Dv) pv_tail<NR_BF - 1>(int(Dv - d), ot + d * kLanes, oc + d * kLanes, vp + d, Dv, pp, np, alpha);
}

// ------------------------------------------------------------------ operand layouts

// Q^T pairs [ceil(Dk/2)][16 lanes][2] of a lane group (zero lanes beyond n, zero half pair).
static void load_q_pairs(const Params& P, const LaneGroup& lg, uint16_t* qp, uint8_t* fl) {
  const int64_t np = (P.Dk + 1) / 2;
  std::memset(qp, 0, sizeof(uint16_t) * size_t(np) * 2 * kLanes);
  const bf16_t* q = static_cast<const bf16_t*>(P.q.data);
  for (int l = 0; l < lg.n; ++l) {
    const bf16_t* row = q + lg.b * P.q.s0 + lg.h[l] * P.q.s1 + lg.i[l] * P.q.s2;
    if (!storage_finite(row, P.Dk)) {
      fl[l] |= kBadQ;
      continue;
    }  // left zero: the row sees scores of 0, as on the other paths
    for (int64_t d = 0; d < P.Dk; ++d) qp[(d / 2) * 2 * kLanes + 2 * l + (d & 1)] = row[d].bits;
  }
}

// P^T [jn][16] float32 -> pairs [ceil(jn/2)][16 lanes][2] bf16 (round to nearest even), in place:
// pair p is written over bytes that pairs <= p have already read.
static void p_pairs(float* st, int64_t jn) {
  const __m512i zip = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21,
                                       5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (int64_t p = 0; 2 * p < jn; ++p) {
    const __m512 a = _mm512_load_ps(st + 2 * p * kLanes);
    const __m512 b = 2 * p + 1 < jn ? _mm512_load_ps(st + (2 * p + 1) * kLanes) : _mm512_setzero_ps();
    const __m512i ab = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a));  // a0..a15, b0..b15
    _mm512_store_si512(st + p * kLanes, _mm512_permutexvar_epi16(zip, ab));   // a0 b0 a1 b1 ...
  }
}

// V rows [j0, j0 + jn) -> vp[p][d] = (v[2p][d], v[2p+1][d]); rows marked bad (non-finite) and the
// row past an odd jn as zeros.
static void pack_v(const uint16_t* v, int64_t ldv, int64_t jn, int64_t Dv, const TileRows& bad, uint32_t* vp) {
  const __m256i zero = _mm256_setzero_si256();
  for (int64_t p = 0; 2 * p < jn; ++p) {
    const int64_t j = 2 * p;
    const bool z0 = bad.any && bad.bad[j], z1 = j + 1 >= jn || (bad.any && bad.bad[j + 1]);
    for (int64_t d = 0; d < Dv; d += kLanes) {
      const __mmask16 mk = Dv - d >= kLanes ? __mmask16(0xffff) : __mmask16((1u << (Dv - d)) - 1u);
      const __m256i a = z0 ? zero : _mm256_maskz_loadu_epi16(mk, v + j * ldv + d);
      const __m256i b = z1 ? zero : _mm256_maskz_loadu_epi16(mk, v + (j + 1) * ldv + d);
      const __m512i x = _mm512_or_si512(_mm512_cvtepu16_epi32(a), _mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
      _mm512_mask_storeu_epi32(vp + p * Dv + d, mk, x);
    }
  }
}

static void scan_bf16(const uint16_t* x, int64_t ld, int64_t jn, int64_t D, TileRows& t) {
  t.any = false;
  for (int64_t jj = 0; jj < jn; ++jj) {
    const bool b = !storage_finite(reinterpret_cast<const bf16_t*>(x + jj * ld), D);
    t.bad[jj] = uint8_t(b);
    t.any = t.any || b;
  }
}

// finite.hpp's dirty_tile for bf16 rows: K rows that are not finite zeroed in a copy (kp / ldk then
// point at it), V's marked in bv (pack_v zeroes them), the lanes attending one of them flagged.
__attribute__((noinline)) static void dirty_tile_bf16(const Params& P, const LaneGroup* lgs, int nlg,
                                                      const TileMask* tm, int64_t j0, int64_t jn, uint16_t* kbuf,
                                                      int64_t ldkb, const uint16_t*& kp, int64_t& ldk,
                                                      const uint16_t* vp, int64_t ldv, TileRows& bv,
                                                      uint8_t (*fl)[kLanes]) {
  TileRows bk;
  scan_bf16(kp, ldk, jn, P.Dk, bk);
  scan_bf16(vp, ldv, jn, P.Dv, bv);
  if (bk.any) {
    for (int64_t jj = 0; jj < jn; ++jj) {
      if (bk.bad[jj])
        std::memset(kbuf + jj * ldkb, 0, sizeof(uint16_t) * size_t(P.Dk));
      else
        std::memcpy(kbuf + jj * ldkb, kp + jj * ldk, sizeof(uint16_t) * size_t(P.Dk));
    }
    kp = kbuf;
    ldk = ldkb;
  }
  for (int g = 0; g < nlg; ++g) flag_attending(P, lgs[g], tm[g], j0, jn, bk, bv, fl[g]);
}

// ------------------------------------------------------------------ the tile loop

// attention_fwd.hpp's fwd_rowset for bf16 inputs, with the two matmuls above. Not yet ported: the
// float loop's exact key spans per pair of lane groups and its shared broadcasts (gemm16x2); this
// loop reads whole tiles of [ka, kz) and masks inside them (classify), so dense work is at full
// speed but a narrow band (window, diagonal) spends more of its time on masked keys. The scratch is
// FwdBufs<bf16_t> (float32 buffers) holding bf16 layouts, which are never larger: qt: Q^T pairs,
// kc: a cleaned K copy, vc: the V pairs, st: S^T then P^T pairs in place.
template <>
__attribute__((noinline)) void fwd_rowset<bf16_t>(const Params& P, FwdBufs<bf16_t>& S, const LaneGroup* lgs, int nlg,
                                                  int64_t ka, int64_t kz, uint8_t (*fl)[kLanes]) {
  using C = float;
  using V = VF;
  const int64_t Dv = P.Dv, dkp = round_up(P.Dk, kLanes);
  const float f = float(q_prescale(P));
  ModLanes<C> ml[4];
  TileMask tm[4];
  uint16_t* qp = reinterpret_cast<uint16_t*>(S.qt);
  for (int g = 0; g < nlg; ++g) {
    load_q_pairs(P, lgs[g], qp + g * P.Dk * kLanes * 2, fl[g]);
    std::memset(static_cast<void*>(S.ot + g * Dv * kLanes), 0, sizeof(C) * size_t(Dv) * kLanes);
    std::memset(static_cast<void*>(S.oc + g * Dv * kLanes), 0, sizeof(C) * size_t(Dv) * kLanes);
    vstore(S.lc + g * kLanes, vzero<V>());
    vstore(S.ml + g * 2 * kLanes, vset1<V>(C(-INFINITY)));
    vstore(S.ml + g * 2 * kLanes + kLanes, vzero<V>());
    mod_lanes_init(P, lgs[g], ml[g]);
  }
  const int64_t b = lgs[0].b, kvh = lgs[0].g;
  const uint16_t* kbase = static_cast<const uint16_t*>(P.k.data) + b * P.k.s0 + kvh * P.k.s1;
  const uint16_t* vbase = static_cast<const uint16_t*>(P.v.data) + b * P.v.s0 + kvh * P.v.s1;
  uint32_t* vpairs = reinterpret_cast<uint32_t*>(S.vc);
  const uint16_t* pp = reinterpret_cast<const uint16_t*>(S.st);
  for (int64_t j0 = ka; j0 < kz; j0 += P.bk) {
    const int64_t jn = imin(P.bk, kz - j0), kb = j0 / P.bk;
    bool any = false;
    for (int g = 0; g < nlg; ++g) {
      classify(P, lgs[g], kb, j0, jn, tm[g]);
      any = any || tm[g].mode != TILE_SKIP;
    }
    if (!any) continue;
    const uint16_t* kp = kbase + j0 * P.k.s2;
    const uint16_t* vp = vbase + j0 * P.v.s2;
    int64_t ldk = P.k.s2;
    TileRows bv;
    bv.any = false;
    if (!kv_range_clean<bf16_t>(P, b, kvh, j0, jn))
      dirty_tile_bf16(P, lgs, nlg, tm, j0, jn, reinterpret_cast<uint16_t*>(S.kc), dkp, kp, ldk, vp, P.v.s2, bv, fl);
    pack_v(vp, P.v.s2, jn, Dv, bv, vpairs);
    for (int g = 0; g < nlg; ++g) {
      if (tm[g].mode == TILE_SKIP) continue;
      scores_bf16(S.st, kp, ldk, qp + g * P.Dk * kLanes * 2, jn, P.Dk, f);
      const bool has_add = build_additive(P, lgs[g], tm[g], j0, jn, S.addt, fl[g]);
      C* m_run = S.ml + g * 2 * kLanes;
      const V alpha = softmax_tile<bf16_t, C>(P, lgs[g], ml[g], tm[g], j0, jn, S.st, has_add ? S.addt : nullptr, m_run,
                                              m_run + kLanes, S.lc + g * kLanes);
      p_pairs(S.st, jn);
      pv_bf16(S.ot + g * Dv * kLanes, S.oc + g * Dv * kLanes, vpairs, Dv, pp, (jn + 1) / 2, alpha);
    }
  }
}

}  // namespace QKV_NS
}  // namespace qkv_native

// The entry points below use forward_impl<bf16_t> only; the other dtypes and the backward are the
// avx512 unit's (so kernels_impl.hpp's own entry points are unused here).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include "kernels_impl.hpp"
#pragma GCC diagnostic pop

namespace qkv_native {
extern const KernelTable kTableAvx512;
inline namespace QKV_NS {
static bool forward_bf16(const Params& P) {
  return P.dtype == DType::bf16 ? forward_impl<bf16_t>(P) : kTableAvx512.forward(P);
}
static bool backward_bf16(const Params& P) { return kTableAvx512.backward(P); }
static double microbench_bf16(int kind, int64_t reps) { return kTableAvx512.microbench(kind, reps); }
}  // namespace QKV_NS

extern const KernelTable kTableAvx512Bf16 = {"avx512bf16", &avx512bf16::forward_bf16, &avx512bf16::backward_bf16,
                                             &avx512bf16::microbench_bf16};
}  // namespace qkv_native
