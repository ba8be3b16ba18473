// The two entry points of one ISA: work items, scratch and threads around the tile loops.
// Included once by each kernels_<isa>.cpp, after its vector types.
#pragma once
#include "attention_bwd.hpp"
#include "attention_fwd.hpp"
#include "decode.hpp"

#include <cstdio>
#include <ctime>
#include <limits>

namespace qkv_native {
inline namespace QKV_NS {

static inline void run_parallel(const Params& P, int n, TaskFn fn, void* ctx) {
  if (n <= 1 || !P.parallel) {
    fn(ctx, 0);
    return;
  }
  P.parallel(n, fn, ctx);
}

// ------------------------------------------------------------------ forward

template <class T>
struct FwdJob {
  const Params* P;
  Arena arena;
  int64_t n_items = 0, next = 0;
  // prefill: an item is pb blocks of 16 positions x hp query heads of one kv head (stacked_rows)
  int64_t hp = 1, n_hc = 1, pb = kLaneGroups, n_pc = 0;
};

// Prefill work items with GQA rows stacked: the group = H / Hkv query heads that share a kv head
// are lane groups of the same item, so each K/V tile is read once for all of them (vLLM's CPU
// attention gathers the heads of a group into one query tile the same way). An item holds at
// most kLaneGroups (4) lane groups: hp heads (the group split into n_hc near-equal chunks of <= 4)
// x pb blocks of 16 positions (pb = 4 / hp: 64 positions of one head without grouping; 16
// positions x 4 heads for groups of 4 or 8). Lane groups keep 16 consecutive positions of one
// head, so the ragged edges of causal / window spans stay <= 15 keys.
template <class T>
static void stacked_rows(const Params& P, FwdJob<T>& J) {
  const int64_t group = P.H / P.Hkv;
  J.n_hc = (group + kLaneGroups - 1) / kLaneGroups;
  J.hp = (group + J.n_hc - 1) / J.n_hc;
  J.pb = imax(1, kLaneGroups / J.hp);
  J.n_pc = (P.Nq + J.pb * kLanes - 1) / (J.pb * kLanes);
  J.n_items = P.B * P.Hkv * J.n_hc * J.n_pc;
}

// The lane groups of a prefill item (stacked_rows; decode has its own, decode.hpp). Returns the
// number of lane groups (<= kLaneGroups).
template <class T>
static int make_rowset(const Params& P, const FwdJob<T>& J, int64_t item, LaneGroup* lgs) {
  const int64_t group = P.H / P.Hkv;
  // one (b, kv head, head chunk) after another, its last position chunks first: under causal
  // masks they are the longest, so the queue ends on short items that even out the threads'
  // ends; and the next item a thread takes is a neighbouring chunk of the same heads, whose keys
  // (a sliding window's band) are still in its cache. The results do not depend on the order.
  const int64_t pc = J.n_pc - 1 - item % J.n_pc;
  item /= J.n_pc;
  const int64_t hc = item % J.n_hc;
  item /= J.n_hc;
  const int64_t g = item % P.Hkv, b = item / P.Hkv;
  const int64_t h0 = g * group + hc * J.hp, nh = imin(J.hp, group - hc * J.hp);
  const int64_t i0 = pc * J.pb * kLanes;
  const int64_t npb = imin(J.pb, (P.Nq - i0 + kLanes - 1) / kLanes);
  int nlg = 0;
  for (int64_t p = 0; p < npb; ++p)
    for (int64_t hh = 0; hh < nh; ++hh) {
      const int64_t ib = i0 + p * kLanes;
      fill_lanes(lgs[nlg++], b, g, ib, P.Nq - ib, [&](int64_t r, int64_t& h, int64_t& i) {
        h = h0 + hh;
        i = r;
      });
    }
  return nlg;
}

template <class T>
static void fwd_task(void* ctx, int tid) {
  FwdJob<T>& J = *static_cast<FwdJob<T>*>(ctx);
  const Params& P = *J.P;
  FwdBufs<T> S;
  S.carve(P, J.arena.at(tid));
  LaneGroup lgs[kLaneGroups];
  for (;;) {
    const int64_t it = __atomic_fetch_add(&J.next, 1, __ATOMIC_RELAXED);
    if (it >= J.n_items) break;
    const int nlg = make_rowset<T>(P, J, it, lgs);
    int64_t ka, kz;
    row_key_range(P, lgs, nlg, ka, kz);
    if (P.tile_class) ka = ka / P.bk * P.bk;  // tiles stay aligned to the mask plan's tile grid
    uint8_t fl[kLaneGroups][kLanes] = {};
    fwd_rowset<T>(P, S, lgs, nlg, ka, kz, fl);
    fwd_finish<T>(P, S, lgs, nlg, fl, nullptr);
  }
}

template <class T>
static bool forward_impl(const Params& P) {
  if (P.Nq <= kDecodeMaxNq) return decode_forward<T>(P);  // decode.hpp
  FwdJob<T> J;
  J.P = &P;
  const int threads = P.threads < 1 ? 1 : P.threads;
  stacked_rows<T>(P, J);
  const int nt = int(imin(threads, J.n_items));
  if (!J.arena.alloc(nt < 1 ? 1 : nt, FwdBufs<T>::bytes(P))) return false;
  run_parallel(P, nt, &fwd_task<T>, &J);
  return true;
}

// ------------------------------------------------------------------ backward

template <class T>
struct BwdJob {
  using C = typename Compute<T>::type;
  const Params* P;
  LazyArena arena;
  int nt = 1;
  int64_t n_items = 0, nkb = 0;
  C* dq = nullptr;
  Owned<uint8_t> row_nan;  // (B, H, Nq) bits: the row sent NaN along its edges (finite.hpp)
  RowBlocks rb;
  DqOrder order;
  RowStats<T> rs;
};

// Before the key tiles, the rows (B H Nq) split evenly over the threads: RowStats, and dQ's rows
// zeroed (a fresh dq's first touch: page faults too, so not on one thread; 8 MiB at H=8 N=4096 Dk=64)
template <class T>
static void bwd_rows_task(void* ctx, int tid) {
  using C = typename Compute<T>::type;
  BwdJob<T>& J = *static_cast<BwdJob<T>*>(ctx);
  const Params& P = *J.P;
  const int64_t rows = P.B * P.H * P.Nq, r0 = rows * tid / J.nt, r1 = rows * (tid + 1) / J.nt;
  J.rs.fill(P, r0, r1);
  std::memset(static_cast<void*>(J.dq + r0 * P.Dk), 0, sizeof(C) * size_t((r1 - r0) * P.Dk));
}

// After them, split alike: dQ rows that are not finite although their row sent no NaN (finite
// inputs overflowed, counted)
template <class T>
static void bwd_check_task(void* ctx, int tid) {
  BwdJob<T>& J = *static_cast<BwdJob<T>*>(ctx);
  const Params& P = *J.P;
  const int64_t rows = P.B * P.H * P.Nq;
  for (int64_t r = rows * tid / J.nt; r < rows * (tid + 1) / J.nt; ++r)
    if (!((J.row_nan[r / 8] >> (r % 8)) & 1) && !all_finite(J.dq + r * P.Dk, P.Dk)) count_row(P, kOverflow);
}

template <class T>
static void bwd_task(void* ctx, int tid) {
  BwdJob<T>& J = *static_cast<BwdJob<T>*>(ctx);
  const Params& P = *J.P;
  BwdBufs<T> S;
  S.carve(P, J.arena.at(tid));
  for (int64_t n = 0;; ++n) {  // DqOrder's schedule
    const int64_t it = J.order.item(tid, n);
    if (it < 0) break;
    const int64_t kb = it % J.nkb, bg = it / J.nkb;
    bwd_item<T>(P, S, tid, it, bg / P.Hkv, bg % P.Hkv, kb, J.rb, J.order, J.rs, J.dq, J.row_nan.get());
  }
}

// ------------------------------------------------------------------ lse too large for its dtype

// The backward rebuilds P = exp(s - lse) from the saved lse, so lse's rounding is an error in every
// exponent of its row: half an ulp of lse, which reaches 2^-16 of P at |lse| >= 2^(digits - 16)
// (256 in float32) and at |lse| ~ 1e10 (scale 2^28) made P = 2^+-1000: inf (dQ read as an overflow
// of finite inputs) or 0 (zero gradients, silently). Such rows get their (m, l) again from the
// forward's own tile loop over their keys, kept apart (m as it is, log l separately; both in score
// units: mods.hpp), so that exp2((s - m - log l) u) is as exact as the forward's exp2((s - m) u) / l
// and made of the same scores. So do the rows of a call the forward ran on the decode path
// (Nq <= kDecodeMaxNq): its dot products sum d across lanes, so its lse differs from the scores this
// backward rebuilds by a few ulps of |s| (P up to 6x torch's float32 error at Nq = 1, Dk = 256); its
// extra pass costs little beside a backward over every key for so few rows.
// A refined row's D_i = rowsum(dO o O) - dlse_i (the backward's row_delta) is summed from that
// tile loop's O too: the forward's out came from the other order's P, and in a nearly one-hot row
// D ~ dP_ij, where their difference stayed whole in dS = P o (dP - D) (dQ, dK 4-10x torch's
// float32 error at Nq = 1, Dk = 256 on the AVX2 and portable paths).
// The refined row keeps what the given lse holds beyond this kernel's keys (attention_backward with
// sinks: their mass) where that exceeds what rounding may explain (two sums of Dk products of |q|
// and |k| in another order); within it, the given lse's difference is rounding, and is dropped.
// The tile loop's dot products for a refined row's D_i = sum_j P_ij dP_ij (Alg. 2 line 4 as
// torch's softmax backward sums it), in float64: S^T as WideDot (so P is the backward's own, made
// of the same scores), and in place of O^T += V^T P^T a per-lane float64 running sum of
// P_ij (dO_i . v_j), rescaled by the same alpha as l. D = rowsum(dO o O) read the float32 O,
// whose rounding (~ulp(|O|) a feature, times |dO| over Dv) is not the P that dS = P o (dP - D)
// multiplies: in a row of a few keys, dS's sum strayed from 0 by that much and dQ, dK measured
// 4-7x torch's float32 error (tests/test_accumulation.py, rows of Nq <= 16). One lane group.
//   dot_t  dO^T [Dv][16] of the lane group, float64 (zero beyond its rows)
//   d      the running sums [16], float64
template <class T>
struct DeltaDot : WideDot<T> {
  using C = typename Compute<T>::type;
  using V = typename VecOf<C>::V;
  double* dot_t = nullptr;
  double* d = nullptr;

  void load_q(const LaneGroup& lg, int g, uint8_t* fl) {
    WideDot<T>::load_q(lg, g, fl);
    const Params& P = *this->P;
    for (int l = 0; l < kLanes; ++l) {
      const T* drow =
          static_cast<const T*>(P.dout) + lg.b * P.dout_s.s0 + lg.h[l] * P.dout_s.s1 + lg.i[l] * P.dout_s.s2;
      for (int64_t e = 0; e < P.Dv; ++e) dot_t[e * kLanes + l] = l < lg.n ? double(to_c<C>(drow[e])) : 0.0;
      d[l] = 0.0;
    }
  }
  void pv(C* pt, int, int64_t off, int64_t n, V alpha) const {
    alignas(64) C al[kLanes];
    vstore(al, alpha);
    double acc[kLanes] = {};
    for (int64_t jj = 0; jj < n; ++jj) {
      const C* vr = this->vp + (off + jj) * this->ldv;
      double w[kLanes] = {};
      for (int64_t e = 0; e < this->P->Dv; ++e)
        for (int l = 0; l < kLanes; ++l) w[l] += double(vr[e]) * dot_t[e * kLanes + l];
      for (int l = 0; l < kLanes; ++l) acc[l] += double(pt[jj * kLanes + l]) * w[l];
    }
    for (int l = 0; l < kLanes; ++l) d[l] = d[l] * double(al[l]) + acc[l];
  }
  void pv2(C*, C*, int, int64_t, int64_t, V, V) const { __builtin_unreachable(); }  // one lane group
};

template <class T>
struct LseJob {
  using C = typename Compute<T>::type;
  const Params* P = nullptr;
  Arena arena;
  Owned<int64_t> blocks;  // (b * H + h) * lane groups + lane group, holding a row to refine
  int64_t n = 0, next = 0;
  double score_bound = 0;   // max |k| |scale| (times the mods' factors): a score per unit of |q|_1
  Owned<C> rows;            // (B*H*Nq, 2): m, log l; m NaN where the given lse stays
  Owned<double> delta;      // (B*H*Nq): D_i of the refined rows (DeltaDot); NaN where out's stays
  Owned<uint8_t> kv_state;  // the forward's K/V tile verdicts (finite.hpp), for its tile loop
  Owned<double> dbuf;       // per thread: DeltaDot's dO^T [Dv][16] and sums [16]
  static int64_t dbuf_size(const Params& P) { return (P.Dv + 1) * kLanes; }
};

template <class T>
static void lse_task(void* ctx, int tid) {
  using C = typename Compute<T>::type;
  LseJob<T>& J = *static_cast<LseJob<T>*>(ctx);
  const Params& P = *J.P;
  FwdBufs<T> S;
  S.carve(P, J.arena.at(tid));
  const int64_t nlg = (P.Nq + kLanes - 1) / kLanes, group = P.H / P.Hkv;
  const double unit = score_unit(P);
  const C* lse = static_cast<const C*>(P.lse_s.data);
  const C* lse_lo = static_cast<const C*>(P.lse_lo_s.data);
  double* dbuf = J.dbuf.get() + tid * LseJob<T>::dbuf_size(P);
  for (;;) {
    const int64_t it = __atomic_fetch_add(&J.next, 1, __ATOMIC_RELAXED);
    if (it >= J.n) break;
    const int64_t blk = J.blocks[it], i0 = blk % nlg * kLanes, h = blk / nlg % P.H, b = blk / nlg / P.H;
    LaneGroup lg;
    lg.b = b;
    lg.g = h / group;
    lg.n = int(imin(kLanes, P.Nq - i0));
    for (int l = 0; l < kLanes; ++l) {
      lg.h[l] = h;
      lg.i[l] = i0 + (l < lg.n ? l : 0);
    }
    int64_t ka, kz;
    row_key_range(P, &lg, 1, ka, kz);
    if (P.tile_class) ka = ka / P.bk * P.bk;
    uint8_t fl[1][kLanes] = {};
    // bf16: its own dot products (the backward's), and D from their O; else D in float64 (DeltaDot)
    constexpr bool kDeltaDot = !std::is_same_v<T, bf16_t>;
    if constexpr (kDeltaDot)
      fwd_tiles(P, S, &lg, 1, ka, kz, fl, DeltaDot<T>{{&P, &S}, dbuf, dbuf + P.Dv * kLanes});
    else
      fwd_rowset<T>(P, S, &lg, 1, ka, kz, fl);
    for (int l = 0; l < lg.n; ++l) {
      const C m = S.ml[l], sum = S.ml[kLanes + l];
      if (fl[0][l] || !(sum > C(0)) || !std::isfinite(m) || !std::isfinite(sum)) continue;
      double given = double(lse[b * P.lse_s.s0 + h * P.lse_s.s1 + (i0 + l) * P.lse_s.s2]);
      if (lse_lo) given += double(lse_lo[b * P.lse_lo_s.s0 + h * P.lse_lo_s.s1 + (i0 + l) * P.lse_lo_s.s2]);
      const double log_l = std::log2(double(sum)), excess = given - (double(m) * unit + log_l) * kLn2;
      // what the scores' rounding may move lse by: two sums of Dk products in any order
      const T* qrow = static_cast<const T*>(P.q.data) + b * P.q.s0 + h * P.q.s1 + (i0 + l) * P.q.s2;
      double q1 = 0;
      for (int64_t d = 0; d < P.Dk; ++d) q1 += std::fabs(double(to_c<C>(qrow[d])));
      const double slack = 2 * double(P.Dk) * double(std::numeric_limits<C>::epsilon()) * q1 * J.score_bound +
                           4 * double(std::numeric_limits<C>::epsilon()) * std::fabs(given);
      const int64_t row = (b * P.H + h) * P.Nq + i0 + l;
      C* f = J.rows.get() + 2 * row;
      f[0] = m;
      f[1] = C((log_l + (excess > slack ? excess * kLog2e : 0.0)) / unit);  // beyond the rounding: sinks' mass
      if (excess > slack) continue;  // O over this kernel's keys is not the out given: D from out
      // D = sum_j P_ij dP_ij: DeltaDot's sum, or (bf16) from O^T [Dv][16] of the lane group (fwd_finish's
      // o / l) as row_delta sums it; either over the row's l
      double acc = 0;
      if constexpr (kDeltaDot) {
        acc = dbuf[P.Dv * kLanes + l];
      } else {
        const T* drow = static_cast<const T*>(P.dout) + b * P.dout_s.s0 + h * P.dout_s.s1 + (i0 + l) * P.dout_s.s2;
        for (int64_t d = 0; d < P.Dv; ++d) acc += double(S.ot[d * kLanes + l]) * double(to_c<C>(drow[d]));
      }
      acc /= double(sum);
      if (P.dlse) acc -= load_any(P.dlse, b * P.dlse_s.s0 + h * P.dlse_s.s1 + (i0 + l) * P.dlse_s.s2, P.dlse_dtype);
      J.delta[row] = acc;
    }
  }
}

// The rows (kernels_impl.hpp's LseJob) refined for P's backward: Q.lse_rows set when some row needs
// it. Returns false only when out of memory.
template <class T>
static bool refine_lse(const Params& P, Params& Q, LseJob<T>& J) {
  using C = typename Compute<T>::type;
  const C big = C(std::ldexp(1.0, std::numeric_limits<C>::digits - 16));
  const C* lse = static_cast<const C*>(P.lse_s.data);
  const int64_t nlg = (P.Nq + kLanes - 1) / kLanes;
  for (int pass = 0; pass < 2; ++pass) {  // count, then list
    J.n = 0;
    for (int64_t bh = 0; bh < P.B * P.H; ++bh)
      for (int64_t g = 0; g < nlg; ++g)
        for (int64_t i = g * kLanes; i < imin(P.Nq, (g + 1) * kLanes); ++i) {
          const C x = lse[bh / P.H * P.lse_s.s0 + bh % P.H * P.lse_s.s1 + i * P.lse_s.s2];
          if (!std::isfinite(x) || (std::fabs(x) < big && P.Nq > kDecodeMaxNq)) continue;
          if (pass) J.blocks[J.n] = bh * nlg + g;
          ++J.n;
          break;
        }
    if (J.n == 0) return true;
    if (!pass) {
      J.blocks = owned_malloc<int64_t>(size_t(J.n));
      if (!J.blocks) return false;
    }
  }
  double kmax = 0, factor = std::fabs(P.scale);
  for (int64_t b = 0; b < P.B; ++b)
    for (int64_t g = 0; g < P.Hkv; ++g)
      for (int64_t j = 0; j < P.Nk; ++j) {
        const T* kr = static_cast<const T*>(P.k.data) + b * P.k.s0 + g * P.k.s1 + j * P.k.s2;
        for (int64_t d = 0; d < P.Dk; ++d) {
          const double a = std::fabs(double(to_c<C>(kr[d])));
          if (a > kmax && std::isfinite(a)) kmax = a;
        }
      }
  for (int k = 0; k < P.n_mods; ++k)
    if (P.mods[k].kind == MOD_MUL) factor *= std::fmax(1.0, std::fabs(P.mods[k].c));
  J.score_bound = kmax * factor;
  const int64_t rows = P.B * P.H * P.Nq;
  J.rows = owned_malloc<C>(size_t(2 * rows));
  J.delta = owned_malloc<double>(size_t(rows));
  J.kv_state = owned_calloc<uint8_t>(size_t(P.B * P.Hkv * P.nbk));
  Q.kv_state = J.kv_state.get();
  J.P = &Q;
  const int nt = int(imax(1, imin(P.parallel ? P.threads : 1, J.n)));
  J.dbuf = owned_malloc<double>(size_t(nt * LseJob<T>::dbuf_size(P)));
  if (!J.rows || !J.delta || !J.kv_state || !J.dbuf || !J.arena.alloc(nt, FwdBufs<T>::bytes(Q))) return false;
  for (int64_t r = 0; r < 2 * rows; ++r) J.rows[r] = C(NAN);
  for (int64_t r = 0; r < rows; ++r) J.delta[r] = NAN;
  run_parallel(Q, nt, &lse_task<T>, &J);
  Q.lse_rows = J.rows.get();
  Q.delta_rows = J.delta.get();
  return true;
}

template <class T>
static bool backward_impl(const Params& P0) {
  using C = typename Compute<T>::type;
  Params P = P0;
  LseJob<T> refined;
  if (!refine_lse<T>(P0, P, refined)) return false;
  BwdJob<T> J;
  J.P = &P;
  J.nkb = (P.Nk + P.bk - 1) / P.bk;
  J.n_items = P.B * P.Hkv * J.nkb;
  // every thread of the call must run at once (DqOrder waits on the others): one without a pool
  J.nt = P.parallel ? int(imax(1, imin(P.threads, J.n_items))) : 1;
  const int64_t rows = P.B * P.H * P.Nq, nbq = (P.Nq + P.bq - 1) / P.bq;
  J.row_nan = owned_calloc<uint8_t>(size_t((rows + 7) / 8));
  bool ok = J.row_nan && J.rb.build(P) && J.order.init(J.nt, (P.H / P.Hkv) * nbq + 1, J.nkb, P.B * P.Hkv) &&
            J.arena.alloc(J.nt, BwdBufs<T>::bytes(P)) && J.rs.alloc(P);
  if (ok) {
    J.dq = static_cast<C*>(P.dq);
    run_parallel(P, J.nt, &bwd_rows_task<T>, &J);
    run_parallel(P, J.nt, &bwd_task<T>, &J);
    run_parallel(P, J.nt, &bwd_check_task<T>, &J);
  }
  return ok;
}

// ------------------------------------------------------------------ micro-benchmarks

// Throughput of the pieces of one (16 queries x 128 keys, Dk = Dv = 64) float32 tile step on
// L1-resident data, single thread, for the benchmark report: 0: S^T = K Q^T, 1: O^T += V^T P^T
// (GFLOP/s), 2: exp2 (G exp/s), 3: the whole step (S, softmax, P.V, compensated rescale-add; GFLOP/s),
// 4: register-only FMAs (the core's peak GFLOP/s, for comparison).
static double microbench(int kind, int64_t reps) {
  using V = VF;
  constexpr int64_t bk = kBlockK, D = 64;
  Arena a;
  if (!a.alloc(1, sizeof(float) * size_t(bk * D * 2 + D * kLanes * 4 + bk * kLanes + 4 * kLanes))) return 0.0;
  float* kt = reinterpret_cast<float*>(a.at(0));
  float* vt = kt + bk * D;
  float* qt = vt + bk * D;
  float* ot = qt + D * kLanes;
  float* st = ot + D * kLanes;
  float* ml = st + bk * kLanes;
  float* oc = ml + 4 * kLanes;  // O's Kahan carry (microkernel.hpp)
  for (int64_t x = 0; x < bk * D; ++x) {
    kt[x] = float(x % 7) * 0.01f;
    vt[x] = float(x % 5) * 0.01f;
  }
  for (int64_t x = 0; x < D * kLanes; ++x) qt[x] = float(x % 3) * 0.01f;
  for (int64_t x = 0; x < bk * kLanes; ++x) st[x] = -float(x % 11);
  Params P;
  P.Nq = P.Nk = 1 << 20;
  P.bk = int(bk);
  LaneGroup lg;
  lg.n = kLanes;
  for (int l = 0; l < kLanes; ++l) {
    lg.h[l] = 0;
    lg.i[l] = l;
  }
  TileMask tm;
  tm.mode = TILE_FULL;
  ModLanes<float> mlanes;
  mod_lanes_init(P, lg, mlanes);
  vstore(ml, vset1<V>(-INFINITY));
  vstore(ml + kLanes, vzero<V>());
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  V sink = vzero<V>();
  for (int64_t r = 0; r < reps; ++r) {
    if (kind == 0)
      gemm16<false>(st, kLanes, kt, D, 1, qt, kLanes, bk, D);
    else if (kind == 1)
      gemm16<true>(ot, kLanes, vt, 1, D, st, kLanes, D, bk);
    else if (kind == 4) {  // register-only FMA peak: 6 x 16 lanes of independent chains
      V acc[6];
      for (int m = 0; m < 6; ++m) acc[m] = vset1<V>(float(m));
      const V b = vset1<V>(0.999f), c = vset1<V>(1e-7f);
      for (int64_t x = 0; x < bk * D; ++x)
#pragma GCC unroll 6
        for (int m = 0; m < 6; ++m) acc[m] = vfma(acc[m], b, c);
      for (int m = 0; m < 6; ++m) sink = vadd(sink, acc[m]);
    } else if (kind == 2)
      for (int64_t jj = 0; jj < bk; ++jj) sink = vadd(sink, vexp2(vload(st + jj * kLanes)));
    else {
      gemm16<false>(st, kLanes, kt, D, 1, qt, kLanes, bk, D);
      const V alpha =
          softmax_tile<float, float>(P, lg, mlanes, tm, 0, bk, st, nullptr, ml, ml + kLanes, ml + 2 * kLanes);
      gemm16_kahan(ot, oc, kLanes, vt, 1, D, st, kLanes, D, bk, alpha);
    }
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  alignas(64) float s[kLanes];
  vstore(s, sink);
  if (s[0] == 12345.0f) std::printf("%g\n", double(ot[0]));  // keep the work
  const double sec = double(t1.tv_sec - t0.tv_sec) + 1e-9 * double(t1.tv_nsec - t0.tv_nsec);
  const double per = kind == 2   ? double(bk * kLanes)
                     : kind == 3 ? 4.0 * bk * kLanes * D
                     : kind == 4 ? 6.0 * 2 * kLanes * bk * D
                                 : 2.0 * bk * kLanes * D;
  return per * double(reps) / sec / 1e9;
}

// ------------------------------------------------------------------ dtype dispatch

static bool forward_entry(const Params& P) {
  switch (P.dtype) {
    case DType::f32:
      return forward_impl<float>(P);
    case DType::f64:
      return forward_impl<double>(P);
    case DType::f16:
      return forward_impl<f16_t>(P);
    default:
      return forward_impl<bf16_t>(P);
  }
}

static bool backward_entry(const Params& P) {
  switch (P.dtype) {
    case DType::f32:
      return backward_impl<float>(P);
    case DType::f64:
      return backward_impl<double>(P);
    case DType::f16:
      return backward_impl<f16_t>(P);
    default:
      return backward_impl<bf16_t>(P);
  }
}

}  // namespace QKV_NS
}  // namespace qkv_native
