// Backward tile loop: FlashAttention-2 (arXiv:2307.08691), Algorithm 2, on the CPU.
//
// Recompute, never store: P = exp2(S - lse) is rebuilt per tile from q, k and the saved lse, so
// no Nq x Nk buffer exists. A work item is one key tile (b, kv head g, key block): it owns dK and
// dV of its BK keys (accumulated over every query head of the group and every query block: the
// GQA sum happens here, no K/V copy), and walks the query blocks with
//   S^T = K Q^T, P^T = exp2(S^T - lse), dP^T = V dO^T, dS^T = P^T o (dP^T - D)   (Alg. 2 l. 11-16)
//   dV += P^T dO,  dK += dS^T Q,  dQ += dS K                                       (l. 12, 17, 18)
// with D_i = rowsum(dO o O) - dlse_i in float64 (row_delta), and P rebuilt from lse + lse_lo (the
// forward's residual of lse's rounding, when given: params.hpp). Where a row is nearly one-hot
// (some P^T of its lane group's tile above kExactDpP), dP^T - D is summed in float64 instead
// (exact_dpt below). The loop (bwd_tiles) runs over a Dot
// policy holding the operand layouts and the five matmuls: WideBwd below (compute-type operands,
// microkernel.hpp), or kernels_avx512bf16.cpp's Bf16Bwd (bf16 operands on vdpbf16ps).
//
// Non-finite numbers (finite.hpp): non-finite K/V rows are zeroed in the tile copies, so a hidden
// one never reaches a gradient. A row whose forward was NaN (lse NaN), or whose q, dO, D or an
// attended bias entry is not finite, contributes P = 0 and instead sends NaN along its attended
// edges only: its dQ row, and the dK / dV rows of the keys it may attend.
//
// Determinism without atomic adds or per-thread copies: dQ rows are added straight into the dq
// output, each query block's in ascending key-tile order (DqOrder below), so the bits do not depend
// on the thread count or the schedule.
#pragma once
#include <sched.h>

#include "attention_fwd.hpp"

namespace qkv_native {
inline namespace QKV_NS {

template <class T>
struct BwdBufs : Scratch<BwdBufs<T>> {
  using C = typename Compute<T>::type;
  C *kc, *vc, *dka, *dva, *qs, *dos, *qt, *dot, *pt, *dst, *dfac, *addt, *zt, *dqt;
  C *dkc, *dvc;                          // the Kahan carries of dK, dV (microkernel.hpp)
  uint16_t *kpair, *dspair;              // bf16 dot products only (kernels_avx512bf16.cpp): K, dS^T key pairs
  static constexpr int64_t W = kBlockQ;  // row stride of the block-wide P^T / dS^T tiles
  static constexpr bool kPairs = std::is_same_v<T, bf16_t>;
  void lay(const Params& P, Carver& c) {
    const int64_t dkp = round_up(P.Dk, kLanes), dvp = round_up(P.Dv, kLanes);
    kc = c.take<C>(P.bk * dkp);
    vc = c.take<C>(P.bk * dvp);
    dka = c.take<C>(P.bk * dkp);
    dva = c.take<C>(P.bk * dvp);
    qs = c.take<C>(W * dkp);
    dos = c.take<C>(W * dvp);
    qt = c.take<C>(kLaneGroups * P.Dk * kLanes);
    dot = c.take<C>(kLaneGroups * P.Dv * kLanes);
    pt = c.take<C>(P.bk * W);
    dst = c.take<C>(P.bk * W);
    dfac = c.take<C>(P.bk * W);
    addt = c.take<C>(P.bk * W);  // each lane group's additive tile [BK][16]
    zt = c.take<C>(P.bk * kLanes);
    dqt = c.take<C>(W * dkp);  // the block's dQ rows of this tile, added in order
    dkc = c.take<C>(P.bk * dkp);
    dvc = c.take<C>(P.bk * dvp);
    kpair = c.take<uint16_t>(kPairs ? round_up(P.bk, 2) * dkp : 0);
    dspair = c.take<uint16_t>(kPairs ? kLaneGroups * round_up(P.bk, 2) * kLanes : 0);
  }
};

// The union [lo, hi) of the key intervals (P.rows) of each BQ-row query block: a key tile then finds
// the query blocks that can see it in O(1) each, instead of classifying their 64 rows. Broadcast
// axes of the rows stay broadcast here (stride 0). lo >= hi: no row of the block sees a key.
struct RowBlocks {
  Owned<int32_t> lohi;  // (Bm, Hm, nbq, 2)
  int64_t sb = 0, sh = 0;
  const int32_t* at(int64_t b, int64_t h, int64_t qb) const { return lohi.get() + b * sb + h * sh + qb * 2; }
  bool build(const Params& P) {
    if (!P.rows || P.tile_class) return true;  // with classes, a FULL tile holds whatever its rows say
    const int64_t nbq = (P.Nq + P.bq - 1) / P.bq, bm = P.rw_b ? P.B : 1, hm = P.rw_h ? P.H : 1;
    sh = P.rw_h ? nbq * 2 : 0;
    sb = P.rw_b ? hm * nbq * 2 : 0;
    lohi = owned_malloc<int32_t>(size_t(bm * hm * nbq * 2));
    if (!lohi) return false;
    for (int64_t b = 0; b < bm; ++b)
      for (int64_t h = 0; h < hm; ++h)
        for (int64_t qb = 0; qb < nbq; ++qb) {
          int64_t lo = P.Nk, hi = 0;
          for (int64_t i = qb * P.bq; i < imin(P.Nq, (qb + 1) * P.bq); ++i) {
            const int32_t* r = P.rows + b * P.rw_b + h * P.rw_h + i * 2;
            const int64_t a = imax(r[0], 0), z = imin(r[1], P.Nk);
            if (a < z) {
              lo = imin(lo, a);
              hi = imax(hi, z);
            }
          }
          int32_t* o = lohi.get() + b * sb + h * sh + qb * 2;
          o[0] = int32_t(lo);
          o[1] = int32_t(hi);
        }
    return true;
  }
};

// Per-thread scratch from calloc: fresh pages read as zero and become resident only when touched,
// so the buffers a call leaves unused (mods, bias, dropout tiles; dK / dV copies when the output rows
// hold the sums) cost no memory, unlike a memset arena.
struct LazyArena {
  Owned<char> raw;
  char* base = nullptr;
  size_t per_thread = 0;
  bool alloc(int threads, size_t bytes) {
    per_thread = size_t(round_up(int64_t(bytes), 64));
    raw = owned_calloc<char>(per_thread * size_t(threads) + 64);
    if (!raw) return false;
    base = raw.get() + (64 - reinterpret_cast<uintptr_t>(raw.get()) % 64) % 64;
    return true;
  }
  char* at(int tid) const { return base + per_thread * size_t(tid); }
};

// dQ summed in one fixed order without a copy per thread. Every key tile adds its dQ rows of a
// query block only after every lower key tile of the same (b, kv head) has added its own, so dQ =
// sum over key tiles in ascending order: the same bits for any thread count and schedule, and no
// B*H*Nq*Dk partial per thread (8 MiB per thread at N = 32768, D = 64).
// The schedule: whole (b, g) slices round-robin over the threads while every thread gets one (no
// thread ever waits: their dQ rows are disjoint); the last B*Hkv mod T slices have their key tiles
// round-robin over all threads (item t, t + T, ...), each thread in ascending order. Only those
// wait, FlashAttention-3's way (its deterministic backward keeps one semaphore per query block,
// arXiv:2407.08608): each thread publishes its position (item * S + query blocks done, release) and
// a thread about to add waits (acquire) for the other threads' last lower items of its slice. The
// lowest item in flight never waits (no deadlock; all threads of a call run at once, threads.hpp);
// causal tiles then walk the query blocks one step apart, a pipeline, but a narrow band overlaps its
// neighbour tiles' blocks early and serialises more (~1.3x on 2 threads, window 256, one head).
struct DqOrder {
  Owned<int64_t> pos;  // per thread, one cache line apart
  int nt = 1;
  int64_t S = 1, nkb = 1, n_items = 0;  // S: query blocks of an item (its heads x nbq) + 1
  int64_t whole = 0;                    // items of the slices taken whole: [0, whole)
  static constexpr int kLine = 8;
  bool init(int threads, int64_t s, int64_t kbs, int64_t slices) {
    nt = threads;
    S = s;
    nkb = kbs;
    n_items = slices * kbs;
    whole = slices / nt * nt * kbs;
    pos = owned_calloc<int64_t>(size_t(nt) * size_t(kLine));
    return pos != nullptr;
  }
  // Thread tid's n-th item, or -1 when it has no more; ascending in n.
  int64_t item(int tid, int64_t n) const {
    const int64_t per = whole / nt;  // items of the whole slices of each thread
    if (n < per) return (tid + n / nkb * nt) * nkb + n % nkb;
    const int64_t it = whole + tid + (n - per) * nt;
    return it < n_items ? it : -1;
  }
  void publish(int tid, int64_t it, int64_t done) const {
    __atomic_store_n(pos.get() + tid * kLine, it * S + done, __ATOMIC_RELEASE);
  }
  // Until every lower item of it's (b, g) has finished query block s.
  void wait(int tid, int64_t it, int64_t s) const {
    if (it < whole) return;
    for (int t = 0; t < nt; ++t) {
      if (t == tid) continue;
      const int64_t r = it - whole, prev = it - (r - t + nt) % nt;  // t's last item below it
      if (prev < whole || prev / nkb != it / nkb) continue;
      const int64_t need = prev * S + s + 1;
      for (int spin = 0; __atomic_load_n(pos.get() + t * kLine, __ATOMIC_ACQUIRE) < need; ++spin)
        if (spin >= 64) sched_yield();  // the machine may be shared: give the core to the thread awaited
    }
  }
};

// D_i = rowsum(dO o O) - dlse_i of row i (Alg. 2 line 4), summed in float64 (it is subtracted from
// dP: keep it exact), once per row and call (RowStats below). Eight independent
// partial sums, added in one fixed order: one serial float64 chain ran at the FMA latency (4
// cycles a product) and measured ~7% of a causal backward; eight chains vectorise (the order is
// written here, so every ISA and thread count sums alike).
template <class T>
static inline double row_delta(const Params& P, int64_t b, int64_t h, int64_t i, const T* drow) {
  using C = typename Compute<T>::type;
  constexpr int64_t kChains = 8;
  const T* orow = static_cast<const T*>(P.out_s.data) + b * P.out_s.s0 + h * P.out_s.s1 + i * P.out_s.s2;
  double part[kChains] = {};
  int64_t d = 0;
  for (; d + kChains <= P.Dv; d += kChains)
    for (int64_t u = 0; u < kChains; ++u) part[u] += double(to_c<C>(orow[d + u])) * double(to_c<C>(drow[d + u]));
  for (int64_t u = 0; d < P.Dv; ++d, ++u) part[u] += double(to_c<C>(orow[d])) * double(to_c<C>(drow[d]));
  double acc = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
  if (P.dlse) acc -= load_any(P.dlse, b * P.dlse_s.s0 + h * P.dlse_s.s1 + i * P.dlse_s.s2, P.dlse_dtype);
  return acc;
}

// dS = P o (dP - D) loses, in a nearly one-hot row, what torch's softmax backward keeps: there
// dP_ij ~ D_i (D = sum_j P_ij dP_ij ~ dP_ij for the one key), so dP - D is a rounding residue. torch
// sums D from the same rounded dP_ij, whose rounding then cancels in dP_ij - D_i; FlashAttention-2's
// D = rowsum(dO o O) cannot cancel a rounding it never saw, and the float32 dP_ij's (a sum of Dv
// products, ~sqrt(Dv) ulps of |dO||v|) stays whole in dS: dQ, dK up to 4x torch's float32 error
// on flash-attn's softcap / window cases (tests/test_accumulation.py). Summed in float64 from the
// float32 dO and V and with D in float64, dP - D keeps only O's own rounding (in D), ~ulp(|O|) |dO|.
// It costs ~3x a float32 dP^T, so it runs only for the lane groups whose tile holds a P above
// kExactDpP: where the cancellation 1 - P_ij is at most 1 - kExactDpP (a softmax spread over many
// keys has no such P, and keeps the float32 matmul).
constexpr double kExactDpP = 0.25;

// dP^T - D of lane group lg over keys [a, a + n) into c (row stride W), summed in float64: dO^T
// [Dv][16] of the lane group and the V tile rows (row stride ldv) in the compute type.
template <class C>
static void exact_dpt(C* c, int64_t W, const C* vp, int64_t ldv, const C* dot, int64_t Dv, int64_t a, int64_t n,
                      const double* d) {
  for (int64_t jj = a; jj < a + n; ++jj) {
    const C* vr = vp + jj * ldv;
    double acc[kLanes];
    for (int l = 0; l < kLanes; ++l) acc[l] = -d[l];
    for (int64_t e = 0; e < Dv; ++e) {
      const double x = double(vr[e]);
      const C* o = dot + e * kLanes;
      for (int l = 0; l < kLanes; ++l) acc[l] += x * double(o[l]);
    }
    for (int l = 0; l < kLanes; ++l) c[jj * W + l] = C(acc[l]);
  }
}

// Whether a non-finite D_i = rowsum(dO o O) - dlse_i comes from finite O, dO and dlse: their sum
// overflowed the compute type, which is reported as an overflow (the row's gradients come out
// non-finite and are counted) instead of being sent along the row's edges as a non-finite input's
// NaN, silently. Runs only for a row whose D is not finite.
template <class T>
__attribute__((noinline)) static bool delta_overflowed(const Params& P, int64_t b, int64_t h, int64_t i) {
  const T* orow = static_cast<const T*>(P.out_s.data) + b * P.out_s.s0 + h * P.out_s.s1 + i * P.out_s.s2;
  const T* drow = static_cast<const T*>(P.dout) + b * P.dout_s.s0 + h * P.dout_s.s1 + i * P.dout_s.s2;
  const double dl = P.dlse ? load_any(P.dlse, b * P.dlse_s.s0 + h * P.dlse_s.s1 + i * P.dlse_s.s2, P.dlse_dtype) : 0;
  return storage_finite(orow, P.Dv) && storage_finite(drow, P.Dv) && std::isfinite(dl);
}

// Per query row, once per call before the key tiles: D_i (row_delta) and whether its q or dO row
// is not finite (it then sends NaN, finite.hpp). Every key tile the row's block meets reads them;
// recomputed there, once per key tile, they measured ~6% of a bf16 backward (perf). One double and
// one byte a row: O(B H Nq).
template <class T>
struct RowStats {
  using C = typename Compute<T>::type;
  Owned<double> delta;  // (B, H, Nq)
  Owned<uint8_t> bad;   // (B, H, Nq)
  bool alloc(const Params& P) {
    const size_t n = size_t(P.B * P.H * P.Nq);
    delta = owned_malloc<double>(n ? n : 1);  // an empty axis still gets a pointer
    bad = owned_malloc<uint8_t>(n ? n : 1);
    return delta && bad;
  }
  // rows [r0, r1) of the flattened (B, H, Nq)
  void fill(const Params& P, int64_t r0, int64_t r1) {
    const T* q = static_cast<const T*>(P.q.data);
    const T* dout = static_cast<const T*>(P.dout);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t i = r % P.Nq, h = r / P.Nq % P.H, b = r / (P.Nq * P.H);
      const T* drow = dout + b * P.dout_s.s0 + h * P.dout_s.s1 + i * P.dout_s.s2;
      const double* dref = P.delta_rows ? P.delta_rows + r : nullptr;  // refine_lse's, where it ran
      delta[r] = dref && *dref == *dref ? *dref : row_delta<T>(P, b, h, i, drow);
      bad[r] = uint8_t(!storage_finite(q + b * P.q.s0 + h * P.q.s1 + i * P.q.s2, P.Dk) || !storage_finite(drow, P.Dv));
    }
  }
};

// The dot products of the backward tile loop below (bwd_tiles), on compute-type operands:
// microkernel.hpp's gemm16 / gemm16x2 on K and V read in place (widened per tile when stored
// narrower), Q^T and dO^T [D][16] per lane group and the block's Q, dO rows. kernels_avx512bf16.cpp
// has another with the same members (vdpbf16ps on bf16 pairs). bwd_tiles makes one per key tile:
//   tile(b, g, j0, jn, bk, bv)   K, V rows [j0, j0 + jn) of (b, g) ready, non-finite rows zeroed
//                                (and marked in bk / bv)
//   row(r, q, dO, bad)           row r of the query block (zeros when bad: not finite)
//   rows_done(nr, rq)            after the block's nr rows; rq: rows of whole lane groups
//   lane_group(lg)               lane group lg's Q^T, dO^T from the block's rows
//   scores(c, lg, two, a, n)     S^T of lane group lg (and lg + 1) for keys [a, a + n) into c
//                                (row stride W; lane group lg + 1's columns follow lg's)
//   dpt(c, lg, two, a, n)        dP^T = V dO^T likewise
//   dq(lg, two, a, n)            dQ = dS K of lg (and lg + 1) from S.dst: rows lg 16 + l of S.dqt
//   dkv(dka, dva, ja, jz, rq)    dK += dS^T Q, dV += P^T dO over keys [ja, jz) and the block's rq
//                                rows, each block's sum added compensated (microkernel.hpp)
//   kKeyStep                     a lane group's keys start at a multiple of it (2: the bf16 dQ
//                                pairs keys from the tile's start)
template <class T>
struct WideBwd {
  using C = typename Compute<T>::type;
  using V = typename VecOf<C>::V;
  static constexpr int64_t kKeyStep = 1;
  static constexpr int64_t W = BwdBufs<T>::W;
  static constexpr bool kExactDp = std::is_same_v<C, float>;  // float64 has nothing to gain
  const Params* P;
  BwdBufs<T>* S;
  const C* kp = nullptr;
  const C* vp = nullptr;
  int64_t ldk = 0, ldv = 0, dkp = 0, dvp = 0;

  void tile(int64_t b, int64_t g, int64_t j0, int64_t jn, TileRows& bk, TileRows& bv) {
    dkp = round_up(P->Dk, kLanes);
    dvp = round_up(P->Dv, kLanes);
    // K, V read in place when already in the compute type and finite (as the forward does: the
    // copies stay untouched, no memory); widened or with non-finite rows zeroed into S.kc / S.vc.
    // K rows padded to whole vectors (zeros) for dQ, where they are the vector operand.
    kp = kv_tile<T, C>(P->k, b, g, j0, jn, P->Dk, S->kc, dkp, P->Dk != dkp, ldk);
    vp = kv_tile<T, C>(P->v, b, g, j0, jn, P->Dv, S->vc, dvp, false, ldv);
    if (scan_rows(kp, ldk, jn, P->Dk, bk)) {
      kp = zeroed_rows(kp, ldk, jn, P->Dk, bk, S->kc, dkp);
      ldk = dkp;
    }
    if (scan_rows(vp, ldv, jn, P->Dv, bv)) {
      vp = zeroed_rows(vp, ldv, jn, P->Dv, bv, S->vc, dvp);
      ldv = dvp;
    }
  }
  void row(int64_t r, const T* qrow, const T* drow, bool bad) {
    C* qd = S->qs + r * dkp;
    C* dd = S->dos + r * dvp;
    if (bad) {
      std::memset(static_cast<void*>(qd), 0, sizeof(C) * size_t(P->Dk));
      std::memset(static_cast<void*>(dd), 0, sizeof(C) * size_t(P->Dv));
      return;
    }
    for (int64_t d = 0; d < P->Dk; ++d) qd[d] = to_c<C>(qrow[d]);
    for (int64_t d = 0; d < P->Dv; ++d) dd[d] = to_c<C>(drow[d]);
  }
  void rows_done(int64_t nr, int64_t rq) {  // zero rows up to whole lane groups (padding stays zero)
    std::memset(static_cast<void*>(S->qs + nr * dkp), 0, sizeof(C) * size_t((rq - nr) * dkp));
    std::memset(static_cast<void*>(S->dos + nr * dvp), 0, sizeof(C) * size_t((rq - nr) * dvp));
  }
  void lane_group(int lg) {
    C* qt = S->qt + lg * P->Dk * kLanes;
    C* dot = S->dot + lg * P->Dv * kLanes;
    const C qf = C(q_prescale(*P));
    for (int64_t d = 0; d < P->Dk; ++d)
      for (int l = 0; l < kLanes; ++l) qt[d * kLanes + l] = S->qs[(lg * kLanes + l) * dkp + d] * qf;
    for (int64_t d = 0; d < P->Dv; ++d)
      for (int l = 0; l < kLanes; ++l) dot[d * kLanes + l] = S->dos[(lg * kLanes + l) * dvp + d];
  }
  // c [n][16 per lane group] = rows x (n of them, ld apart) against bt [R][16] of one lane group,
  // or of two (bt's next R x 16 block) sharing each broadcast of x
  void dots(C* c, bool two, const C* x, int64_t ld, const C* bt, int64_t R, int64_t n) const {
    if (two)
      gemm16x2(c, c + kLanes, W, x, ld, 1, bt, bt + R * kLanes, kLanes, n, R);
    else
      gemm16<false>(c, W, x, ld, 1, bt, kLanes, n, R);
  }
  void scores(C* c, int lg, bool two, int64_t a, int64_t n) const {
    dots(c, two, kp + a * ldk, ldk, S->qt + lg * P->Dk * kLanes, P->Dk, n);
  }
  void dpt(C* c, int lg, bool two, int64_t a, int64_t n) const {
    dots(c, two, vp + a * ldv, ldv, S->dot + lg * P->Dv * kLanes, P->Dv, n);
  }
  // dP^T - D of lane group lg, keys [a, a + n), in float64 (exact_dpt); d: its D per lane
  void dpt_exact(C* c, int lg, int64_t a, int64_t n, const double* d) const {
    exact_dpt(c, W, vp, ldv, S->dot + lg * P->Dv * kLanes, P->Dv, a, n, d);
  }
  void dq(int lg, bool two, int64_t a, int64_t n) const {
    C* c = S->dqt + lg * kLanes * dkp;
    const C* ds = S->dst + a * W + lg * kLanes;  // row m of dS: column m of dS^T (two lane groups adjacent)
    const C* kr = kp + a * ldk;
    const int64_t m = two ? 2 * kLanes : kLanes, nc = dkp / kLanes;
    int64_t x = 0;
    for (; x + 2 <= nc; x += 2)
      gemm16x2(c + x * kLanes, c + (x + 1) * kLanes, dkp, ds, 1, W, kr + x * kLanes, kr + (x + 1) * kLanes, ldk, m, n);
    if (x < nc) gemm16<false>(c + x * kLanes, dkp, ds, 1, W, kr + x * kLanes, ldk, m, n);
  }
  void dkv(C* dka, C* dva, int64_t ja, int64_t jz, int64_t rq) const {
    const V one = vset1<V>(C(1));
    const int64_t nj = jz - ja;
    for (int64_t c = 0; c < dvp / kLanes; ++c)
      gemm16_kahan(dva + ja * dvp + c * kLanes, S->dvc + ja * dvp + c * kLanes, dvp, S->pt + ja * W, W, 1,
                   S->dos + c * kLanes, dvp, nj, rq, one);
    for (int64_t c = 0; c < dkp / kLanes; ++c)
      gemm16_kahan(dka + ja * dkp + c * kLanes, S->dkc + ja * dkp + c * kLanes, dkp, S->dst + ja * W, W, 1,
                   S->qs + c * kLanes, dkp, nj, rq, one);
  }
};

// One key tile: dK, dV of keys [j0, j0 + jn) of (b, g); dQ contributions added to dq in order.
// Exact ranges: only the query blocks whose rows can see the tile are visited (RowBlocks, tile
// classes), and in each, every lane group computes S^T, P^T, dP^T, dS^T and its dQ share only over
// the keys [a, z) its 16 rows may see (the union of their intervals, as the forward's lane groups
// walk theirs); the block's dK / dV sums run over the union of those. A causal diagonal tile costs
// then about half a tile, and a narrow band only its band. Two lane groups that both see the tile
// go together over the union of their keys (one broadcast of K or V feeds both, as the forward's
// pairs): the keys one of them may not see come out P = 0, dS = 0, adding nothing to any sum.
template <class Dot, class T>
__attribute__((noinline)) static void bwd_tiles(const Params& P, BwdBufs<T>& S, int tid, int64_t it, int64_t b,
                                                int64_t g, int64_t kb, const RowBlocks& rb, const DqOrder& order,
                                                const RowStats<T>& rs, typename Compute<T>::type* dq,
                                                uint8_t* row_nan) {
  using C = typename Compute<T>::type;
  using V = typename VecOf<C>::V;
  constexpr int64_t W = BwdBufs<T>::W;
  const int64_t dkp = round_up(P.Dk, kLanes), dvp = round_up(P.Dv, kLanes);
  const int64_t j0 = kb * P.bk, jn = imin(P.bk, P.Nk - j0), group = P.H / P.Hkv;
  Dot dot{&P, &S};
  TileRows bad_k, bad_v;
  dot.tile(b, g, j0, jn, bad_k, bad_v);
  uint8_t key_nan[kBlockK] = {};  // keys attended by a row that sends NaN
  // dK, dV summed in the output rows themselves when their rows need no padding (Dk, Dv multiples
  // of 16, the usual head sizes): the scratch copies are then never touched (no memory)
  C* dk = static_cast<C*>(P.dk) + ((b * P.Hkv + g) * P.Nk + j0) * P.Dk;
  C* dvo = static_cast<C*>(P.dv) + ((b * P.Hkv + g) * P.Nk + j0) * P.Dv;
  C* dka = P.Dk == dkp ? dk : S.dka;
  C* dva = P.Dv == dvp ? dvo : S.dva;
  std::memset(static_cast<void*>(dka), 0, sizeof(C) * size_t(jn * dkp));
  std::memset(static_cast<void*>(dva), 0, sizeof(C) * size_t(jn * dvp));
  std::memset(static_cast<void*>(S.dkc), 0, sizeof(C) * size_t(P.bk * dkp));
  std::memset(static_cast<void*>(S.dvc), 0, sizeof(C) * size_t(P.bk * dvp));
  const T* dout = static_cast<const T*>(P.dout);
  const T* q = static_cast<const T*>(P.q.data);
  const C* lse = static_cast<const C*>(P.lse_s.data);
  const C* lse_lo = static_cast<const C*>(P.lse_lo_s.data);
  const bool want_d = P.n_mods > 0;
  const double unit = score_unit(P), kl = kLog2e / unit;  // P = exp2((s - lse kl) unit)
  const bool drop = P.dropout_p > 0.0;
  const uint32_t thr = drop ? dropout_threshold(P.dropout_p) : 0;
  const C inv_keep = drop ? C(1.0 / (1.0 - P.dropout_p)) : C(1);
  const V ninf = vset1<V>(C(-INFINITY));
  LaneGroup lgs[kLaneGroups];
  TileMask tm[kLaneGroups];
  ModLanes<C> ml[kLaneGroups];
  const int64_t nbq = (P.Nq + P.bq - 1) / P.bq;
  for (int64_t h = g * group; h < (g + 1) * group; ++h) {
    for (int64_t qb = 0; qb < nbq; ++qb) {
      if (rb.lohi) {  // no row of the block sees the tile: not even classified
        const int32_t* r = rb.at(P.rw_b ? b : 0, P.rw_h ? h : 0, qb);
        if (r[0] >= r[1] || r[1] <= j0 || r[0] >= j0 + jn) continue;
      }
      if (P.tile_class && P.tile_class[b * P.tc_b + h * P.tc_h + qb * P.nbk + kb] == EMPTY) continue;
      const int64_t sub = (h - g * group) * nbq + qb;  // the query block's place in the dQ order
      order.publish(tid, it, sub);                     // every block before it is added or not ours
      const int64_t i0 = qb * P.bq, nr = imin(P.bq, P.Nq - i0);
      const int nlg = int((nr + kLanes - 1) / kLanes);
      int64_t ra[kLaneGroups], rz[kLaneGroups];  // each lane group's own keys [ra, rz)
      for (int lg = 0; lg < nlg; ++lg) {
        LaneGroup& L = lgs[lg];
        fill_lanes(L, b, g, i0 + lg * kLanes, nr - lg * kLanes, [&](int64_t r, int64_t& hl, int64_t& i) {
          hl = h;
          i = r;
        });
        classify(P, L, kb, j0, jn, tm[lg]);
        ra[lg] = 0;
        rz[lg] = tm[lg].mode == TILE_SKIP ? 0 : jn;
        if (tm[lg].mode == TILE_MASKED) {
          ra[lg] = jn;
          rz[lg] = 0;
          for (int l = 0; l < L.n; ++l)
            if (tm[lg].lo[l] < tm[lg].hi[l]) {
              ra[lg] = imin(ra[lg], tm[lg].lo[l]);
              rz[lg] = imax(rz[lg], tm[lg].hi[l]);
            }
        }
        if (ra[lg] >= rz[lg]) tm[lg].mode = TILE_SKIP;
      }
      // the keys [ca, cz) each lane group is computed over: its own, or its pair's union, from a
      // multiple of the Dot's key step; their union [ja, jz)
      int64_t ca[kLaneGroups], cz[kLaneGroups], ja = jn, jz = 0;
      for (int lg = 0; lg < nlg; lg += 2) {
        const bool on0 = tm[lg].mode != TILE_SKIP, on1 = lg + 1 < nlg && tm[lg + 1].mode != TILE_SKIP;
        int64_t a = on0 ? ra[lg] : (on1 ? ra[lg + 1] : 0), z = on0 ? rz[lg] : (on1 ? rz[lg + 1] : 0);
        if (on0 && on1) {
          a = imin(a, ra[lg + 1]);
          z = imax(z, rz[lg + 1]);
        }
        a = a / Dot::kKeyStep * Dot::kKeyStep;
        for (int x = lg; x < lg + 2 && x < nlg; ++x) {
          ca[x] = tm[x].mode == TILE_SKIP ? 0 : a;
          cz[x] = tm[x].mode == TILE_SKIP ? 0 : z;
        }
        if ((on0 || on1) && a < z) {
          ja = imin(ja, a);
          jz = imax(jz, z);
        }
      }
      if (ja >= jz) continue;
      // Q and dO rows of the block; D_i = rowsum(dO o O) - dlse_i (float64, and rounded to the
      // compute type for dP^T's float32 path) and the rows' finiteness (RowStats)
      const int64_t row0 = (b * P.H + h) * P.Nq + i0;
      const double* drow64 = rs.delta.get() + row0;
      const uint8_t* row_bad = rs.bad.get() + row0;
      uint8_t dq_nan[kBlockQ] = {};
      alignas(64) C drow_dot[kBlockQ];
      for (int64_t r = 0; r < nr; ++r) {
        const T* qrow = q + b * P.q.s0 + h * P.q.s1 + (i0 + r) * P.q.s2;
        const T* drow = dout + b * P.dout_s.s0 + h * P.dout_s.s1 + (i0 + r) * P.dout_s.s2;
        dot.row(r, qrow, drow, row_bad[r] != 0);
        drow_dot[r] = C(drow64[r]);
      }
      dot.rows_done(nr, int64_t(nlg) * kLanes);
      // outside its own computed keys, a lane group's columns of the block-wide P^T, dS^T are zero
      for (int lg = 0; lg < nlg; ++lg) {
        const int64_t a = cz[lg] > ca[lg] ? ca[lg] : jz, z = cz[lg] > ca[lg] ? cz[lg] : jz;
        for (int64_t jj = ja; jj < a; ++jj) {
          vstore(S.pt + jj * W + lg * kLanes, vzero<V>());
          vstore(S.dst + jj * W + lg * kLanes, vzero<V>());
        }
        for (int64_t jj = z; jj < jz; ++jj) {
          vstore(S.pt + jj * W + lg * kLanes, vzero<V>());
          vstore(S.dst + jj * W + lg * kLanes, vzero<V>());
        }
      }
      alignas(64) C lse2[kLaneGroups][kLanes], lse2_lo[kLaneGroups][kLanes], dd[kLaneGroups][kLanes];
      double dd64[kLaneGroups][kLanes];
      bool has_add[kLaneGroups] = {};
      for (int lg0 = 0; lg0 < nlg; lg0 += 2) {
        const bool on0 = tm[lg0].mode != TILE_SKIP, on1 = lg0 + 1 < nlg && tm[lg0 + 1].mode != TILE_SKIP;
        if (!on0 && !on1) continue;
        const bool two = on0 && on1;
        const int first = on0 ? lg0 : lg0 + 1, last = on1 ? lg0 + 1 : lg0;
        const int64_t a = ca[first], z = cz[first], n = z - a;
        for (int lg = first; lg <= last; ++lg) {
          const LaneGroup& L = lgs[lg];
          dot.lane_group(lg);
          uint8_t fl[kLanes] = {};
          mod_lanes_init(P, L, ml[lg]);
          has_add[lg] = build_additive(P, L, tm[lg], j0, jn, S.addt + lg * P.bk * kLanes, fl);
          flag_attending(P, L, tm[lg], j0, jn, bad_k, bad_v, fl);
          for (int l = 0; l < kLanes; ++l) {
            const int64_t row = (b * P.H + h) * P.Nq + L.i[l];
            const C x = l < L.n ? lse[b * P.lse_s.s0 + h * P.lse_s.s1 + L.i[l] * P.lse_s.s2] : C(-INFINITY);
            const C dx = l < L.n ? drow_dot[lg * kLanes + l] : C(0);
            bool sends_nan = l < L.n && (fl[l] || row_bad[lg * kLanes + l] || !(x == x) || x == C(INFINITY) ||
                                         (!std::isfinite(dx) && !delta_overflowed<T>(P, b, h, L.i[l])));
            // a row that saw no key (lse = -inf) must get P = 0: exp2(s - inf); so does one sending NaN
            // lse + lse_lo in the scores' units (mods.hpp) as hi + lo, since rounded to one float it
            // would shift every P of the row by up to half its ulp (3.8e-6 relative at |lse| ~ 50);
            // s - hi is exact near the row's max
            double xl = double(x);
            if (lse_lo && l < L.n && std::isfinite(xl)) {
              const double lo = double(lse_lo[b * P.lse_lo_s.s0 + h * P.lse_lo_s.s1 + L.i[l] * P.lse_lo_s.s2]);
              xl += std::isfinite(lo) ? lo : 0.0;
            }
            lse2[lg][l] = (x == C(-INFINITY) || sends_nan) ? C(INFINITY) : C(xl * kl);
            lse2_lo[lg][l] = std::isfinite(lse2[lg][l]) ? C(xl * kl - double(lse2[lg][l])) : C(0);
            if (P.lse_rows && std::isfinite(lse2[lg][l])) {  // the row's own (m, log l): kernels_impl.hpp's refine_lse
              const C* f = static_cast<const C*>(P.lse_rows) + 2 * row;
              if (f[0] == f[0]) {
                lse2[lg][l] = f[0];
                lse2_lo[lg][l] = f[1];
              }
            }
            dd[lg][l] = sends_nan ? C(0) : dx;
            dd64[lg][l] = sends_nan || l >= L.n ? 0.0 : drow64[lg * kLanes + l];
            if (!sends_nan) continue;
            bool touched = false;
            for (int64_t jj = ra[lg]; jj < rz[lg]; ++jj)
              if (lane_allows(P, L, tm[lg], l, j0, jj)) {
                key_nan[jj] = 1;
                touched = true;
              }
            if (touched) {
              dq_nan[lg * kLanes + l] = 1;  // written NaN in dQ's order below
              __atomic_fetch_or(row_nan + row / 8, uint8_t(1u << (row % 8)), __ATOMIC_RELAXED);
            }
          }
        }
        // S^T and P^T (Alg. 2 lines 11, 13), keys [a, z) only
        C* pt = S.pt + a * W + first * kLanes;
        dot.scores(pt, first, two, a, n);
        bool exact[kLaneGroups] = {};  // the lane group's dP^T - D in float64 (exact_dpt)
        for (int lg = first; lg <= last; ++lg) {
          const bool masked = tm[lg].mode == TILE_MASKED;
          alignas(64) C lo_[kLanes], hi_[kLanes];
          for (int l = 0; l < kLanes; ++l) {
            lo_[l] = C(tm[lg].lo[l]);
            hi_[l] = C(tm[lg].hi[l]);
          }
          const V lo = vload(lo_), hi = vload(hi_), lv = vload(lse2[lg]), lv_lo = vload(lse2_lo[lg]);
          const V u = vset1<V>(C(unit));
          C* p = S.pt + lg * kLanes;
          C* df = S.dfac + lg * kLanes;
          [[maybe_unused]] V pmax = vzero<V>();
          for (int64_t jj = a; jj < z; ++jj) {
            V dv = vzero<V>();
            const C* add = has_add[lg] ? S.addt + (lg * P.bk + jj) * kLanes : nullptr;
            V s = want_d ? score_row<V, true>(P, ml[lg], vload(p + jj * W), j0 + jj, add, &dv)
                         : score_row<V, false>(P, ml[lg], vload(p + jj * W), j0 + jj, add, static_cast<V*>(nullptr));
            if (masked) {
              const V jv = vset1<V>(C(jj));
              s = vsel(vand(vle(lo, jv), vlt(jv, hi)), s, ninf);
            }
            const V pv = vexp2(vmul(vsub(vsub(s, lv), lv_lo), u));
            vstore(p + jj * W, pv);
            if constexpr (Dot::kExactDp) pmax = vmax(pmax, pv);
            if (want_d) vstore(df + jj * W, dv);
          }
          if constexpr (Dot::kExactDp) {
            alignas(64) C pm[kLanes];
            vstore(pm, pmax);
            for (int l = 0; l < kLanes; ++l) exact[lg] = exact[lg] || pm[l] > C(kExactDpP);
            exact[lg] = exact[lg] && !drop;  // dropout's dP is scaled by its mask before D
          }
        }
        // dP^T = V dO^T (line 14); dP^T - D in float64 for the lane groups marked exact
        dot.dpt(S.dst + a * W + first * kLanes, first, two, a, n);
        if constexpr (Dot::kExactDp)
          for (int lg = first; lg <= last; ++lg)
            if (exact[lg]) dot.dpt_exact(S.dst + lg * kLanes, lg, a, n, dd64[lg]);
        for (int lg = first; lg <= last; ++lg) {
          const LaneGroup& L = lgs[lg];
          if (drop) {
            for (int l = 0; l < kLanes; ++l)
              for (int64_t jj = a; jj < z; ++jj) S.zt[jj * kLanes + l] = C(0);
            for (int l = 0; l < L.n; ++l)
              philox_row(P.seed, uint32_t(b), uint32_t(h), uint32_t(L.i[l]), j0 + a, j0 + z, thr,
                         [&](int64_t j, bool keep) { S.zt[(j - j0) * kLanes + l] = keep ? inv_keep : C(0); });
          }
          // dS^T = P^T o (dP^T - D) (line 16); the dropped P^T goes on to dV
          const V dvec = exact[lg] ? vzero<V>() : vload(dd[lg]);
          C* p = S.pt + lg * kLanes;
          C* ds_ = S.dst + lg * kLanes;
          const C* df = S.dfac + lg * kLanes;
          for (int64_t jj = a; jj < z; ++jj) {
            V pv = vload(p + jj * W), dp = vload(ds_ + jj * W);
            if (drop) {
              const V zk = vload(S.zt + jj * kLanes);
              dp = vmul(dp, zk);
              vstore(p + jj * W, vmul(pv, zk));
            }
            V ds = vmul(pv, vsub(dp, dvec));
            if (want_d) ds = vmul(ds, vload(df + jj * W));
            vstore(ds_ + jj * W, ds);
          }
        }
        // dQ = dS K for these lane groups (line 18), added to dQ in order below
        dot.dq(first, two, a, n);
      }
      // the dQ rows this tile adds to, towards L2 while dK / dV are summed: read from memory at the
      // add, they stalled it (~5% of a bf16 backward in perf, dq being B H Nq Dk floats)
      for (int lg = 0; lg < nlg; ++lg)
        if (tm[lg].mode != TILE_SKIP)
          for (int l = 0; l < lgs[lg].n; ++l) {
            const char* r = reinterpret_cast<const char*>(dq + (row0 + lg * kLanes + l) * P.Dk);
            for (int64_t x = 0; x < P.Dk * int64_t(sizeof(C)); x += 64) __builtin_prefetch(r + x, 1, 2);
          }
      // dV += P^T dO, dK += dS^T Q over the block's keys [ja, jz) (lines 12, 17): lanes over Dv / Dk.
      // The block's sum starts from zero and is added compensated (microkernel.hpp): over Nq rows the
      // error stays that of one block's sum instead of growing with Nq / 64.
      dot.dkv(dka, dva, ja, jz, int64_t(nlg) * kLanes);
      // this tile's dQ rows, after every lower key tile's (DqOrder)
      order.wait(tid, it, sub);
      const C sc = C(P.scale);
      for (int lg = 0; lg < nlg; ++lg) {
        if (tm[lg].mode == TILE_SKIP) continue;
        for (int l = 0; l < lgs[lg].n; ++l) {
          C* dqr = dq + ((b * P.H + h) * P.Nq + lgs[lg].i[l]) * P.Dk;
          const C* src = S.dqt + (lg * kLanes + l) * dkp;
          if (dq_nan[lg * kLanes + l])
            for (int64_t d = 0; d < P.Dk; ++d) dqr[d] = C(NAN);
          else
            for (int64_t d = 0; d < P.Dk; ++d) dqr[d] += src[d] * sc;
        }
      }
      order.publish(tid, it, sub + 1);
    }
  }
  order.publish(tid, it, order.S);
  const C sc = C(P.scale);
  for (int64_t jj = 0; jj < jn; ++jj) {  // in place when dka / dva are the output rows
    C* kr = dk + jj * P.Dk;
    C* vr = dvo + jj * P.Dv;
    const C nan_or_1 = key_nan[jj] ? C(NAN) : C(1);
    for (int64_t d = 0; d < P.Dk; ++d) kr[d] = dka[jj * dkp + d] * sc * nan_or_1;
    for (int64_t d = 0; d < P.Dv; ++d) vr[d] = dva[jj * dvp + d] * nan_or_1;
    if (!key_nan[jj] && !(all_finite(kr, P.Dk) && all_finite(vr, P.Dv))) count_row(P, kOverflow);
  }
}

// The backward tile loop of a dtype. kernels_avx512bf16.cpp specializes it for bf16_t (bwd_tiles
// over its vdpbf16ps Dot): keep the signature in step.
template <class T>
static void bwd_item(const Params& P, BwdBufs<T>& S, int tid, int64_t it, int64_t b, int64_t g, int64_t kb,
                     const RowBlocks& rb, const DqOrder& order, const RowStats<T>& rs, typename Compute<T>::type* dq,
                     uint8_t* row_nan) {
  bwd_tiles<WideBwd<T>>(P, S, tid, it, b, g, kb, rb, order, rs, dq, row_nan);
}

}  // namespace QKV_NS
}  // namespace qkv_native
