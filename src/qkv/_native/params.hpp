// The plain-data contract between the entrance (entrance.cpp, which checks a call from any host)
// and the kernels (which know no host). The entrance has checked every shape, dtype and stride
// before a Params reaches a kernel, so the kernels trust it. Strides are in elements (not bytes);
// 0 means a broadcast axis.
#pragma once
#include <cstdint>

// Every header but this one puts its code in namespace qkv_native::QKV_NS, a name each ISA
// translation unit sets before including (avx2, avx512, portable): inline functions and template
// instances compiled with different -m flags then never share a symbol, so the linker cannot
// merge an AVX-512 copy into the portable path.
#ifndef QKV_NS
#define QKV_NS generic
#endif

namespace qkv_native {

// The dtypes of q, k, v the kernel computes in; the names in DType order (Python's _facts.DTYPES).
enum class DType : int { f32 = 0, f64 = 1, f16 = 2, bf16 = 3 };
constexpr const char* kDTypeNames[] = {"float32", "float64", "float16", "bfloat16"};

// How K and V are stored: in q's dtype (native), or quantized with a float32 scale per
// (batch, kv head, key): int8, or the float8 bit patterns of E4M3 / E5M2 (OCP FP8) as uint8.
// Python's _facts.KvFormat; the names in KvFormat order.
enum class KvFormat : int { native = 0, i8 = 1, e4m3 = 2, e5m2 = 3 };
constexpr const char* kKvFormatNames[] = {"native", "i8", "e4m3", "e5m2"};

enum TileClass : int8_t { EMPTY = 0, PARTIAL = 1, FULL = 2 };

// Tile sizes. BQ queries x BK keys is the unit of the tile classes and bitmaps of a mask's plan (masks.plan).
// 16 queries sit across the SIMD lanes (one zmm, two ymm): the row max, exp2 and row sum of the
// online softmax are then vertical operations (FlashAttention-2, arXiv:2307.08691, Alg. 1 l. 9-10).
constexpr int kLanes = 16;
// 64 queries (4 lane groups) share every K/V tile they load: the tile is read from L2 once per
// 64 queries instead of once per 16.
constexpr int kBlockQ = 64;
// The lane groups of one query block: a prefill work item holds at most this many, and the tile
// loops size their per-group arrays and scratch with it. The loops take them in pairs (two lane
// groups share each broadcast of K and V), so the count is even.
constexpr int kLaneGroups = kBlockQ / kLanes;
static_assert(kBlockQ % kLanes == 0, "a query block is whole lane groups");
static_assert(kLaneGroups % 2 == 0, "the tile loops pair the lane groups");
// 128 keys x Dk=64 x 4 B = 32 KiB: the K tile stays in L1/L2 while the 4 lane groups reuse it;
// the score tile 128 x 16 x 4 B = 8 KiB stays in L1 between the matmul, exp2 and P.V passes.
constexpr int kBlockK = 128;
// Decode (Nq <= kDecodeMaxNq): one tile row of 16 queries; keys are split across threads.
constexpr int kDecodeMaxNq = 16;
// Most worker threads of one call: sizes the per-thread tables of the forward (decode partials)
// and backward (dQ partials); the binding refuses more and Python caps its thread count here.
constexpr int kMaxThreads = 256;

struct Strided {  // a 4-D (or 3-D) strided view; strides in elements
  const void* data = nullptr;
  int64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
};

enum ModKind : int { MOD_MUL = 0, MOD_SOFTCAP = 1, MOD_ALIBI = 2, MOD_RELBIAS = 3 };

struct Mod {
  int kind = MOD_MUL;
  double c = 1.0;                 // mul / softcap constant
  const double* table = nullptr;  // alibi: slopes (Bm*Hm) ; relbias: (Hm, 2M+1), float64 copies
  int64_t tb_b = 0, tb_h = 0;     // element strides of the table over batch / head (0 = broadcast)
  int64_t m = 0;                  // relbias clip radius M
};
constexpr int kMaxMods = 8;

// Where the decode loop's software prefetch puts the K/V lines it asks for ahead (decode.hpp): L1
// (prefetcht0) or L2 only (prefetcht2). Picked once from the CPU (dispatch.cpp, decode_prefetch).
enum class Prefetch : int8_t { l1 = 0, l2 = 1 };

using TaskFn = void (*)(void* ctx, int tid);
// Runs fn(ctx, tid) for tid in [0, n) on the persistent pool (threads.hpp) and returns when all
// are done. The kernels get it as a function pointer so the ISA translation units need no
// std::thread / std::function (their inline code could otherwise be merged across ISAs).
using ParallelFn = void (*)(int n, TaskFn fn, void* ctx);

struct Params {
  DType dtype = DType::f32;
  int64_t B = 0, H = 0, Hkv = 0, Nq = 0, Nk = 0, Dk = 0, Dv = 0;
  Strided q, k, v;  // (B, H, Nq, Dk), (B, Hkv, Nk, Dk), (B, Hkv, Nk, Dv); last stride 1
  // K/V storage; quantized: k, v hold int8 / float8 bits, scaled per (B, Hkv, Nk) by k_scale, v_scale
  // (float32, 3-D strides s0..s2, 0 on a broadcast axis)
  KvFormat kv_format = KvFormat::native;
  Strided k_scale, v_scale;
  double scale = 1.0;
  // mask (all optional)
  int bq = kBlockQ, bk = kBlockK;  // tile shape (tile_shape())
  int64_t nbq = 0, nbk = 0;
  const int8_t* tile_class = nullptr;
  int64_t tc_b = 0, tc_h = 0;  // (Bm, Hm, nbq, nbk) contiguous
  const int32_t* rows = nullptr;
  int64_t rw_b = 0, rw_h = 0;  // (Bm, Hm, Nq, 2) contiguous
  const int32_t* bitmap_index = nullptr;
  int64_t bi_b = 0, bi_h = 0;  // (Bm, Hm, nbq, nbk) contiguous
  const uint64_t* bitmaps = nullptr;
  int64_t n_bitmaps = 0, words = 0;  // (n, bq, words) contiguous
  // score mods, then bias
  int n_mods = 0;
  Mod mods[kMaxMods];
  Strided bias;
  DType bias_dtype = DType::f32;
  bool has_bias = false;
  // dropout
  double dropout_p = 0.0;
  uint64_t seed = 0;
  // outputs (C-contiguous): out (B,H,Nq,Dv) dtype; lse (B,H,Nq) float32 or float64 (f64 inputs)
  void* out = nullptr;
  void* lse = nullptr;
  // optional (B,H,Nq), lse's dtype: lse_lo = (lse as computed) - lse, the rounding of the written lse
  // (below ulp(lse) / 2), kept for the backward, which rebuilds P from lse + lse_lo: lse's rounding
  // alone shifts every P of its row by up to ulp(lse) / 2 (1.9e-6 relative at |lse| ~ 40)
  void* lse_lo = nullptr;
  // backward only
  const void* dout = nullptr;
  Strided dout_s;    // (B,H,Nq,Dv) dtype, last stride 1
  Strided out_s;     // out as input of backward (strided)
  Strided lse_s;     // lse as input of backward (float32/64 per dtype)
  Strided lse_lo_s;  // optional: the forward's lse_lo (data nullptr: absent, lse as given)
  const void* dlse = nullptr;
  Strided dlse_s;
  DType dlse_dtype = DType::f32;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;  // C-contiguous, f32 (f64 for f64)
  int threads = 1;
  ParallelFn parallel = nullptr;
  Prefetch prefetch = Prefetch::l1;  // the decode loop's (dispatch.cpp)
  // rows written as NaN: [0] attended a non-finite input, [1] finite inputs overflowed (finite.hpp)
  int64_t* counts = nullptr;
  // forward: one byte per aligned K/V tile (B, Hkv, nbk), the tile's non-finite verdict (finite.hpp)
  uint8_t* kv_state = nullptr;
  // backward, set by the kernel itself: (B*H*Nq, 2) compute-type (m, log l) of the rows whose lse is
  // too large for its dtype (kernels_impl.hpp, refine_lse); NaN m: the row uses lse as given
  const void* lse_rows = nullptr;
  // and their (B*H*Nq) float64 D_i = rowsum(dO o O) - dlse_i from the O of that same tile loop (NaN:
  // the row's D from out)
  const double* delta_rows = nullptr;
};

// One table per ISA translation unit (kernels_<isa>.cpp); dispatch.cpp picks one.
struct KernelTable {
  const char* name;
  bool (*forward)(const Params&);  // false: out of memory (scratch could not be allocated)
  bool (*backward)(const Params&);
  double (*microbench)(int kind, int64_t reps);  // benchmark report only (kernels_impl.hpp)
};

}  // namespace qkv_native
