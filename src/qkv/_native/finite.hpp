// Non-finite numbers, found inside the tile loops' own pass (no separate pass over K, V or O).
//
// The contract (README, "Conventions"): a key or value the mask hides is never read, so NaN or
// inf there changes nothing; a query row that attends a non-finite number -- in its q row, in an
// attended k or v row, or in an attended bias entry (NaN or +inf; -inf is a legal "hidden") --
// gives out = NaN and lse = NaN; finite inputs whose scores overflow are reported (the caller
// raises) instead of being returned as a silent NaN.
//
// How, without a pass of its own: each aligned K/V tile is checked once per call, by the first
// work item that reads it (a bitwise test per element while the tile comes into cache for that
// item's matmul; the verdict is shared through a per-call byte per tile). A tile holding a
// non-finite row (rare) is used as a copy with those rows zeroed, and the lanes whose mask admits
// one of them are flagged. q rows are checked as they are loaded, bias entries as the additive
// tile is built. Scores can then be non-finite only by overflow: vexp2 keeps NaN, so a NaN or
// +inf admitted score leaves the row's running sum l = NaN (or its max m = +inf), read once per
// row; a row whose every admitted score overflowed to -inf looks empty, and is told from a truly
// empty one by its mask (row_admits). Rows are written as NaN from their flags, and counted.
#pragma once
#include "mask.hpp"
#include "microkernel.hpp"
#include "quant.hpp"

namespace qkv_native {
inline namespace QKV_NS {

// Per-lane flags, OR-ed over a row's tiles (and over the splits of a decode row).
enum LaneFlag : uint8_t {
  kBadQ = 1,      // the q row is non-finite (it matters only if the row attends a key)
  kBadInput = 2,  // an attended k / v row or bias entry is non-finite
  kOverflow = 4,  // finite inputs, non-finite score or output
};

// Whether every one of the n values is finite: a bitwise test of the exponent (vectorises; no
// floating-point compare, so no -ffast-math assumptions are involved).
template <class C>
static inline bool all_finite(const C* p, int64_t n) {
  using U = std::conditional_t<sizeof(C) == 4, uint32_t, uint64_t>;
  constexpr U kExp = sizeof(C) == 4 ? U(0x7f800000u) : U(0x7ff0000000000000ull);
  U bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    U u;
    std::memcpy(&u, p + i, sizeof(C));
    bad |= U((u & kExp) == kExp);
  }
  return bad == 0;
}

// Whether every one of the n values of a storage type (float, double, float16, bfloat16) is finite.
template <class T>
static inline bool storage_finite(const T* p, int64_t n) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    return all_finite(p, n);
  } else {
    constexpr uint16_t kExp = std::is_same_v<T, f16_t> ? uint16_t(0x7c00u) : uint16_t(0x7f80u);
    const uint16_t* u = reinterpret_cast<const uint16_t*>(p);
    uint16_t bad = 0;
    for (int64_t i = 0; i < n; ++i) bad |= uint16_t((u[i] & kExp) == kExp);
    return bad == 0;
  }
}

// Whether some value of the tile is not finite: x * 0 + probe over whole vectors (one FMA per 16
// values, ~1/64 of the tile's matmul work) and the row tails in scalars; the probe is looked at
// once per tile.
template <class C>
static inline bool tile_has_nonfinite(const C* x, int64_t ld, int64_t jn, int64_t D) {
  using V = typename VecOf<C>::V;
  const V zero = vzero<V>();
  V p0 = zero, p1 = zero, p2 = zero, p3 = zero;  // four chains: the FMA latency hides behind each other
  C tail = C(0);
  const int64_t D4 = D / (4 * kLanes) * (4 * kLanes), Dv = D / kLanes * kLanes;
  for (int64_t jj = 0; jj < jn; ++jj) {
    const C* row = x + jj * ld;
    int64_t d = 0;
    for (; d < D4; d += 4 * kLanes) {
      p0 = vfma(vload(row + d), zero, p0);
      p1 = vfma(vload(row + d + kLanes), zero, p1);
      p2 = vfma(vload(row + d + 2 * kLanes), zero, p2);
      p3 = vfma(vload(row + d + 3 * kLanes), zero, p3);
    }
    for (; d < Dv; d += kLanes) p0 = vfma(vload(row + d), zero, p0);
    for (; d < D; ++d) tail += row[d] * C(0);
  }
  alignas(64) C p[kLanes];
  vstore(p, vadd(vadd(p0, p1), vadd(p2, p3)));
  bool bad = !(tail == tail);
  for (int l = 0; l < kLanes; ++l) bad = bad || !(p[l] == p[l]);
  return bad;
}

// The per-call verdict of aligned key tile kb of (b, g): K and V rows all finite? Checked by the
// first reader (a race between two first readers only repeats the same check).
enum TileVerdict : uint8_t { kUnchecked = 0, kClean = 1, kDirty = 2 };

template <class T>
static inline bool kv_tile_clean(const Params& P, int64_t b, int64_t g, int64_t kb) {
  uint8_t* slot = P.kv_state + (b * P.Hkv + g) * P.nbk + kb;
  uint8_t v = __atomic_load_n(slot, __ATOMIC_RELAXED);
  if (v == kUnchecked) {
    const int64_t j0 = kb * P.bk, jn = imin(P.bk, P.Nk - j0);
    const T* k = static_cast<const T*>(P.k.data) + b * P.k.s0 + g * P.k.s1 + j0 * P.k.s2;
    const T* vv = static_cast<const T*>(P.v.data) + b * P.v.s0 + g * P.v.s1 + j0 * P.v.s2;
    bool clean = true;
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {  // vector probe, 4 chains
      clean = !tile_has_nonfinite(k, P.k.s2, jn, P.Dk) && !tile_has_nonfinite(vv, P.v.s2, jn, P.Dv);
    } else {
      for (int64_t j = 0; j < jn && clean; ++j)
        clean = storage_finite(k + j * P.k.s2, P.Dk) && storage_finite(vv + j * P.v.s2, P.Dv);
    }
    v = clean ? kClean : kDirty;
    __atomic_store_n(slot, v, __ATOMIC_RELAXED);
  }
  return v == kClean;
}

// Whether keys [j0, j0 + jn) lie in clean aligned tiles only (they span at most two).
template <class T>
static inline bool kv_range_clean(const Params& P, int64_t b, int64_t g, int64_t j0, int64_t jn) {
  if (!P.kv_state) return true;
  for (int64_t kb = j0 / P.bk; kb <= (j0 + jn - 1) / P.bk; ++kb)
    if (!kv_tile_clean<T>(P, b, g, kb)) return false;
  return true;
}

// The non-finite rows of a K / V tile (jn <= kBlockK rows), as one flag per row.
struct TileRows {
  bool any = false;
  uint8_t bad[kBlockK];
};

template <class C>
static inline bool scan_rows(const C* x, int64_t ld, int64_t jn, int64_t D, TileRows& t) {
  t.any = false;
  if (!tile_has_nonfinite(x, ld, jn, D)) return false;  // the usual case: one probe, no row flags
  for (int64_t jj = 0; jj < jn; ++jj) {
    const bool b = !all_finite(x + jj * ld, D);
    t.bad[jj] = uint8_t(b);
    t.any = t.any || b;
  }
  return t.any;
}

// Rows of `x` into `buf` (row stride ld_buf), the rows marked in t zeroed; returns buf. In place
// when x already is buf (a widened half tile).
template <class C>
static inline const C* zeroed_rows(const C* x, int64_t ld, int64_t jn, int64_t D, const TileRows& t, C* buf,
                                   int64_t ld_buf) {
  for (int64_t jj = 0; jj < jn; ++jj) {
    C* dst = buf + jj * ld_buf;
    if (t.any && t.bad[jj])
      std::memset(static_cast<void*>(dst), 0, sizeof(C) * size_t(D));
    else if (x != buf)
      std::memcpy(static_cast<void*>(dst), x + jj * ld, sizeof(C) * size_t(D));
  }
  return buf;
}

// Whether lane l of lg may attend key j0 + jj of the tile: its interval and bitmap, and a bias
// entry that is not -inf (a bias of -inf hides the key as a mask does).
static inline bool lane_allows(const Params& P, const LaneGroup& lg, const TileMask& tm, int l, int64_t j0,
                               int64_t jj) {
  if (l >= lg.n || tm.mode == TILE_SKIP) return false;
  if (tm.mode == TILE_MASKED) {
    if (jj < tm.lo[l] || jj >= tm.hi[l]) return false;
    if (tm.bm_row[l] && !((tm.bm_row[l][jj >> 6] >> (jj & 63)) & 1u)) return false;
  }
  if (P.has_bias) {
    const int64_t off = lg.b * P.bias.s0 + lg.h[l] * P.bias.s1 + lg.i[l] * P.bias.s2 + (j0 + jj) * P.bias.s3;
    if (load_any(P.bias.data, off, P.bias_dtype) == -HUGE_VAL) return false;
  }
  return true;
}

// Flags (kBadInput) the lanes of lg that attend one of the non-finite rows of a K or V tile.
static inline void flag_attending(const Params& P, const LaneGroup& lg, const TileMask& tm, int64_t j0, int64_t jn,
                                  const TileRows& bk, const TileRows& bv, uint8_t* fl) {
  if (!bk.any && !bv.any) return;
  for (int l = 0; l < lg.n; ++l) {
    if (fl[l] & kBadInput) continue;
    for (int64_t jj = 0; jj < jn; ++jj)
      if (((bk.any && bk.bad[jj]) || (bv.any && bv.bad[jj])) && lane_allows(P, lg, tm, l, j0, jj)) {
        fl[l] |= kBadInput;
        break;
      }
  }
}

// The rare path of a tile holding a non-finite K or V row: zeroed copies, attending lanes flagged.
// Out of line, so that the tile loop's code stays what it is without it.
template <class C>
__attribute__((noinline)) static void dirty_tile(const Params& P, const LaneGroup* lgs, int nlg, const TileMask* tm,
                                                 int64_t j0, int64_t jn, C* kbuf, C* vbuf, int64_t ldkb, int64_t ldvb,
                                                 const C*& kp, int64_t& ldk, const C*& vp, int64_t& ldv,
                                                 uint8_t (*fl)[kLanes]) {
  TileRows bk, bv;
  const bool k_bad = scan_rows(kp, ldk, jn, P.Dk, bk), v_bad = scan_rows(vp, ldv, jn, P.Dv, bv);
  if (k_bad) {
    kp = zeroed_rows(kp, ldk, jn, P.Dk, bk, kbuf, ldkb);
    ldk = ldkb;
  }
  if (v_bad) {
    vp = zeroed_rows(vp, ldv, jn, P.Dv, bv, vbuf, ldvb);
    ldv = ldvb;
  }
  for (int g = 0; g < nlg; ++g) flag_attending(P, lgs[g], tm[g], j0, jn, bk, bv, fl[g]);
}

// kOverflow when a row's running max / sum show a non-finite admitted score (inputs are clean).
template <class C>
static inline uint8_t score_flags(C m, C l) {
  return (l == l && m != C(INFINITY)) ? uint8_t(0) : uint8_t(kOverflow);
}

// Whether lane l of lg may attend some key (its mask and bias, not its scores): tells a row whose
// every score overflowed to -inf from a row with nothing to attend. Runs only for rows that came
// out empty: O(1) with intervals alone, else a walk over the row's key tiles.
__attribute__((noinline)) static bool row_admits(const Params& P, const LaneGroup& lg, int l) {
  int64_t a = 0, z = P.Nk;
  if (P.rows) {
    const int32_t* r = P.rows + lg.b * P.rw_b + lg.h[l] * P.rw_h + lg.i[l] * 2;
    a = imax(r[0], 0);
    z = imin(r[1], P.Nk);
    if (a >= z) return false;
    if (!P.tile_class && !P.has_bias) return true;
  }
  LaneGroup one = lg;
  one.n = l + 1;  // lanes before l are classified too (harmless); lane l is what counts
  TileMask tm;
  for (int64_t kb = a / P.bk; kb * P.bk < z; ++kb) {
    const int64_t j0 = kb * P.bk, jn = imin(P.bk, P.Nk - j0);
    classify(P, one, kb, j0, jn, tm);
    for (int64_t jj = 0; jj < jn; ++jj)
      if (lane_allows(P, one, tm, l, j0, jj)) return true;
  }
  return false;
}

// Whether lane l of lg attends a key whose k or v row is not finite: tells a non-finite input that
// reached a row unscanned (decode's FULL tiles read K and V without a scan) from an overflow.
// Runs only for rows about to be reported as overflowed.
template <class T>
__attribute__((noinline)) static bool row_reads_nonfinite(const Params& P, const LaneGroup& lg, int l) {
  LaneGroup one = lg;
  one.n = l + 1;
  TileMask tm;
  const T* k = static_cast<const T*>(P.k.data) + lg.b * P.k.s0 + lg.g * P.k.s1;
  const T* v = static_cast<const T*>(P.v.data) + lg.b * P.v.s0 + lg.g * P.v.s1;
  for (int64_t kb = 0; kb * P.bk < P.Nk; ++kb) {
    const int64_t j0 = kb * P.bk, jn = imin(P.bk, P.Nk - j0);
    classify(P, one, kb, j0, jn, tm);
    for (int64_t jj = 0; jj < jn; ++jj) {
      const int64_t j = j0 + jj;
      if (!lane_allows(P, one, tm, l, j0, jj)) continue;
      if (P.kv_format != KvFormat::native
              ? !kv_key_finite(P, lg.b, lg.g, j)
              : !(storage_finite(k + j * P.k.s2, P.Dk) && storage_finite(v + j * P.v.s2, P.Dv)))
        return true;
    }
  }
  return false;
}

// What a row's flags make of it: 0 (as computed), kBadInput (NaN: a non-finite input) or
// kOverflow (NaN: finite inputs overflowed; the caller raises). `attended`: the row saw a key.
static inline uint8_t row_verdict(uint8_t f, bool attended) {
  if ((f & kBadInput) || ((f & kBadQ) && attended)) return kBadInput;
  if (f & kOverflow) return kOverflow;
  return 0;
}

static inline void count_row(const Params& P, uint8_t verdict) {
  if (!P.counts || !verdict) return;
  __atomic_fetch_add(P.counts + (verdict == kBadInput ? 0 : 1), int64_t(1), __ATOMIC_RELAXED);
}

}  // namespace QKV_NS
}  // namespace qkv_native
