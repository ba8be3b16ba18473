// The kernel as an XLA custom call (jax.ffi): what a jitted JAX program runs in place of qkv's
// array engine. Built only where jaxlib's FFI header was found at configure time (CMakeLists.txt);
// qkv/_impls/_jax_ffi.py lowers a call to it and wires the backward in with jax.custom_vjp.
//
// Operands, in order (every one dense and row-major, as XLA hands them over):
//   forward:  q (B, H, Nq, Dk), k (B, Hkv, Nk, Dk), v (B, Hkv, Nk, Dv)
//   backward: the same, then out (B, H, Nq, Dv), lse (B, H, Nq), dout (B, H, Nq, Dv), [dlse (B, H, Nq)]
//   then, as the attributes say: the mask (rows (Bm, Hm, Nq, 2) int32, or tile_class (Bm, Hm, nbq, nbk)
//   int8 + bitmap_index (same, int32) + bitmaps (n, BQ, words) uint64), [bias (B|1, H|1, Nq|1, Nk)],
//   and one table per alibi / relbias score mod (float32 or float64).
// Results: forward out (q's dtype) and lse; backward dq, dk, dv (float32; float64 for float64).
// jax.vmap batches the call with every operand broadcast to the mapped axes (vmap_method
// "broadcast_all"): leading axes beyond an operand's own are walked here, merged into B (one
// kernel call over all of them) where every operand allows it, else one kernel call per index.
// Bounds are checked here as in binding.cpp: a bad operand is an InvalidArgument error, never a read
// outside a buffer. Rows a non-finite input or an overflow condemns come back NaN (no exception
// can leave a jitted program; documented in docs/jax.md).
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "dispatch.hpp"
#include "params.hpp"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace qkv_native {
namespace {

enum MaskKind : int64_t { MASK_NONE = 0, MASK_ROWS = 1, MASK_TILES = 2 };

// One operand: its data, element type and the dims of one vmapped index (its own rank).
struct View {
  char* data = nullptr;
  ffi::DataType type = ffi::DataType::INVALID;
  std::vector<int64_t> dims;
  int64_t bytes = 0;  // of one vmapped index
  int64_t dim(size_t i) const { return dims[i]; }
};

std::string dims_str(const std::vector<int64_t>& d) {
  std::string s = "(";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + (d.size() == 1 ? ",)" : ")");
}

int64_t width(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F64:
    case ffi::DataType::U64:
    case ffi::DataType::S64:
      return 8;
    case ffi::DataType::F32:
    case ffi::DataType::S32:
      return 4;
    case ffi::DataType::F16:
    case ffi::DataType::BF16:
      return 2;
    case ffi::DataType::S8:
    case ffi::DataType::PRED:
      return 1;
    default:
      return 0;
  }
}

bool float_type(ffi::DataType t, DType& out) {
  switch (t) {
    case ffi::DataType::F32:
      out = DType::f32;
      return true;
    case ffi::DataType::F64:
      out = DType::f64;
      return true;
    case ffi::DataType::F16:
      out = DType::f16;
      return true;
    case ffi::DataType::BF16:
      out = DType::bf16;
      return true;
    default:
      return false;
  }
}

// The operands' vmapped axes: the leading axes q has beyond its 4, which every operand carries
// too (broadcast_all), in front of its own `core` axes.
struct Lead {
  std::vector<int64_t> dims;
  int64_t n = 1;
};

ffi::Error view(const ffi::AnyBuffer& b, size_t core, const Lead& lead, const char* name, View& v) {
  const auto d = b.dimensions();
  if (d.size() != core + lead.dims.size())
    return ffi::Error::InvalidArgument(std::string(name) + ": rank " + std::to_string(d.size()) + ", expected " +
                                       std::to_string(core + lead.dims.size()));
  for (size_t i = 0; i < lead.dims.size(); ++i)
    if (d[i] != lead.dims[i]) return ffi::Error::InvalidArgument(std::string(name) + ": mapped axes differ from q's");
  v.data = static_cast<char*>(b.untyped_data());
  v.type = b.element_type();
  v.dims.assign(d.begin() + lead.dims.size(), d.end());
  v.bytes = width(v.type);
  if (!v.bytes) return ffi::Error::InvalidArgument(std::string(name) + ": unsupported element type");
  for (int64_t x : v.dims) v.bytes *= x;
  return ffi::Error::Success();
}

ffi::Error out_view(ffi::Result<ffi::AnyBuffer>& r, size_t core, const Lead& lead, const char* name, View& v) {
  return view(*r, core, lead, name, v);
}

// Strides of a dense row-major view, in elements; an axis of size 1 gets 0 (Strided's broadcast).
Strided strided(const View& v) {
  Strided s;
  s.data = v.data;
  int64_t st[4] = {0, 0, 0, 0}, acc = 1;
  for (size_t i = v.dims.size(); i-- > 0;) {
    st[i] = v.dims[i] == 1 ? 0 : acc;
    acc *= v.dims[i];
  }
  s.s0 = st[0];
  s.s1 = st[1];
  s.s2 = st[2];
  s.s3 = st[3];
  return s;
}

bool bh_ok(const View& v, int64_t B, int64_t H) {
  return (v.dim(0) == 1 || v.dim(0) == B) && (v.dim(1) == 1 || v.dim(1) == H);
}

double as_double(const View& t, int64_t x) {
  if (t.type == ffi::DataType::F64) return reinterpret_cast<const double*>(t.data)[x];
  return double(reinterpret_cast<const float*>(t.data)[x]);
}

struct Attrs {
  double scale, dropout_p;
  int64_t seed, threads, mask, has_bias, n_mods;
  ffi::Span<const int64_t> mod_kinds;
  ffi::Span<const double> mod_c;
  ffi::Span<const int64_t> mod_m;
};

// Everything but q, k, v (and the backward's own operands): the mask, bias and score mods of one
// kernel call, checked as binding.cpp checks them.
struct Extras {
  View rows, tile_class, bitmap_index, bitmaps, bias;
  std::vector<View> tables;
};

ffi::Error fill(Params& P, const View& q, const View& k, const View& v, const Extras& x, const Attrs& a,
                std::vector<std::vector<double>>& tables) {
  if (q.dims.size() != 4 || k.dims.size() != 4 || v.dims.size() != 4)
    return ffi::Error::InvalidArgument("q, k, v must be 4-D (B, H, N, D)");
  if (!float_type(q.type, P.dtype) || k.type != q.type || v.type != q.type)
    return ffi::Error::InvalidArgument("q, k, v must have one float dtype");
  P.B = q.dim(0);
  P.H = q.dim(1);
  P.Nq = q.dim(2);
  P.Dk = q.dim(3);
  P.Hkv = k.dim(1);
  P.Nk = k.dim(2);
  P.Dv = v.dim(3);
  if (P.B < 1 || P.H < 1 || P.Nq < 1 || P.Dk < 1 || P.Hkv < 1 || P.Nk < 1 || P.Dv < 1)
    return ffi::Error::InvalidArgument("every axis of q, k, v must be >= 1");
  if (k.dim(0) != P.B || k.dim(3) != P.Dk || v.dim(0) != P.B || v.dim(1) != P.Hkv || v.dim(2) != P.Nk)
    return ffi::Error::InvalidArgument("k " + dims_str(k.dims) + " and v " + dims_str(v.dims) + " do not match q " +
                                       dims_str(q.dims) + " as (B, Hkv, Nk, Dk/Dv)");
  if (P.H % P.Hkv != 0) return ffi::Error::InvalidArgument("H must be a multiple of Hkv");
  P.q = strided(q);
  P.k = strided(k);
  P.v = strided(v);
  if (!std::isfinite(a.scale)) return ffi::Error::InvalidArgument("scale must be finite");
  P.scale = a.scale;
  if (a.threads < 1 || a.threads > kMaxThreads) return ffi::Error::InvalidArgument("threads out of range");
  P.threads = int(a.threads);
  P.parallel = parallel_fn();
  if (!(a.dropout_p >= 0.0 && a.dropout_p < 1.0)) return ffi::Error::InvalidArgument("dropout_p must be in [0, 1)");
  P.dropout_p = a.dropout_p;
  P.seed = uint64_t(a.seed);
  // the tile grid of binding.cpp's tile_shape(), which the Python side planned the mask with
  if (P.Nq <= kDecodeMaxNq) P.bq = kDecodeMaxNq;
  P.bk = kBlockK;
  P.nbq = (P.Nq + P.bq - 1) / P.bq;
  P.nbk = (P.Nk + P.bk - 1) / P.bk;
  if (a.mask == MASK_ROWS) {
    const View& r = x.rows;
    if (r.type != ffi::DataType::S32 || r.dims.size() != 4 || !bh_ok(r, P.B, P.H) || r.dim(2) != P.Nq || r.dim(3) != 2)
      return ffi::Error::InvalidArgument("rows must be int32 (Bm, Hm, Nq, 2), got " + dims_str(r.dims));
    P.rows = reinterpret_cast<const int32_t*>(r.data);
    P.rw_b = r.dim(0) == 1 ? 0 : r.dim(1) * P.Nq * 2;
    P.rw_h = r.dim(1) == 1 ? 0 : P.Nq * 2;
  } else if (a.mask == MASK_TILES) {
    const View &t = x.tile_class, &bi = x.bitmap_index, &bm = x.bitmaps;
    if (t.type != ffi::DataType::S8 || t.dims.size() != 4 || !bh_ok(t, P.B, P.H) || t.dim(2) != P.nbq ||
        t.dim(3) != P.nbk)
      return ffi::Error::InvalidArgument("tile_class must be int8 (Bm, Hm, nbq, nbk), got " + dims_str(t.dims));
    if (bi.type != ffi::DataType::S32 || bi.dims != t.dims)
      return ffi::Error::InvalidArgument("bitmap_index must be int32 shaped as tile_class, got " + dims_str(bi.dims));
    P.words = (P.bk + 63) / 64;
    if (bm.type != ffi::DataType::U64 || bm.dims.size() != 3 || bm.dim(1) != P.bq || bm.dim(2) != P.words)
      return ffi::Error::InvalidArgument("bitmaps must be uint64 (n, BQ, words), got " + dims_str(bm.dims));
    P.n_bitmaps = bm.dim(0);
    const int64_t n = t.bytes;  // int8: bytes = elements
    const auto* tc = reinterpret_cast<const int8_t*>(t.data);
    const auto* ix = reinterpret_cast<const int32_t*>(bi.data);
    for (int64_t e = 0; e < n; ++e) {
      if (tc[e] < EMPTY || tc[e] > FULL) return ffi::Error::InvalidArgument("tile_class values must be 0, 1 or 2");
      if (ix[e] < -1 || ix[e] >= P.n_bitmaps) return ffi::Error::InvalidArgument("bitmap_index out of range");
    }
    P.tile_class = tc;
    P.tc_b = t.dim(0) == 1 ? 0 : t.dim(1) * P.nbq * P.nbk;
    P.tc_h = t.dim(1) == 1 ? 0 : P.nbq * P.nbk;
    P.bitmap_index = ix;
    P.bi_b = P.tc_b;
    P.bi_h = P.tc_h;
    P.bitmaps = reinterpret_cast<const uint64_t*>(bm.data);
  } else if (a.mask != MASK_NONE) {
    return ffi::Error::InvalidArgument("unknown mask kind");
  }
  if (a.has_bias) {
    const View& b = x.bias;
    if (!float_type(b.type, P.bias_dtype) || b.dims.size() != 4 || !(b.dim(0) == 1 || b.dim(0) == P.B) ||
        !(b.dim(1) == 1 || b.dim(1) == P.H) || !(b.dim(2) == 1 || b.dim(2) == P.Nq) || b.dim(3) != P.Nk)
      return ffi::Error::InvalidArgument("bias must be float (B|1, H|1, Nq|1, Nk), got " + dims_str(b.dims));
    P.bias = strided(b);
    P.has_bias = true;
  }
  if (a.n_mods < 0 || a.n_mods > kMaxMods || int64_t(a.mod_kinds.size()) < a.n_mods ||
      int64_t(a.mod_c.size()) < a.n_mods || int64_t(a.mod_m.size()) < a.n_mods)
    return ffi::Error::InvalidArgument("score mods: bad attributes");
  size_t next_table = 0;
  tables.clear();
  tables.reserve(size_t(a.n_mods));
  for (int64_t i = 0; i < a.n_mods; ++i) {
    Mod& m = P.mods[i];
    m.kind = int(a.mod_kinds[i]);
    m.c = a.mod_c[i];
    if (m.kind == MOD_MUL || m.kind == MOD_SOFTCAP) {
      if (!std::isfinite(m.c) || (m.kind == MOD_SOFTCAP && !(m.c > 0)))
        return ffi::Error::InvalidArgument("score mod constant must be finite (softcap: > 0)");
      continue;
    }
    if ((m.kind != MOD_ALIBI && m.kind != MOD_RELBIAS) || next_table >= x.tables.size())
      return ffi::Error::InvalidArgument("score mods: unknown kind or missing table");
    const View& t = x.tables[next_table++];
    if (t.type != ffi::DataType::F32 && t.type != ffi::DataType::F64)
      return ffi::Error::InvalidArgument("score mod tables must be float32 or float64");
    int64_t nb = 1, nh, w = 1;
    if (m.kind == MOD_ALIBI) {
      if (t.dims.size() == 1) {
        nh = t.dim(0);
      } else if (t.dims.size() == 2) {
        nb = t.dim(0);
        nh = t.dim(1);
      } else {
        return ffi::Error::InvalidArgument("alibi slopes must be (Hm,) or (Bm, Hm), got " + dims_str(t.dims));
      }
      if (!(nb == 1 || nb == P.B)) return ffi::Error::InvalidArgument("alibi slopes: axis 0 must be 1 or B");
    } else {
      m.m = a.mod_m[i];
      if (m.m < 0 || t.dims.size() != 2 || t.dim(1) != 2 * m.m + 1)
        return ffi::Error::InvalidArgument("relative bias table must be (Hm, 2M+1), got " + dims_str(t.dims));
      nh = t.dim(0);
      w = t.dim(1);
    }
    if (!(nh == 1 || nh == P.H)) return ffi::Error::InvalidArgument("score mod table: head axis must be 1 or H");
    std::vector<double> buf(size_t(nb * nh * w));
    for (size_t e = 0; e < buf.size(); ++e) {
      buf[e] = as_double(t, int64_t(e));
      if (!std::isfinite(buf[e])) return ffi::Error::InvalidArgument("a score mod table holds NaN or inf");
    }
    tables.push_back(std::move(buf));
    m.table = tables.back().data();
    m.tb_b = m.kind == MOD_ALIBI && nb != 1 ? nh : 0;
    m.tb_h = nh == 1 ? 0 : w;
  }
  if (next_table != x.tables.size()) return ffi::Error::InvalidArgument("score mods: extra tables");
  P.n_mods = int(a.n_mods);
  return ffi::Error::Success();
}

// The extras of the operand list from `first` on, as the attributes describe them.
ffi::Error extras(const ffi::RemainingArgs& args, size_t first, const Attrs& a, const Lead& lead, Extras& x) {
  size_t i = first;
  auto next = [&](size_t core, const char* name, View& v) -> ffi::Error {
    if (i >= args.size()) return ffi::Error::InvalidArgument(std::string("missing operand ") + name);
    auto b = args.get<ffi::AnyBuffer>(i++);
    if (!b.has_value()) return b.error();
    return view(*b, core, lead, name, v);
  };
  struct Want {
    bool on;
    size_t core;
    const char* name;
    View* v;
  };
  const Want wants[] = {{a.mask == MASK_ROWS, 4, "rows", &x.rows},
                        {a.mask == MASK_TILES, 4, "tile_class", &x.tile_class},
                        {a.mask == MASK_TILES, 4, "bitmap_index", &x.bitmap_index},
                        {a.mask == MASK_TILES, 3, "bitmaps", &x.bitmaps},
                        {a.has_bias != 0, 4, "bias", &x.bias}};
  for (const Want& w : wants) {
    if (!w.on) continue;
    const ffi::Error e = next(w.core, w.name, *w.v);
    if (!e.success()) return e;
  }
  while (i < args.size()) {
    auto b = args.get<ffi::AnyBuffer>(i++);
    if (!b.has_value()) return b.error();
    View t;
    const size_t core = b->dimensions().size() - lead.dims.size();
    const ffi::Error e = view(*b, core, lead, "score mod table", t);
    if (!e.success()) return e;
    x.tables.push_back(t);
  }
  return ffi::Error::Success();
}

// Whether the vmapped indices can run as one kernel call with B' = n B: every batch-indexed operand
// carries its own B axis at full size (or B = 1), the operands without one are the same at every
// index, and no dropout (whose masks are drawn per batch index: merged, each index would draw anew).
bool mergeable(const Lead& lead, int64_t B, const Extras& x, const Attrs& a, const std::vector<const View*>& batched) {
  if (lead.n == 1) return false;
  if (a.dropout_p > 0) return false;
  for (const View* v : batched)
    if (v->data && v->dim(0) != B) return false;
  std::vector<const View*> shared{&x.bitmaps};
  for (const View& t : x.tables) shared.push_back(&t);
  for (const View* v : shared) {
    if (!v->data) continue;
    for (int64_t e = 1; e < lead.n; ++e)
      if (std::memcmp(v->data, v->data + e * v->bytes, size_t(v->bytes)) != 0) return false;
  }
  return true;
}

// View `v` at vmapped index e (loop), or all indices merged into its axis 0 (merge).
View at(const View& v, int64_t e, int64_t n, bool merge, bool batch_axis) {
  View r = v;
  if (!v.data) return r;
  if (merge) {
    if (batch_axis) r.dims[0] *= n;
  } else {
    r.data = v.data + e * v.bytes;
  }
  return r;
}

ffi::Error lead_of(const ffi::RemainingArgs& args, Lead& lead) {
  if (args.size() < 3) return ffi::Error::InvalidArgument("expected q, k, v");
  auto q = args.get<ffi::AnyBuffer>(0);
  if (!q.has_value()) return q.error();
  const auto d = q->dimensions();
  if (d.size() < 4) return ffi::Error::InvalidArgument("q must be (..., B, H, Nq, Dk)");
  lead.dims.assign(d.begin(), d.end() - 4);
  for (int64_t x : lead.dims) lead.n *= x;
  return ffi::Error::Success();
}

ffi::Error buffers(const ffi::RemainingArgs& args, size_t n, const Lead& lead, std::vector<View>& out,
                   const char* const* names, const size_t* cores) {
  out.resize(n);
  for (size_t i = 0; i < n; ++i) {
    auto b = args.get<ffi::AnyBuffer>(i);
    if (!b.has_value()) return b.error();
    ffi::Error e = view(*b, cores[i], lead, names[i], out[i]);
    if (!e.success()) return e;
  }
  return ffi::Error::Success();
}

Attrs attrs(double scale, double dropout_p, int64_t seed, int64_t threads, int64_t mask, int64_t has_bias,
            int64_t n_mods, ffi::Span<const int64_t> kinds, ffi::Span<const double> c, ffi::Span<const int64_t> m) {
  return Attrs{scale, dropout_p, seed, threads, mask, has_bias, n_mods, kinds, c, m};
}

ffi::Error forward_impl(ffi::RemainingArgs args, ffi::RemainingRets rets, double scale, double dropout_p, int64_t seed,
                        int64_t threads, int64_t mask, int64_t has_bias, int64_t n_mods,
                        ffi::Span<const int64_t> mod_kinds, ffi::Span<const double> mod_c,
                        ffi::Span<const int64_t> mod_m) {
  const Attrs a = attrs(scale, dropout_p, seed, threads, mask, has_bias, n_mods, mod_kinds, mod_c, mod_m);
  Lead lead;
  ffi::Error e = lead_of(args, lead);
  if (!e.success()) return e;
  static const char* const names[] = {"q", "k", "v"};
  static const size_t cores[] = {4, 4, 4};
  std::vector<View> in;
  e = buffers(args, 3, lead, in, names, cores);
  if (!e.success()) return e;
  Extras x;
  e = extras(args, 3, a, lead, x);
  if (!e.success()) return e;
  if (rets.size() != 2) return ffi::Error::InvalidArgument("expected 2 results (out, lse)");
  auto ro = rets.get<ffi::AnyBuffer>(0), rl = rets.get<ffi::AnyBuffer>(1);
  if (!ro.has_value()) return ro.error();
  if (!rl.has_value()) return rl.error();
  View out, lse;
  e = out_view(*ro, 4, lead, "out", out);
  if (!e.success()) return e;
  e = out_view(*rl, 3, lead, "lse", lse);
  if (!e.success()) return e;
  const int64_t B = in[0].dim(0);
  const bool merge =
      mergeable(lead, B, x, a, {&in[0], &in[1], &in[2], &x.rows, &x.tile_class, &x.bitmap_index, &x.bias});
  const int64_t calls = merge ? 1 : lead.n;
  for (int64_t c = 0; c < calls; ++c) {
    auto sl = [&](const View& v, bool batch) { return at(v, c, lead.n, merge, batch); };
    Extras xs{sl(x.rows, true),     sl(x.tile_class, true), sl(x.bitmap_index, true),
              sl(x.bitmaps, false), sl(x.bias, true),       {}};
    for (const View& t : x.tables) xs.tables.push_back(sl(t, false));
    Params P;
    std::vector<std::vector<double>> tables;
    e = fill(P, sl(in[0], true), sl(in[1], true), sl(in[2], true), xs, a, tables);
    if (!e.success()) return e;
    const View o = sl(out, true), l = sl(lse, true);
    const DType acc = P.dtype == DType::f64 ? DType::f64 : DType::f32;
    DType ot, lt;
    if (o.dims != std::vector<int64_t>{P.B, P.H, P.Nq, P.Dv} || !float_type(o.type, ot) || ot != P.dtype)
      return ffi::Error::InvalidArgument("out must be (B, H, Nq, Dv) in q's dtype");
    if (l.dims != std::vector<int64_t>{P.B, P.H, P.Nq} || !float_type(l.type, lt) || lt != acc)
      return ffi::Error::InvalidArgument("lse must be (B, H, Nq), float32 (float64 for float64)");
    P.out = o.data;
    P.lse = l.data;
    int64_t counts[2] = {0, 0};
    P.counts = counts;
    std::vector<uint8_t> kv_state(size_t(P.B * P.Hkv * P.nbk), 0);
    P.kv_state = kv_state.data();
    if (!current()->forward(P)) return ffi::Error::Internal("qkv: out of memory for the kernel's scratch");
  }
  return ffi::Error::Success();
}

ffi::Error backward_impl(ffi::RemainingArgs args, ffi::RemainingRets rets, double scale, double dropout_p, int64_t seed,
                         int64_t threads, int64_t mask, int64_t has_bias, int64_t n_mods,
                         ffi::Span<const int64_t> mod_kinds, ffi::Span<const double> mod_c,
                         ffi::Span<const int64_t> mod_m, int64_t has_dlse) {
  const Attrs a = attrs(scale, dropout_p, seed, threads, mask, has_bias, n_mods, mod_kinds, mod_c, mod_m);
  Lead lead;
  ffi::Error e = lead_of(args, lead);
  if (!e.success()) return e;
  static const char* const names[] = {"q", "k", "v", "out", "lse", "dout", "dlse"};
  static const size_t cores[] = {4, 4, 4, 4, 3, 4, 3};
  const size_t n = has_dlse ? 7 : 6;
  std::vector<View> in;
  e = buffers(args, n, lead, in, names, cores);
  if (!e.success()) return e;
  Extras x;
  e = extras(args, n, a, lead, x);
  if (!e.success()) return e;
  if (rets.size() != 3) return ffi::Error::InvalidArgument("expected 3 results (dq, dk, dv)");
  View g[3];
  static const char* const gnames[] = {"dq", "dk", "dv"};
  for (int i = 0; i < 3; ++i) {
    auto r = rets.get<ffi::AnyBuffer>(size_t(i));
    if (!r.has_value()) return r.error();
    e = out_view(*r, 4, lead, gnames[i], g[i]);
    if (!e.success()) return e;
  }
  const int64_t B = in[0].dim(0);
  std::vector<const View*> batched{&in[0], &in[1],  &in[2],        &in[3],          &in[4],
                                   &in[5], &x.rows, &x.tile_class, &x.bitmap_index, &x.bias};
  if (has_dlse) batched.push_back(&in[6]);
  const bool merge = mergeable(lead, B, x, a, batched);
  const int64_t calls = merge ? 1 : lead.n;
  for (int64_t c = 0; c < calls; ++c) {
    auto sl = [&](const View& v, bool batch) { return at(v, c, lead.n, merge, batch); };
    Extras xs{sl(x.rows, true),     sl(x.tile_class, true), sl(x.bitmap_index, true),
              sl(x.bitmaps, false), sl(x.bias, true),       {}};
    for (const View& t : x.tables) xs.tables.push_back(sl(t, false));
    Params P;
    std::vector<std::vector<double>> tables;
    e = fill(P, sl(in[0], true), sl(in[1], true), sl(in[2], true), xs, a, tables);
    if (!e.success()) return e;
    const DType acc = P.dtype == DType::f64 ? DType::f64 : DType::f32;
    const View o = sl(in[3], true), l = sl(in[4], true), d = sl(in[5], true);
    DType t1, t2, t3;
    if (o.dims != std::vector<int64_t>{P.B, P.H, P.Nq, P.Dv} || !float_type(o.type, t1) || t1 != P.dtype ||
        d.dims != o.dims || !float_type(d.type, t2) || t2 != P.dtype)
      return ffi::Error::InvalidArgument("out and dout must be (B, H, Nq, Dv) in q's dtype");
    if (l.dims != std::vector<int64_t>{P.B, P.H, P.Nq} || !float_type(l.type, t3) || t3 != acc)
      return ffi::Error::InvalidArgument("lse must be (B, H, Nq), float32 (float64 for float64)");
    P.out_s = strided(o);
    P.dout = d.data;
    P.dout_s = strided(d);
    P.lse_s = strided(l);
    if (has_dlse) {
      const View dl = sl(in[6], true);
      if (dl.dims != l.dims || !float_type(dl.type, P.dlse_dtype))
        return ffi::Error::InvalidArgument("dlse must be float (B, H, Nq)");
      P.dlse = dl.data;
      P.dlse_s = strided(dl);
    }
    const View gq = sl(g[0], true), gk = sl(g[1], true), gv = sl(g[2], true);
    const std::vector<int64_t> wq{P.B, P.H, P.Nq, P.Dk}, wk{P.B, P.Hkv, P.Nk, P.Dk}, wv{P.B, P.Hkv, P.Nk, P.Dv};
    DType a1, a2, a3;
    if (gq.dims != wq || gk.dims != wk || gv.dims != wv || !float_type(gq.type, a1) || !float_type(gk.type, a2) ||
        !float_type(gv.type, a3) || a1 != acc || a2 != acc || a3 != acc)
      return ffi::Error::InvalidArgument("dq, dk, dv must be shaped as q, k, v in float32 (float64 for float64)");
    P.dq = gq.data;
    P.dk = gk.data;
    P.dv = gv.data;
    int64_t counts[2] = {0, 0};
    P.counts = counts;
    if (!current()->backward(P)) return ffi::Error::Internal("qkv: out of memory for the kernel's scratch");
  }
  return ffi::Error::Success();
}

}  // namespace

// The operands and attributes both handlers take (the Attrs struct, in its order), written once.
static auto call_binding() {
  return ffi::Ffi::Bind()
      .RemainingArgs()
      .RemainingRets()
      .Attr<double>("scale")
      .Attr<double>("dropout_p")
      .Attr<int64_t>("seed")
      .Attr<int64_t>("threads")
      .Attr<int64_t>("mask")
      .Attr<int64_t>("has_bias")
      .Attr<int64_t>("n_mods")
      .Attr<ffi::Span<const int64_t>>("mod_kinds")
      .Attr<ffi::Span<const double>>("mod_c")
      .Attr<ffi::Span<const int64_t>>("mod_m");
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(QkvFfiForward, forward_impl, call_binding());
XLA_FFI_DEFINE_HANDLER_SYMBOL(QkvFfiBackward, backward_impl, call_binding().Attr<int64_t>("has_dlse"));

void* ffi_forward_handler() { return reinterpret_cast<void*>(QkvFfiForward); }
void* ffi_backward_handler() { return reinterpret_cast<void*>(QkvFfiBackward); }

}  // namespace qkv_native
