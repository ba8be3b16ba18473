// The checks of entrance.hpp, in the order a call is read: q, k, v (and the K/V format), the
// options (scale, threads, dropout, mask, bias, score mods), then the outputs (forward) or the
// backward's own arrays. The first failure refuses the call with a message naming the argument,
// the axis and the sizes (the only wording of these errors: Python's tests assert it).
#include "entrance.hpp"

#include <cmath>
#include <initializer_list>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "dispatch.hpp"
#include "dtypes.hpp"

namespace qkv_native {

int64_t ArrayView::size() const {
  int64_t n = 1;
  for (int i = 0; i < rank && i < kMaxRank; ++i) n *= shape[i];
  return n;
}

bool ArrayView::c_contiguous() const {
  int64_t expect = 1;
  for (int i = rank; i-- > 0;) {
    if (i >= kMaxRank) return false;
    if (shape[i] != 1 && strides[i] != expect) return false;
    expect *= shape[i];
  }
  return true;
}

namespace {

// A refused call, thrown by the checks below and caught by build_forward / build_backward.
struct Refusal : std::runtime_error {
  Status::Kind kind;
  Refusal(Status::Kind k, const std::string& m) : std::runtime_error(m), kind(k) {}
};
[[noreturn]] void shape_error(const std::string& m) { throw Refusal(Status::shape, m); }
[[noreturn]] void dtype_error(const std::string& m) { throw Refusal(Status::dtype, m); }
[[noreturn]] void argument_error(const std::string& m) { throw Refusal(Status::argument, m); }

std::string str(int64_t x) { return std::to_string(x); }

std::string shape_str(const ArrayView& a) {
  std::string s = "(";
  for (int i = 0; i < a.rank && i < kMaxRank; ++i) s += (i ? ", " : "") + str(a.shape[i]);
  if (a.rank > kMaxRank) s += ", ...";
  return s + (a.rank == 1 ? ",)" : ")");
}

// The float element types are Elem's first four; anything else is no DType.
bool float_dtype(Elem e, DType& out) {
  static constexpr DType kOf[] = {DType::f16, DType::bf16, DType::f32, DType::f64};
  static_assert(int(Elem::f64) == 3, "Elem's float types come first");
  if (int(e) > int(Elem::f64)) return false;
  out = kOf[int(e)];
  return true;
}

const char* dtype_str(DType d) { return kDTypeNames[int(d)]; }

// An axis's stride as Strided holds it: 0 on an axis of size 1 (whatever the host reported).
int64_t stride_of(const ArrayView& a, int i) { return i < a.rank && a.shape[i] != 1 ? a.strides[i] : 0; }

Strided strided(const ArrayView& a) {
  Strided s;
  s.data = a.data;
  s.s0 = stride_of(a, 0);
  s.s1 = stride_of(a, 1);
  s.s2 = stride_of(a, 2);
  s.s3 = stride_of(a, 3);
  return s;
}

// The axis names of each array, written once.
constexpr const char* kQ = "(B, H, Nq, Dk)";
constexpr const char* kK = "(B, Hkv, Nk, Dk)";
constexpr const char* kV = "(B, Hkv, Nk, Dv)";
constexpr const char* kOut = "(B, H, Nq, Dv)";
constexpr const char* kLse = "(B, H, Nq)";
constexpr const char* kTiles = "(Bm, Hm, nbq, nbk)";
constexpr const char* kRows = "(Bm, Hm, Nq, 2)";
constexpr const char* kBitmaps = "(n, BQ, ceil(BK/64))";
constexpr const char* kBias = "(B|1, H|1, Nq|1, Nk)";
constexpr const char* kScale = "(B|1, Hkv|1, Nk|1)";

void need_ndim(const ArrayView& a, const char* name, int nd, const char* axes) {
  if (a.rank != nd)
    shape_error(std::string(name) + " must be " + str(nd) + "-D " + axes + ", got shape " + shape_str(a));
}

void need_shape(const ArrayView& a, const char* name, std::initializer_list<int64_t> want, const char* axes) {
  int i = 0;
  for (int64_t w : want) {
    if (a.shape[i] != w) {
      std::string s = "(";
      int j = 0;
      for (int64_t x : want) s += (j++ ? ", " : "") + str(x);
      shape_error(std::string(name) + " must have shape " + axes + " = " + s + (want.size() == 1 ? ",)" : ")") +
                  ", got " + shape_str(a) + " (axis " + str(i) + ")");
    }
    ++i;
  }
}

void need_last_unit(const ArrayView& a, const char* name) {
  const int l = a.rank - 1;
  if (a.shape[l] > 1 && a.strides[l] != 1)
    shape_error(std::string(name) + ": the last axis must have stride 1 (got stride " + str(a.strides[l]) +
                " elements); copy it first, e.g. with .contiguous() / np.ascontiguousarray");
}

void need_type(const ArrayView& a, const char* name, Elem want) {
  if (a.type != want) dtype_error(std::string(name) + " must be " + elem_name(want) + ", got " + elem_name(a.type));
}

void need_contiguous(const ArrayView& a, const char* name) {
  if (!a.c_contiguous()) shape_error(std::string(name) + " must be C-contiguous");
}

// (Bm, Hm, ...) leading axes of a mask array: Bm in {1, B}, Hm in {1, H}.
void need_bh(const ArrayView& a, const char* name, int64_t B, int64_t H) {
  if (!(a.shape[0] == 1 || a.shape[0] == B))
    shape_error(std::string(name) + ": axis 0 must be 1 or B=" + str(B) + ", got shape " + shape_str(a));
  if (!(a.shape[1] == 1 || a.shape[1] == H))
    shape_error(std::string(name) + ": axis 1 must be 1 or H=" + str(H) + ", got shape " + shape_str(a));
}

// Each axis i of `a` is 1 (broadcast) or want[i]; the last one may be required at full size.
void need_broadcast(const ArrayView& a, const char* name, std::initializer_list<int64_t> want,
                    std::initializer_list<const char*> axis, bool last_full) {
  int i = 0;
  auto ax = axis.begin();
  const int n = int(want.size());
  for (int64_t w : want) {
    const bool full_only = last_full && i == n - 1;
    if (!(a.shape[i] == w || (!full_only && a.shape[i] == 1)))
      shape_error(std::string(name) + ": axis " + str(i) + " must be " + (full_only ? "" : "1 or ") + *ax + "=" +
                  str(w) + ", got shape " + shape_str(a));
    ++i;
    ++ax;
  }
}

// A written output: its shape, dtype and C order (the kernels write it densely).
void check_result(const ArrayView& a, const char* name, std::initializer_list<int64_t> want, const char* axes,
                  DType dt) {
  need_ndim(a, name, int(want.size()), axes);
  need_shape(a, name, want, axes);
  DType got;
  if (!float_dtype(a.type, got) || got != dt)
    dtype_error(std::string(name) + " must be " + dtype_str(dt) + ", got " + elem_name(a.type));
  if (!a.c_contiguous()) shape_error(std::string(name) + " must be C-contiguous (it is written in place)");
}

// The outputs are the host's writable arrays (nanobind's non-read-only ndarrays, XLA's results).
void* writable(const ArrayView& a) {
  return const_cast<void*>(a.data);  // NOLINT(cppcoreguidelines-pro-type-const-cast): see above
}

const char* kv_format_name(int64_t f) {
  return f >= 0 && f < int64_t(std::size(kKvFormatNames)) ? kKvFormatNames[f] : "unknown";
}

void check_kv_scale(const ArrayView& s, const char* name, const Params& P) {
  need_ndim(s, name, 3, kScale);
  need_type(s, name, Elem::f32);
  need_broadcast(s, name, {P.B, P.Hkv, P.Nk}, {"B", "Hkv", "Nk"}, false);
}

// How K and V are stored: in q's dtype (native), or quantized as int8 / float8 bits (as uint8).
void check_kv_dtype(Params& P, const CallArgs& a) {
  const ArrayView &q = a.q, &k = a.k, &v = a.v;
  if (a.kv_format < 0 || a.kv_format >= int64_t(std::size(kKvFormatNames)))
    argument_error("kv_format must be a KvFormat (0 native, 1 i8, 2 e4m3, 3 e5m2), got " + str(a.kv_format));
  P.kv_format = KvFormat(a.kv_format);
  if (P.kv_format == KvFormat::native) {
    DType dk_, dv_;
    if (!float_dtype(k.type, dk_) || dk_ != P.dtype || !float_dtype(v.type, dv_) || dv_ != P.dtype)
      dtype_error(std::string("q, k, v must have one dtype, got ") + elem_name(q.type) + ", " + elem_name(k.type) +
                  ", " + elem_name(v.type));
    return;
  }
  const Elem want = P.kv_format == KvFormat::i8 ? Elem::i8 : Elem::u8;
  if (k.type != want || v.type != want)
    dtype_error("k, v must be " + std::string(elem_name(want)) + " with kv_format=" + kv_format_name(a.kv_format) +
                ", got " + elem_name(k.type) + ", " + elem_name(v.type));
}

// A quantized cache's scales, one float32 per (B, Hkv, Nk) (broadcast where an axis is 1).
void check_kv_scales(Params& P, const CallArgs& a) {
  if (P.kv_format == KvFormat::native) {
    if (a.k_scale.given() || a.v_scale.given())
      argument_error("k_scale and v_scale scale a quantized K/V cache; with kv_format=native K and V are in q's dtype");
    return;
  }
  if (!a.k_scale.given() || !a.v_scale.given())
    argument_error(std::string("kv_format=") + kv_format_name(a.kv_format) + " needs k_scale and v_scale " + kScale);
  check_kv_scale(a.k_scale, "k_scale", P);
  check_kv_scale(a.v_scale, "v_scale", P);
  P.k_scale = strided(a.k_scale);
  P.v_scale = strided(a.v_scale);
}

void check_qkv(Params& P, const CallArgs& a) {
  const ArrayView &q = a.q, &k = a.k, &v = a.v;
  need_ndim(q, "q", 4, kQ);
  need_ndim(k, "k", 4, kK);
  need_ndim(v, "v", 4, kV);
  if (!float_dtype(q.type, P.dtype))
    dtype_error(std::string("q: dtype must be float32, float64, float16 or bfloat16, got ") + elem_name(q.type));
  check_kv_dtype(P, a);
  P.B = q.shape[0];
  P.H = q.shape[1];
  P.Nq = q.shape[2];
  P.Dk = q.shape[3];
  P.Hkv = k.shape[1];
  P.Nk = k.shape[2];
  P.Dv = v.shape[3];
  if (P.Nq < 1 || P.Dk < 1) shape_error("q: Nq and Dk must be >= 1, got shape " + shape_str(q));
  if (P.Nk < 1 || P.Hkv < 1) shape_error("k: Hkv and Nk must be >= 1, got shape " + shape_str(k));
  if (P.Dv < 1) shape_error("v: Dv must be >= 1, got shape " + shape_str(v));
  if (P.B < 1 || P.H < 1) shape_error("q: B and H must be >= 1, got shape " + shape_str(q));
  need_shape(k, "k", {P.B, P.Hkv, P.Nk, P.Dk}, kK);
  need_shape(v, "v", {P.B, P.Hkv, P.Nk}, "(B, Hkv, Nk)");
  if (P.H % P.Hkv != 0)
    shape_error("the query heads H=" + str(P.H) + " (q axis 1) must be a multiple of the kv heads Hkv=" + str(P.Hkv) +
                " (k axis 1)");
  need_last_unit(q, "q");
  need_last_unit(k, "k");
  need_last_unit(v, "v");
  check_kv_scales(P, a);
  P.q = strided(q);
  P.k = strided(k);
  P.v = strided(v);
}

void check_tiles(Params& P, const CallArgs& a) {
  if (a.tile_class.given()) {
    const ArrayView& t = a.tile_class;
    need_ndim(t, "tile_class", 4, kTiles);
    need_type(t, "tile_class", Elem::i8);
    need_bh(t, "tile_class", P.B, P.H);
    need_shape(t, "tile_class", {t.shape[0], t.shape[1], P.nbq, P.nbk}, kTiles);
    need_contiguous(t, "tile_class");
    const auto* d = static_cast<const int8_t*>(t.data);
    for (int64_t x = 0, n = t.size(); x < n; ++x)
      if (d[x] < EMPTY || d[x] > FULL)
        argument_error("tile_class values must be 0 (EMPTY), 1 (PARTIAL) or 2 (FULL), got " + str(d[x]));
    P.tile_class = d;
    P.tc_b = stride_of(t, 0);
    P.tc_h = stride_of(t, 1);
  }
  if (a.rows.given()) {
    const ArrayView& r = a.rows;
    need_ndim(r, "rows", 4, kRows);
    need_type(r, "rows", Elem::i32);
    need_bh(r, "rows", P.B, P.H);
    need_shape(r, "rows", {r.shape[0], r.shape[1], P.Nq, 2}, kRows);
    need_contiguous(r, "rows");
    P.rows = static_cast<const int32_t*>(r.data);
    P.rw_b = stride_of(r, 0);
    P.rw_h = stride_of(r, 1);
  }
  if (!a.bitmap_index.given() && !a.bitmaps.given()) return;
  if (!a.bitmap_index.given() || !a.bitmaps.given()) argument_error("bitmap_index and bitmaps must be given together");
  if (!a.tile_class.given()) argument_error("bitmap_index needs tile_class (bitmaps apply in PARTIAL tiles only)");
  const ArrayView &bi = a.bitmap_index, &bm = a.bitmaps;
  need_ndim(bi, "bitmap_index", 4, kTiles);
  need_type(bi, "bitmap_index", Elem::i32);
  need_bh(bi, "bitmap_index", P.B, P.H);
  need_shape(bi, "bitmap_index", {bi.shape[0], bi.shape[1], P.nbq, P.nbk}, kTiles);
  need_contiguous(bi, "bitmap_index");
  need_ndim(bm, "bitmaps", 3, kBitmaps);
  need_type(bm, "bitmaps", Elem::u64);
  P.words = (P.bk + 63) / 64;
  need_shape(bm, "bitmaps", {bm.shape[0], P.bq, P.words}, kBitmaps);
  need_contiguous(bm, "bitmaps");
  P.n_bitmaps = bm.shape[0];
  const auto* d = static_cast<const int32_t*>(bi.data);
  for (int64_t x = 0, n = bi.size(); x < n; ++x)
    if (d[x] < -1 || d[x] >= P.n_bitmaps)
      argument_error("bitmap_index values must be -1 or in [0, " + str(P.n_bitmaps) + "), got " + str(d[x]));
  P.bitmap_index = d;
  P.bi_b = stride_of(bi, 0);
  P.bi_h = stride_of(bi, 1);
  P.bitmaps = static_cast<const uint64_t*>(bm.data);
}

void check_bias(Params& P, const ArrayView& b) {
  if (!b.given()) return;
  need_ndim(b, "bias", 4, kBias);
  if (!float_dtype(b.type, P.bias_dtype))
    dtype_error(std::string("bias must be a float array, got ") + elem_name(b.type));
  need_broadcast(b, "bias", {P.B, P.H, P.Nq, P.Nk}, {"B", "H", "Nq", "Nk"}, true);
  P.bias = strided(b);
  P.has_bias = true;
}

// A mod's table as a contiguous float64 copy (B x H x (2M+1) at most: tiny), read through its strides.
std::vector<double> table_copy(const ArrayView& a, DType dt, int64_t n0, int64_t n1, const std::string& where) {
  std::vector<double> buf(size_t(n0 * n1));
  const int64_t s0 = a.rank == 1 ? 0 : stride_of(a, 0), s1 = a.rank == 1 ? stride_of(a, 0) : stride_of(a, 1);
  for (int64_t x0 = 0; x0 < n0; ++x0)
    for (int64_t x1 = 0; x1 < n1; ++x1) {
      const double x = load_any(a.data, x0 * s0 + x1 * s1, dt);
      if (!std::isfinite(x)) argument_error(where + ": the table holds NaN or inf");
      buf[size_t(x0 * n1 + x1)] = x;
    }
  return buf;
}

void check_mods(KernelCall& c, const std::vector<ModArg>& mods) {
  Params& P = c.P;
  const size_t nm = mods.size();
  if (nm > size_t(kMaxMods)) argument_error("at most " + str(kMaxMods) + " mods, got " + str(int64_t(nm)));
  c.tables.reserve(nm);
  static const char* const kModNames[] = {"mul", "softcap", "alibi", "relbias"};  // ModKind order
  for (size_t x = 0; x < nm; ++x) {
    const ModArg& arg = mods[x];
    if (arg.kind < MOD_MUL || arg.kind > MOD_RELBIAS)
      argument_error("mods[" + str(int64_t(x)) + "]: unknown mod kind " + str(arg.kind) +
                     "; expected a ModKind (MUL, SOFTCAP, ALIBI or RELBIAS)");
    Mod& m = P.mods[x];
    m.kind = int(arg.kind);
    const std::string where = "mods[" + str(int64_t(x)) + "] (" + kModNames[arg.kind] + ")";
    if (!mod_has_table(m.kind)) {
      m.c = arg.c;
      if (!std::isfinite(m.c) || (m.kind == MOD_SOFTCAP && !(m.c > 0)))
        argument_error(where + ": c must be finite" +
                       (m.kind == MOD_SOFTCAP ? std::string(" and > 0") : std::string()));
      if (arg.table.given()) argument_error(where + ": takes no table");
      continue;
    }
    const ArrayView& t = arg.table;
    if (!t.given()) argument_error(where + ": needs its table");
    DType tdt;
    if (!float_dtype(t.type, tdt)) dtype_error(where + ": table must be float, got " + elem_name(t.type));
    const bool alibi = m.kind == MOD_ALIBI;
    int64_t nb = 1, nh = 0, width = 1;
    if (alibi) {
      if (t.rank == 1) {
        nh = t.shape[0];
      } else if (t.rank == 2) {
        nb = t.shape[0];
        nh = t.shape[1];
      } else {
        shape_error(where + ": slopes must be (Hm,) or (Bm, Hm), got shape " + shape_str(t));
      }
      if (!(nb == 1 || nb == P.B))
        shape_error(where + ": slopes axis 0 must be 1 or B=" + str(P.B) + ", got " + shape_str(t));
    } else {
      m.m = arg.m;
      if (m.m < 0) argument_error(where + ": M must be >= 0, got " + str(m.m));
      if (t.rank != 2) shape_error(where + ": table must be (Hm, 2M+1), got shape " + shape_str(t));
      nh = t.shape[0];
      width = t.shape[1];
      if (width != 2 * m.m + 1)
        shape_error(where + ": table axis 1 must be 2M+1=" + str(2 * m.m + 1) + ", got shape " + shape_str(t));
    }
    if (!(nh == 1 || nh == P.H))
      shape_error(where + ": head axis must be 1 or H=" + str(P.H) + ", got shape " + shape_str(t));
    c.tables.push_back(alibi ? table_copy(t, tdt, nb, nh, where) : table_copy(t, tdt, nh, width, where));
    m.table = c.tables.back().data();
    m.tb_b = alibi && nb != 1 ? nh : 0;
    m.tb_h = nh == 1 ? 0 : alibi ? 1 : width;
  }
  P.n_mods = int(nm);
}

// Everything both directions share: q, k, v, their storage, and the options.
void check_call(KernelCall& c, const CallArgs& a) {
  Params& P = c.P;
  check_qkv(P, a);
  if (!std::isfinite(a.scale)) argument_error("scale must be finite, got " + std::to_string(a.scale));
  P.scale = a.scale;
  if (a.threads < 1 || a.threads > kMaxThreads)
    argument_error("threads must be in [1, " + str(kMaxThreads) + "], got " + str(a.threads));
  P.threads = int(a.threads);
  P.parallel = parallel_fn();
  P.prefetch = decode_prefetch();
  if (!(a.dropout_p >= 0.0 && a.dropout_p < 1.0))
    argument_error("dropout_p must be in [0, 1), got " + std::to_string(a.dropout_p));
  P.dropout_p = a.dropout_p;
  P.seed = a.seed;
  P.bq = tile_rows(P.Nq);
  P.bk = kBlockK;
  P.nbq = (P.Nq + P.bq - 1) / P.bq;
  P.nbk = (P.Nk + P.bk - 1) / P.bk;
  check_tiles(P, a);
  check_bias(P, a.bias);
  check_mods(c, a.mods);
}

DType acc_dtype(DType d) { return d == DType::f64 ? DType::f64 : DType::f32; }

void check_forward(KernelCall& c, const CallArgs& a) {
  check_call(c, a);
  Params& P = c.P;
  const DType acc = acc_dtype(P.dtype);
  check_result(a.out, "out", {P.B, P.H, P.Nq, P.Dv}, kOut, P.dtype);
  check_result(a.lse, "lse", {P.B, P.H, P.Nq}, kLse, acc);
  P.out = writable(a.out);
  P.lse = writable(a.lse);
  if (a.lse_lo.given()) {
    check_result(a.lse_lo, "lse_lo", {P.B, P.H, P.Nq}, kLse, acc);
    P.lse_lo = writable(a.lse_lo);
  }
}

// An input of the backward in q's dtype, shaped (B, H, Nq, Dv), read row by row.
void check_row_input(const ArrayView& x, const char* name, const Params& P) {
  need_ndim(x, name, 4, kOut);
  need_shape(x, name, {P.B, P.H, P.Nq, P.Dv}, kOut);
  DType got;
  if (!float_dtype(x.type, got) || got != P.dtype)
    dtype_error(std::string(name) + " must have q's dtype " + dtype_str(P.dtype) + ", got " + elem_name(x.type));
  need_last_unit(x, name);
}

void check_backward(KernelCall& c, const CallArgs& a) {
  check_call(c, a);
  Params& P = c.P;
  if (P.kv_format != KvFormat::native)
    argument_error("the backward takes K and V in q's dtype (kv_format=native): a quantized cache has no gradient");
  const DType acc = acc_dtype(P.dtype);
  check_row_input(a.out, "out", P);
  check_row_input(a.dout, "dout", P);
  need_ndim(a.lse, "lse", 3, kLse);
  need_shape(a.lse, "lse", {P.B, P.H, P.Nq}, kLse);
  DType got;
  if (!float_dtype(a.lse.type, got) || got != acc)
    dtype_error(std::string("lse must be ") + dtype_str(acc) + ", got " + elem_name(a.lse.type));
  if (a.lse_lo.given()) {
    need_ndim(a.lse_lo, "lse_lo", 3, kLse);
    need_shape(a.lse_lo, "lse_lo", {P.B, P.H, P.Nq}, kLse);
    if (!float_dtype(a.lse_lo.type, got) || got != acc)
      dtype_error(std::string("lse_lo must be ") + dtype_str(acc) + ", got " + elem_name(a.lse_lo.type));
    P.lse_lo_s = strided(a.lse_lo);
  }
  if (a.dlse.given()) {
    need_ndim(a.dlse, "dlse", 3, kLse);
    need_shape(a.dlse, "dlse", {P.B, P.H, P.Nq}, kLse);
    if (!float_dtype(a.dlse.type, P.dlse_dtype))
      dtype_error(std::string("dlse must be float, got ") + elem_name(a.dlse.type));
    P.dlse = a.dlse.data;
    P.dlse_s = strided(a.dlse);
  }
  check_result(a.dq, "dq", {P.B, P.H, P.Nq, P.Dk}, kQ, acc);
  check_result(a.dk, "dk", {P.B, P.Hkv, P.Nk, P.Dk}, kK, acc);
  check_result(a.dv, "dv", {P.B, P.Hkv, P.Nk, P.Dv}, kV, acc);
  P.out_s = strided(a.out);
  P.dout = a.dout.data;
  P.dout_s = strided(a.dout);
  P.lse_s = strided(a.lse);
  P.dq = writable(a.dq);
  P.dk = writable(a.dk);
  P.dv = writable(a.dv);
}

template <class Check>
Status build(const CallArgs& a, KernelCall& c, Check check) {
  try {
    check(c, a);
  } catch (const Refusal& r) { return Status{r.kind, r.what()}; }
  return Status{};
}

}  // namespace

Status build_forward(const CallArgs& a, KernelCall& c) { return build(a, c, check_forward); }
Status build_backward(const CallArgs& a, KernelCall& c) { return build(a, c, check_backward); }

bool run_forward(Params& P, int64_t (&counts)[2]) {
  counts[0] = counts[1] = 0;
  P.counts = counts;
  std::vector<uint8_t> kv_state(size_t(P.B * P.Hkv * P.nbk), 0);  // the K/V tiles' verdicts (finite.hpp)
  P.kv_state = kv_state.data();
  const bool ok = current()->forward(P);
  P.kv_state = nullptr;
  return ok;
}

bool run_backward(Params& P, int64_t (&counts)[2]) {
  counts[0] = counts[1] = 0;
  P.counts = counts;
  return current()->backward(P);
}

}  // namespace qkv_native
