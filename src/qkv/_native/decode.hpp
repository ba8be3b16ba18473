// Decode: few queries (Nq <= 16) against a long K/V (flash-decoding, split-K).
//
// All H/Hkv query heads of a kv head are stacked into one row set ((h, i) rows, h-major), so K and
// V are read once per kv head however many query heads share them (grouped-query attention: no
// K/V copy, no repeat). With fewer row sets than threads the key range is split into contiguous,
// tile-aligned parts; each part leaves a partial (m, l, O) and the parts are merged by their
// log-sum-exp in a fixed order (deterministic for a given thread count).
//
// With at most 8 rows, the wide layout (16 queries across the lanes) would waste most of its
// lanes, so the "thin" path puts Dk / Dv across the lanes instead: S = one dot product per
// (key, row) finished by a horizontal sum, and O rows += P * V rows. Memory-bound either way:
// each K/V byte is used by every row of the set while it is in L1.
#pragma once
#include "attention_fwd.hpp"

namespace qkv_native {
inline namespace QKV_NS {

constexpr int kThinMaxRows = 8;

// One lane group of <= 8 rows against keys [ka, kz): thin layout. Same results as fwd_rowset, and
// as it, the tile loop alone (thin_finish writes the rows): cold code here slows the loop.
template <class T>
__attribute__((noinline)) static void fwd_thin(const Params& P, FwdBufs<T>& S, const LaneGroup& lg, int64_t ka,
                                               int64_t kz, uint8_t* fl) {
  using C = typename Compute<T>::type;
  using V = typename VecOf<C>::V;
  const int64_t dkp = round_up(P.Dk, kLanes), dvp = round_up(P.Dv, kLanes), nck = dkp / kLanes;
  // rows of Q (zero-padded to dkp) and of O, reusing the wide path's buffers
  C* qr = S.qr;      // [rows][dkp]
  C* orow = S.orow;  // [rows][dvp]
  std::memset(static_cast<void*>(qr), 0, sizeof(C) * size_t(kThinMaxRows * dkp));
  std::memset(static_cast<void*>(orow), 0, sizeof(C) * size_t(kThinMaxRows * dvp));
  std::memset(static_cast<void*>(S.oc), 0, sizeof(C) * size_t(kThinMaxRows * dvp));
  const T* q = static_cast<const T*>(P.q.data);
  for (int l = 0; l < lg.n; ++l) {
    const T* row = q + lg.b * P.q.s0 + lg.h[l] * P.q.s1 + lg.i[l] * P.q.s2;
    if (!storage_finite(row, P.Dk)) {
      fl[l] |= kBadQ;
      continue;
    }  // left zero: the row sees scores of 0
    for (int64_t d = 0; d < P.Dk; ++d) qr[l * dkp + d] = to_c<C>(row[d]) * C(q_prescale(P));
  }
  C* m_run = S.ml;
  C* l_run = S.ml + kLanes;
  vstore(m_run, vset1<V>(C(-INFINITY)));
  vstore(l_run, vzero<V>());
  vstore(S.lc, vzero<V>());
  ModLanes<C> ml;
  mod_lanes_init(P, lg, ml);
  TileMask tm;
  // K/V rows must be zero-padded to a multiple of 16 for the lane-wide loads: copy when they are not
  const bool copy_k = !std::is_same_v<T, C> || P.Dk % kLanes != 0;
  const bool copy_v = !std::is_same_v<T, C> || P.Dv % kLanes != 0;
  for (int64_t j0 = ka; j0 < kz; j0 += P.bk) {
    const int64_t jn = imin(P.bk, kz - j0), kb = j0 / P.bk;
    classify(P, lg, kb, j0, jn, tm);
    if (tm.mode == TILE_SKIP) continue;
    int64_t ldk, ldv;
    const C* kp = kv_tile<T, C>(P.k, lg.b, lg.g, j0, jn, P.Dk, S.kc, dkp, copy_k, ldk);
    const C* vp = kv_tile<T, C>(P.v, lg.b, lg.g, j0, jn, P.Dv, S.vc, dvp, copy_v, ldv);
    // Where a lane may not see every key (or a bias may hide one), non-finite rows must be zeroed
    // before they are read (finite.hpp); where all see all (the bulk of a decode step), K is probed
    // in the dot products below (memory-bound: the FMA is free) and V through the O rows written.
    const bool full = tm.mode == TILE_FULL && !P.has_bias;
    if (!full)
      clean_tile<T>(P, &lg, 1, &tm, j0, jn, S.kc, S.vc, dkp, dvp, kp, ldk, vp, ldv,
                    reinterpret_cast<uint8_t (*)[kLanes]>(fl));
    C* st = S.st;
    const V zero = vzero<V>();
    V kprobe = zero;
    for (int64_t jj = 0; jj < jn; ++jj) {
      const C* kr = kp + jj * ldk;
      alignas(64) C srow[kLanes] = {};
      for (int l = 0; l < lg.n; ++l) {
        V acc = vzero<V>();
        for (int64_t c = 0; c < nck; ++c) acc = vfma(vload(kr + c * kLanes), vload(qr + l * dkp + c * kLanes), acc);
        srow[l] = vhsum(acc);
      }
      if (full)
        for (int64_t c = 0; c < nck; ++c) kprobe = vfma(vload(kr + c * kLanes), zero, kprobe);
      vstore(st + jj * kLanes, vload(srow));
    }
    if (full) {  // a non-finite key row in a tile every lane attends: every lane read it
      alignas(64) C pr[kLanes];
      vstore(pr, kprobe);
      bool bad = false;
      for (int l = 0; l < kLanes; ++l) bad = bad || !(pr[l] == pr[l]);
      if (bad)
        for (int l = 0; l < lg.n; ++l) fl[l] |= kBadInput;
    }
    const bool has_add = build_additive(P, lg, tm, j0, jn, S.addt, fl);
    const V alpha = softmax_tile<T, C>(P, lg, ml, tm, j0, jn, st, has_add ? S.addt : nullptr, m_run, l_run, S.lc);
    // O rows = O rows alpha + P^T V (m = row (lane of st), r = key), the tile summed from zero and
    // added compensated, alpha per row (microkernel.hpp)
    alignas(64) C a[kLanes];
    vstore(a, alpha);
    for (int64_t c = 0; c < dvp / kLanes; ++c)
      gemm16_kahan(orow + c * kLanes, S.oc + c * kLanes, dvp, st, 1, kLanes, vp + c * kLanes, ldv, lg.n, jn, alpha, a);
  }
}

// After fwd_thin: its rows (write_rows), or for a decode split (part) the partial with its flags.
template <class T>
__attribute__((noinline)) static void thin_finish(const Params& P, FwdBufs<T>& S, const LaneGroup& lg,
                                                  const uint8_t* fl, const Partial<typename Compute<T>::type>* part) {
  using C = typename Compute<T>::type;
  const int64_t dvp = round_up(P.Dv, kLanes);
  const C* m_run = S.ml;
  const C* l_run = S.ml + kLanes;
  const C* orow = S.orow;
  if (part) {
    for (int l = 0; l < kLanes; ++l) {
      part->m[l] = m_run[l];
      part->l[l] = l_run[l];
      part->f[l] = C(fl[l] | score_flags(m_run[l], l_run[l]));
      for (int64_t d = 0; d < P.Dv; ++d) part->o[l * P.Dv + d] = l < lg.n ? orow[l * dvp + d] : C(0);
    }
  } else {
    write_rows<T, C>(P, lg, m_run, l_run, fl, [&](int l, int64_t d) { return orow[l * dvp + d]; });
  }
}

// Merge the partials of one row set (splits in order) and write its rows.
template <class T>
static void merge_partials(const Params& P, const LaneGroup* lgs, int nlg, int splits,
                           const Partial<typename Compute<T>::type>* parts) {
  using C = typename Compute<T>::type;
  const double unit = score_unit(P);  // m in log2 units or natural (mods.hpp)
  for (int g = 0; g < nlg; ++g) {
    alignas(64) C m[kLanes], l[kLanes];
    uint8_t fl[kLanes];
    for (int ln = 0; ln < kLanes; ++ln) {
      fl[ln] = 0;
      for (int s = 0; s < splits; ++s) fl[ln] |= uint8_t(parts[s].f[g * kLanes + ln]);
      C mx = C(-INFINITY);
      for (int s = 0; s < splits; ++s) mx = parts[s].m[g * kLanes + ln] > mx ? parts[s].m[g * kLanes + ln] : mx;
      m[ln] = mx;
      C sum = 0;
      for (int s = 0; s < splits; ++s)
        if (parts[s].l[g * kLanes + ln] > C(0))
          sum += parts[s].l[g * kLanes + ln] * C(std::exp2((double(parts[s].m[g * kLanes + ln]) - mx) * unit));
      l[ln] = sum;
    }
    write_rows<T, C>(P, lgs[g], m, l, fl, [&](int ln, int64_t d) {
      C acc = 0;
      for (int s = 0; s < splits; ++s)
        if (parts[s].l[g * kLanes + ln] > C(0))
          acc += parts[s].o[(g * kLanes + ln) * P.Dv + d] *
                 C(std::exp2((double(parts[s].m[g * kLanes + ln]) - m[ln]) * unit));
      return acc;
    });
  }
}

}  // namespace QKV_NS
}  // namespace qkv_native
