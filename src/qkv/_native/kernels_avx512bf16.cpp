// AVX-512 with AVX512-BF16 (Cooper Lake, Sapphire Rapids, Zen 4 and 5): the avx512 path, except
// that the bfloat16 forward and backward compute their matmuls with vdpbf16ps instead of widening
// their operands to float32. Chosen (dispatch.cpp) only where the CPU reports avx512bf16 besides avx512f/bw/dq/vl:
// this is the only unit built with -mavx512bf16.
//
// vdpbf16ps multiplies PAIRS of bf16 and adds both products into a float32 lane, so each matmul
// runs over pairs of its reduction axis, twice the products of a float32 FMA per instruction:
//   S^T = K Q^T   pairs along Dk: one dword of a K row (k[2p], k[2p+1]) broadcast over the lanes,
//                 against Q^T as pairs [Dk/2][16 lanes][2] (q kept in bf16, unscaled: the scale is
//                 applied to the float32 dot products, so no bf16 rounding of q * scale);
//   O^T += V^T P^T  pairs along keys: V packed once per range of keys read as [keys/2][Dv]
//                 dwords (v[2p][d], v[2p+1][d]), P^T as pairs [keys/2][16 lanes][2] rounded to
//                 bf16 from the float32 softmax (as FlashAttention-2 rounds P to the input type
//                 before its P V matmul on GPUs, arXiv:2307.08691), the tile's sum added
//                 compensated.
// An odd Dk or an odd key count ends with a half pair whose missing half is 0 in P and Q (the V
// row it meets is zero or a finite row of the range).
// Both are the dot products (Bf16Dot) of attention_fwd.hpp's tile loop, fwd_tiles: the exact key
// spans, the paired lane groups (one broadcast of K or V feeds two lane groups), the softmax, its
// statistics, masks, mods, dropout and the output are those of every other path (float32).
// vdpbf16ps treats bf16 subnormals (|x| < 1.2e-38) as zero; the widening path does not. And since
// the scale comes after the dot product, |q.k| beyond float32's range (3.4e38) is reported as an
// overflow (finite.hpp) even where |q.k| * scale would have fitted.
//
// Decode's thin path (decode.hpp) runs its own loop: there the scores of a bfloat16 cache read in
// place are vdpbf16ps over pairs along Dk as well (dec_scores_b16: simd_avx512.hpp's VB under
// __AVX512BF16__), while its P V stays in float32 FMAs (P not rounded).
//
// The backward's five matmuls likewise (Bf16Bwd below, the dot products of attention_bwd.hpp's
// bwd_tiles). Everything else (float32, float64, float16) is the avx512 path's own code: this
// table forwards those calls to kTableAvx512.
#define QKV_NS avx512bf16
#include "simd_avx512.hpp"

#include "attention_bwd.hpp"

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

// Rows of C kept in registers: 16 accumulators of 32 zmm for one lane group: whole blocks for the
// usual 64 / 128 keys per tile and Dv = 64 / 128 (with 12, as the float block, Dv = 64 left a
// 4-row tail that is latency-bound, 4 chains: 4% of a dense forward's time for 6% of its P V work,
// perf, Zen 5). Two lane groups: 2 x NR_BF2 accumulators, two operand vectors and the broadcast.
constexpr int NR_BF = 16;
constexpr int NR_BF2 = 12;

// The one vdpbf16ps block behind the four dot products (S^T and O^T, of one lane group or of two
// sharing each broadcast of K or V, as microkernel.hpp's gemm16x2): for g < NG and m < NRm,
//   acc_g[m] = sum_{p < R} pair(a + m sam + p sar) . b_g[p]   (+ (a[m sam + R sar], 0) . b_g[R] if half)
// where pair(x) broadcasts the two bf16 at x (x[0] low) over the lanes and b_g holds pairs
// [.][16 lanes][2]; then STORE: C_g[m] = acc_g[m] s_g, or KAHAN: C_g[m] = C_g[m] s_g + acc_g[m],
// compensated with the carry k_g (microkernel.hpp). Strides in bf16 elements.
template <int NG, int NRm, int MODE>
static inline __attribute__((always_inline)) void dp_block(float* __restrict c0, float* __restrict c1,
                                                           float* __restrict k0, float* __restrict k1, int64_t ldc,
                                                           const uint16_t* __restrict a, int64_t sam, int64_t sar,
                                                           const uint16_t* __restrict b0, const uint16_t* __restrict b1,
                                                           int64_t ldb, int64_t R, bool half, VF s0, VF s1) {
  __m512 acc0[NRm], acc1[NRm];
#pragma GCC unroll 16
  for (int m = 0; m < NRm; ++m) acc0[m] = acc1[m] = _mm512_setzero_ps();
  for (int64_t p = 0; p < R; ++p) {
    const __m512i x0 = _mm512_loadu_si512(b0 + p * ldb);
    const __m512i x1 = NG == 2 ? _mm512_loadu_si512(b1 + p * ldb) : x0;
#pragma GCC unroll 16
    for (int m = 0; m < NRm; ++m) {
      const __m512i y = bcast_pair(a + m * sam + p * sar);
      acc0[m] = dpbf16(acc0[m], y, x0);
      if constexpr (NG == 2) acc1[m] = dpbf16(acc1[m], y, x1);
    }
  }
  if (half) {  // never read past a row (the next element may be NaN or unmapped)
    const __m512i x0 = _mm512_loadu_si512(b0 + R * ldb);
    const __m512i x1 = NG == 2 ? _mm512_loadu_si512(b1 + R * ldb) : x0;
#pragma GCC unroll 16
    for (int m = 0; m < NRm; ++m) {
      const __m512i y = bcast_half(a[m * sam + R * sar]);
      acc0[m] = dpbf16(acc0[m], y, x0);
      if constexpr (NG == 2) acc1[m] = dpbf16(acc1[m], y, x1);
    }
  }
#pragma GCC unroll 16
  for (int m = 0; m < NRm; ++m) {
    if constexpr (MODE == KAHAN) {
      kahan_add(c0 + m * ldc, k0 + m * ldc, VF{acc0[m]}, s0);
      if constexpr (NG == 2) kahan_add(c1 + m * ldc, k1 + m * ldc, VF{acc1[m]}, s1);
    } else {
      _mm512_storeu_ps(c0 + m * ldc, _mm512_mul_ps(acc0[m], s0.a));
      if constexpr (NG == 2) _mm512_storeu_ps(c1 + m * ldc, _mm512_mul_ps(acc1[m], s1.a));
    }
  }
}

template <int NG, int K, int MODE>
static inline void dp_tail(int rem, float* c0, float* c1, float* k0, float* k1, int64_t ldc, const uint16_t* a,
                           int64_t sam, int64_t sar, const uint16_t* b0, const uint16_t* b1, int64_t ldb, int64_t R,
                           bool half, VF s0, VF s1) {
  if constexpr (K >= 1) {
    if (rem == K) return dp_block<NG, K, MODE>(c0, c1, k0, k1, ldc, a, sam, sar, b0, b1, ldb, R, half, s0, s1);
    dp_tail<NG, K - 1, MODE>(rem, c0, c1, k0, k1, ldc, a, sam, sar, b0, b1, ldb, R, half, s0, s1);
  }
}

// dp_block over M rows of C (row m at c0 + m ldc: 16 floats; k0 / k1 only for KAHAN, c1 / k1 / b1
// only for NG = 2); b_g's pair p at b_g + p ldb (bf16 elements).
template <int NG, int MODE>
static void dp(float* c0, float* c1, float* k0, float* k1, int64_t ldc, const uint16_t* a, int64_t sam, int64_t sar,
               const uint16_t* b0, const uint16_t* b1, int64_t ldb, int64_t M, int64_t R, bool half, VF s0, VF s1) {
  constexpr int NR = NG == 1 ? NR_BF : NR_BF2;
  const auto at = [ldc](float* x, int64_t m) { return x ? x + m * ldc : x; };
  int64_t m = 0;
  for (; m + NR <= M; m += NR)
    dp_block<NG, NR, MODE>(c0 + m * ldc, at(c1, m), at(k0, m), at(k1, m), ldc, a + m * sam, sam, sar, b0, b1, ldb, R,
                           half, s0, s1);
  if (m < M)
    dp_tail<NG, NR - 1, MODE>(int(M - m), c0 + m * ldc, at(c1, m), at(k0, m), at(k1, m), ldc, a + m * sam, sam, sar, b0,
                              b1, ldb, R, half, s0, s1);
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

// jn rows of 16 float32 (row jj at src + jj lds: P^T or dS^T) -> pairs [ceil(jn/2)][16 lanes][2]
// bf16 (round to nearest even), pair p at dst + p ldd (floats' bytes); in place when dst = src and
// lds = ldd = 16: pair p is written over bytes that pairs <= p have already read.
static void p_pairs(const float* src, int64_t lds, int64_t jn, float* dst, int64_t ldd) {
  const __m512i zip = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21,
                                       5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (int64_t p = 0; 2 * p < jn; ++p) {
    const __m512 a = _mm512_loadu_ps(src + 2 * p * lds);
    const __m512 b = 2 * p + 1 < jn ? _mm512_loadu_ps(src + (2 * p + 1) * lds) : _mm512_setzero_ps();
    const __m512i ab = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a));  // a0..a15, b0..b15
    _mm512_storeu_si512(dst + p * ldd, _mm512_permutexvar_epi16(zip, ab));    // a0 b0 a1 b1 ...
  }
}

// Rows ra, rb of D bf16 (nullptr: a row of zeros) -> D dwords (ra[d], rb[d]) at dst. 32 d per
// step: two row loads, two vpermt2w interleaving them (the widen-shift-or of 16 d at a time it
// replaces took ~15% of a dense bf16 forward, perf); never reads or writes past D.
static inline void zip_rows(const uint16_t* ra, const uint16_t* rb, int64_t D, uint32_t* dst) {
  const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37, 5,
                                      36, 4, 35, 3, 34, 2, 33, 1, 32, 0);  // a0 b0 a1 b1 ... a15 b15
  const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));          // a16 b16 ... a31 b31
  int64_t d = 0;
  for (; d + 2 * kLanes <= D; d += 2 * kLanes) {
    const __m512i a = ra ? _mm512_loadu_si512(ra + d) : _mm512_setzero_si512();
    const __m512i b = rb ? _mm512_loadu_si512(rb + d) : _mm512_setzero_si512();
    _mm512_storeu_si512(dst + d, _mm512_permutex2var_epi16(a, lo, b));
    _mm512_storeu_si512(dst + d + kLanes, _mm512_permutex2var_epi16(a, hi, b));
  }
  if (d < D) {  // masked loads and stores of the last D - d < 32
    const int64_t r = D - d;
    const __mmask32 m = __mmask32((uint64_t(1) << r) - 1);
    const __m512i a = ra ? _mm512_maskz_loadu_epi16(m, ra + d) : _mm512_setzero_si512();
    const __m512i b = rb ? _mm512_maskz_loadu_epi16(m, rb + d) : _mm512_setzero_si512();
    _mm512_mask_storeu_epi32(dst + d, __mmask16(m), _mm512_permutex2var_epi16(a, lo, b));
    if (r > kLanes)
      _mm512_mask_storeu_epi32(dst + d + kLanes, __mmask16(m >> kLanes), _mm512_permutex2var_epi16(a, hi, b));
  }
}

// Rows [0, jn) of a K or V tile (row stride ld) -> key pairs vp[p][d] = (x[2p][d], x[2p+1][d]),
// pair p at vp + p ldp (dwords); rows marked bad (non-finite) and the row past an odd jn as zeros.
static void pack_v(const uint16_t* x, int64_t ld, int64_t jn, int64_t D, const TileRows& bad, uint32_t* vp,
                   int64_t ldp) {
  for (int64_t p = 0; 2 * p < jn; ++p) {
    const int64_t j = 2 * p;
    const bool z0 = bad.any && bad.bad[j], z1 = j + 1 >= jn || (bad.any && bad.bad[j + 1]);
    zip_rows(z0 ? nullptr : x + j * ld, z1 ? nullptr : x + (j + 1) * ld, D, vp + p * ldp);
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

// attention_fwd.hpp's dirty_span for bf16 rows (rare, so out of line): K rows that are not finite
// zeroed in a copy (kp / ldk then point at it), V's marked in bv (pack_v zeroes them), the lanes
// attending one of them (by their masks over the whole range) flagged.
__attribute__((noinline)) static void dirty_span_bf16(const Params& P, const LaneGroup* lgs, int nlg, int64_t kb,
                                                      int64_t j0, int64_t jn, uint16_t* kbuf, int64_t ldkb,
                                                      const uint16_t*& kp, int64_t& ldk, const uint16_t* vp,
                                                      int64_t ldv, TileRows& bv, uint8_t (*fl)[kLanes]) {
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
  TileMask whole;
  for (int g = 0; g < nlg; ++g) {
    classify(P, lgs[g], kb, j0, jn, whole);
    flag_attending(P, lgs[g], whole, j0, jn, bk, bv, fl[g]);
  }
}

// ------------------------------------------------------------------ the tile loop's dot products

// attention_fwd.hpp's WideDot for bf16 inputs: fwd_tiles (spans, paired lane groups, softmax,
// masks, mods) runs over these. The scratch is FwdBufs<bf16_t> (float32 buffers) holding bf16
// layouts, which are never larger: qt: Q^T pairs per slot, kc: a cleaned K copy, vc: the range's
// V pairs, st / st2: S^T, then P^T pairs written in place.
struct Bf16Dot {
  static constexpr int64_t kKeyStep = 2;  // P^T pairs of a span meet V's pairs packed from the range's start
  const Params* P;
  FwdBufs<bf16_t>* S;
  const uint16_t* kp = nullptr;
  int64_t ldk = 0;

  const uint16_t* q(int g) const { return reinterpret_cast<const uint16_t*>(S->qt + g * P->Dk * kLanes); }
  const uint16_t* vpairs(int64_t off) const { return reinterpret_cast<const uint16_t*>(S->vc) + off * P->Dv; }
  float* o(int g) const { return S->ot + g * P->Dv * kLanes; }
  float* oc(int g) const { return S->oc + g * P->Dv * kLanes; }
  VF scale() const { return vset1<VF>(float(q_prescale(*P))); }
  void load_q(const LaneGroup& lg, int g, uint8_t* fl) {
    load_q_pairs(*P, lg, reinterpret_cast<uint16_t*>(S->qt + g * P->Dk * kLanes), fl);
  }
  void range(const LaneGroup* lgs, int nlg, int64_t kb, int64_t j0, int64_t jn, uint8_t (*fl)[kLanes]) {
    const int64_t b = lgs[0].b, g = lgs[0].g;
    kp = static_cast<const uint16_t*>(P->k.data) + b * P->k.s0 + g * P->k.s1 + j0 * P->k.s2;
    ldk = P->k.s2;
    const uint16_t* vr = static_cast<const uint16_t*>(P->v.data) + b * P->v.s0 + g * P->v.s1 + j0 * P->v.s2;
    TileRows bv;
    bv.any = false;
    if (!kv_range_clean<bf16_t>(*P, b, g, j0, jn))
      dirty_span_bf16(*P, lgs, nlg, kb, j0, jn, reinterpret_cast<uint16_t*>(S->kc), round_up(P->Dk, kLanes), kp, ldk,
                      vr, P->v.s2, bv, fl);
    pack_v(vr, P->v.s2, jn, P->Dv, bv, reinterpret_cast<uint32_t*>(S->vc), P->Dv);
  }
  // S^T: pairs along Dk, K rows broadcast from the range in place
  void scores(float* st, int g, int64_t off, int64_t n) const {
    dp<1, STORE>(st, nullptr, nullptr, nullptr, kLanes, kp + off * ldk, ldk, 2, q(g), nullptr, 2 * kLanes, n, P->Dk / 2,
                 P->Dk & 1, scale(), scale());
  }
  void scores2(float* st0, float* st1, int g, int64_t off, int64_t n) const {
    dp<2, STORE>(st0, st1, nullptr, nullptr, kLanes, kp + off * ldk, ldk, 2, q(g), q(g + 1), 2 * kLanes, n, P->Dk / 2,
                 P->Dk & 1, scale(), scale());
  }
  // O^T: pairs along keys (off is even: kKeyStep), P^T rounded to bf16 pairs in place
  void pv(float* pt, int g, int64_t off, int64_t n, VF alpha) const {
    p_pairs(pt, kLanes, n, pt, kLanes);
    dp<1, KAHAN>(o(g), nullptr, oc(g), nullptr, kLanes, vpairs(off), 2, 2 * P->Dv,
                 reinterpret_cast<const uint16_t*>(pt), nullptr, 2 * kLanes, P->Dv, (n + 1) / 2, false, alpha, alpha);
  }
  void pv2(float* pt0, float* pt1, int g, int64_t off, int64_t n, VF a0, VF a1) const {
    p_pairs(pt0, kLanes, n, pt0, kLanes);
    p_pairs(pt1, kLanes, n, pt1, kLanes);
    dp<2, KAHAN>(o(g), o(g + 1), oc(g), oc(g + 1), kLanes, vpairs(off), 2, 2 * P->Dv,
                 reinterpret_cast<const uint16_t*>(pt0), reinterpret_cast<const uint16_t*>(pt1), 2 * kLanes, P->Dv,
                 (n + 1) / 2, false, a0, a1);
  }
};

template <>
void fwd_rowset<bf16_t>(const Params& P, FwdBufs<bf16_t>& S, const LaneGroup* lgs, int nlg, int64_t ka, int64_t kz,
                        uint8_t (*fl)[kLanes]) {
  if (P.kv_format != KvFormat::native)  // a quantized cache: dequantised to float32 tiles (quant.hpp)
    return fwd_tiles(P, S, lgs, nlg, ka, kz, fl, WideDot<bf16_t>{&P, &S});
  fwd_tiles(P, S, lgs, nlg, ka, kz, fl, Bf16Dot{&P, &S});
}

// ------------------------------------------------------------------ the backward's dot products

// attention_bwd.hpp's WideBwd for bf16 inputs: bwd_tiles (exact ranges, paired lane groups, P^T,
// dS^T, masks, mods, dropout, the dQ order, non-finite rows) runs over these. Each of the five
// matmuls pairs its reduction axis for vdpbf16ps, the operands in bf16, the sums in float32:
//   S^T = K Q^T      pairs along Dk: K rows broadcast in place, Q^T pairs [Dk/2][16][2] (q
//                    unscaled, the scale applied to the float32 sums, as the forward)
//   dP^T = V dO^T    pairs along Dv: V rows in place, dO^T pairs [Dv/2][16][2]
//   dQ^T = K^T dS^T  pairs along keys: K packed once per tile as key pairs [BK/2][Dk], dS^T of
//                    the lane groups rounded to bf16 pairs [keys/2][16][2]
//   dV += P^T dO     pairs along queries: P^T rounded to bf16 in place ([BK][64] rows, so a
//                    dword holds two queries of a key), dO rows as query pairs [32][Dv]
//   dK += dS^T Q     likewise, dS^T rounded to bf16 and Q rows as query pairs [32][Dk]
// P is rounded to bf16 only where it meets V's matmul partner dO, and dS only where it meets K
// and Q (FlashAttention-2's bf16 backward rounds the same two, arXiv:2307.08691): dS = P o (dP - D)
// itself, D, lse and the softmax are float32, and so are dQ, dK, dV.
// Scratch: BwdBufs<bf16_t> (float32 buffers) holds the bf16 layouts, which are never larger: qs /
// dos the query pairs of Q / dO, qt / dot the pairs of each lane group, kc / vc cleaned K / V
// copies, kpair / dspair the key pairs.
struct Bf16Bwd {
  static constexpr int64_t kKeyStep = 2;  // dS^T key pairs meet K's pairs packed from the tile's start
  static constexpr int64_t W = BwdBufs<bf16_t>::W;
  static constexpr bool kExactDp = false;  // bf16 dP^T: its rounding is bf16's, not the cancellation's
  const Params* P;
  BwdBufs<bf16_t>* S;
  const uint16_t* kp = nullptr;
  const uint16_t* vp = nullptr;
  int64_t ldk = 0, ldv = 0, dkp = 0, dvp = 0;
  const uint16_t* qrow[W] = {};  // the block's rows (nullptr: zeros, a row not finite or past the block)
  const uint16_t* drow[W] = {};

  uint16_t* qt(int lg) const { return reinterpret_cast<uint16_t*>(S->qt + lg * P->Dk * kLanes); }
  uint16_t* dot(int lg) const { return reinterpret_cast<uint16_t*>(S->dot + lg * P->Dv * kLanes); }

  void tile(int64_t b, int64_t g, int64_t j0, int64_t jn, TileRows& bk, TileRows& bv) {
    dkp = round_up(P->Dk, kLanes);
    dvp = round_up(P->Dv, kLanes);
    kp = static_cast<const uint16_t*>(P->k.data) + b * P->k.s0 + g * P->k.s1 + j0 * P->k.s2;
    vp = static_cast<const uint16_t*>(P->v.data) + b * P->v.s0 + g * P->v.s1 + j0 * P->v.s2;
    ldk = P->k.s2;
    ldv = P->v.s2;
    scan_bf16(kp, ldk, jn, P->Dk, bk);
    scan_bf16(vp, ldv, jn, P->Dv, bv);
    if (bk.any) {
      kp = cleaned(kp, ldk, jn, P->Dk, bk, reinterpret_cast<uint16_t*>(S->kc), dkp);
      ldk = dkp;
    }
    if (bv.any) {
      vp = cleaned(vp, ldv, jn, P->Dv, bv, reinterpret_cast<uint16_t*>(S->vc), dvp);
      ldv = dvp;
    }
    TileRows none;
    none.any = false;
    pack_v(kp, ldk, jn, P->Dk, none, reinterpret_cast<uint32_t*>(S->kpair), dkp);
  }
  // rows of x, those marked in t zeroed, into buf (row stride ldb); returns buf (rare)
  __attribute__((noinline)) static const uint16_t* cleaned(const uint16_t* x, int64_t ld, int64_t jn, int64_t D,
                                                           const TileRows& t, uint16_t* buf, int64_t ldb) {
    for (int64_t jj = 0; jj < jn; ++jj) {
      if (t.bad[jj])
        std::memset(buf + jj * ldb, 0, sizeof(uint16_t) * size_t(D));
      else
        std::memcpy(buf + jj * ldb, x + jj * ld, sizeof(uint16_t) * size_t(D));
    }
    return buf;
  }
  void row(int64_t r, const bf16_t* q, const bf16_t* d, bool bad) {
    qrow[r] = bad ? nullptr : reinterpret_cast<const uint16_t*>(q);
    drow[r] = bad ? nullptr : reinterpret_cast<const uint16_t*>(d);
  }
  // the block's Q and dO rows as query pairs [rq/2][dkp] / [rq/2][dvp] dwords (padding stays zero)
  void rows_done(int64_t nr, int64_t rq) {
    for (int64_t r = nr; r < rq; ++r) qrow[r] = drow[r] = nullptr;
    uint32_t* qp = reinterpret_cast<uint32_t*>(S->qs);
    uint32_t* dp_ = reinterpret_cast<uint32_t*>(S->dos);
    for (int64_t p = 0; 2 * p < rq; ++p) {
      zip_rows(qrow[2 * p], qrow[2 * p + 1], P->Dk, qp + p * dkp);
      zip_rows(drow[2 * p], drow[2 * p + 1], P->Dv, dp_ + p * dvp);
    }
  }
  // lane group lg's Q^T and dO^T pairs [ceil(D/2)][16][2]: dword p of lane l = elements 2p, 2p+1
  // of its row (a half pair padded with 0). 16 x 16 dword blocks transposed in registers (a
  // scalar transpose cost ~5% of a D = 128 backward's instructions).
  static void transpose_pairs(const uint16_t* const* rows, int64_t D, uint16_t* out) {
    uint32_t* o = reinterpret_cast<uint32_t*>(out);
    const int64_t np = D / 2;
    for (int64_t c0 = 0; c0 < np; c0 += kLanes) {
      const int64_t w = imin(kLanes, np - c0);
      const __mmask16 m = __mmask16((1u << w) - 1);
      __m512i r[kLanes];
      for (int l = 0; l < kLanes; ++l)
        r[l] = rows[l] ? _mm512_maskz_loadu_epi32(m, rows[l] + 2 * c0) : _mm512_setzero_si512();
      transpose16(r);
      for (int64_t c = 0; c < w; ++c) _mm512_storeu_si512(o + (c0 + c) * kLanes, r[c]);
    }
    if (D & 1)
      for (int l = 0; l < kLanes; ++l) o[np * kLanes + l] = rows[l] ? uint32_t(rows[l][D - 1]) : 0u;
  }
  // r[c] = column c of the 16 x 16 dwords r[0..15]: 32-bit and 64-bit interleaves within 128-bit
  // lanes (r[4a + c], lane L: column 4L + c of rows 4a..4a + 3), then two 128-bit shuffles
  static inline void transpose16(__m512i* r) {
    __m512i t[kLanes];
    for (int i = 0; i < kLanes; i += 2) {
      t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
      t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < kLanes; i += 4) {
      r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
      r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
      r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
      r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int c = 0; c < 4; ++c) {
      const __m512i x0 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x88), x1 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xdd);
      const __m512i y0 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x88);
      const __m512i y1 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xdd);
      t[c] = _mm512_shuffle_i32x4(x0, y0, 0x88);
      t[4 + c] = _mm512_shuffle_i32x4(x1, y1, 0x88);
      t[8 + c] = _mm512_shuffle_i32x4(x0, y0, 0xdd);
      t[12 + c] = _mm512_shuffle_i32x4(x1, y1, 0xdd);
    }
    for (int i = 0; i < kLanes; ++i) r[i] = t[i];
  }
  void lane_group(int lg) {
    transpose_pairs(qrow + lg * kLanes, P->Dk, qt(lg));
    transpose_pairs(drow + lg * kLanes, P->Dv, dot(lg));
  }
  // c [n][16 per lane group] = s x (n bf16 rows, ld apart) against the pairs b0 [R/2][16][2] of one
  // lane group, or of two (b1) sharing each broadcast of x
  void dots(float* c, bool two, const uint16_t* x, int64_t ld, const uint16_t* b0, const uint16_t* b1, int64_t R,
            int64_t n, float s) const {
    const VF sv = vset1<VF>(s);
    if (two)
      dp<2, STORE>(c, c + kLanes, nullptr, nullptr, W, x, ld, 2, b0, b1, 2 * kLanes, n, R / 2, R & 1, sv, sv);
    else
      dp<1, STORE>(c, nullptr, nullptr, nullptr, W, x, ld, 2, b0, nullptr, 2 * kLanes, n, R / 2, R & 1, sv, sv);
  }
  void scores(float* c, int lg, bool two, int64_t a, int64_t n) const {
    dots(c, two, kp + a * ldk, ldk, qt(lg), two ? qt(lg + 1) : nullptr, P->Dk, n, float(q_prescale(*P)));
  }
  void dpt(float* c, int lg, bool two, int64_t a, int64_t n) const {
    dots(c, two, vp + a * ldv, ldv, dot(lg), two ? dot(lg + 1) : nullptr, P->Dv, n, 1.0f);
  }
  // dQ rows = dS K: dS of the m = 16 or 32 rows as key pairs [n/2][m][2] (broadcast), K pairs as
  // the vector operand, lanes over Dk
  void dq(int lg, bool two, int64_t a, int64_t n) const {
    const int64_t m = two ? 2 * kLanes : kLanes;
    float* ds = reinterpret_cast<float*>(S->dspair);
    p_pairs(S->dst + a * W + lg * kLanes, W, n, ds, m);
    if (two) p_pairs(S->dst + a * W + (lg + 1) * kLanes, W, n, ds + kLanes, m);
    sum_rows<STORE>(S->dqt + lg * kLanes * dkp, nullptr, dkp, P->Dk, S->dspair, 2, 2 * m, S->kpair + a * dkp, m,
                    (n + 1) / 2);  // key pair a / 2 (a is even: kKeyStep)
  }
  // float32 rows [ja, jz) of rq values (stride W floats) -> bf16, in place at each row's start
  static void rows_to_bf16(float* x, int64_t ja, int64_t jz, int64_t rq) {
    for (int64_t jj = ja; jj < jz; ++jj) {
      float* r = x + jj * W;
      for (int64_t c = 0; c < rq; c += 2 * kLanes) {
        const __m512 a = _mm512_loadu_ps(r + c), b = _mm512_loadu_ps(r + c + kLanes);
        _mm512_storeu_si512(reinterpret_cast<uint16_t*>(r) + c, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a)));
      }
    }
  }
  // C rows [M][ld] = (STORE) or += (KAHAN, carry rows k) A B over the 16-float chunks of D, two
  // chunks per broadcast of A: A's pair r of row m at a + m sam + r sar, B pairs [R][ld] dwords
  template <int MODE>
  static void sum_rows(float* c, float* k, int64_t ld, int64_t D, const uint16_t* a, int64_t sam, int64_t sar,
                       const uint16_t* b, int64_t M, int64_t R) {
    const VF one = vset1<VF>(1.0f);
    const auto at = [](float* x, int64_t o) { return x ? x + o : x; };
    const int64_t nc = round_up(D, kLanes) / kLanes;
    int64_t x = 0;
    for (; x + 2 <= nc; x += 2)
      dp<2, MODE>(c + x * kLanes, c + (x + 1) * kLanes, at(k, x * kLanes), at(k, (x + 1) * kLanes), ld, a, sam, sar,
                  b + x * 2 * kLanes, b + (x + 1) * 2 * kLanes, 2 * ld, M, R, false, one, one);
    if (x < nc)
      dp<1, MODE>(c + x * kLanes, nullptr, at(k, x * kLanes), nullptr, ld, a, sam, sar, b + x * 2 * kLanes, nullptr,
                  2 * ld, M, R, false, one, one);
  }
  void dkv(float* dka, float* dva, int64_t ja, int64_t jz, int64_t rq) const {
    rows_to_bf16(S->pt, ja, jz, rq);
    rows_to_bf16(S->dst, ja, jz, rq);
    const uint16_t* pb = reinterpret_cast<const uint16_t*>(S->pt + ja * W);
    const uint16_t* db = reinterpret_cast<const uint16_t*>(S->dst + ja * W);
    sum_rows<KAHAN>(dva + ja * dvp, S->dvc + ja * dvp, dvp, P->Dv, pb, 2 * W, 2,
                    reinterpret_cast<const uint16_t*>(S->dos), jz - ja, rq / 2);
    sum_rows<KAHAN>(dka + ja * dkp, S->dkc + ja * dkp, dkp, P->Dk, db, 2 * W, 2,
                    reinterpret_cast<const uint16_t*>(S->qs), jz - ja, rq / 2);
  }
};

template <>
void bwd_item<bf16_t>(const Params& P, BwdBufs<bf16_t>& S, int tid, int64_t it, int64_t b, int64_t g, int64_t kb,
                      const RowBlocks& rb, const DqOrder& order, const RowStats<bf16_t>& rs, float* dq,
                      uint8_t* row_nan) {
  bwd_tiles<Bf16Bwd>(P, S, tid, it, b, g, kb, rb, order, rs, dq, row_nan);
}

}  // namespace QKV_NS
}  // namespace qkv_native

// The entry points below use forward_impl<bf16_t> and backward_impl<bf16_t> only; the other
// dtypes are the avx512 unit's (so kernels_impl.hpp's own entry points are unused here).
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
static bool backward_bf16(const Params& P) {
  return P.dtype == DType::bf16 ? backward_impl<bf16_t>(P) : kTableAvx512.backward(P);
}
static double microbench_bf16(int kind, int64_t reps) { return kTableAvx512.microbench(kind, reps); }
}  // namespace QKV_NS

extern const KernelTable kTableAvx512Bf16 = {"avx512bf16", &avx512bf16::forward_bf16, &avx512bf16::backward_bf16,
                                             &avx512bf16::microbench_bf16};
}  // namespace qkv_native
