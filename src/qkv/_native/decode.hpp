// Decode: few queries (Nq <= 16) against a long K/V (flash-decoding, split-K).
//
// All H/Hkv query heads of a kv head are stacked into one row set ((h, i) rows, h-major), so K and
// V are read once per kv head however many query heads share them (grouped-query attention: no
// K/V copy, no repeat). The key range of every row set is cut at fixed, tile-aligned points into
// as many parts as make the work items a multiple of the thread count (every thread gets the same
// number of equal items); each part leaves a partial (m, l, O) and the parts are merged by their
// log-sum-exp in a fixed order: the result depends on the thread count, never on the scheduling.
//
// With at most 8 rows (the "thin" path: one query of up to 8 grouped heads, the common decode
// step) the kernel is a streaming read of K and V and everything else must hide under it:
//   - keys across lanes: S for R rows x 16 / R keys (R = 4, 2 or 1) comes from 16 accumulators of
//     vertical FMAs over d, folded by one transposing reduction (vsum16: 15 adds, ~30 shuffles)
//     instead of a horizontal sum per (key, row); the softmax then runs on 16 keys per vector.
//     Each K vector loaded serves all R rows of the block (4 grouped query heads: one load per 4
//     FMAs' K operand instead of one per 2).
//     (Transposing the K tile instead costs ~64 shuffles per 16 keys x 16 d, shared by the rows:
//     more than the reduction below 8 rows.)
//   - K and V are read in their own dtype (bf16 / fp16 widened in registers: half the bytes of a
//     float copy) wherever a tile is FULL and unbiased (the bulk of a decode step), with a software
//     prefetch kDecodePrefetch keys ahead issued from the loops that read K and V (one per 64-byte
//     line); other tiles (mask edges, bias, odd Dk / Dv) take a widened, cleaned copy (finite.hpp)
//     and the general softmax step (softmax_tile).
// Above 8 rows the wide layout (fwd_rowset: 16 rows across the lanes) is used as in prefill.
#pragma once
#include <type_traits>

#include "attention_fwd.hpp"
#include "quant.hpp"

namespace qkv_native {
inline namespace QKV_NS {

constexpr int kThinMaxRows = 8;
// Keys read ahead by software prefetch (K in the score pass, V in the P.V pass). Without it the
// one-thread read of a 32k-key bf16 cache ran at 0.75x (GQA) of the prefetched one on Zen 5; 16,
// 32, 64 and 128 keys measured alike within the noise of a shared machine. Where the lines go (L1,
// or L2 only: P.prefetch) depends on the CPU (dispatch.cpp). QKV_DECODE_PREFETCH (0: none) exists
// for benchmarks/decode_ab.sh, which builds variants of this loop side by side to measure them.
#ifndef QKV_DECODE_PREFETCH
#define QKV_DECODE_PREFETCH 64
#endif
constexpr int64_t kDecodePrefetch = QKV_DECODE_PREFETCH;

// One software prefetch of a K/V line read kDecodePrefetch keys later: into L1 (prefetcht0), or
// into L2 only (prefetcht2). The target is a run-time argument, not a template one: a predictable
// branch beside a load (decode_ab.sh: no measurable cost), where a copy of every decode loop per
// target was a third of each unit's machine code (AVX-512 unit 2.16 -> 1.46 MB, 15% of its build).
static inline void prefetch_line(const void* p, Prefetch to) {
  if (to == Prefetch::l2)
    __builtin_prefetch(p, 0, 1);
  else
    __builtin_prefetch(p, 0, 3);
}
// A decode call reading fewer K+V bytes runs on the calling thread: waking the pool (~5-10 us,
// far more on a busy machine) would cost more than the read it shares (256 KiB: ~3-6 us on one
// core).
constexpr int64_t kDecodeSerialBytes = int64_t(1) << 18;
// Keys of one P.V pass: their V rows stay in L1 across the passes over Dv.
constexpr int64_t kPvKeys = 32;

// ------------------------------------------------------------------ vector helpers
// Generic versions; an ISA translation unit may define non-template overloads (preferred).

// Lane j of the result = the sum of the 16 lanes of a[j].
template <class V>
static inline V vsum16(const V* a) {
  using C = std::conditional_t<std::is_same_v<V, VF>, float, double>;
  alignas(64) C t[kLanes], r[kLanes];
  for (int j = 0; j < kLanes; ++j) {
    vstore(t, a[j]);
    C s = 0;
    for (int i = 0; i < kLanes; ++i) s += t[i];
    r[j] = s;
  }
  return vload(r);
}
template <class U>
static inline VF vload_bf16(const U* p) {
  alignas(64) float t[kLanes];
  for (int i = 0; i < kLanes; ++i) t[i] = bits_to_float(uint32_t(p[i]) << 16);
  return vload(t);
}
template <class U>
static inline VF vload_f16(const U* p) {
  alignas(64) float t[kLanes];
  for (int i = 0; i < kLanes; ++i) t[i] = half_to_float(p[i]);
  return vload(t);
}

// 16 codes of a quantized cache as their values / kUnit (quant.hpp), in float32.
template <class U>
static inline VF vload_i8(const U* p) {
  alignas(64) float t[kLanes];
  for (int i = 0; i < kLanes; ++i) t[i] = code_unit(i8_t{int8_t(p[i])});
  return vload(t);
}
template <class U>
static inline VF vload_e4m3(const U* p) {  // the NaN pattern reads as a number (dec_thin scans)
  alignas(64) float t[kLanes];
  for (int i = 0; i < kLanes; ++i)
    t[i] = half_to_float(uint16_t(((uint16_t(p[i]) & 0x80u) << 8) | ((uint16_t(p[i]) & 0x7fu) << 7)));
  return vload(t);
}
template <class U>
static inline VF vload_e5m2(const U* p) {
  alignas(64) float t[kLanes];
  for (int i = 0; i < kLanes; ++i) t[i] = half_to_float(uint16_t(uint16_t(p[i]) << 8));
  return vload(t);
}

// 16 values of a K / V row in its storage type, widened to the compute type in registers (codes:
// their values / kUnit, the key's scale applied by the caller).
template <class E>
static inline typename VecOf<typename Compute<E>::type>::V vload_kv(const E* p) {
  if constexpr (std::is_same_v<E, bf16_t>)
    return vload_bf16(reinterpret_cast<const uint16_t*>(p));
  else if constexpr (std::is_same_v<E, f16_t>)
    return vload_f16(reinterpret_cast<const uint16_t*>(p));
  else if constexpr (std::is_same_v<E, i8_t>)
    return vload_i8(reinterpret_cast<const int8_t*>(p));
  else if constexpr (std::is_same_v<E, e4m3_t>)
    return vload_e4m3(reinterpret_cast<const uint8_t*>(p));
  else if constexpr (std::is_same_v<E, e5m2_t>)
    return vload_e5m2(reinterpret_cast<const uint8_t*>(p));
  else
    return vload(p);
}

// ------------------------------------------------------------------ scratch of the thin path

template <class C>
struct DecBufs : Scratch<DecBufs<C>> {
  C *qr = nullptr, *qh = nullptr, *orow = nullptr, *oc = nullptr, *tsum = nullptr, *sc = nullptr, *st = nullptr,
    *addt = nullptr, *kc = nullptr, *vc = nullptr, *ml = nullptr, *ks = nullptr, *vs = nullptr;
  int64_t dkp = 0, dvp = 0, lds = 0;  // set by carve()
  // Each buffer once (Scratch: bytes() is the same layout measured without memory).
  void lay(const Params& P, Carver& c) {
    dkp = round_up(P.Dk, kLanes);
    dvp = round_up(P.Dv, kLanes);
    lds = round_up(P.bk, kLanes);
    qr = c.take<C>(kThinMaxRows * dkp);
    qh = c.take<C>(kThinMaxRows * dkp);  // q's bfloat16 bits (dec_scores_b16), dkp per row
    orow = c.take<C>(kThinMaxRows * dvp);
    oc = c.take<C>(kThinMaxRows * dvp);
    tsum = c.take<C>(kThinMaxRows * dvp);
    sc = c.take<C>(kThinMaxRows * lds);
    st = c.take<C>(P.bk * kLanes);
    addt = c.take<C>(P.bk * kLanes);
    kc = c.take<C>(P.bk * dkp);
    vc = c.take<C>(P.bk * dvp);
    ml = c.take<C>(8 * kLanes);  // m, l, l's carry, alpha, tile max, m used, row sums
    ks = c.take<C>(lds);         // a quantized tile's key factors: kUnit x k scale, kUnit x v scale
    vs = c.take<C>(lds);
  }
};

// Per-thread scratch kept across calls (the pool's threads live for the process): no allocation,
// zeroing or page faults in a decode step's fixed cost.
struct DecScratch {
  Owned<char> p;
  size_t n = 0;
};
static inline char* decode_scratch(size_t bytes) {
  static thread_local DecScratch s;
  if (s.n < bytes) {
    s.p.reset();
    s.n = size_t(round_up(int64_t(bytes), 4096));
    s.p.reset(static_cast<char*>(std::aligned_alloc(64, s.n)));
    if (!s.p) {
      s.n = 0;
      return nullptr;
    }
    std::memset(s.p.get(), 0, s.n);
  }
  return s.p.get();
}

// ------------------------------------------------------------------ the thin tile steps

// A fold's scores to their rows (lds apart in sc): lane r * KB + i of s is row r's score of key
// kh + i, nh of the KB keys real; t is kLanes of scratch. One row stores the vector whole (lanes
// past the keys are padded below).
template <int R, class V, class C>
static inline void put_fold(C* sc, int64_t lds, C* t, V s, int64_t kh, int nh) {
  constexpr int KB = kLanes / R;
  if constexpr (R == 1) {
    vstore(sc + kh, s);
  } else {
    vstore(t, s);
    if (nh == KB) {
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) std::memcpy(sc + r * lds + kh, t + r * KB, sizeof(C) * KB);
    } else {
      for (int r = 0; r < R; ++r)
        for (int i = 0; i < nh; ++i) sc[r * lds + kh + i] = t[r * KB + i];
    }
  }
}

// Keys [jn, jn rounded up to kLanes) of each of the R rows read as -inf: the softmax takes whole
// vectors
template <class C>
static inline void pad_rows(C* sc, int64_t lds, int R, int64_t jn) {
  const int64_t jv = round_up(jn, kLanes);
  for (int r = 0; r < R; ++r)
    for (int64_t j = jn; j < jv; ++j) sc[r * lds + j] = C(-INFINITY);
}

// Raw scores of R rows (R = 1, 2 or 4) against keys [0, jn) of a tile (rows of K at kp, stride
// ldk, nck chunks of 16): sc[r * lds + j], lanes past jn hold -inf. probe: s * 0 accumulated (NaN
// exactly when some score is not finite). R rows x 16 / R keys fill the 16 accumulators of one fold
// (vsum16), so each K vector loaded (and widened, for bf16 / fp16) serves all R rows: grouped
// heads (4 query heads per kv head) load K once per chunk instead of once per pair of rows, half
// the loads per FMA. q is taken NCQ chunks at a time (R x NCQ registers, 16 accumulators and the K
// vector within the 32 zmm). Each K row is read front to back at constant offsets from one pointer
// (a pointer per chunk across 16 rows would need more address registers than x86 has), and acc is
// only ever indexed by constants: a runtime index puts the 16 accumulators on the stack (measured
// 3x slower).
template <int R, int NCQ, int LD, class E, class C>
static inline void dec_block_t(const E* kp, int64_t ld_, int64_t jn, int64_t nck, const C* qr, int64_t dkp, C* sc,
                               int64_t lds, int64_t ahead, Prefetch to, typename VecOf<C>::V& probe) {
  using V = typename VecOf<C>::V;
  constexpr int KB = kLanes / R;  // keys per fold
  // LD > 0: K rows contiguous, LD elements apart, known here: the 16 rows of a one-row fold are
  // then displacements from one pointer (with a runtime stride, one address register per row,
  // spilled with the prefetch addresses)
  const int64_t ldk = LD > 0 ? LD : ld_;
  const V zero = vzero<V>();
  alignas(64) C t[kLanes];
  // a 64-byte line holds 16 float32 or 32 bf16 / fp16 elements: one prefetch per line
  constexpr int kPfEvery = int(64 / (kLanes * sizeof(E))) < 1 ? 1 : int(64 / (kLanes * sizeof(E)));
  for (int64_t jb = 0; jb < jn; jb += kLanes) {
    const int64_t je = imin(jb + kLanes, jn);
    for (int64_t kh = jb; kh < je; kh += KB) {
      const int nh = int(imin(KB, je - kh));
      const bool pf = ahead > kh + KB - 1;  // every key of the block has its key kDecodePrefetch ahead in range
      V acc[kLanes];
#pragma GCC unroll 16
      for (int x = 0; x < kLanes; ++x) acc[x] = zero;
      for (int64_t c0 = 0; c0 < nck; c0 += NCQ) {
        V q[R][NCQ];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
          for (int c = 0; c < NCQ; ++c) q[r][c] = vload(qr + r * dkp + (c0 + c) * kLanes);
#pragma GCC unroll 16
        for (int i = 0; i < KB; ++i) {
          if (i >= nh) break;
          const E* kr = kp + (kh + i) * ldk + c0 * kLanes;
#pragma GCC unroll 8
          for (int c = 0; c < NCQ; ++c) {
            // the same row kDecodePrefetch keys ahead, in the loop that reads K (a separate
            // prefetch loop cost ~10% of the scores, and gcc may delete it as side-effect free)
            if (kDecodePrefetch > 0 && (c0 + c) % kPfEvery == 0 && pf)
              prefetch_line(kr + kDecodePrefetch * ldk + c * kLanes, to);
            const V k = vload_kv(kr + c * kLanes);
#pragma GCC unroll 4
            for (int r = 0; r < R; ++r) acc[r * KB + i] = vfma(k, q[r][c], acc[r * KB + i]);
          }
        }
      }
      const V s = vsum16(acc);  // lane r * KB + i = row r, key kh + i
      probe = vfma(s, zero, probe);
      put_fold<R>(sc, lds, t, s, kh, nh);
    }
  }
  pad_rows(sc, lds, R, jn);
}

// dec_block_t for R rows with q's chunks taken as many at a time as the registers allow. A unit
// that defines QKV_DECODE_ONE_CHUNK (kernels_portable.cpp: the reference path, whose 16-lane arrays
// made these unrolled variants most of the kernel's build time) takes one chunk at a time.
template <int R, class E, class C>
static inline void dec_block(const E* kp, int64_t ldk, int64_t jn, int64_t nck, const C* qr, int64_t dkp, C* sc,
                             int64_t lds, int64_t ahead, Prefetch to, typename VecOf<C>::V& probe) {
#ifdef QKV_DECODE_ONE_CHUNK
  dec_block_t<R, 1, 0>(kp, ldk, jn, nck, qr, dkp, sc, lds, ahead, to, probe);
#else
  constexpr int kMaxQ = R == 1 ? 8 : 8 / R;  // q registers: 8 of the 32 zmm
  if constexpr (R == 1) {                    // one row: Dk = 64 and 128 with the stride known (contiguous K)
    if (nck == 4 && ldk == 4 * kLanes)
      return dec_block_t<R, 4, 4 * kLanes>(kp, ldk, jn, nck, qr, dkp, sc, lds, ahead, to, probe);
    if (nck == 8 && ldk == 8 * kLanes)
      return dec_block_t<R, 8, 8 * kLanes>(kp, ldk, jn, nck, qr, dkp, sc, lds, ahead, to, probe);
  }
  if constexpr (kMaxQ >= 8)
    if (nck % 8 == 0) return dec_block_t<R, 8, 0>(kp, ldk, jn, nck, qr, dkp, sc, lds, ahead, to, probe);
  if constexpr (R == 1) {
    if (nck == 6) return dec_block_t<R, 6, 0>(kp, ldk, jn, nck, qr, dkp, sc, lds, ahead, to, probe);
    if (nck == 3) return dec_block_t<R, 3, 0>(kp, ldk, jn, nck, qr, dkp, sc, lds, ahead, to, probe);
  }
  if constexpr (kMaxQ >= 4)
    if (nck % 4 == 0) return dec_block_t<R, 4, 0>(kp, ldk, jn, nck, qr, dkp, sc, lds, ahead, to, probe);
  if constexpr (kMaxQ >= 2)
    if (nck % 2 == 0) return dec_block_t<R, 2, 0>(kp, ldk, jn, nck, qr, dkp, sc, lds, ahead, to, probe);
  dec_block_t<R, 1, 0>(kp, ldk, jn, nck, qr, dkp, sc, lds, ahead, to, probe);
#endif
}

// Raw scores of rows [0, n) (n <= 8) against keys [0, jn): blocks of 4, 2 and 1 rows (a second
// block re-reads the tile's K from L1; the prefetch runs with the first). Returns whether some
// score is not finite.
template <class E, class C>
static inline bool dec_scores(const E* kp, int64_t ldk, int64_t jn, int64_t nck, const C* qr, int64_t dkp, int n, C* sc,
                              int64_t lds, int64_t ahead, Prefetch to) {
  using V = typename VecOf<C>::V;
  V probe = vzero<V>();
  for (int r = 0; r < n;) {
    const int rem = n - r;
    const C* q = qr + r * dkp;
    C* s = sc + r * lds;
    if (rem >= 4) {
      dec_block<4>(kp, ldk, jn, nck, q, dkp, s, lds, ahead, to, probe);
      r += 4;
    } else if (rem >= 2) {
      dec_block<2>(kp, ldk, jn, nck, q, dkp, s, lds, ahead, to, probe);
      r += 2;
    } else {
      dec_block<1>(kp, ldk, jn, nck, q, dkp, s, lds, ahead, to, probe);
      r += 1;
    }
    ahead = 0;  // prefetched once
  }
  alignas(64) C pr[kLanes];
  vstore(pr, probe);
  bool bad = false;
  for (int l = 0; l < kLanes; ++l) bad = bad || !(pr[l] == pr[l]);
  return bad;
}

#ifdef QKV_DECODE_BF16_DOT
// Raw scores of a bfloat16 K against bfloat16 q rows (an ISA unit with a bf16 pair dot product:
// VB holds 32 bf16, vdot_b32 adds the 16 pairs' products into float32 lanes): dec_block_t's blocks
// and folds, but each K vector is 32 elements read as stored, no widening, and one instruction
// per 32 products instead of a widening and two FMAs. The products of two bf16 are exact in
// float32; q is taken unscaled (bf16: q x prescale rounded would not be q's value) and the sum is
// scaled once, so the score is |q.k| x prescale rounded once more than in float32 FMAs.
// (vdpbf16ps reads bf16 subnormals as 0 and reports |q.k| beyond float32's range as an overflow
// even where |q.k| x prescale would fit, as the avx512bf16 prefill does: kernels_avx512bf16.cpp.)
// Chunks of 32: Dk a multiple of 32 (the caller checks), qh rows dkp apart.
template <int R, int NCQ, int LD>
static inline void dec_block_b16_t(const uint16_t* kp, int64_t ld_, int64_t jn, int64_t ncp, const uint16_t* qh,
                                   int64_t dkp, float* sc, int64_t lds, int64_t ahead, Prefetch to, VF mul, VF& probe) {
  constexpr int KB = kLanes / R;  // keys per fold
  const int64_t ldk = LD > 0 ? LD : ld_;
  const VF zero = vzero<VF>();
  alignas(64) float t[kLanes];
  for (int64_t jb = 0; jb < jn; jb += kLanes) {
    const int64_t je = imin(jb + kLanes, jn);
    for (int64_t kh = jb; kh < je; kh += KB) {
      const int nh = int(imin(KB, je - kh));
      const bool pf = ahead > kh + KB - 1;
      VF acc[kLanes];
#pragma GCC unroll 16
      for (int x = 0; x < kLanes; ++x) acc[x] = zero;
      for (int64_t c0 = 0; c0 < ncp; c0 += NCQ) {
        VB q[R][NCQ];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
          for (int c = 0; c < NCQ; ++c) q[r][c] = vload_b32(qh + r * dkp + (c0 + c) * 2 * kLanes);
#pragma GCC unroll 16
        for (int i = 0; i < KB; ++i) {
          if (i >= nh) break;
          const uint16_t* kr = kp + (kh + i) * ldk + c0 * 2 * kLanes;
#pragma GCC unroll 8
          for (int c = 0; c < NCQ; ++c) {
            if (kDecodePrefetch > 0 && pf) prefetch_line(kr + kDecodePrefetch * ldk + c * 2 * kLanes, to);
            const VB k = vload_b32(kr + c * 2 * kLanes);
#pragma GCC unroll 4
            for (int r = 0; r < R; ++r) acc[r * KB + i] = vdot_b32(acc[r * KB + i], k, q[r][c]);
          }
        }
      }
      const VF s = vmul(vsum16(acc), mul);  // lane r * KB + i = row r, key kh + i
      probe = vfma(s, zero, probe);
      put_fold<R>(sc, lds, t, s, kh, nh);
    }
  }
  pad_rows(sc, lds, R, jn);
}

template <int R>
static inline void dec_block_b16(const uint16_t* kp, int64_t ldk, int64_t jn, int64_t ncp, const uint16_t* qh,
                                 int64_t dkp, float* sc, int64_t lds, int64_t ahead, Prefetch to, VF mul, VF& probe) {
  constexpr int kMaxQ = R == 1 ? 8 : 8 / R;  // q registers: 8 of the 32 zmm
  if constexpr (R == 1) {                    // Dk = 64 and 128 with the stride known (contiguous K)
    if (ncp == 2 && ldk == 4 * kLanes)
      return dec_block_b16_t<1, 2, 4 * kLanes>(kp, ldk, jn, ncp, qh, dkp, sc, lds, ahead, to, mul, probe);
    if (ncp == 4 && ldk == 8 * kLanes)
      return dec_block_b16_t<1, 4, 8 * kLanes>(kp, ldk, jn, ncp, qh, dkp, sc, lds, ahead, to, mul, probe);
  }
  if constexpr (kMaxQ >= 4)
    if (ncp % 4 == 0) return dec_block_b16_t<R, 4, 0>(kp, ldk, jn, ncp, qh, dkp, sc, lds, ahead, to, mul, probe);
  if constexpr (kMaxQ >= 2)
    if (ncp % 2 == 0) return dec_block_b16_t<R, 2, 0>(kp, ldk, jn, ncp, qh, dkp, sc, lds, ahead, to, mul, probe);
  dec_block_b16_t<R, 1, 0>(kp, ldk, jn, ncp, qh, dkp, sc, lds, ahead, to, mul, probe);
}

// dec_scores over a bfloat16 K with q's bf16 bits (qh), scores x mul (q_prescale).
static inline bool dec_scores_b16(const bf16_t* k, int64_t ldk, int64_t jn, int64_t dk, const uint16_t* qh, int64_t dkp,
                                  int n, float* sc, int64_t lds, int64_t ahead, Prefetch to, float mul) {
  const uint16_t* kp = reinterpret_cast<const uint16_t*>(k);
  const int64_t ncp = dk / (2 * kLanes);
  const VF m = vset1<VF>(mul);
  VF probe = vzero<VF>();
  for (int r = 0; r < n;) {
    const int rem = n - r;
    const uint16_t* q = qh + r * dkp;
    float* s = sc + r * lds;
    if (rem >= 4) {
      dec_block_b16<4>(kp, ldk, jn, ncp, q, dkp, s, lds, ahead, to, m, probe);
      r += 4;
    } else if (rem >= 2) {
      dec_block_b16<2>(kp, ldk, jn, ncp, q, dkp, s, lds, ahead, to, m, probe);
      r += 2;
    } else {
      dec_block_b16<1>(kp, ldk, jn, ncp, q, dkp, s, lds, ahead, to, m, probe);
      r += 1;
    }
    ahead = 0;
  }
  alignas(64) float pr[kLanes];
  vstore(pr, probe);
  bool bad = false;
  for (int l = 0; l < kLanes; ++l) bad = bad || !(pr[l] == pr[l]);
  return bad;
}
#endif

// The online-softmax step of a FULL, plain tile (no mods or bias), keys across lanes:
// sc rows (log2 units) -> P in place; m, l (compensated) updated per row; alpha per row in ml + 3 kLanes.
template <class C>
static inline void dec_softmax_plain(const Params& P, const LaneGroup& lg, int64_t j0, int64_t jn, C* sc, int64_t lds,
                                     C* ml) {
  const int n = lg.n;
  using V = typename VecOf<C>::V;
  C* m_run = ml;
  C* l_run = ml + kLanes;
  C* lc = ml + 2 * kLanes;
  C* al = ml + 3 * kLanes;
  C* tmax = ml + 4 * kLanes;
  C* mu = ml + 5 * kLanes;
  C* rs = ml + 6 * kLanes;
  const V ninf = vset1<V>(C(-INFINITY));
  const int64_t jv = round_up(jn, kLanes);
  for (int l = 0; l < kLanes; ++l) tmax[l] = C(-INFINITY);
  for (int l = 0; l < n; ++l) {
    V mx = ninf;
    for (int64_t jb = 0; jb < jv; jb += kLanes) mx = vmax(mx, vload(sc + l * lds + jb));
    alignas(64) C t[kLanes];
    vstore(t, mx);
    C x = t[0];
    for (int i = 1; i < kLanes; ++i) x = t[i] > x ? t[i] : x;
    tmax[l] = x;
  }
  const V m_old = vload(m_run);
  const V m_new = vmax(m_old, vload(tmax));
  // a row with nothing allowed yet keeps m = -inf; subtract 0 instead so exp2 sees -inf, not NaN
  const V m_use = vsel(veq(m_new, ninf), vzero<V>(), m_new);
  const V alpha = vexp2(vsub(m_old, m_use));
  vstore(mu, m_use);
  for (int l = 0; l < kLanes; ++l) rs[l] = C(0);
  for (int l = 0; l < n; ++l) {
    const V m = vset1<V>(mu[l]);
    // the lanes' sums compensated, and added across lanes in float64: a running sum in the lane
    // of the row's largest P lost every small one after it (attention_fwd.hpp's tile_sum)
    const V sum = tile_sum<V>(jv / kLanes, [&](int64_t x) {
      const V p = vexp2(vsub(vload(sc + l * lds + x * kLanes), m));
      vstore(sc + l * lds + x * kLanes, p);
      return p;
    });
    alignas(64) C t[kLanes];
    vstore(t, sum);
    double total = 0;
    for (int i = 0; i < kLanes; ++i) total += double(t[i]);
    rs[l] = C(total);
  }
  kahan_add(l_run, lc, vload(rs), alpha);
  vstore(m_run, m_new);
  vstore(al, alpha);
  if (P.dropout_p > 0.0) {  // as softmax_tile: after the row sums, so l and lse stay pre-dropout
    const uint32_t thr = dropout_threshold(P.dropout_p);
    const C inv = C(1.0 / (1.0 - P.dropout_p));
    for (int l = 0; l < n; ++l)
      philox_row(P.seed, uint32_t(lg.b), uint32_t(lg.h[l]), uint32_t(lg.i[l]), j0, j0 + jn, thr,
                 [&](int64_t j, bool keep) { sc[l * lds + (j - j0)] *= keep ? inv : C(0); });
  }
}

// tsum rows (ROWS of them) += P V over keys [0, jn) for Dv chunks [c0, c0 + NC): P[r * psl + j * psj].
// With fewer than 8 accumulators (one row, Dv = 64) the FMA chains would wait on their latency
// (4 cycles, 2 FMAs a cycle): even and odd keys then go to two accumulator sets, summed at the end.
// pf: prefetch the same V lines kDecodePrefetch keys ahead (one per 64 bytes, in the loop that reads
// V: no separate loop for the compiler to drop).
template <class E, int ROWS, int NC, class C>
static inline void pv_block(const E* vp, int64_t ldv, int64_t jn, const C* p, int64_t psl, int64_t psj, C* tsum,
                            int64_t dvp, int64_t c0, bool pf, Prefetch to) {
  using V = typename VecOf<C>::V;
  constexpr int KS = ROWS * NC < 8 ? 2 : 1;  // key sets
  constexpr int kPfEvery = int(64 / (kLanes * sizeof(E))) < 1 ? 1 : int(64 / (kLanes * sizeof(E)));
  V acc[KS][ROWS][NC];
#pragma GCC unroll 8
  for (int r = 0; r < ROWS; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < NC; ++c) {
      acc[0][r][c] = vload(tsum + r * dvp + (c0 + c) * kLanes);
      if constexpr (KS == 2) acc[KS - 1][r][c] = vzero<V>();
    }
  int64_t j = 0;
  for (; j + KS <= jn; j += KS) {
#pragma GCC unroll 2
    for (int ks = 0; ks < KS; ++ks) {
      const E* vr = vp + (j + ks) * ldv + c0 * kLanes;
      V v[NC];
#pragma GCC unroll 8
      for (int c = 0; c < NC; ++c) {
        if (kDecodePrefetch > 0 && (c0 + c) % kPfEvery == 0 && pf)
          prefetch_line(vr + kDecodePrefetch * ldv + c * kLanes, to);
        v[c] = vload_kv(vr + c * kLanes);
      }
#pragma GCC unroll 8
      for (int r = 0; r < ROWS; ++r) {
        const V pr = vset1<V>(p[r * psl + (j + ks) * psj]);
#pragma GCC unroll 8
        for (int c = 0; c < NC; ++c) acc[ks][r][c] = vfma(pr, v[c], acc[ks][r][c]);
      }
    }
  }
  for (; j < jn; ++j) {  // an odd key left (KS = 2)
    const E* vr = vp + j * ldv + c0 * kLanes;
#pragma GCC unroll 8
    for (int r = 0; r < ROWS; ++r) {
      const V pr = vset1<V>(p[r * psl + j * psj]);
#pragma GCC unroll 8
      for (int c = 0; c < NC; ++c) acc[0][r][c] = vfma(pr, vload_kv(vr + c * kLanes), acc[0][r][c]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < ROWS; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < NC; ++c) {
      V x = acc[0][r][c];
      if constexpr (KS == 2) x = vadd(x, acc[KS - 1][r][c]);
      vstore(tsum + r * dvp + (c0 + c) * kLanes, x);
    }
}

template <class E, int ROWS, class C>
static inline void pv_rows(const E* vp, int64_t ldv, int64_t jn, const C* p, int64_t psl, int64_t psj, C* tsum,
                           int64_t dvp, bool pf, Prefetch to) {
  // accumulators held in registers: 16 of the 32 zmm (AVX-512), the micro-kernel's count elsewhere
  constexpr int budget = VecOf<C>::NR >= 12 ? 16 : VecOf<C>::NR;
  constexpr int per = budget / ROWS;
  const int64_t ncv = dvp / kLanes;
  int64_t c0 = 0;
  if constexpr (per >= 8)
    for (; c0 + 8 <= ncv; c0 += 8) pv_block<E, ROWS, 8>(vp, ldv, jn, p, psl, psj, tsum, dvp, c0, pf, to);
  if constexpr (per >= 4)
    for (; c0 + 4 <= ncv; c0 += 4) pv_block<E, ROWS, 4>(vp, ldv, jn, p, psl, psj, tsum, dvp, c0, pf, to);
  if constexpr (per >= 2)
    for (; c0 + 2 <= ncv; c0 += 2) pv_block<E, ROWS, 2>(vp, ldv, jn, p, psl, psj, tsum, dvp, c0, pf, to);
  for (; c0 < ncv; ++c0) pv_block<E, ROWS, 1>(vp, ldv, jn, p, psl, psj, tsum, dvp, c0, pf, to);
}

// O rows = O rows alpha + P V over the tile's keys: the tile summed from zero in tsum (in passes
// of kPvKeys keys, V prefetched ahead by the first row block), then added compensated per row
// (microkernel.hpp).
template <class E, class C>
static inline void dec_pv(const E* vp, int64_t ldv, int64_t jn, const C* p, int64_t psl, int64_t psj, int n, C* tsum,
                          C* orow, C* oc, int64_t dvp, const C* alpha, int64_t ahead, Prefetch to) {
  using V = typename VecOf<C>::V;
  std::memset(static_cast<void*>(tsum), 0, sizeof(C) * size_t(n * dvp));
  for (int64_t j0 = 0; j0 < jn; j0 += kPvKeys) {
    const int64_t nj = imin(kPvKeys, jn - j0);
    const E* vb = vp + j0 * ldv;
    bool pf = ahead > j0 + nj - 1;  // every key of the pass has its key kDecodePrefetch ahead in range
    const C* pb = p + j0 * psj;
    for (int r = 0; r < n;) {
      const int rem = n - r;
      if (rem >= 4) {
        pv_rows<E, 4>(vb, ldv, nj, pb + r * psl, psl, psj, tsum + r * dvp, dvp, pf, to);
        r += 4;
      } else if (rem >= 2) {
        pv_rows<E, 2>(vb, ldv, nj, pb + r * psl, psl, psj, tsum + r * dvp, dvp, pf, to);
        r += 2;
      } else {
        pv_rows<E, 1>(vb, ldv, nj, pb + r * psl, psl, psj, tsum + r * dvp, dvp, pf, to);
        r += 1;
      }
      pf = false;  // prefetched once
    }
  }
  for (int r = 0; r < n; ++r) {
    const V a = vset1<V>(alpha[r]);
    for (int64_t c = 0; c < dvp; c += kLanes)
      kahan_add(orow + r * dvp + c, oc + r * dvp + c, vload(tsum + r * dvp + c), a);
  }
}

// Whether rows [0, jn) of a K slice are all finite (the rare check after a non-finite score).
template <class T>
__attribute__((noinline)) static bool k_rows_finite(const T* k, int64_t ld, int64_t jn, int64_t D) {
  for (int64_t j = 0; j < jn; ++j)
    if (!storage_finite(k + j * ld, D)) return false;
  return true;
}
// The same for the keys [j0, j0 + jn) of a quantized K (codes and k scales).
template <class E>
__attribute__((noinline)) static bool k_codes_finite(const Params& P, int64_t b, int64_t g, int64_t j0, int64_t jn) {
  const E* k = static_cast<const E*>(P.k.data) + b * P.k.s0 + g * P.k.s1;
  for (int64_t j = j0; j < j0 + jn; ++j)
    if (!std::isfinite(kv_scale(P.k_scale, b, g, j)) || !codes_finite(k + j * P.k.s2, P.Dk)) return false;
  return true;
}

// A quantized tile read in place: f[j] = kUnit x scale of key j0 + j (j < jn) for K or V.
template <class E, class C>
static inline void key_factors(const Strided& s, int64_t b, int64_t g, int64_t j0, int64_t jn, C* f) {
  const float* p = static_cast<const float*>(s.data) + b * s.s0 + g * s.s1 + j0 * s.s2;
  if (s.s2 == 1)  // a scale per key, contiguous: the loop the compiler vectorises
    for (int64_t j = 0; j < jn; ++j) f[j] = C(p[j] * kUnit<E>);
  else
    for (int64_t j = 0; j < jn; ++j) f[j] = C(p[j * s.s2] * kUnit<E>);
}

// Rows [0, n) of scores (or of P) times the key factors f over keys [0, jn); returns whether some
// product is not finite (only the scores ask).
template <class C>
static inline bool scale_keys(C* x, int64_t lds, int n, int64_t jn, const C* f) {
  using V = typename VecOf<C>::V;
  const V zero = vzero<V>();
  V probe = zero;
  C tail = C(0);
  const int64_t jv = jn / kLanes * kLanes;
  for (int r = 0; r < n; ++r) {
    C* row = x + r * lds;
    for (int64_t j = 0; j < jv; j += kLanes) {
      const V y = vmul(vload(row + j), vload(f + j));
      vstore(row + j, y);
      probe = vfma(y, zero, probe);
    }
    for (int64_t j = jv; j < jn; ++j) {
      row[j] *= f[j];
      tail += row[j] * C(0);
    }
  }
  alignas(64) C pr[kLanes];
  vstore(pr, probe);
  bool bad = !(tail == tail);
  for (int l = 0; l < kLanes; ++l) bad = bad || !(pr[l] == pr[l]);
  return bad;
}

// One row set of <= 8 rows against keys [ka, kz): the tile loop. Leaves m, l (S.ml) and the O
// rows (S.orow) for thin_finish, flags in fl. T: q's (and the output's) type; E: K and V's storage,
// T itself or the codes of a quantized cache (quant.hpp), read in place where a tile is FULL and
// plain (scores and P scaled by the key factors, 16 keys a vector), else dequantised into the
// widened copy that the other tiles take.
template <class T, class E>
__attribute__((noinline)) static void dec_thin(const Params& P, DecBufs<typename Compute<T>::type>& S,
                                               const LaneGroup& lg, int64_t ka, int64_t kz, uint8_t* fl) {
  using C = typename Compute<T>::type;
  using V = typename VecOf<C>::V;
  constexpr bool kCodes = IsCode<E>::value;
  static_assert(kCodes || std::is_same_v<E, T>, "K and V are stored in q's dtype or as codes");
  // codes are read in place by float32 code only (float64 q: the dequantised copy, exact in float64)
  constexpr bool kInPlace = !kCodes || std::is_same_v<C, float>;
  const int64_t dkp = S.dkp, dvp = S.dvp, lds = S.lds;
  const int n = lg.n;
  std::memset(static_cast<void*>(S.qr), 0, sizeof(C) * size_t(kThinMaxRows * dkp));
  std::memset(static_cast<void*>(S.orow), 0, sizeof(C) * size_t(kThinMaxRows * dvp));
  std::memset(static_cast<void*>(S.oc), 0, sizeof(C) * size_t(kThinMaxRows * dvp));
#ifdef QKV_DECODE_BF16_DOT
  // a bfloat16 cache read in place against bfloat16 q: dot products of bf16 pairs (dec_scores_b16)
  constexpr bool kB16 = std::is_same_v<T, bf16_t> && std::is_same_v<E, bf16_t>;
  const bool b16 = kB16 && P.Dk % (2 * kLanes) == 0;
  uint16_t* qh = reinterpret_cast<uint16_t*>(S.qh);
  if (b16) std::memset(static_cast<void*>(qh), 0, sizeof(uint16_t) * size_t(kThinMaxRows * dkp));
#endif
  const T* q = static_cast<const T*>(P.q.data);
  for (int l = 0; l < n; ++l) {
    const T* row = q + lg.b * P.q.s0 + lg.h[l] * P.q.s1 + lg.i[l] * P.q.s2;
    if (!storage_finite(row, P.Dk)) {
      fl[l] |= kBadQ;
      continue;
    }  // left zero: the row sees scores of 0
    for (int64_t d = 0; d < P.Dk; ++d) S.qr[l * dkp + d] = to_c<C>(row[d]) * C(q_prescale(P));
#ifdef QKV_DECODE_BF16_DOT
    if (b16) std::memcpy(qh + l * dkp, row, sizeof(uint16_t) * size_t(P.Dk));
#endif
  }
  C* m_run = S.ml;
  C* l_run = S.ml + kLanes;
  C* lc = S.ml + 2 * kLanes;
  C* al = S.ml + 3 * kLanes;
  vstore(m_run, vset1<V>(C(-INFINITY)));
  vstore(l_run, vzero<V>());
  vstore(lc, vzero<V>());
  ModLanes<C> ml;
  mod_lanes_init(P, lg, ml);
  TileMask tm;
  // direct reads need whole 16-wide chunks and no bias entry to check (finite.hpp)
  const bool direct_ok = kInPlace && P.Dk % kLanes == 0 && P.Dv % kLanes == 0 && !P.has_bias;
  // (dropout included: a call's lse must not depend on it, bit for bit)
  const bool plain = P.n_mods == 0;
  const E* kbase = static_cast<const E*>(P.k.data) + lg.b * P.k.s0 + lg.g * P.k.s1;
  const E* vbase = static_cast<const E*>(P.v.data) + lg.b * P.v.s0 + lg.g * P.v.s1;
  for (int64_t j0 = ka; j0 < kz; j0 += P.bk) {
    const int64_t jn = imin(P.bk, kz - j0), kb = j0 / P.bk;
    classify(P, lg, kb, j0, jn, tm);
    if (tm.mode == TILE_SKIP) continue;
    const bool direct = direct_ok && tm.mode == TILE_FULL;
    // keys of this item left after the tile's start: how far the prefetch may run ahead
    [[maybe_unused]] const int64_t ahead = direct ? kz - j0 - kDecodePrefetch : 0;
    const C* p;
    int64_t psl, psj;
    [[maybe_unused]] const E* vd = vbase + j0 * P.v.s2;
    const C* vcopy = nullptr;
    int64_t ldv = P.v.s2;
    if constexpr (!kInPlace) {
      // (direct is false)
    } else if (direct) {
      // FULL tile, read in place: a non-finite score means a non-finite k row (or k scale) or an
      // overflow; every lane attends every key, so a bad k row flags them all (v: through the O rows)
      const E* kp = kbase + j0 * P.k.s2;
      [[maybe_unused]] bool bad;
#ifdef QKV_DECODE_BF16_DOT
      if constexpr (kB16)
        bad = b16 ? dec_scores_b16(kp, P.k.s2, jn, P.Dk, qh, dkp, n, S.sc, lds, ahead, P.prefetch, float(q_prescale(P)))
                  : dec_scores(kp, P.k.s2, jn, dkp / kLanes, S.qr, dkp, n, S.sc, lds, ahead, P.prefetch);
      else
#endif
        bad = dec_scores(kp, P.k.s2, jn, dkp / kLanes, S.qr, dkp, n, S.sc, lds, ahead, P.prefetch);
      if constexpr (kCodes) {
        key_factors<E>(P.k_scale, lg.b, lg.g, j0, jn, S.ks);
        key_factors<E>(P.v_scale, lg.b, lg.g, j0, jn, S.vs);
        if (scale_keys(S.sc, lds, n, jn, S.ks) && !k_codes_finite<E>(P, lg.b, lg.g, j0, jn))
          for (int l = 0; l < n; ++l) fl[l] |= kBadInput;
      } else {
        if (bad && !k_rows_finite(kp, P.k.s2, jn, P.Dk))
          for (int l = 0; l < n; ++l) fl[l] |= kBadInput;
      }
    }
    if (!direct) {
      int64_t ldk;
      const C* kp;
      if constexpr (kCodes) {  // the dequantised copy, cleaned as a float tile (finite.hpp)
        dequant_rows<E, C>(P.k, P.k_scale, lg.b, lg.g, j0, jn, P.Dk, S.kc, dkp);
        dequant_rows<E, C>(P.v, P.v_scale, lg.b, lg.g, j0, jn, P.Dv, S.vc, dvp);
        kp = S.kc;
        ldk = dkp;
        vcopy = S.vc;
        ldv = dvp;
        dirty_tile(P, &lg, 1, &tm, j0, jn, S.kc, S.vc, dkp, dvp, kp, ldk, vcopy, ldv,
                   reinterpret_cast<uint8_t (*)[kLanes]>(fl));
      } else {
        const bool copy_k = !std::is_same_v<T, C> || P.Dk % kLanes != 0;
        const bool copy_v = !std::is_same_v<T, C> || P.Dv % kLanes != 0;
        kp = kv_tile<T, C>(P.k, lg.b, lg.g, j0, jn, P.Dk, S.kc, dkp, copy_k, ldk);
        vcopy = kv_tile<T, C>(P.v, lg.b, lg.g, j0, jn, P.Dv, S.vc, dvp, copy_v, ldv);
        clean_tile<T>(P, &lg, 1, &tm, j0, jn, S.kc, S.vc, dkp, dvp, kp, ldk, vcopy, ldv,
                      reinterpret_cast<uint8_t (*)[kLanes]>(fl));
      }
      dec_scores(kp, ldk, jn, dkp / kLanes, S.qr, dkp, n, S.sc, lds, int64_t(0), P.prefetch);
    }
    if (plain && direct) {
      dec_softmax_plain(P, lg, j0, jn, S.sc, lds, S.ml);
      if constexpr (kCodes) scale_keys(S.sc, lds, n, jn, S.vs);  // P x (kUnit x v scale) meets V's codes
      p = S.sc;
      psl = lds;
      psj = 1;
    } else {  // the general step on the transposed tile (rows across the lanes, as prefill)
      for (int64_t jj = 0; jj < jn; ++jj)
        for (int l = 0; l < kLanes; ++l) S.st[jj * kLanes + l] = l < n ? S.sc[l * lds + jj] : C(0);
      const bool has_add = build_additive(P, lg, tm, j0, jn, S.addt, fl);
      vstore(al, softmax_tile<T, C>(P, lg, ml, tm, j0, jn, S.st, has_add ? S.addt : nullptr, m_run, l_run, lc));
      if constexpr (kCodes)
        if (direct)  // mods on a FULL tile read in place: P^T rows times the v factors
          for (int64_t jj = 0; jj < jn; ++jj)
            vstore(S.st + jj * kLanes, vmul(vload(S.st + jj * kLanes), vset1<V>(S.vs[jj])));
      p = S.st;
      psl = 1;
      psj = kLanes;
    }
    if (vcopy)
      dec_pv(vcopy, ldv, jn, p, psl, psj, n, S.tsum, S.orow, S.oc, dvp, al, int64_t(0), P.prefetch);
    else if constexpr (kInPlace)
      dec_pv(vd, ldv, jn, p, psl, psj, n, S.tsum, S.orow, S.oc, dvp, al, ahead, P.prefetch);
    if constexpr (std::is_same_v<E, e4m3_t>) {
      // E4M3's NaN pattern reads as a number in place: the tile's codes are scanned after it was
      // read (in L1 / L2 then; a scan before the reads took the misses without the prefetch, in
      // series with the arithmetic). A FULL tile is attended by every row, so a NaN code in it
      // flags them all (kBadInput: NaN rows), whatever the rows computed from it.
      if (direct && !(e4m3_tile_clean(kbase + j0 * P.k.s2, P.k.s2, jn, P.Dk) && e4m3_tile_clean(vd, P.v.s2, jn, P.Dv)))
        for (int l = 0; l < n; ++l) fl[l] |= kBadInput;
    }
  }
}

// After dec_thin: its rows (write_rows), or for a decode split (part) the partial with its flags.
template <class T>
__attribute__((noinline)) static void thin_finish(const Params& P, const DecBufs<typename Compute<T>::type>& S,
                                                  const LaneGroup& lg, const uint8_t* fl,
                                                  const Partial<typename Compute<T>::type>* part) {
  using C = typename Compute<T>::type;
  const int64_t dvp = S.dvp;
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

// ------------------------------------------------------------------ the decode call

template <class T>
struct DecodeJob {
  using C = typename Compute<T>::type;
  const Params* P;
  Arena arena;  // the wide path's scratch (FwdBufs)
  bool thin = false, oom = false;
  int64_t rows_per_kv = 0, chunks = 0, splits = 1, nkb = 0, n_items = 0, next = 0;
  C* part_buf = nullptr;
  int64_t part_stride = 0;  // elements per partial
};

// The lane groups of work item `item` (kv head (b, g), row chunk c of its stacked (h, i) rows,
// key split `split`). Returns the number of lane groups (<= 4).
template <class T>
static int decode_rowset(const Params& P, const DecodeJob<T>& J, int64_t item, LaneGroup* lgs, int64_t& split) {
  const int64_t group = P.H / P.Hkv;
  split = item % J.splits;
  item /= J.splits;
  const int64_t c = item % J.chunks;
  item /= J.chunks;
  const int64_t g = item % P.Hkv, b = item / P.Hkv;
  const int64_t r0 = c * kBlockQ, nr = imin(int64_t(kBlockQ), J.rows_per_kv - r0);
  const int nlg = int((nr + kLanes - 1) / kLanes);
  for (int lg = 0; lg < nlg; ++lg)  // row r of the kv head's group: query head r / Nq, query r % Nq
    fill_lanes(lgs[lg], b, g, r0 + lg * kLanes, nr - lg * kLanes, [&](int64_t r, int64_t& h, int64_t& i) {
      h = g * group + r / P.Nq;
      i = r % P.Nq;
    });
  return nlg;
}

// dec_thin for the call's K/V storage.
template <class T>
static inline void dec_thin_format(const Params& P, DecBufs<typename Compute<T>::type>& S, const LaneGroup& lg,
                                   int64_t ka, int64_t kz, uint8_t* fl) {
  switch (P.kv_format) {
    case KvFormat::i8:
      return dec_thin<T, i8_t>(P, S, lg, ka, kz, fl);
    case KvFormat::e4m3:
      return dec_thin<T, e4m3_t>(P, S, lg, ka, kz, fl);
    case KvFormat::e5m2:
      return dec_thin<T, e5m2_t>(P, S, lg, ka, kz, fl);
    default:
      return dec_thin<T, T>(P, S, lg, ka, kz, fl);
  }
}

// One decode split's partial in the job's buffer: m, l and flags of each of a row set's kBlockQ rows
// (up to kLaneGroups lane groups), then their O rows (Dv each): kBlockQ x (3 + Dv) elements.
template <class C>
static inline Partial<C> partial_at(C* base) {
  return Partial<C>{base, base + kBlockQ, base + 2 * kBlockQ, base + 3 * kBlockQ};
}

template <class T>
static void decode_task(void* ctx, int tid) {
  using C = typename Compute<T>::type;
  DecodeJob<T>& J = *static_cast<DecodeJob<T>*>(ctx);
  const Params& P = *J.P;
  FwdBufs<T> W;
  DecBufs<C> S;
  const bool thin = J.thin;  // read once: the buffers carved here are the ones the loop uses
  if (thin) {
    char* mem = decode_scratch(DecBufs<C>::bytes(P));
    if (!mem) {
      __atomic_store_n(&J.oom, true, __ATOMIC_RELAXED);
      return;
    }
    S.carve(P, mem);
    // the widened copies' row padding must read as zero (it was written by an earlier call's Dk)
    if (P.Dk % kLanes) std::memset(static_cast<void*>(S.kc), 0, sizeof(C) * size_t(P.bk * S.dkp));
    if (P.Dv % kLanes) std::memset(static_cast<void*>(S.vc), 0, sizeof(C) * size_t(P.bk * S.dvp));
  } else {
    W.carve(P, J.arena.at(tid));
  }
  LaneGroup lgs[kLaneGroups];
  for (;;) {
    const int64_t it = __atomic_fetch_add(&J.next, 1, __ATOMIC_RELAXED);
    if (it >= J.n_items) break;
    int64_t split;
    const int nlg = decode_rowset<T>(P, J, it, lgs, split);
    int64_t ka, kz;
    row_key_range(P, lgs, nlg, ka, kz);
    if (P.tile_class) ka = ka / P.bk * P.bk;  // tiles stay aligned to the lead's tile grid
    Partial<C> part{}, *pp = nullptr;
    if (J.splits > 1) {
      // fixed, tile-aligned split points, balanced to one tile: the same partials whichever
      // thread runs them
      const int64_t s0 = split * J.nkb / J.splits * P.bk, s1 = imin(P.Nk, (split + 1) * J.nkb / J.splits * P.bk);
      ka = imax(ka, s0);
      kz = imin(kz, s1);
      part = partial_at(J.part_buf + it * J.part_stride);
      pp = &part;
    }
    if (thin) {
      uint8_t fl[kLanes] = {};
      dec_thin_format<T>(P, S, lgs[0], ka, kz, fl);
      thin_finish<T>(P, S, lgs[0], fl, pp);
    } else {
      uint8_t fl[kLaneGroups][kLanes] = {};
      fwd_rowset<T>(P, W, lgs, nlg, ka, kz, fl);
      fwd_finish<T>(P, W, lgs, nlg, fl, pp);
    }
  }
}

static inline int64_t gcd64(int64_t a, int64_t b) {
  while (b) {
    const int64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

// The forward of a decode call (Nq <= kDecodeMaxNq). false: out of memory.
template <class T>
static bool decode_forward(const Params& P) {
  using C = typename Compute<T>::type;
  DecodeJob<T> J;
  J.P = &P;
  J.rows_per_kv = (P.H / P.Hkv) * P.Nq;
  J.thin = J.rows_per_kv <= kThinMaxRows;
  J.chunks = (J.rows_per_kv + kBlockQ - 1) / kBlockQ;
  J.nkb = (P.Nk + P.bk - 1) / P.bk;
  const int64_t base = P.B * P.Hkv * J.chunks;
  const int64_t kv_bytes = P.B * P.Hkv * P.Nk * (P.Dk + P.Dv) *
                           int64_t(P.kv_format != KvFormat::native ? 1
                                   : P.dtype == DType::f64         ? 8
                                   : P.dtype == DType::f32         ? 4
                                                                   : 2);
  int64_t threads = P.threads < 1 || !P.parallel || kv_bytes < kDecodeSerialBytes ? 1 : P.threads;
  if (threads > 1) {
    // every thread gets the same number of equal items: base x splits a multiple of the threads,
    // but no split under a tile of keys
    J.splits = imax(1, imin(threads / gcd64(base, threads), J.nkb));
  }
  J.n_items = base * J.splits;
  if (J.splits > 1) {
    J.part_stride = kBlockQ * (3 + P.Dv);  // partial_at
    J.part_buf = static_cast<C*>(std::malloc(sizeof(C) * size_t(J.part_stride * J.n_items)));
    if (!J.part_buf) return false;
  }
  const int nt = int(imin(threads, J.n_items));
  if (!J.thin && !J.arena.alloc(nt < 1 ? 1 : nt, FwdBufs<T>::bytes(P))) {
    std::free(J.part_buf);
    return false;
  }
  if (nt <= 1)
    decode_task<T>(&J, 0);
  else
    P.parallel(nt, &decode_task<T>, &J);
  if (J.part_buf && !J.oom) {
    LaneGroup lgs[kLaneGroups];
    Partial<C> parts[kMaxThreads];  // splits <= threads <= kMaxThreads
    for (int64_t it = 0; it < J.n_items; it += J.splits) {
      int64_t split;
      const int nlg = decode_rowset<T>(P, J, it, lgs, split);
      for (int64_t s = 0; s < J.splits; ++s) parts[s] = partial_at(J.part_buf + (it + s) * J.part_stride);
      merge_partials<T>(P, lgs, nlg, int(J.splits), parts);
    }
  }
  std::free(J.part_buf);
  return !J.oom;
}

}  // namespace QKV_NS
}  // namespace qkv_native
