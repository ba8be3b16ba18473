// The kernel's one entrance: a call described over neutral array views, checked once and turned
// into the Params the kernels trust (params.hpp). The host adapters only translate: binding.cpp
// (NumPy, torch and JAX arrays through nanobind) and ffi.cpp (XLA's buffers) fill a CallArgs with
// ArrayViews of their arrays and turn a refused Status into their own error. Every check and every
// message is written here, once: a bad argument is named with its axis and sizes and never
// reaches a kernel (an index outside a buffer, a dtype the kernel does not take).
//
// A new host library is one more adapter onto CallArgs; a new kernel argument is one field of
// CallArgs and Params and its check in entrance.cpp (docs/architecture.md, "The kernel's entrance").
#pragma once
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "params.hpp"

namespace qkv_native {

// The element types an argument may arrive in; `other` is anything else (refused where read).
enum class Elem : int { f16, bf16, f32, f64, i8, u8, i16, u16, i32, u32, i64, u64, boolean, other };

// Each Elem's name (NumPy's, in messages) and width in bytes, in the enum's order.
struct ElemFacts {
  const char* name;
  int bytes;
};
inline constexpr ElemFacts kElems[] = {
    {"float16", 2}, {"bfloat16", 2}, {"float32", 4}, {"float64", 8}, {"int8", 1},   {"uint8", 1}, {"int16", 2},
    {"uint16", 2},  {"int32", 4},    {"uint32", 4},  {"int64", 8},   {"uint64", 8}, {"bool", 1},  {"unsupported", 0}};
static_assert(std::size(kElems) == size_t(Elem::other) + 1, "one ElemFacts per Elem");
inline const char* elem_name(Elem e) { return kElems[int(e)].name; }
inline int64_t elem_bytes(Elem e) { return kElems[int(e)].bytes; }

// The mask arrays a call carries (ffi.cpp's `mask` attribute; Python's _facts.MaskKind): none, per-row
// key intervals, or tile classes with a bitmap per PARTIAL tile (mask.hpp).
enum MaskKind : int { MASK_NONE = 0, MASK_ROWS = 1, MASK_TILES = 2 };

// Whether a score mod reads a table (ALIBI's slopes, RELBIAS's table) rather than a constant.
inline bool mod_has_table(int64_t kind) { return kind == MOD_ALIBI || kind == MOD_RELBIAS; }

// Query rows of one tile for a call with nq queries: the decode tile (one lane group's 16 rows)
// or the prefill tile. Python plans masks on this grid (qkv._native.tile_shape).
inline int tile_rows(int64_t nq) { return nq <= kDecodeMaxNq ? kDecodeMaxNq : kBlockQ; }

constexpr int kMaxRank = 8;  // axes a view records; a higher rank is kept (and refused) but its shape cut

// One array of a call, whatever library holds it. Strides are in elements. data == nullptr: absent.
struct ArrayView {
  const void* data = nullptr;
  Elem type = Elem::other;
  int rank = 0;
  int64_t shape[kMaxRank] = {};
  int64_t strides[kMaxRank] = {};
  bool given() const { return data != nullptr; }
  int64_t size() const;
  bool c_contiguous() const;  // row-major and dense (axes of size 1 may have any stride)
};

// One score mod as the host passed it (qkv._native.KernelMod): a ModKind, MUL's / SOFTCAP's
// constant c, ALIBI's slopes or RELBIAS's table, RELBIAS's clip radius m.
struct ModArg {
  int64_t kind = MOD_MUL;
  double c = 1.0;
  ArrayView table;
  int64_t m = 0;
};

// Everything one forward or backward call passes to the kernel. Forward: out (B, H, Nq, Dv) and
// lse (B, H, Nq) are written, and lse_lo when given. Backward: out, lse, lse_lo (optional), dout
// and dlse are read; dq, dk, dv written.
struct CallArgs {
  ArrayView q, k, v;       // (B, H, Nq, Dk), (B, Hkv, Nk, Dk), (B, Hkv, Nk, Dv)
  ArrayView out, lse;      // (B, H, Nq, Dv), (B, H, Nq)
  ArrayView lse_lo;        // optional (B, H, Nq) in lse's dtype: lse's rounding residual (params.hpp)
  ArrayView dout, dlse;    // backward: (B, H, Nq, Dv), optional (B, H, Nq)
  ArrayView dq, dk, dv;    // backward: shaped as q, k, v; float32 (float64 for float64)
  ArrayView tile_class;    // int8 (Bm, Hm, nbq, nbk)
  ArrayView rows;          // int32 (Bm, Hm, Nq, 2)
  ArrayView bitmap_index;  // int32 (Bm, Hm, nbq, nbk)
  ArrayView bitmaps;       // uint64 (n, BQ, ceil(BK/64))
  ArrayView bias;          // float (B|1, H|1, Nq|1, Nk)
  std::vector<ModArg> mods;
  double scale = 1.0;
  double dropout_p = 0.0;
  uint64_t seed = 0;
  int64_t threads = 1;
  int64_t kv_format = int64_t(KvFormat::native);  // a KvFormat (params.hpp)
  ArrayView k_scale, v_scale;                     // float32 (B|1, Hkv|1, Nk|1), quantized K/V only
};

// A checked call: the kernels' Params and the float64 copies of the mod tables it points into.
struct KernelCall {
  Params P;
  std::vector<std::vector<double>> tables;
};

// The entrance's verdict: ok, or a refusal of one kind with its message. Python raises the
// qkv.errors class of that name (ShapeError, DTypeError, ArgumentError); XLA an InvalidArgument
// error whose message starts with it.
struct Status {
  enum Kind : int { ok = 0, shape = 1, dtype = 2, argument = 3 };
  Kind kind = ok;
  std::string message;
  const char* error_class() const {
    static const char* const kNames[] = {"", "ShapeError", "DTypeError", "ArgumentError"};
    return kNames[kind];
  }
};

Status build_forward(const CallArgs& a, KernelCall& c);
Status build_backward(const CallArgs& a, KernelCall& c);

// Runs a built call on the current ISA path (dispatch.cpp). counts: rows written NaN for a
// non-finite input, rows whose finite inputs overflowed (finite.hpp). False: the kernel's scratch
// could not be allocated.
bool run_forward(Params& P, int64_t (&counts)[2]);
bool run_backward(Params& P, int64_t (&counts)[2]);

}  // namespace qkv_native
