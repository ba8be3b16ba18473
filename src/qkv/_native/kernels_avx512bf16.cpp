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
                                                           float* __restrict k0, float* __restrict k1,
                                                           const uint16_t* __restrict a, int64_t sam, int64_t sar,
                                                           const uint16_t* __restrict b0, const uint16_t* __restrict b1,
                                                           int64_t R, bool half, VF s0, VF s1) {
  __m512 acc0[NRm], acc1[NRm];
#pragma GCC unroll 16
  for (int m = 0; m < NRm; ++m) acc0[m] = acc1[m] = _mm512_setzero_ps();
  for (int64_t p = 0; p < R; ++p) {
    const __m512i x0 = _mm512_load_si512(b0 + p * 2 * kLanes);
    const __m512i x1 = NG == 2 ? _mm512_load_si512(b1 + p * 2 * kLanes) : x0;
#pragma GCC unroll 16
    for (int m = 0; m < NRm; ++m) {
      const __m512i y = bcast_pair(a + m * sam + p * sar);
      acc0[m] = dpbf16(acc0[m], y, x0);
      if constexpr (NG == 2) acc1[m] = dpbf16(acc1[m], y, x1);
    }
  }
  if (half) {  // never read past a row (the next element may be NaN or unmapped)
    const __m512i x0 = _mm512_load_si512(b0 + R * 2 * kLanes);
    const __m512i x1 = NG == 2 ? _mm512_load_si512(b1 + R * 2 * kLanes) : x0;
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
      kahan_add(c0 + m * kLanes, k0 + m * kLanes, VF{acc0[m]}, s0);
      if constexpr (NG == 2) kahan_add(c1 + m * kLanes, k1 + m * kLanes, VF{acc1[m]}, s1);
    } else {
      _mm512_store_ps(c0 + m * kLanes, _mm512_mul_ps(acc0[m], s0.a));
      if constexpr (NG == 2) _mm512_store_ps(c1 + m * kLanes, _mm512_mul_ps(acc1[m], s1.a));
    }
  }
}

template <int NG, int K, int MODE>
static inline void dp_tail(int rem, float* c0, float* c1, float* k0, float* k1, const uint16_t* a, int64_t sam,
                           int64_t sar, const uint16_t* b0, const uint16_t* b1, int64_t R, bool half, VF s0, VF s1) {
  if constexpr (K >= 1) {
    if (rem == K) return dp_block<NG, K, MODE>(c0, c1, k0, k1, a, sam, sar, b0, b1, R, half, s0, s1);
    dp_tail<NG, K - 1, MODE>(rem, c0, c1, k0, k1, a, sam, sar, b0, b1, R, half, s0, s1);
  }
}

// dp_block over M rows of C ([M][16] each; k0 / k1 only for KAHAN, c1 / k1 / b1 only for NG = 2).
template <int NG, int MODE>
static void dp(float* c0, float* c1, float* k0, float* k1, const uint16_t* a, int64_t sam, int64_t sar,
               const uint16_t* b0, const uint16_t* b1, int64_t M, int64_t R, bool half, VF s0, VF s1) {
  constexpr int NR = NG == 1 ? NR_BF : NR_BF2;
  const auto at = [](float* x, int64_t m) { return x ? x + m * kLanes : x; };
  int64_t m = 0;
  for (; m + NR <= M; m += NR)
    dp_block<NG, NR, MODE>(c0 + m * kLanes, at(c1, m), at(k0, m), at(k1, m), a + m * sam, sam, sar, b0, b1, R, half, s0,
                           s1);
  if (m < M)
    dp_tail<NG, NR - 1, MODE>(int(M - m), c0 + m * kLanes, at(c1, m), at(k0, m), at(k1, m), a + m * sam, sam, sar, b0,
                              b1, R, half, s0, s1);
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
// row past an odd jn as zeros. 32 d per step: two row loads, two vpermt2w interleaving them (the
// widen-shift-or of 16 d at a time it replaces took ~15% of a dense bf16 forward, perf).
static void pack_v(const uint16_t* v, int64_t ldv, int64_t jn, int64_t Dv, const TileRows& bad, uint32_t* vp) {
  const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37, 5,
                                      36, 4, 35, 3, 34, 2, 33, 1, 32, 0);  // a0 b0 a1 b1 ... a15 b15
  const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));          // a16 b16 ... a31 b31
  for (int64_t p = 0; 2 * p < jn; ++p) {
    const int64_t j = 2 * p;
    const bool z0 = bad.any && bad.bad[j], z1 = j + 1 >= jn || (bad.any && bad.bad[j + 1]);
    const uint16_t* ra = v + j * ldv;
    const uint16_t* rb = ra + ldv;
    uint32_t* dst = vp + p * Dv;
    int64_t d = 0;
    for (; d + 2 * kLanes <= Dv; d += 2 * kLanes) {
      const __m512i a = z0 ? _mm512_setzero_si512() : _mm512_loadu_si512(ra + d);
      const __m512i b = z1 ? _mm512_setzero_si512() : _mm512_loadu_si512(rb + d);
      _mm512_storeu_si512(dst + d, _mm512_permutex2var_epi16(a, lo, b));
      _mm512_storeu_si512(dst + d + kLanes, _mm512_permutex2var_epi16(a, hi, b));
    }
    if (d < Dv) {  // never read past a row: masked loads and stores of the last Dv - d < 32
      const int64_t r = Dv - d;
      const __mmask32 m = __mmask32((uint64_t(1) << r) - 1);
      const __m512i a = z0 ? _mm512_setzero_si512() : _mm512_maskz_loadu_epi16(m, ra + d);
      const __m512i b = z1 ? _mm512_setzero_si512() : _mm512_maskz_loadu_epi16(m, rb + d);
      _mm512_mask_storeu_epi32(dst + d, __mmask16(m), _mm512_permutex2var_epi16(a, lo, b));
      if (r > kLanes)
        _mm512_mask_storeu_epi32(dst + d + kLanes, __mmask16(m >> kLanes), _mm512_permutex2var_epi16(a, hi, b));
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
    pack_v(vr, P->v.s2, jn, P->Dv, bv, reinterpret_cast<uint32_t*>(S->vc));
  }
  // S^T: pairs along Dk, K rows broadcast from the range in place
  void scores(float* st, int g, int64_t off, int64_t n) const {
    dp<1, STORE>(st, nullptr, nullptr, nullptr, kp + off * ldk, ldk, 2, q(g), nullptr, n, P->Dk / 2, P->Dk & 1, scale(),
                 scale());
  }
  void scores2(float* st0, float* st1, int g, int64_t off, int64_t n) const {
    dp<2, STORE>(st0, st1, nullptr, nullptr, kp + off * ldk, ldk, 2, q(g), q(g + 1), n, P->Dk / 2, P->Dk & 1, scale(),
                 scale());
  }
  // O^T: pairs along keys (off is even: kKeyStep), P^T rounded to bf16 pairs in place
  void pv(float* pt, int g, int64_t off, int64_t n, VF alpha) const {
    p_pairs(pt, n);
    dp<1, KAHAN>(o(g), nullptr, oc(g), nullptr, vpairs(off), 2, 2 * P->Dv, reinterpret_cast<const uint16_t*>(pt),
                 nullptr, P->Dv, (n + 1) / 2, false, alpha, alpha);
  }
  void pv2(float* pt0, float* pt1, int g, int64_t off, int64_t n, VF a0, VF a1) const {
    p_pairs(pt0, n);
    p_pairs(pt1, n);
    dp<2, KAHAN>(o(g), o(g + 1), oc(g), oc(g + 1), vpairs(off), 2, 2 * P->Dv, reinterpret_cast<const uint16_t*>(pt0),
                 reinterpret_cast<const uint16_t*>(pt1), P->Dv, (n + 1) / 2, false, a0, a1);
  }
};

template <>
void fwd_rowset<bf16_t>(const Params& P, FwdBufs<bf16_t>& S, const LaneGroup* lgs, int nlg, int64_t ka, int64_t kz,
                        uint8_t (*fl)[kLanes]) {
  fwd_tiles<Bf16Dot>(P, S, lgs, nlg, ka, kz, fl);
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
