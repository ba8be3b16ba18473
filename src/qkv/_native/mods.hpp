// Score mods, bias and mask applied to a tile of raw dot products, in the order fixed for qkv:
//   s = (q.k) * scale -> mods (in the given order) -> + bias -> disallowed keys -> -inf
// With no mods the result is in log2 units (s * log2 e), because the tile loop uses exp2: one
// multiply folded into the scale, one FMA with the bias. With mods it stays in natural units and
// the tile loop multiplies s - m by log2 e (score_unit): a score near the row's max then loses no
// rounding at |s| log2 e (a softcap of 50 puts every score near 72 in log2 units, and that
// rounding, 2.6e-6 relative in P, measured 2.5x torch's float32 error on the output).
// For the backward pass the same function also returns d s / d((q.k) * scale), the product of
// the mods' derivatives (mul: c, softcap: 1 - tanh^2, additive mods and bias: 1).
#pragma once
#include "finite.hpp"

namespace qkv_native {
inline namespace QKV_NS {

constexpr double kLog2e = 1.4426950408889634074;
constexpr double kLn2 = 0.6931471805599453094;

// Per lane group: what each lane needs from the mods (its query position, its head's slope/table).
template <class C>
struct ModLanes {
  C pos[kLanes];                        // p = i + (Nk - Nq): bottom-right aligned query position
  C slope[kMaxMods][kLanes];            // alibi slope of the lane's head
  const double* rel[kMaxMods][kLanes];  // relbias table row of the lane's head
};

template <class C>
static inline void mod_lanes_init(const Params& P, const LaneGroup& lg, ModLanes<C>& ml) {
  for (int l = 0; l < kLanes; ++l) {
    const int64_t h = l < lg.n ? lg.h[l] : 0, i = l < lg.n ? lg.i[l] : 0;
    ml.pos[l] = C(i + (P.Nk - P.Nq));
    for (int k = 0; k < P.n_mods; ++k) {
      const Mod& m = P.mods[k];
      ml.slope[k][l] = m.kind == MOD_ALIBI ? C(m.table[lg.b * m.tb_b + h * m.tb_h]) : C(0);
      ml.rel[k][l] = m.kind == MOD_RELBIAS ? m.table + lg.b * m.tb_b + h * m.tb_h : nullptr;
    }
  }
}

// The additive tile [jn][16] (natural units): bias, plus -inf where a lane's bitmap bit is clear.
// Built only when needed (a bias, or a PARTIAL tile with a bitmap); returns whether it was. A bias
// entry that is NaN or +inf where the lane may attend is a non-finite input (finite.hpp): it reads
// as 0 here and the lane is flagged kBadInput (its row becomes NaN); -inf hides the key.
template <class C>
static bool build_additive(const Params& P, const LaneGroup& lg, const TileMask& tm, int64_t j0, int64_t jn, C* addt,
                           uint8_t* fl) {
  const bool bitmaps = tm.mode == TILE_MASKED && tm.any_bitmap;
  if (!P.has_bias && !bitmaps) return false;
  const C ninf = -INFINITY;
  const bool masked = tm.mode == TILE_MASKED;
  for (int l = 0; l < kLanes; ++l) {
    if (l >= lg.n) {
      for (int64_t jj = 0; jj < jn; ++jj) addt[jj * kLanes + l] = C(0);
      continue;
    }
    const int64_t off = lg.b * P.bias.s0 + lg.h[l] * P.bias.s1 + lg.i[l] * P.bias.s2 + j0 * P.bias.s3;
    const uint64_t* bm = bitmaps ? tm.bm_row[l] : nullptr;
    for (int64_t jj = 0; jj < jn; ++jj) {
      C a = P.has_bias ? C(load_any(P.bias.data, off + jj * P.bias.s3, P.bias_dtype)) : C(0);
      const bool hidden = (bm && !((bm[jj >> 6] >> (jj & 63)) & 1u)) || (masked && (jj < tm.lo[l] || jj >= tm.hi[l]));
      if (!(a == a) || a == C(INFINITY)) {
        if (!hidden) fl[l] |= kBadInput;
        a = C(0);
      }
      if (bm && !((bm[jj >> 6] >> (jj & 63)) & 1u)) a = ninf;
      addt[jj * kLanes + l] = a;
    }
  }
  return true;
}

// Factor folded into Q^T before the S = K Q^T micro-kernel: with no mods, scale * log2 e (the
// scores come out of the matmul in log2 units, no per-score multiply); with mods, 1 (the mods need
// s = (q.k) * scale in natural units, multiplied in score_row).
static inline double q_prescale(const Params& P) { return P.n_mods == 0 ? P.scale * kLog2e : 1.0; }

// log2 units per unit of score_row's result: 1 (no mods: already log2) or log2 e (natural units).
static inline double score_unit(const Params& P) { return P.n_mods == 0 ? 1.0 : kLog2e; }

template <class V, class C>
static inline V vtanh_lanes(V x) {
  alignas(64) C t[kLanes];
  vstore(t, x);
  for (int l = 0; l < kLanes; ++l) t[l] = C(std::tanh(t[l]));
  return vload(t);
}

// Dot products of row jj (16 lanes; pre-scaled by q_prescale) -> scores (in log2 units without mods, natural with
// them: score_unit). WANT_D: *d = product of the mods' derivatives.
template <class V, bool WANT_D, class C>
static inline V score_row(const Params& P, const ModLanes<C>& ml, V x, int64_t j, const C* add_row, V* d) {
  if (P.n_mods == 0) {  // q was pre-multiplied by scale * log2 e (q_prescale): x is already s * log2 e
    if (add_row) x = vfma(vload(add_row), vset1<V>(C(kLog2e)), x);
    if (WANT_D) *d = vset1<V>(C(1));
    return x;
  }
  x = vmul(x, vset1<V>(C(P.scale)));
  V dd = vset1<V>(C(1));
  for (int k = 0; k < P.n_mods; ++k) {
    const Mod& m = P.mods[k];
    switch (m.kind) {
      case MOD_MUL:
        x = vmul(x, vset1<V>(C(m.c)));
        if (WANT_D) dd = vmul(dd, vset1<V>(C(m.c)));
        break;
      case MOD_SOFTCAP: {
        const V t = vtanh_lanes<V, C>(vmul(x, vset1<V>(C(1.0 / m.c))));
        x = vmul(t, vset1<V>(C(m.c)));
        if (WANT_D) dd = vmul(dd, vsub(vset1<V>(C(1)), vmul(t, t)));
        break;
      }
      case MOD_ALIBI: {  // - slope * |p - j|
        const V pj = vsub(vload(ml.pos), vset1<V>(C(j)));
        const V a = vmax(pj, vsub(vzero<V>(), pj));
        x = vsub(x, vmul(vload(ml.slope[k]), a));
        break;
      }
      default: {  // relbias: table[h, clip(j - p, -M, M) + M]
        alignas(64) C t[kLanes];
        for (int l = 0; l < kLanes; ++l) {
          int64_t r = j - int64_t(ml.pos[l]);
          r = r < -m.m ? -m.m : (r > m.m ? m.m : r);
          t[l] = ml.rel[k][l] ? C(ml.rel[k][l][r + m.m]) : C(0);
        }
        x = vadd(x, vload(t));
      }
    }
  }
  if (add_row) x = vadd(x, vload(add_row));
  if (WANT_D) *d = dd;
  return x;
}

}  // namespace QKV_NS
}  // namespace qkv_native
