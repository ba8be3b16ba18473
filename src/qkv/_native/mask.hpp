// Masks, per tile: which of a lane group's 16 queries may see which of a tile's keys.
//
// The lead describes a mask at tile granularity (BQ x BK = tile_shape()): a class per tile
// (EMPTY: skip, FULL: no mask work, PARTIAL: evaluate), per-query key intervals [lo, hi)
// (causal, sliding window, documents, padding, prefix-LM are all intervals) and, for anything
// else, per-tile bitmaps. Without classes the intervals alone give them: a tile is EMPTY for a
// query when its interval misses the tile and FULL when it covers it (O(1) per query and tile).
//
// A lane group is up to 16 (head, query) rows that share one kv head; they may come from
// different heads (grouped-query decode), so classes are looked up per lane.
#pragma once
#include "dtypes.hpp"

namespace qkv_native {
inline namespace QKV_NS {

struct LaneGroup {
  int n = 0;             // active lanes; lanes n..15 hold zero queries and are never stored
  int64_t b = 0, g = 0;  // batch index, kv head
  int64_t h[kLanes], i[kLanes];
};

// L = the rows r0 .. r0 + n - 1 (n clipped to kLanes) of batch b, kv head g, where at(r, h, i) names
// row r's query head h and query i; the lanes past n repeat row r0 (zero queries, never stored).
template <class At>
static inline void fill_lanes(LaneGroup& L, int64_t b, int64_t g, int64_t r0, int64_t n, At at) {
  L.b = b;
  L.g = g;
  L.n = int(imin(kLanes, n));
  for (int l = 0; l < kLanes; ++l) at(r0 + (l < L.n ? l : 0), L.h[l], L.i[l]);
}

enum TileMode { TILE_SKIP = 0, TILE_FULL = 1, TILE_MASKED = 2 };

// Per (lane group, key tile): the mode, and in TILE_MASKED the per-lane interval relative to the
// tile start (lo/hi in [0, jn]) plus the bitmap row of each lane (nullptr: no bitmap condition).
// [free_lo, free_hi) is the part of the tile inside every active lane's interval: the softmax
// masks only the ragged edges outside it (a causal diagonal or window edge costs at most 15 keys
// of mask work per lane group, not the whole tile). Bitmaps are applied separately (mods.hpp).
struct TileMask {
  int mode = TILE_FULL;
  bool any_bitmap = false;
  int32_t free_lo = 0, free_hi = 0;
  int32_t lo[kLanes], hi[kLanes];
  const uint64_t* bm_row[kLanes];
};

static inline void classify(const Params& P, const LaneGroup& lg, int64_t kb, int64_t j0, int64_t jn, TileMask& tm) {
  bool all_empty = true, all_full = true;
  tm.any_bitmap = false;
  for (int l = 0; l < kLanes; ++l) {
    tm.lo[l] = 0;
    tm.hi[l] = int32_t(jn);
    tm.bm_row[l] = nullptr;
    if (l >= lg.n) continue;
    const int64_t h = lg.h[l], i = lg.i[l], qb = i / P.bq;
    int cls = FULL;
    int64_t lo = 0, hi = jn;
    if (P.rows) {
      const int32_t* r = P.rows + lg.b * P.rw_b + h * P.rw_h + i * 2;
      lo = imax(int64_t(r[0]) - j0, 0);
      hi = imin(int64_t(r[1]) - j0, jn);
    }
    if (P.tile_class) {
      cls = P.tile_class[lg.b * P.tc_b + h * P.tc_h + qb * P.nbk + kb];
      if (cls == PARTIAL) {
        if (!P.rows) {
          lo = 0;
          hi = jn;
        }
        if (P.bitmap_index) {
          const int32_t bi = P.bitmap_index[lg.b * P.bi_b + h * P.bi_h + qb * P.nbk + kb];
          if (bi >= 0) {
            tm.bm_row[l] = P.bitmaps + (bi * int64_t(P.bq) + (i - qb * P.bq)) * P.words;
            tm.any_bitmap = true;
          }
        }
        if (lo >= hi) cls = EMPTY;
      }
    } else if (P.rows) {
      cls = lo >= hi ? EMPTY : (lo == 0 && hi == jn ? FULL : PARTIAL);
    }
    if (cls == EMPTY) {
      lo = 0;
      hi = 0;
    }
    if (cls == FULL) {
      lo = 0;
      hi = jn;
    }
    tm.lo[l] = int32_t(lo);
    tm.hi[l] = int32_t(hi);
    all_empty = all_empty && cls == EMPTY;
    all_full = all_full && cls == FULL;
  }
  tm.mode = all_empty ? TILE_SKIP : (all_full ? TILE_FULL : TILE_MASKED);
  int32_t fa = 0, fz = int32_t(jn);
  for (int l = 0; l < lg.n; ++l) {
    fa = tm.lo[l] > fa ? tm.lo[l] : fa;
    fz = tm.hi[l] < fz ? tm.hi[l] : fz;
  }
  if (fa >= fz) fa = fz = 0;
  tm.free_lo = fa;
  tm.free_hi = fz;
}

// The keys one lane group can see when only intervals are given: the union [a, z) of its lanes'
// intervals (the keys it loops over) and their intersection [c, d) (the keys every lane sees: no
// mask work there), both clamped to [0, Nk); an empty union gives a = z = 0, an empty
// intersection c = d = 0. Exact ranges per row group, as vLLM's CPU attention computes per tile
// from the causal / window limits (csrc/cpu, read to learn): no key outside [a, z) is touched.
struct LaneSpan {
  int64_t a = 0, z = 0, c = 0, d = 0;
};

static inline LaneSpan lane_span(const Params& P, const LaneGroup& lg) {
  LaneSpan s;
  int64_t a = P.Nk, z = 0, c = 0, d = P.Nk;
  for (int l = 0; l < lg.n; ++l) {
    const int32_t* r = P.rows + lg.b * P.rw_b + lg.h[l] * P.rw_h + lg.i[l] * 2;
    const int64_t lo = imax(r[0], 0), hi = imin(r[1], P.Nk);
    c = imax(c, lo);
    d = imin(d, hi);
    if (lo < hi) {
      a = imin(a, lo);
      z = imax(z, hi);
    }
  }
  if (a < z) {
    s.a = a;
    s.z = z;
  }
  if (c < d) {
    s.c = c;
    s.d = d;
  }
  return s;
}

// Key range [k_lo, k_hi) that can matter to any row of a set, when only intervals are given:
// tiles outside it are never visited (causal skips its upper triangle without touching it).
static inline void row_key_range(const Params& P, const LaneGroup* lgs, int nlg, int64_t& k_lo, int64_t& k_hi) {
  k_lo = 0;
  k_hi = P.Nk;
  if (!P.rows || P.tile_class) return;
  int64_t lo = P.Nk, hi = 0;
  for (int g = 0; g < nlg; ++g)
    for (int l = 0; l < lgs[g].n; ++l) {
      const int32_t* r = P.rows + lgs[g].b * P.rw_b + lgs[g].h[l] * P.rw_h + lgs[g].i[l] * 2;
      const int64_t a = imax(r[0], 0), z = imin(r[1], P.Nk);
      if (a < z) {
        lo = imin(lo, a);
        hi = imax(hi, z);
      }
    }
  if (lo >= hi) {
    k_lo = 0;
    k_hi = 0;
    return;
  }
  k_lo = lo;
  k_hi = hi;
}

}  // namespace QKV_NS
}  // namespace qkv_native
