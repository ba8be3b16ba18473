// Forward tile loop: FlashAttention-2 (Dao, arXiv:2307.08691), Algorithm 1, on the CPU.
//
// A work item is a set of up to kLaneGroups = 4 lane groups (64 (head, query) rows sharing one kv head) and a
// key range (tiles on the BK grid of the mask's plan when it gave tile classes; else from the range's first key). For
// each BK-key tile of the range, each lane group computes its transposed score tile S^T (BK x 16) with the
// micro-kernel, turns it into scores (mods, bias, mask; mods.hpp's units), updates its running max m and sum l (Alg. 1
// lines 8-10: vertical ops, 16 queries per vector), rescales its O^T accumulator by exp2(m_old - m_new) and adds V^T
// P^T. The BK x Nq score matrix never exists; O is divided by l once at the end (Alg. 1 line 12), and lse = m + log l.
// Parallelism: items are independent, handed out dynamically; each writes disjoint rows.
#pragma once
#include <cstdlib>

#include "finite.hpp"
#include "owned.hpp"
#include "microkernel.hpp"
#include "mods.hpp"
#include "philox.hpp"

namespace qkv_native {
inline namespace QKV_NS {

// ------------------------------------------------------------------ scratch

// One aligned, zeroed block per thread, carved into named buffers; sized once per call.
struct Arena {
  char* base = nullptr;
  size_t per_thread = 0;
  Arena() = default;
  Arena(const Arena&) = delete;  // owns base: a copy would free it twice
  Arena& operator=(const Arena&) = delete;
  ~Arena() { std::free(base); }
  bool alloc(int threads, size_t bytes) {
    per_thread = round_up(int64_t(bytes), 64);
    base = static_cast<char*>(std::aligned_alloc(64, per_thread * size_t(threads)));
    if (!base) return false;
    std::memset(base, 0, per_thread * size_t(threads));
    return true;
  }
  char* at(int tid) const { return base + per_thread * size_t(tid); }
};

// Cuts a thread's scratch block into buffers, each starting on a 64-byte line. A scratch struct
// (a Scratch below) lists its buffers once, in a `lay(P, Carver&)`: run on a Carver without memory
// it only counts (bytes: the size to allocate), run on the block it hands out the pointers (carve).
struct Carver {
  char* p = nullptr;
  size_t used = 0;
  template <class C>
  C* take(int64_t n) {
    C* r = p ? reinterpret_cast<C*>(p + used) : nullptr;
    used += size_t(round_up(n * int64_t(sizeof(C)), 64));
    return r;
  }
};

template <class Bufs>
struct Scratch {
  static size_t bytes(const Params& P) {
    Bufs b;
    Carver c;
    b.lay(P, c);
    return c.used;
  }
  void carve(const Params& P, char* p) {
    Carver c{p};
    static_cast<Bufs*>(this)->lay(P, c);
  }

 private:
  Scratch() = default;  // only as the base of its Bufs
  friend Bufs;
};

// ------------------------------------------------------------------ tiles of K and V

// Row widening for K/V tiles. cvt_f16_row is defined by each ISA translation unit (F16C on x86), so
// these live here, with the tile loops, and not in dtypes.hpp (which the entrance includes too).
static inline void cvt_row(const float* s, float* d, int64_t n) { std::memcpy(d, s, size_t(n) * sizeof(float)); }
static inline void cvt_row(const double* s, double* d, int64_t n) { std::memcpy(d, s, size_t(n) * sizeof(double)); }
static inline void cvt_row(const bf16_t* s, float* d, int64_t n) {
  const uint16_t* u = reinterpret_cast<const uint16_t*>(s);
  for (int64_t i = 0; i < n; ++i) d[i] = bits_to_float(uint32_t(u[i]) << 16);  // bf16 = top half of f32
}
static inline void cvt_row(const f16_t* s, float* d, int64_t n) {
  cvt_f16_row(reinterpret_cast<const uint16_t*>(s), d, n);
}

// Rows [j0, j0 + jn) of a (b, g) slice of K or V as compute-type rows: the array itself when it
// already is (no copy), else widened into `buf` with row stride ld_buf (zero padding untouched).
template <class T, class C>
static inline const C* kv_tile(const Strided& x, int64_t b, int64_t g, int64_t j0, int64_t jn, int64_t D, C* buf,
                               int64_t ld_buf, bool force_copy, int64_t& ld) {
  const T* base = static_cast<const T*>(x.data) + b * x.s0 + g * x.s1 + j0 * x.s2;
  if constexpr (std::is_same_v<T, C>) {
    if (!force_copy) {
      ld = x.s2;
      return base;
    }
  }
  for (int64_t jj = 0; jj < jn; ++jj) cvt_row(base + jj * x.s2, buf + jj * ld_buf, D);
  ld = ld_buf;
  return buf;
}

// Q^T [Dk][16] of a lane group (zero lanes beyond n).
template <class T, class C>
static inline void load_qt(const Params& P, const LaneGroup& lg, C* qt, uint8_t* fl) {
  std::memset(static_cast<void*>(qt), 0, sizeof(C) * size_t(P.Dk) * kLanes);
  const T* q = static_cast<const T*>(P.q.data);
  const C f = C(q_prescale(P));
  for (int l = 0; l < lg.n; ++l) {
    const T* row = q + lg.b * P.q.s0 + lg.h[l] * P.q.s1 + lg.i[l] * P.q.s2;
    if (!storage_finite(row, P.Dk)) {
      fl[l] |= kBadQ;
      continue;
    }  // left zero: the row sees scores of 0
    for (int64_t d = 0; d < P.Dk; ++d) qt[d * kLanes + l] = to_c<C>(row[d]) * f;
  }
}

// ------------------------------------------------------------------ the online-softmax step

// Raw S^T [jn][16] in st -> P^T in place; updates m (score_row's units, mods.hpp) and l (summed per
// tile, then added compensated, with its carry in l_comp); returns alpha = exp(m_old - m_new) for
// the caller's O rescale. Dropout (inverted) is applied to P after the row sum, so l
// and lse stay the pre-dropout ones.
// sum_{x < n} p(x) per lane (a row's keys: one lane per query row here, a lane's keys in decode),
// in pairs summed from zero, each pair added compensated (Kahan) to one of two sums (pairs
// alternate), and the two sums added at the end. One running sum per lane swallowed every small
// P_ij added after the row's largest (~1): each below half an ulp of 1 was lost whole, all with one
// sign, so l came out low (5e-7 relative on a softcap row whose largest P is 0.955, 257 keys: dK 4x
// torch's float32 error; 5e-7 on a row of one dominant key and 127 keys of ~5e-8, 8x torch's lse
// error). Now only the key paired with a dominant one can be lost. A compensated add is four
// dependent adds; two sums in turn keep the loop's chain at one add per key, the plain sum's
// (one sum measured 1-2.5% of the dense forward on Zen 4).
template <class V>
struct Kahan {
  V sum = vzero<V>(), carry = vzero<V>();
  void add(V t) {
    const V y = vsub(t, carry);
    const V s = vadd(sum, y);
    carry = vsub(vsub(s, sum), y);
    sum = s;
  }
  V value() const { return vsub(sum, carry); }
};

template <class V, class F>
static inline V tile_sum(int64_t n, F p) {
  Kahan<V> k0, k1;
  int64_t x = 0;
  for (; x + 4 <= n; x += 4) {
    const V a = p(x), b = p(x + 1), c = p(x + 2), d = p(x + 3);
    k0.add(vadd(a, b));
    k1.add(vadd(c, d));
  }
  if (x + 2 <= n) {
    const V a = p(x), b = p(x + 1);
    k0.add(vadd(a, b));
    x += 2;
  }
  if (x < n) k1.add(p(x));
  k0.add(k1.value());
  return k0.value();
}

template <class T, class C>
static inline typename VecOf<C>::V softmax_tile(const Params& P, const LaneGroup& lg, const ModLanes<C>& ml,
                                                const TileMask& tm, int64_t j0, int64_t jn, C* st, const C* addt,
                                                C* m_run, C* l_run, C* l_comp) {
  using V = typename VecOf<C>::V;
  const bool masked = tm.mode == TILE_MASKED;
  V lo = vzero<V>(), hi = vzero<V>();
  if (masked) {
    alignas(64) C a[kLanes], z[kLanes];
    for (int l = 0; l < kLanes; ++l) {
      a[l] = C(tm.lo[l]);
      z[l] = C(tm.hi[l]);
    }
    lo = vload(a);
    hi = vload(z);
  }
  const V ninf = vset1<V>(C(-INFINITY));
  V tmax = ninf;
  // Keys [fa, fz) are inside every lane's interval: no mask work there, only on the ragged edges
  // [0, fa) and [fz, jn) (at most the partial 16 keys of a causal diagonal or a window edge).
  const int64_t fa = masked ? tm.free_lo : 0, fz = masked ? tm.free_hi : jn;
  const auto edge = [&](int64_t jj, V s) {
    const V jv = vset1<V>(C(jj));
    return vsel(vand(vle(lo, jv), vlt(jv, hi)), s, ninf);
  };
  if (P.n_mods == 0 && !addt) {
    // plain scores left the matmul final: the row max, and the edges masked in place
    for (int64_t jj = 0; jj < fa; ++jj) {
      const V s = edge(jj, vload(st + jj * kLanes));
      vstore(st + jj * kLanes, s);
      tmax = vmax(tmax, s);
    }
    for (int64_t jj = fa; jj < fz; ++jj) tmax = vmax(tmax, vload(st + jj * kLanes));
    for (int64_t jj = fz; jj < jn; ++jj) {
      const V s = edge(jj, vload(st + jj * kLanes));
      vstore(st + jj * kLanes, s);
      tmax = vmax(tmax, s);
    }
  } else
    for (int64_t jj = 0; jj < jn; ++jj) {
      V s = score_row<V, false>(P, ml, vload(st + jj * kLanes), j0 + jj, addt ? addt + jj * kLanes : nullptr,
                                static_cast<V*>(nullptr));
      if (jj < fa || jj >= fz) s = edge(jj, s);
      vstore(st + jj * kLanes, s);
      tmax = vmax(tmax, s);
    }
  const V m_old = vload(m_run);
  const V m_new = vmax(m_old, tmax);
  // a row with nothing allowed yet keeps m = -inf; subtract 0 instead so exp2 sees -inf, not NaN
  const V m_use = vsel(veq(m_new, ninf), vzero<V>(), m_new);
  V sum = vzero<V>(), alpha;
  if (P.n_mods == 0) {  // log2 units
    alpha = vexp2(vsub(m_old, m_use));
    sum = tile_sum<V>(jn, [&](int64_t jj) {
      const V p = vexp2(vsub(vload(st + jj * kLanes), m_use));
      vstore(st + jj * kLanes, p);
      return p;
    });
  } else {  // natural units: exp2((s - m) log2 e)
    const V u = vset1<V>(C(kLog2e));
    alpha = vexp2(vmul(vsub(m_old, m_use), u));
    sum = tile_sum<V>(jn, [&](int64_t jj) {
      const V p = vexp2(vmul(vsub(vload(st + jj * kLanes), m_use), u));
      vstore(st + jj * kLanes, p);
      return p;
    });
  }
  kahan_add(l_run, l_comp, sum, alpha);
  vstore(m_run, m_new);
  if (P.dropout_p > 0.0) {
    const uint32_t thr = dropout_threshold(P.dropout_p);
    const C inv = C(1.0 / (1.0 - P.dropout_p));
    for (int l = 0; l < lg.n; ++l)
      philox_row(P.seed, uint32_t(lg.b), uint32_t(lg.h[l]), uint32_t(lg.i[l]), j0, j0 + jn, thr,
                 [&](int64_t j, bool keep) { st[(j - j0) * kLanes + l] *= keep ? inv : C(0); });
  }
  return alpha;
}

// Writes out rows (divided by l) and lse = (m + log2 l) ln 2; l = 0 -> zeros and -inf. A row its
// flags condemn, whose l is NaN or m +inf (a non-finite score from clean inputs: an overflow), or
// that is empty although it admits keys (every score overflowed to -inf) -> NaN and lse = NaN,
// counted (finite.hpp). o(l, d) reads the accumulator of lane l; ok (optional, T = C only: no
// narrowing) says whether lane l's written row is finite, known before the row is stored.
template <class T, class C, class Get>
static inline void write_rows(const Params& P, const LaneGroup& lg, const C* m_run, const C* l_run, const uint8_t* fl,
                              Get&& o, const uint8_t* ok = nullptr) {
  T* out = static_cast<T*>(P.out);
  C* lse = static_cast<C*>(P.lse);
  C* lse_lo = static_cast<C*>(P.lse_lo);  // optional: lse's rounding (params.hpp), 0 where lse is not finite
  for (int l = 0; l < lg.n; ++l) {
    const int64_t row = (lg.b * P.H + lg.h[l]) * P.Nq + lg.i[l];
    T* dst = out + row * P.Dv;
    const uint8_t f = uint8_t(fl[l] | score_flags(m_run[l], l_run[l]));
    const bool attended = l_run[l] > C(0) || (f & kOverflow);
    uint8_t verdict = row_verdict(f, attended);
    if (!verdict && !attended) {
      if (!row_admits(P, lg, l)) {
        for (int64_t d = 0; d < P.Dv; ++d) dst[d] = Narrow<T>::from(C(0));
        lse[row] = C(-INFINITY);
        if (lse_lo) lse_lo[row] = C(0);
        continue;
      }
      verdict = kOverflow;
    }
    if (!verdict) {
      // o / l rounded once (o * (1 / l) rounded twice: up to an ulp more of every output; l >= 1,
      // the row's largest weight being 1, so both are finite exactly where o is: rows_finite)
      const C lr = l_run[l];
      for (int64_t d = 0; d < P.Dv; ++d) dst[d] = Narrow<T>::from(o(l, d) / lr);
      const double x = (double(m_run[l]) * score_unit(P) + std::log2(double(l_run[l]))) * kLn2;
      lse[row] = C(x);
      if (lse_lo) lse_lo[row] = C(x - double(C(x)));
      // the written row, by a bitwise test (a compare in the loop above measured 6% slower)
      if (ok ? ok[l] != 0 : storage_finite(dst, P.Dv)) continue;
      verdict = kOverflow;  // finite scores: a value row the tile loop did not scan, or |v| near the limit
    }
    if (verdict == kOverflow && row_reads_nonfinite<T>(P, lg, l)) verdict = kBadInput;
    for (int64_t d = 0; d < P.Dv; ++d) dst[d] = Narrow<T>::from(C(NAN));
    lse[row] = C(NAN);
    if (lse_lo) lse_lo[row] = C(0);
    count_row(P, verdict);
  }
}

// Whether each lane's row O^T[.][l] / l_run[l] is finite, from the O^T [Dv][16] accumulator: the
// products write_rows stores (the same IEEE multiply), probed as x * 0 + p (finite.hpp). Reading
// the rows back after storing them stalled on the stores' cache misses: ~40% of fwd_finish on W3.
template <class C>
static inline void rows_finite(const C* ot, int64_t Dv, const C* l_run, uint8_t* ok) {
  using V = typename VecOf<C>::V;
  alignas(64) C t[kLanes];
  for (int l = 0; l < kLanes; ++l) t[l] = l_run[l] > C(0) ? C(1) / l_run[l] : C(0);
  const V inv = vload(t), zero = vzero<V>();
  V p = zero;
  for (int64_t d = 0; d < Dv; ++d) p = vfma(vmul(vload(ot + d * kLanes), inv), zero, p);
  vstore(t, p);
  for (int l = 0; l < kLanes; ++l) ok[l] = uint8_t(t[l] == t[l]);
}

// Partial result of a key-range split (decode): per lane m (score_unit's units), l, flags and unnormalised O.
template <class C>
struct Partial {
  C* m;
  C* l;
  C* f;
  C* o;
};

// Keys [j0, j0 + jn) of (b, g) as clean tiles (finite.hpp): in clean aligned tiles (the usual
// case, one byte read) kp / vp stay as they are; else they point at copies with the non-finite
// rows zeroed, and the lanes that attend one of those rows are flagged.
template <class T, class C>
static inline void clean_tile(const Params& P, const LaneGroup* lgs, int nlg, const TileMask* tm, int64_t j0,
                              int64_t jn, C* kbuf, C* vbuf, int64_t ldkb, int64_t ldvb, const C*& kp, int64_t& ldk,
                              const C*& vp, int64_t& ldv, uint8_t (*fl)[kLanes]) {
  if (kv_range_clean<T>(P, lgs[0].b, lgs[0].g, j0, jn)) return;
  dirty_tile(P, lgs, nlg, tm, j0, jn, kbuf, vbuf, ldkb, ldvb, kp, ldk, vp, ldv, fl);
}

// A K / V tile with non-finite rows (rare, so out of the tile loop's function): the lanes are
// flagged by their masks over the whole tile (a lane's interval lies inside its group's span, so
// these are the keys the spans read), and kp / vp point at zeroed copies (finite.hpp).
template <class C>
__attribute__((noinline)) static void dirty_span(const Params& P, const LaneGroup* lgs, int nlg, int64_t kb, int64_t j0,
                                                 int64_t jn, C* kbuf, C* vbuf, int64_t ldkb, int64_t ldvb, const C*& kp,
                                                 int64_t& ldk, const C*& vp, int64_t& ldv, uint8_t (*fl)[kLanes]) {
  TileMask whole[kLaneGroups];
  for (int g = 0; g < nlg; ++g) classify(P, lgs[g], kb, j0, jn, whole[g]);
  dirty_tile(P, lgs, nlg, whole, j0, jn, kbuf, vbuf, ldkb, ldvb, kp, ldk, vp, ldv, fl);
}

// ------------------------------------------------------------------ the wide path

template <class T>
struct FwdBufs : Scratch<FwdBufs<T>> {
  using C = typename Compute<T>::type;
  C *qt, *ot, *st, *st2, *addt, *kc, *vc, *ml, *qr, *orow;
  C *oc, *lc;  // the Kahan carries of O (wide: 4 x Dv x 16; thin: rows x dvp) and of l (microkernel.hpp)
  // Per lane group: Q^T (qt), O^T (ot), m and l (ml), l's carry (lc); per tile: S^T of a pair
  // (st, st2), the additive tile, widened K / V (kc, vc); one row's Q / O (qr, orow, the thin
  // path); O's carry (oc: wide, every lane group's O^T; thin, up to 8 rows).
  void lay(const Params& P, Carver& c) {
    const int64_t dkp = round_up(P.Dk, kLanes), dvp = round_up(P.Dv, kLanes);
    qt = c.take<C>(kLaneGroups * P.Dk * kLanes);
    ot = c.take<C>(kLaneGroups * P.Dv * kLanes);
    st = c.take<C>(P.bk * kLanes);
    st2 = c.take<C>(P.bk * kLanes);
    addt = c.take<C>(P.bk * kLanes);
    kc = c.take<C>(P.bk * dkp);
    vc = c.take<C>(P.bk * dvp);
    ml = c.take<C>(2 * kLaneGroups * kLanes);
    qr = c.take<C>(kLanes * dkp);
    orow = c.take<C>(kLanes * dvp);
    oc = c.take<C>(imax(kLaneGroups * P.Dv * kLanes, 8 * dvp));
    lc = c.take<C>(kLaneGroups * kLanes);
  }
};

// The dot products of the tile loop below, on compute-type operands: microkernel.hpp's gemm16 /
// gemm16x2 on Q^T [Dk][16] per lane group, K and V read in place (widened per range when stored
// narrower). kernels_avx512bf16.cpp has another with the same members (vdpbf16ps on bf16 pairs).
// fwd_tiles runs over one (its caller's Dot{&P, &S}); it keeps the range read:
//   load_q(lg, g, fl)       lane group lg's queries into slot g, its bad q rows flagged
//   range(lgs, nlg, kb, j0, jn, fl)  K and V rows [j0, j0 + jn) ready (the union of the spans
//                           of one tile), clean (finite.hpp): lanes attending a bad row flagged
//   scores / scores2        S^T of slot g (and g + 1) for the n keys at offset off of the range
//   pv / pv2                O^T = O^T alpha + V^T P^T (compensated) from the same keys; P^T
//                           (the softmax's, in S.st / S.st2) may be overwritten
//   kKeyStep                spans start at a multiple of it from the range's start (2: the bf16
//                           kernels pair keys, and P's pairs must meet V's packed ones)
template <class T>
struct WideDot {
  using C = typename Compute<T>::type;
  using V = typename VecOf<C>::V;
  static constexpr int64_t kKeyStep = 1;
  const Params* P;
  FwdBufs<T>* S;
  const C* kp = nullptr;
  const C* vp = nullptr;
  int64_t ldk = 0, ldv = 0;

  const C* q(int g) const { return S->qt + g * P->Dk * kLanes; }
  C* o(int g) const { return S->ot + g * P->Dv * kLanes; }
  C* oc(int g) const { return S->oc + g * P->Dv * kLanes; }
  void load_q(const LaneGroup& lg, int g, uint8_t* fl) { load_qt<T, C>(*P, lg, S->qt + g * P->Dk * kLanes, fl); }
  void range(const LaneGroup* lgs, int nlg, int64_t kb, int64_t j0, int64_t jn, uint8_t (*fl)[kLanes]) {
    const int64_t b = lgs[0].b, g = lgs[0].g, dkp = round_up(P->Dk, kLanes), dvp = round_up(P->Dv, kLanes);
    if (P->kv_format != KvFormat::native) {  // a quantized cache: the dequantised copy, scanned (quant.hpp)
      dequant_tile(P->kv_format, P->k, P->k_scale, b, g, j0, jn, P->Dk, S->kc, dkp);
      dequant_tile(P->kv_format, P->v, P->v_scale, b, g, j0, jn, P->Dv, S->vc, dvp);
      kp = S->kc;
      vp = S->vc;
      ldk = dkp;
      ldv = dvp;
      dirty_span(*P, lgs, nlg, kb, j0, jn, S->kc, S->vc, dkp, dvp, kp, ldk, vp, ldv, fl);
      return;
    }
    kp = kv_tile<T, C>(P->k, b, g, j0, jn, P->Dk, S->kc, dkp, false, ldk);
    vp = kv_tile<T, C>(P->v, b, g, j0, jn, P->Dv, S->vc, dvp, false, ldv);
    if (!kv_range_clean<T>(*P, b, g, j0, jn))
      dirty_span(*P, lgs, nlg, kb, j0, jn, S->kc, S->vc, dkp, dvp, kp, ldk, vp, ldv, fl);
  }
  void scores(C* st, int g, int64_t off, int64_t n) const {
    gemm16<false>(st, kLanes, kp + off * ldk, ldk, 1, q(g), kLanes, n, P->Dk);
  }
  void scores2(C* st0, C* st1, int g, int64_t off, int64_t n) const {
    gemm16x2(st0, st1, kLanes, kp + off * ldk, ldk, 1, q(g), q(g + 1), kLanes, n, P->Dk);
  }
  void pv(C* pt, int g, int64_t off, int64_t n, V alpha) const {
    gemm16_kahan(o(g), oc(g), kLanes, vp + off * ldv, 1, ldv, pt, kLanes, P->Dv, n, alpha);
  }
  void pv2(C* pt0, C* pt1, int g, int64_t off, int64_t n, V a0, V a1) const {
    gemm16x2_kahan(o(g), oc(g), o(g + 1), oc(g + 1), kLanes, vp + off * ldv, 1, ldv, pt0, pt1, kLanes, P->Dv, n, a0,
                   a1);
  }
};

// Up to kLaneGroups lane groups of one (b, g) against keys [ka, kz) (tile-aligned ka when the mask's plan gave
// tile classes): the tile loop only, over the dot products of a Dot (WideDot above). It leaves m,
// l (S.ml) and O^T (S.ot) of each lane group, and their flags in fl, for fwd_finish.
// Kept free of everything else: cold code in this function (a row check, a call) measured 5-9%
// slower dense forward, the loops' code being sensitive to what shares their function.
template <class Dot, class T>
__attribute__((noinline)) static void fwd_tiles(const Params& P, FwdBufs<T>& S, const LaneGroup* lgs, int nlg,
                                                int64_t ka, int64_t kz, uint8_t (*fl)[kLanes], Dot dot) {
  using C = typename Compute<T>::type;
  using V = typename VecOf<C>::V;
  ModLanes<C> ml[kLaneGroups];
  TileMask tm[kLaneGroups];
  for (int g = 0; g < nlg; ++g) {
    dot.load_q(lgs[g], g, fl[g]);
    std::memset(static_cast<void*>(dot.o(g)), 0, sizeof(C) * size_t(P.Dv) * kLanes);
    std::memset(static_cast<void*>(dot.oc(g)), 0, sizeof(C) * size_t(P.Dv) * kLanes);
    vstore(S.lc + g * kLanes, vzero<V>());
    vstore(S.ml + g * 2 * kLanes, vset1<V>(C(-INFINITY)));
    vstore(S.ml + g * 2 * kLanes + kLanes, vzero<V>());
    mod_lanes_init(P, lgs[g], ml[g]);
  }
  // Intervals alone (no tile grid to honour): each pair of lane groups loops over the exact key
  // span of its 32 rows (mask.hpp lane_span) inside the shared K/V tile, so a causal diagonal or
  // a window edge costs it its ragged keys, not the rest of a 128-key tile. The two lane groups
  // of a pair share every broadcast of K and V (scores2, pv2); stacked GQA heads have equal spans.
  const bool spans = P.rows && !P.tile_class;
  LaneSpan sp[kLaneGroups / 2];
  for (int g = 0; g < nlg; g += 2) {
    LaneSpan x = spans ? lane_span(P, lgs[g]) : LaneSpan{ka, kz, 0, 0};
    if (spans && g + 1 < nlg) {
      const LaneSpan y = lane_span(P, lgs[g + 1]);
      if (x.a >= x.z)
        x = y;
      else if (y.a < y.z) {
        x.a = imin(x.a, y.a);
        x.z = imax(x.z, y.z);
      }
    }
    sp[g / 2] = x;
  }
  const int npair = (nlg + 1) / 2;
  for (int64_t j0 = ka; j0 < kz; j0 += P.bk) {
    const int64_t jn = imin(P.bk, kz - j0), kb = j0 / P.bk;
    // each pair's keys [s0[p], s1[p]) in this tile, and their union [t0, t1): the range read
    int64_t s0[kLaneGroups / 2], s1[kLaneGroups / 2], t0 = j0 + jn, t1 = j0;
    for (int p = 0; p < npair; ++p) {
      s0[p] = imax(j0, sp[p].a);
      s1[p] = imin(j0 + jn, sp[p].z);
      if (s0[p] < s1[p]) {
        t0 = imin(t0, s0[p]);
        t1 = imax(t1, s1[p]);
      }
    }
    if (t0 >= t1) continue;
    bool any = false;
    for (int p = 0; p < npair; ++p) {
      // down to the Dot's key step from t0: the keys added lie outside every lane's interval
      if (s0[p] < s1[p]) s0[p] = t0 + (s0[p] - t0) / Dot::kKeyStep * Dot::kKeyStep;
      for (int g = 2 * p; g < 2 * p + 2 && g < nlg; ++g) {
        if (s1[p] <= s0[p]) {
          tm[g].mode = TILE_SKIP;
          continue;
        }
        classify(P, lgs[g], kb, s0[p], s1[p] - s0[p], tm[g]);
        any = any || tm[g].mode != TILE_SKIP;
      }
    }
    if (!any) continue;
    dot.range(lgs, nlg, kb, t0, t1 - t0, fl);
    for (int g = 0; g < nlg; g += 2) {
      const int64_t a = s0[g / 2], n = s1[g / 2] - a, off = a - t0;
      const bool pair = g + 1 < nlg && tm[g].mode != TILE_SKIP && tm[g + 1].mode != TILE_SKIP;
      if (pair) {
        C* m0 = S.ml + g * 2 * kLanes;
        C* m1 = m0 + 2 * kLanes;
        dot.scores2(S.st, S.st2, g, off, n);
        bool has_add = build_additive(P, lgs[g], tm[g], a, n, S.addt, fl[g]);
        const V a0 = softmax_tile<T, C>(P, lgs[g], ml[g], tm[g], a, n, S.st, has_add ? S.addt : nullptr, m0,
                                        m0 + kLanes, S.lc + g * kLanes);
        has_add = build_additive(P, lgs[g + 1], tm[g + 1], a, n, S.addt, fl[g + 1]);
        const V a1 = softmax_tile<T, C>(P, lgs[g + 1], ml[g + 1], tm[g + 1], a, n, S.st2, has_add ? S.addt : nullptr,
                                        m1, m1 + kLanes, S.lc + (g + 1) * kLanes);
        dot.pv2(S.st, S.st2, g, off, n, a0, a1);
        continue;
      }
      for (int h = g; h < g + 2 && h < nlg; ++h) {
        if (tm[h].mode == TILE_SKIP) continue;
        dot.scores(S.st, h, off, n);
        const bool has_add = build_additive(P, lgs[h], tm[h], a, n, S.addt, fl[h]);
        C* m_run = S.ml + h * 2 * kLanes;
        const V alpha = softmax_tile<T, C>(P, lgs[h], ml[h], tm[h], a, n, S.st, has_add ? S.addt : nullptr, m_run,
                                           m_run + kLanes, S.lc + h * kLanes);
        // O^T = O^T alpha + V^T P^T, the tile summed from zero and added compensated (microkernel.hpp)
        dot.pv(S.st, h, off, n, alpha);
      }
    }
  }
}

// The tile loop of a dtype. kernels_avx512bf16.cpp specializes it for bf16_t (fwd_tiles over its
// vdpbf16ps Dot): keep the signature in step.
template <class T>
static void fwd_rowset(const Params& P, FwdBufs<T>& S, const LaneGroup* lgs, int nlg, int64_t ka, int64_t kz,
                       uint8_t (*fl)[kLanes]) {
  fwd_tiles(P, S, lgs, nlg, ka, kz, fl, WideDot<T>{&P, &S});
}

// After fwd_rowset: the rows of each lane group (write_rows), or, for a decode split (part), the
// unnormalised partials with their flags.
template <class T>
__attribute__((noinline)) static void fwd_finish(const Params& P, FwdBufs<T>& S, const LaneGroup* lgs, int nlg,
                                                 const uint8_t (*fl)[kLanes],
                                                 const Partial<typename Compute<T>::type>* part) {
  using C = typename Compute<T>::type;
  const int64_t Dv = P.Dv;
  for (int g = 0; g < nlg; ++g) {
    const C* m_run = S.ml + g * 2 * kLanes;
    const C* ot = S.ot + g * Dv * kLanes;
    if (part) {
      for (int l = 0; l < kLanes; ++l) {
        part->m[g * kLanes + l] = m_run[l];
        part->l[g * kLanes + l] = m_run[kLanes + l];
        part->f[g * kLanes + l] = C(fl[g][l] | score_flags(m_run[l], m_run[kLanes + l]));
        for (int64_t d = 0; d < Dv; ++d) part->o[(g * kLanes + l) * Dv + d] = ot[d * kLanes + l];
      }
    } else {
      uint8_t ok[kLanes] = {};
      if constexpr (std::is_same_v<T, C>) rows_finite(ot, Dv, m_run + kLanes, ok);
      write_rows<T, C>(
          P, lgs[g], m_run, m_run + kLanes, fl[g], [&](int l, int64_t d) { return ot[d * kLanes + l]; },
          std::is_same_v<T, C> ? ok : nullptr);
    }
  }
}

}  // namespace QKV_NS
}  // namespace qkv_native
