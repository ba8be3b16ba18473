// Backward tile loop: FlashAttention-2 (arXiv:2307.08691), Algorithm 2, on the CPU.
//
// Recompute, never store: P = exp2(S - lse) is rebuilt per tile from q, k and the saved lse, so
// no Nq x Nk buffer exists. A work item is one key tile (b, kv head g, key block): it owns dK and
// dV of its BK keys (accumulated over every query head of the group and every query block: the
// GQA sum happens here, no K/V copy), and walks the query blocks with
//   S^T = K Q^T, P^T = exp2(S^T - lse), dP^T = V dO^T, dS^T = P^T o (dP^T - D)   (Alg. 2 l. 11-16)
//   dV += P^T dO,  dK += dS^T Q,  dQ += dS K                                       (l. 12, 17, 18)
// with D_i = rowsum(dO o O) - dlse_i computed once, in float64.
//
// Non-finite numbers (finite.hpp): non-finite K/V rows are zeroed in the tile copies, so a hidden
// one never reaches a gradient. A row whose forward was NaN (lse NaN), or whose q, dO, D or an
// attended bias entry is not finite, contributes P = 0 and instead sends NaN along its attended
// edges only: its dQ row, and the dK / dV rows of the keys it may attend.
//
// Determinism without atomics: items are assigned statically (item t, t + T, ...), so each
// thread's dQ partial (thread 0 writes the dq output itself, others a private buffer) is the sum of
// a fixed sequence; the partials are added in thread order at the end. Same thread count, same bits.
#pragma once
#include "attention_fwd.hpp"

namespace qkv_native {
inline namespace QKV_NS {

template <class T>
struct BwdBufs {
  using C = typename Compute<T>::type;
  C *kc, *vc, *dka, *dva, *qs, *dos, *qt, *dot, *pt, *dst, *dfac, *addt, *zt, *dqt;
  C *dkc, *dvc;                          // the Kahan carries of dK, dV (microkernel.hpp)
  static constexpr int64_t W = kBlockQ;  // row stride of the block-wide P^T / dS^T tiles
  static size_t bytes(const Params& P) {
    const int64_t dkp = round_up(P.Dk, kLanes), dvp = round_up(P.Dv, kLanes);
    const int64_t e = 2 * P.bk * dkp + 2 * P.bk * dvp + W * dkp + W * dvp + 4 * P.Dk * kLanes + 4 * P.Dv * kLanes +
                      2 * P.bk * W + 3 * P.bk * kLanes + P.Dk * kLanes + P.bk * dkp + P.bk * dvp;
    return size_t(e) * sizeof(C) + 20 * 64;
  }
  void carve(const Params& P, char* p) {
    Carver c{p};
    const int64_t dkp = round_up(P.Dk, kLanes), dvp = round_up(P.Dv, kLanes);
    kc = c.take<C>(P.bk * dkp);
    vc = c.take<C>(P.bk * dvp);
    dka = c.take<C>(P.bk * dkp);
    dva = c.take<C>(P.bk * dvp);
    qs = c.take<C>(W * dkp);
    dos = c.take<C>(W * dvp);
    qt = c.take<C>(4 * P.Dk * kLanes);
    dot = c.take<C>(4 * P.Dv * kLanes);
    pt = c.take<C>(P.bk * W);
    dst = c.take<C>(P.bk * W);
    dfac = c.take<C>(P.bk * kLanes);
    addt = c.take<C>(P.bk * kLanes);
    zt = c.take<C>(P.bk * kLanes);
    dqt = c.take<C>(P.Dk * kLanes);
    dkc = c.take<C>(P.bk * dkp);
    dvc = c.take<C>(P.bk * dvp);
  }
};

// One key tile: dK, dV of keys [j0, j0 + jn) of (b, g); dQ contributions into dq_acc (B,H,Nq,Dk).
template <class T>
static void bwd_item(const Params& P, BwdBufs<T>& S, int64_t b, int64_t g, int64_t kb,
                     const typename Compute<T>::type* Dbuf, typename Compute<T>::type* dq_acc, uint8_t* row_nan) {
  using C = typename Compute<T>::type;
  using V = typename VecOf<C>::V;
  constexpr int64_t W = BwdBufs<T>::W;
  const int64_t dkp = round_up(P.Dk, kLanes), dvp = round_up(P.Dv, kLanes);
  const int64_t j0 = kb * P.bk, jn = imin(P.bk, P.Nk - j0), group = P.H / P.Hkv;
  int64_t ldk, ldv;
  kv_tile<T, C>(P.k, b, g, j0, jn, P.Dk, S.kc, dkp, true, ldk);
  kv_tile<T, C>(P.v, b, g, j0, jn, P.Dv, S.vc, dvp, true, ldv);
  TileRows bad_k, bad_v;
  if (scan_rows(S.kc, dkp, jn, P.Dk, bad_k)) zeroed_rows(S.kc, dkp, jn, P.Dk, bad_k, S.kc, dkp);
  if (scan_rows(S.vc, dvp, jn, P.Dv, bad_v)) zeroed_rows(S.vc, dvp, jn, P.Dv, bad_v, S.vc, dvp);
  uint8_t key_nan[kBlockK] = {};  // keys attended by a row that sends NaN
  std::memset(static_cast<void*>(S.dka), 0, sizeof(C) * size_t(P.bk * dkp));
  std::memset(static_cast<void*>(S.dva), 0, sizeof(C) * size_t(P.bk * dvp));
  std::memset(static_cast<void*>(S.dkc), 0, sizeof(C) * size_t(P.bk * dkp));
  std::memset(static_cast<void*>(S.dvc), 0, sizeof(C) * size_t(P.bk * dvp));
  const T* dout = static_cast<const T*>(P.dout);
  const T* q = static_cast<const T*>(P.q.data);
  const C* lse = static_cast<const C*>(P.lse_s.data);
  const bool want_d = P.n_mods > 0;
  const double unit = score_unit(P), kl = kLog2e / unit;  // P = exp2((s - lse kl) unit)
  const bool drop = P.dropout_p > 0.0;
  const uint32_t thr = drop ? dropout_threshold(P.dropout_p) : 0;
  const C inv_keep = drop ? C(1.0 / (1.0 - P.dropout_p)) : C(1);
  const V ninf = vset1<V>(C(-INFINITY));
  LaneGroup lgs[4];
  TileMask tm[4];
  ModLanes<C> ml;
  const int64_t nbq = (P.Nq + P.bq - 1) / P.bq;
  for (int64_t h = g * group; h < (g + 1) * group; ++h) {
    for (int64_t qb = 0; qb < nbq; ++qb) {
      const int64_t i0 = qb * P.bq, nr = imin(P.bq, P.Nq - i0);
      const int nlg = int((nr + kLanes - 1) / kLanes);
      bool any = false;
      for (int lg = 0; lg < nlg; ++lg) {
        LaneGroup& L = lgs[lg];
        L.b = b;
        L.g = g;
        L.n = int(imin(kLanes, nr - lg * kLanes));
        for (int l = 0; l < kLanes; ++l) {
          L.h[l] = h;
          L.i[l] = i0 + lg * kLanes + (l < L.n ? l : 0);
        }
        classify(P, L, kb, j0, jn, tm[lg]);
        any = any || tm[lg].mode != TILE_SKIP;
      }
      if (!any) continue;
      // Q and dO rows of the block, zero-padded to dkp / dvp and to whole lane groups
      std::memset(static_cast<void*>(S.qs), 0, sizeof(C) * size_t(W * dkp));
      std::memset(static_cast<void*>(S.dos), 0, sizeof(C) * size_t(W * dvp));
      uint8_t row_bad[kBlockQ] = {};
      for (int64_t r = 0; r < nr; ++r) {
        const T* qrow = q + b * P.q.s0 + h * P.q.s1 + (i0 + r) * P.q.s2;
        const T* drow = dout + b * P.dout_s.s0 + h * P.dout_s.s1 + (i0 + r) * P.dout_s.s2;
        C* qd = S.qs + r * dkp;
        C* dd_ = S.dos + r * dvp;
        for (int64_t d = 0; d < P.Dk; ++d) qd[d] = to_c<C>(qrow[d]);
        for (int64_t d = 0; d < P.Dv; ++d) dd_[d] = to_c<C>(drow[d]);
        if (!all_finite(qd, P.Dk) || !all_finite(dd_, P.Dv)) {
          row_bad[r] = 1;
          std::memset(static_cast<void*>(qd), 0, sizeof(C) * size_t(P.Dk));
          std::memset(static_cast<void*>(dd_), 0, sizeof(C) * size_t(P.Dv));
        }
      }
      for (int lg = 0; lg < nlg; ++lg) {
        const LaneGroup& L = lgs[lg];
        C* pt = S.pt + lg * kLanes;
        C* dst = S.dst + lg * kLanes;
        if (tm[lg].mode == TILE_SKIP) {
          for (int64_t jj = 0; jj < jn; ++jj) {
            vstore(pt + jj * W, vzero<V>());
            vstore(dst + jj * W, vzero<V>());
          }
          continue;
        }
        C* qt = S.qt + lg * P.Dk * kLanes;
        C* dot = S.dot + lg * P.Dv * kLanes;
        const C qf = C(q_prescale(P));
        for (int64_t d = 0; d < P.Dk; ++d)
          for (int l = 0; l < kLanes; ++l) qt[d * kLanes + l] = S.qs[(lg * kLanes + l) * dkp + d] * qf;
        for (int64_t d = 0; d < P.Dv; ++d)
          for (int l = 0; l < kLanes; ++l) dot[d * kLanes + l] = S.dos[(lg * kLanes + l) * dvp + d];
        uint8_t fl[kLanes] = {};
        mod_lanes_init(P, L, ml);
        const bool has_add = build_additive(P, L, tm[lg], j0, jn, S.addt, fl);
        flag_attending(P, L, tm[lg], j0, jn, bad_k, bad_v, fl);
        alignas(64) C lse2[kLanes], lse2_lo[kLanes], dd[kLanes];
        for (int l = 0; l < kLanes; ++l) {
          const int64_t row = (b * P.H + h) * P.Nq + L.i[l];
          const C x = l < L.n ? lse[b * P.lse_s.s0 + h * P.lse_s.s1 + L.i[l] * P.lse_s.s2] : C(-INFINITY);
          const C dx = l < L.n ? Dbuf[row] : C(0);
          bool sends_nan =
              l < L.n && (fl[l] || row_bad[lg * kLanes + l] || !(x == x) || x == C(INFINITY) || !std::isfinite(dx));
          // a row that saw no key (lse = -inf) must get P = 0: exp2(s - inf); so does one sending NaN
          // lse in the scores' units (mods.hpp): natural as it is; in log2 units as hi + lo, since
          // rounded to one float lse log2 e would shift every P of the row by up to half its ulp
          // (3.8e-6 relative at |lse| ~ 50); s - hi is exact near the row's max
          lse2[l] = (x == C(-INFINITY) || sends_nan) ? C(INFINITY) : C(double(x) * kl);
          lse2_lo[l] = std::isfinite(lse2[l]) ? C(double(x) * kl - double(lse2[l])) : C(0);
          dd[l] = sends_nan ? C(0) : dx;
          if (!sends_nan) continue;
          bool touched = false;
          for (int64_t jj = 0; jj < jn; ++jj)
            if (lane_allows(P, L, tm[lg], l, j0, jj)) {
              key_nan[jj] = 1;
              touched = true;
            }
          if (touched) {
            C* dqr = dq_acc + row * P.Dk;
            for (int64_t d = 0; d < P.Dk; ++d) dqr[d] = C(NAN);
            __atomic_store_n(row_nan + row, uint8_t(1), __ATOMIC_RELAXED);
          }
        }
        // S^T and P^T (Alg. 2 lines 11, 13)
        gemm16<false>(pt, W, S.kc, dkp, 1, qt, kLanes, jn, P.Dk);
        {
          const bool masked = tm[lg].mode == TILE_MASKED;
          alignas(64) C a[kLanes], z[kLanes];
          for (int l = 0; l < kLanes; ++l) {
            a[l] = C(tm[lg].lo[l]);
            z[l] = C(tm[lg].hi[l]);
          }
          const V lo = vload(a), hi = vload(z), lv = vload(lse2), lv_lo = vload(lse2_lo), u = vset1<V>(C(unit));
          for (int64_t jj = 0; jj < jn; ++jj) {
            V dv = vzero<V>();
            const C* add = has_add ? S.addt + jj * kLanes : nullptr;
            V s = want_d ? score_row<V, true>(P, ml, vload(pt + jj * W), j0 + jj, add, &dv)
                         : score_row<V, false>(P, ml, vload(pt + jj * W), j0 + jj, add, static_cast<V*>(nullptr));
            if (masked) {
              const V jv = vset1<V>(C(jj));
              s = vsel(vand(vle(lo, jv), vlt(jv, hi)), s, ninf);
            }
            vstore(pt + jj * W, vexp2(vmul(vsub(vsub(s, lv), lv_lo), u)));
            if (want_d) vstore(S.dfac + jj * kLanes, dv);
          }
        }
        // dP^T = V dO^T (line 14)
        gemm16<false>(dst, W, S.vc, dvp, 1, dot, kLanes, jn, P.Dv);
        if (drop) {
          for (int l = 0; l < kLanes; ++l)
            for (int64_t jj = 0; jj < jn; ++jj) S.zt[jj * kLanes + l] = C(0);
          for (int l = 0; l < L.n; ++l)
            philox_row(P.seed, uint32_t(b), uint32_t(h), uint32_t(L.i[l]), j0, j0 + jn, thr,
                       [&](int64_t j, bool keep) { S.zt[(j - j0) * kLanes + l] = keep ? inv_keep : C(0); });
        }
        // dS^T = P^T o (dP^T - D) (line 16); the dropped P^T goes on to dV
        const V dvec = vload(dd);
        for (int64_t jj = 0; jj < jn; ++jj) {
          V p = vload(pt + jj * W), dp = vload(dst + jj * W);
          if (drop) {
            const V z = vload(S.zt + jj * kLanes);
            dp = vmul(dp, z);
            vstore(pt + jj * W, vmul(p, z));
          }
          V ds = vmul(p, vsub(dp, dvec));
          if (want_d) ds = vmul(ds, vload(S.dfac + jj * kLanes));
          vstore(dst + jj * W, ds);
        }
        // dQ^T = K^T dS^T for this lane group (line 18), into this thread's dQ rows
        gemm16<false>(S.dqt, kLanes, S.kc, 1, dkp, dst, W, P.Dk, jn);
        const C sc = C(P.scale);
        for (int l = 0; l < L.n; ++l) {
          C* dqr = dq_acc + ((b * P.H + h) * P.Nq + L.i[l]) * P.Dk;
          for (int64_t d = 0; d < P.Dk; ++d) dqr[d] += S.dqt[d * kLanes + l] * sc;
        }
      }
      // dV += P^T dO, dK += dS^T Q over the whole block (lines 12, 17): lanes over Dv / Dk. The
      // block's sum starts from zero and is added compensated (microkernel.hpp): over Nq rows the
      // error stays that of one block's sum instead of growing with Nq / 64.
      const V one = vset1<V>(C(1));
      for (int64_t c = 0; c < dvp / kLanes; ++c)
        gemm16_kahan(S.dva + c * kLanes, S.dvc + c * kLanes, dvp, S.pt, W, 1, S.dos + c * kLanes, dvp, jn,
                     int64_t(nlg) * kLanes, one);
      for (int64_t c = 0; c < dkp / kLanes; ++c)
        gemm16_kahan(S.dka + c * kLanes, S.dkc + c * kLanes, dkp, S.dst, W, 1, S.qs + c * kLanes, dkp, jn,
                     int64_t(nlg) * kLanes, one);
    }
  }
  C* dk = static_cast<C*>(P.dk);
  C* dvo = static_cast<C*>(P.dv);
  const C sc = C(P.scale);
  for (int64_t jj = 0; jj < jn; ++jj) {
    C* kr = dk + ((b * P.Hkv + g) * P.Nk + j0 + jj) * P.Dk;
    C* vr = dvo + ((b * P.Hkv + g) * P.Nk + j0 + jj) * P.Dv;
    const C nan_or_1 = key_nan[jj] ? C(NAN) : C(1);
    for (int64_t d = 0; d < P.Dk; ++d) kr[d] = S.dka[jj * dkp + d] * sc * nan_or_1;
    for (int64_t d = 0; d < P.Dv; ++d) vr[d] = S.dva[jj * dvp + d] * nan_or_1;
    if (!key_nan[jj] && !(all_finite(kr, P.Dk) && all_finite(vr, P.Dv))) count_row(P, kOverflow);
  }
}

}  // namespace QKV_NS
}  // namespace qkv_native
