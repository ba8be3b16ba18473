// The kernel as an XLA custom call (jax.ffi): what a jitted JAX program runs in place of qkv's
// array engine. Built only where jaxlib's FFI header was found at configure time (CMakeLists.txt);
// qkv/_impls/_jax_ffi.py lowers a call to it and wires the backward in with jax.custom_vjp.
// An adapter onto the kernel's entrance (entrance.hpp): XLA's buffers become ArrayViews (dense,
// row-major), the entrance checks the call as it checks every host's, and a refusal is an
// InvalidArgument error with its message, never a read outside a buffer.
//
// Operands, in order (every one dense and row-major, as XLA hands them over):
//   forward:  q (B, H, Nq, Dk), k (B, Hkv, Nk, Dk), v (B, Hkv, Nk, Dv)
//   backward: the same, then out (B, H, Nq, Dv), lse (B, H, Nq), lse_lo (B, H, Nq), dout (B, H, Nq, Dv),
//             [dlse (B, H, Nq)]
//   then, as the attributes say: the mask (`mask`, a MaskKind: rows (Bm, Hm, Nq, 2) int32, or
//   tile_class (Bm, Hm, nbq, nbk) int8 + bitmap_index (same, int32) + bitmaps (n, BQ, words) uint64),
//   [bias (B|1, H|1, Nq|1, Nk)], [k_scale, v_scale (B|1, Hkv|1, Nk|1) float32 when kv_format is not
//   native], and one table per alibi / relbias score mod.
// Results: forward out (q's dtype), lse and, when a third result is asked for, lse_lo (lse's rounding
// residual, params.hpp; zeros as the backward's operand: lse as it is); backward dq, dk, dv
// (float32; float64 for float64).
// jax.vmap batches the call with every operand broadcast to the mapped axes (vmap_method
// "broadcast_all"): leading axes beyond an operand's own are walked here, merged into B (one
// kernel call over all of them) where every operand allows it, else one kernel call per index.
// Rows a non-finite input or an overflow condemns come back NaN (no exception can leave a jitted
// program; documented in docs/jax.md).
#include <cstring>
#include <string>
#include <vector>

#include "entrance.hpp"
#include "params.hpp"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace qkv_native {
namespace {

Elem elem(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F16:
      return Elem::f16;
    case ffi::DataType::BF16:
      return Elem::bf16;
    case ffi::DataType::F32:
      return Elem::f32;
    case ffi::DataType::F64:
      return Elem::f64;
    case ffi::DataType::S8:
      return Elem::i8;
    case ffi::DataType::U8:
      return Elem::u8;
    case ffi::DataType::S16:
      return Elem::i16;
    case ffi::DataType::U16:
      return Elem::u16;
    case ffi::DataType::S32:
      return Elem::i32;
    case ffi::DataType::U32:
      return Elem::u32;
    case ffi::DataType::S64:
      return Elem::i64;
    case ffi::DataType::U64:
      return Elem::u64;
    case ffi::DataType::PRED:
      return Elem::boolean;
    default:
      return Elem::other;
  }
}

// The operands' vmapped axes: the leading axes q has beyond its 4, which every operand carries
// too (broadcast_all), in front of its own `core` axes.
struct Lead {
  std::vector<int64_t> dims;
  int64_t n = 1;
};

// One operand or result: its view at vmapped index 0 (its own axes, dense row-major strides), the
// bytes of one index, and whether its axis 0 is the kernel's B (else it is shared: the same at
// every index, like the bitmaps and the mod tables).
struct Operand {
  ArrayView view;
  int64_t bytes = 0;
  bool batched = true;
};

void dense_strides(ArrayView& v) {
  int64_t acc = 1;
  for (int i = v.rank; i-- > 0;) {
    v.strides[i] = acc;
    acc *= v.shape[i];
  }
}

ffi::Error operand(const ffi::AnyBuffer& b, size_t core, const Lead& lead, const char* name, bool batched, Operand& o) {
  const auto d = b.dimensions();
  if (d.size() != core + lead.dims.size())
    return ffi::Error::InvalidArgument(std::string(name) + ": rank " + std::to_string(d.size()) + ", expected " +
                                       std::to_string(core + lead.dims.size()));
  if (core > size_t(kMaxRank)) return ffi::Error::InvalidArgument(std::string(name) + ": too many axes");
  for (size_t i = 0; i < lead.dims.size(); ++i)
    if (d[i] != lead.dims[i]) return ffi::Error::InvalidArgument(std::string(name) + ": mapped axes differ from q's");
  ArrayView& v = o.view;
  v.data = b.untyped_data();
  v.type = elem(b.element_type());
  v.rank = int(core);
  for (size_t i = 0; i < core; ++i) v.shape[i] = d[lead.dims.size() + i];
  dense_strides(v);
  o.bytes = elem_bytes(v.type) * v.size();
  if (!elem_bytes(v.type)) return ffi::Error::InvalidArgument(std::string(name) + ": unsupported element type");
  o.batched = batched;
  return ffi::Error::Success();
}

// Operand `o` at vmapped index e (one call per index), or every index merged into its axis 0.
ArrayView at(const Operand& o, int64_t e, int64_t n, bool merge) {
  ArrayView r = o.view;
  if (merge) {
    if (o.batched) r.shape[0] *= n;  // row-major: the strides stay those of one index
  } else {
    r.data = static_cast<const char*>(o.view.data) + e * o.bytes;
  }
  return r;
}

// The attributes of both handlers (decoded by name: XLA_FFI_REGISTER_STRUCT_ATTR_DECODING below,
// in this order). has_dlse: the backward's dlse operand follows dout (0 for the forward).
struct Attrs {
  double scale, dropout_p;
  int64_t seed, threads, mask, has_bias, n_mods, kv_format;
  ffi::Span<const int64_t> mod_kinds;
  ffi::Span<const double> mod_c;
  ffi::Span<const int64_t> mod_m;
  int64_t has_dlse;
};

// An operand's place in the entrance's CallArgs.
struct Slot {
  const char* name;
  size_t core;  // its own rank
  bool batched;
  ArrayView CallArgs::* field;
};

// Whether the vmapped indices can run as one kernel call with B' = n B: every batched operand
// carries its own B axis at full size (or B = 1), every shared one is the same at every index, and
// no dropout (whose masks are drawn per batch index: merged, each index would draw anew).
bool mergeable(const Lead& lead, int64_t B, const Attrs& a, const std::vector<Operand>& ops) {
  if (lead.n == 1 || a.dropout_p > 0) return false;
  for (const Operand& o : ops) {
    if (o.batched && o.view.shape[0] != B) return false;
    if (o.batched) continue;
    const char* d = static_cast<const char*>(o.view.data);
    for (int64_t e = 1; e < lead.n; ++e)
      if (std::memcmp(d, d + e * o.bytes, size_t(o.bytes)) != 0) return false;
  }
  return true;
}

// Forward or backward: the operands after q, k, v (and the backward's own) as the attributes name
// them, then one entrance check and one kernel run per vmapped index (or one for all, merged).
template <bool Backward>
ffi::Error handle(ffi::RemainingArgs args, ffi::RemainingRets rets, Attrs a) {
  if (args.size() < 3) return ffi::Error::InvalidArgument("expected q, k, v");
  if (!Backward && a.has_dlse) return ffi::Error::InvalidArgument("has_dlse: the forward takes no dlse");
  Lead lead;
  {
    auto q = args.get<ffi::AnyBuffer>(0);
    if (!q.has_value()) return q.error();
    const auto d = q->dimensions();
    if (d.size() < 4) return ffi::Error::InvalidArgument("q must be (..., B, H, Nq, Dk)");
    lead.dims.assign(d.begin(), d.end() - 4);
    for (int64_t x : lead.dims) lead.n *= x;
  }
  std::vector<Slot> ins{{"q", 4, true, &CallArgs::q}, {"k", 4, true, &CallArgs::k}, {"v", 4, true, &CallArgs::v}};
  std::vector<Slot> outs;
  if (Backward) {
    ins.insert(ins.end(), {{"out", 4, true, &CallArgs::out},
                           {"lse", 3, true, &CallArgs::lse},
                           {"lse_lo", 3, true, &CallArgs::lse_lo},
                           {"dout", 4, true, &CallArgs::dout}});
    if (a.has_dlse) ins.push_back({"dlse", 3, true, &CallArgs::dlse});
    outs = {{"dq", 4, true, &CallArgs::dq}, {"dk", 4, true, &CallArgs::dk}, {"dv", 4, true, &CallArgs::dv}};
  } else {
    outs = {{"out", 4, true, &CallArgs::out}, {"lse", 3, true, &CallArgs::lse}};
    if (rets.size() == 3) outs.push_back({"lse_lo", 3, true, &CallArgs::lse_lo});
  }
  if (a.mask == MASK_ROWS) {
    ins.push_back({"rows", 4, true, &CallArgs::rows});
  } else if (a.mask == MASK_TILES) {
    ins.insert(ins.end(), {{"tile_class", 4, true, &CallArgs::tile_class},
                           {"bitmap_index", 4, true, &CallArgs::bitmap_index},
                           {"bitmaps", 3, false, &CallArgs::bitmaps}});
  } else if (a.mask != MASK_NONE) {
    return ffi::Error::InvalidArgument("mask must be a MaskKind (0 none, 1 rows, 2 tiles), got " +
                                       std::to_string(a.mask));
  }
  if (a.has_bias) ins.push_back({"bias", 4, true, &CallArgs::bias});
  if (a.kv_format != int64_t(KvFormat::native))
    ins.insert(ins.end(), {{"k_scale", 3, true, &CallArgs::k_scale}, {"v_scale", 3, true, &CallArgs::v_scale}});
  if (ins.size() > args.size())
    return ffi::Error::InvalidArgument(std::string("missing operand ") + ins[args.size()].name);
  if (rets.size() != outs.size())
    return ffi::Error::InvalidArgument("expected " + std::to_string(outs.size()) + " results");
  // every operand after the named ones is a score mod's table, in the order of the mods that take one
  const size_t n_tables = args.size() - ins.size();
  std::vector<Operand> ops(ins.size() + n_tables + outs.size());
  for (size_t i = 0; i < args.size(); ++i) {
    auto b = args.get<ffi::AnyBuffer>(i);
    if (!b.has_value()) return b.error();
    const bool named = i < ins.size();
    const size_t core = named ? ins[i].core : b->dimensions().size() - lead.dims.size();
    const ffi::Error e =
        operand(*b, core, lead, named ? ins[i].name : "score mod table", named && ins[i].batched, ops[i]);
    if (!e.success()) return e;
  }
  for (size_t i = 0; i < outs.size(); ++i) {
    auto r = rets.get<ffi::AnyBuffer>(i);
    if (!r.has_value()) return r.error();
    const ffi::Error e = operand(**r, outs[i].core, lead, outs[i].name, true, ops[args.size() + i]);
    if (!e.success()) return e;
  }
  if (a.n_mods < 0 || a.n_mods > int64_t(a.mod_kinds.size()) || a.n_mods > int64_t(a.mod_c.size()) ||
      a.n_mods > int64_t(a.mod_m.size()))
    return ffi::Error::InvalidArgument("score mods: n_mods exceeds mod_kinds / mod_c / mod_m");
  size_t wanted = 0;
  for (int64_t i = 0; i < a.n_mods; ++i) wanted += mod_has_table(a.mod_kinds[i]) ? 1 : 0;
  if (wanted != n_tables)
    return ffi::Error::InvalidArgument("score mods: " + std::to_string(wanted) + " tables expected, got " +
                                       std::to_string(n_tables));
  const bool merge = mergeable(lead, ops[0].view.shape[0], a, ops);
  const int64_t calls = merge ? 1 : lead.n;
  for (int64_t c = 0; c < calls; ++c) {
    CallArgs call;
    for (size_t i = 0; i < ins.size(); ++i) call.*ins[i].field = at(ops[i], c, lead.n, merge);
    for (size_t i = 0; i < outs.size(); ++i) call.*outs[i].field = at(ops[args.size() + i], c, lead.n, merge);
    size_t table = ins.size();
    for (int64_t i = 0; i < a.n_mods; ++i) {
      ModArg m{a.mod_kinds[i], a.mod_c[i], ArrayView{}, a.mod_m[i]};
      if (mod_has_table(m.kind)) m.table = at(ops[table++], c, lead.n, merge);
      call.mods.push_back(m);
    }
    call.scale = a.scale;
    call.dropout_p = a.dropout_p;
    call.seed = uint64_t(a.seed);
    call.threads = a.threads;
    call.kv_format = a.kv_format;
    KernelCall k;
    const Status s = Backward ? build_backward(call, k) : build_forward(call, k);
    if (s.kind != Status::ok) return ffi::Error::InvalidArgument(std::string(s.error_class()) + ": " + s.message);
    int64_t counts[2];
    if (!(Backward ? run_backward(k.P, counts) : run_forward(k.P, counts)))
      return ffi::Error::Internal("qkv: out of memory for the kernel's scratch");
  }
  return ffi::Error::Success();
}

}  // namespace

}  // namespace qkv_native

XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(qkv_native::Attrs, ffi::StructMember<double>("scale"),
                                      ffi::StructMember<double>("dropout_p"), ffi::StructMember<int64_t>("seed"),
                                      ffi::StructMember<int64_t>("threads"), ffi::StructMember<int64_t>("mask"),
                                      ffi::StructMember<int64_t>("has_bias"), ffi::StructMember<int64_t>("n_mods"),
                                      ffi::StructMember<int64_t>("kv_format"),
                                      ffi::StructMember<ffi::Span<const int64_t>>("mod_kinds"),
                                      ffi::StructMember<ffi::Span<const double>>("mod_c"),
                                      ffi::StructMember<ffi::Span<const int64_t>>("mod_m"),
                                      ffi::StructMember<int64_t>("has_dlse"));

namespace qkv_native {

// Both handlers take the operands and results as they come and the attributes as one Attrs.
XLA_FFI_DEFINE_HANDLER_SYMBOL(QkvFfiForward, handle<false>,
                              ffi::Ffi::Bind().RemainingArgs().RemainingRets().Attrs<Attrs>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(QkvFfiBackward, handle<true>,
                              ffi::Ffi::Bind().RemainingArgs().RemainingRets().Attrs<Attrs>());

void* ffi_forward_handler() { return reinterpret_cast<void*>(QkvFfiForward); }
void* ffi_backward_handler() { return reinterpret_cast<void*>(QkvFfiBackward); }

}  // namespace qkv_native
