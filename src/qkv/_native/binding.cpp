// The only file that knows Python. Every array arrives as an nb::ndarray (NumPy through the buffer
// protocol, torch / JAX through DLPack; no copies), is checked here -- ndim, shape, dtype, strides,
// index ranges -- and a bad argument raises ValueError / TypeError naming the argument, the axis
// and the sizes, never reaching a kernel. Then the GIL is released and one C++ entry runs.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "dispatch.hpp"
#ifdef QKV_HAVE_XLA_FFI
#include "ffi.hpp"
#endif
#include "params.hpp"
#include "philox.hpp"

namespace nb = nanobind;
using namespace qkv_native;

namespace {

using In = nb::ndarray<nb::ro, nb::device::cpu>;
using Out = nb::ndarray<nb::device::cpu>;

std::string shape_str(const In& a) {
  std::string s = "(";
  for (size_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + (a.ndim() == 1 ? ",)" : ")");
}
std::string shape_str(const Out& a) {
  std::string s = "(";
  for (size_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

[[noreturn]] void value_error(const std::string& m) { throw nb::value_error(m.c_str()); }
[[noreturn]] void type_error(const std::string& m) { throw nb::type_error(m.c_str()); }

In as_array(nb::handle o, const char* name) {
  try {
    return nb::cast<In>(o);
  } catch (const std::exception&) {
    type_error(std::string(name) + " must be a CPU array (NumPy, torch or JAX), got " +
               nb::cast<std::string>(nb::str(o.type())));
  }
}

const char* dtype_name(nb::dlpack::dtype t) {
  using C = nb::dlpack::dtype_code;
  if (t.lanes != 1) return "vector";
  if (t.code == uint8_t(C::Float))
    return t.bits == 16 ? "float16" : t.bits == 32 ? "float32" : t.bits == 64 ? "float64" : "float";
  if (t.code == uint8_t(C::Bfloat) && t.bits == 16) return "bfloat16";
  if (t.code == uint8_t(C::Int)) return t.bits == 8 ? "int8" : t.bits == 32 ? "int32" : t.bits == 64 ? "int64" : "int";
  if (t.code == uint8_t(C::UInt)) return t.bits == 8 ? "uint8" : t.bits == 64 ? "uint64" : "uint";
  if (t.code == uint8_t(C::Bool)) return "bool";
  return "unsupported";
}

bool float_dtype(nb::dlpack::dtype t, DType& out) {
  using C = nb::dlpack::dtype_code;
  if (t.lanes != 1) return false;
  if (t.code == uint8_t(C::Float) && t.bits == 32) {
    out = DType::f32;
    return true;
  }
  if (t.code == uint8_t(C::Float) && t.bits == 64) {
    out = DType::f64;
    return true;
  }
  if (t.code == uint8_t(C::Float) && t.bits == 16) {
    out = DType::f16;
    return true;
  }
  if (t.code == uint8_t(C::Bfloat) && t.bits == 16) {
    out = DType::bf16;
    return true;
  }
  return false;
}

bool is_dtype(nb::dlpack::dtype t, nb::dlpack::dtype_code code, int bits) {
  return t.lanes == 1 && t.code == uint8_t(code) && t.bits == bits;
}

template <class A>
int64_t stride_of(const A& a, size_t i) {
  return a.shape(i) == 1 ? 0 : a.stride(i);
}

template <class A>
bool c_contiguous(const A& a) {
  int64_t expect = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expect) return false;
    expect *= int64_t(a.shape(i));
  }
  return true;
}

void need_ndim(const In& a, const char* name, size_t nd, const char* axes) {
  if (a.ndim() != nd)
    value_error(std::string(name) + " must be " + std::to_string(nd) + "-D " + axes + ", got shape " + shape_str(a));
}
void need_ndim(const Out& a, const char* name, size_t nd, const char* axes) {
  if (a.ndim() != nd)
    value_error(std::string(name) + " must be " + std::to_string(nd) + "-D " + axes + ", got shape " + shape_str(a));
}

template <class A>
void need_shape(const A& a, const char* name, const std::vector<int64_t>& want, const char* axes) {
  for (size_t i = 0; i < want.size(); ++i)
    if (int64_t(a.shape(i)) != want[i]) {
      std::string w = "(";
      for (size_t j = 0; j < want.size(); ++j) w += (j ? ", " : "") + std::to_string(want[j]);
      value_error(std::string(name) + " must have shape " + axes + " = " + w + (want.size() == 1 ? ",)" : ")") +
                  ", got " + shape_str(a) + " (axis " + std::to_string(i) + ")");
    }
}

void need_last_unit(const In& a, const char* name) {
  const size_t l = a.ndim() - 1;
  if (a.shape(l) > 1 && a.stride(l) != 1)
    value_error(std::string(name) + ": the last axis must have stride 1 (got stride " + std::to_string(a.stride(l)) +
                " elements); copy it first, e.g. with .contiguous() / np.ascontiguousarray");
}

Strided strided4(const In& a) {
  Strided s;
  s.data = a.data();
  s.s0 = stride_of(a, 0);
  s.s1 = stride_of(a, 1);
  s.s2 = stride_of(a, 2);
  s.s3 = a.ndim() > 3 ? stride_of(a, 3) : 0;
  return s;
}

// (Bm, Hm, ...) broadcast leading axes of a mask array: Bm in {1, B}, Hm in {1, H}.
template <class A>
void need_bh(const A& a, const char* name, int64_t B, int64_t H) {
  if (!(a.shape(0) == 1 || int64_t(a.shape(0)) == B))
    value_error(std::string(name) + ": axis 0 must be 1 or B=" + std::to_string(B) + ", got shape " + shape_str(a));
  if (!(a.shape(1) == 1 || int64_t(a.shape(1)) == H))
    value_error(std::string(name) + ": axis 1 must be 1 or H=" + std::to_string(H) + ", got shape " + shape_str(a));
}

struct KernelCall {
  Params P;
  std::vector<std::vector<double>> tables;  // float64 copies of mod tables (tiny)
};

// ----------------------------------------------------------- common argument checks

double number(nb::handle o, const std::string& what) {
  if (!(nb::isinstance<nb::float_>(o) || nb::isinstance<nb::int_>(o)) || nb::isinstance<nb::bool_>(o))
    type_error(what + " must be a number, got " + nb::cast<std::string>(nb::str(o.type())));
  return nb::cast<double>(o);
}

void check_qkv(Params& P, const In& q, const In& k, const In& v) {
  need_ndim(q, "q", 4, "(B, H, Nq, Dk)");
  need_ndim(k, "k", 4, "(B, Hkv, Nk, Dk)");
  need_ndim(v, "v", 4, "(B, Hkv, Nk, Dv)");
  if (!float_dtype(q.dtype(), P.dtype))
    type_error(std::string("q: dtype must be float32, float64, float16 or bfloat16, got ") + dtype_name(q.dtype()));
  DType dk_, dv_;
  if (!float_dtype(k.dtype(), dk_) || dk_ != P.dtype || !float_dtype(v.dtype(), dv_) || dv_ != P.dtype)
    type_error(std::string("q, k, v must have one dtype, got ") + dtype_name(q.dtype()) + ", " + dtype_name(k.dtype()) +
               ", " + dtype_name(v.dtype()));
  P.B = int64_t(q.shape(0));
  P.H = int64_t(q.shape(1));
  P.Nq = int64_t(q.shape(2));
  P.Dk = int64_t(q.shape(3));
  P.Hkv = int64_t(k.shape(1));
  P.Nk = int64_t(k.shape(2));
  P.Dv = int64_t(v.shape(3));
  if (P.Nq < 1 || P.Dk < 1) value_error("q: Nq and Dk must be >= 1, got shape " + shape_str(q));
  if (P.Nk < 1 || P.Hkv < 1) value_error("k: Hkv and Nk must be >= 1, got shape " + shape_str(k));
  if (P.Dv < 1) value_error("v: Dv must be >= 1, got shape " + shape_str(v));
  if (P.B < 1 || P.H < 1) value_error("q: B and H must be >= 1, got shape " + shape_str(q));
  need_shape(k, "k", {P.B, P.Hkv, P.Nk, P.Dk}, "(B, Hkv, Nk, Dk)");
  need_shape(v, "v", {P.B, P.Hkv, P.Nk}, "(B, Hkv, Nk)");
  if (P.H % P.Hkv != 0)
    value_error("the query heads H=" + std::to_string(P.H) +
                " (q axis 1) must be a multiple of the kv heads Hkv=" + std::to_string(P.Hkv) + " (k axis 1)");
  need_last_unit(q, "q");
  need_last_unit(k, "k");
  need_last_unit(v, "v");
  P.q = strided4(q);
  P.k = strided4(k);
  P.v = strided4(v);
}

void check_options(KernelCall& c, double scale, const nb::object& tile_class, const nb::object& rows,
                   const nb::object& bitmap_index, const nb::object& bitmaps, const nb::object& mods,
                   const nb::object& bias, double dropout_p, uint64_t seed, int threads, std::vector<In>& keep) {
  Params& P = c.P;
  if (!std::isfinite(scale)) value_error("scale must be finite, got " + std::to_string(scale));
  P.scale = scale;
  if (threads < 1 || threads > kMaxThreads)
    value_error("threads must be in [1, " + std::to_string(kMaxThreads) + "], got " + std::to_string(threads));
  P.threads = threads;
  P.parallel = parallel_fn();
  if (!(dropout_p >= 0.0 && dropout_p < 1.0))
    value_error("dropout_p must be in [0, 1), got " + std::to_string(dropout_p));
  P.dropout_p = dropout_p;
  P.seed = seed;
  if (P.Nq <= kDecodeMaxNq) P.bq = kDecodeMaxNq;
  P.bk = kBlockK;
  P.nbq = (P.Nq + P.bq - 1) / P.bq;
  P.nbk = (P.Nk + P.bk - 1) / P.bk;
  using DC = nb::dlpack::dtype_code;
  if (!tile_class.is_none()) {
    In t = as_array(tile_class, "tile_class");
    keep.push_back(t);
    need_ndim(t, "tile_class", 4, "(Bm, Hm, nbq, nbk)");
    if (!is_dtype(t.dtype(), DC::Int, 8))
      type_error(std::string("tile_class must be int8, got ") + dtype_name(t.dtype()));
    need_bh(t, "tile_class", P.B, P.H);
    need_shape(t, "tile_class", {int64_t(t.shape(0)), int64_t(t.shape(1)), P.nbq, P.nbk}, "(Bm, Hm, nbq, nbk)");
    if (!c_contiguous(t)) value_error("tile_class must be C-contiguous");
    const int8_t* d = static_cast<const int8_t*>(t.data());
    for (size_t x = 0; x < t.size(); ++x)
      if (d[x] < 0 || d[x] > 2)
        value_error("tile_class values must be 0 (EMPTY), 1 (PARTIAL) or 2 (FULL), got " + std::to_string(int(d[x])));
    P.tile_class = d;
    P.tc_b = stride_of(t, 0);
    P.tc_h = stride_of(t, 1);
  }
  if (!rows.is_none()) {
    In r = as_array(rows, "rows");
    keep.push_back(r);
    need_ndim(r, "rows", 4, "(Bm, Hm, Nq, 2)");
    if (!is_dtype(r.dtype(), DC::Int, 32)) type_error(std::string("rows must be int32, got ") + dtype_name(r.dtype()));
    need_bh(r, "rows", P.B, P.H);
    need_shape(r, "rows", {int64_t(r.shape(0)), int64_t(r.shape(1)), P.Nq, 2}, "(Bm, Hm, Nq, 2)");
    if (!c_contiguous(r)) value_error("rows must be C-contiguous");
    P.rows = static_cast<const int32_t*>(r.data());
    P.rw_b = stride_of(r, 0);
    P.rw_h = stride_of(r, 1);
  }
  if (!bitmap_index.is_none() || !bitmaps.is_none()) {
    if (bitmap_index.is_none() || bitmaps.is_none()) value_error("bitmap_index and bitmaps must be given together");
    if (tile_class.is_none()) value_error("bitmap_index needs tile_class (bitmaps apply in PARTIAL tiles only)");
    In bi = as_array(bitmap_index, "bitmap_index"), bm = as_array(bitmaps, "bitmaps");
    keep.push_back(bi);
    keep.push_back(bm);
    need_ndim(bi, "bitmap_index", 4, "(Bm, Hm, nbq, nbk)");
    if (!is_dtype(bi.dtype(), DC::Int, 32))
      type_error(std::string("bitmap_index must be int32, got ") + dtype_name(bi.dtype()));
    need_bh(bi, "bitmap_index", P.B, P.H);
    need_shape(bi, "bitmap_index", {int64_t(bi.shape(0)), int64_t(bi.shape(1)), P.nbq, P.nbk}, "(Bm, Hm, nbq, nbk)");
    if (!c_contiguous(bi)) value_error("bitmap_index must be C-contiguous");
    need_ndim(bm, "bitmaps", 3, "(n, BQ, ceil(BK/64))");
    if (!is_dtype(bm.dtype(), DC::UInt, 64))
      type_error(std::string("bitmaps must be uint64, got ") + dtype_name(bm.dtype()));
    P.words = (P.bk + 63) / 64;
    need_shape(bm, "bitmaps", {int64_t(bm.shape(0)), P.bq, P.words}, "(n, BQ, ceil(BK/64))");
    if (!c_contiguous(bm)) value_error("bitmaps must be C-contiguous");
    P.n_bitmaps = int64_t(bm.shape(0));
    const int32_t* d = static_cast<const int32_t*>(bi.data());
    for (size_t x = 0; x < bi.size(); ++x)
      if (d[x] < -1 || d[x] >= P.n_bitmaps)
        value_error("bitmap_index values must be -1 or in [0, " + std::to_string(P.n_bitmaps) + "), got " +
                    std::to_string(d[x]));
    P.bitmap_index = d;
    P.bi_b = stride_of(bi, 0);
    P.bi_h = stride_of(bi, 1);
    P.bitmaps = static_cast<const uint64_t*>(bm.data());
  }
  if (!bias.is_none()) {
    In b = as_array(bias, "bias");
    keep.push_back(b);
    need_ndim(b, "bias", 4, "(B|1, H|1, Nq|1, Nk)");
    if (!float_dtype(b.dtype(), P.bias_dtype))
      type_error(std::string("bias must be a float array, got ") + dtype_name(b.dtype()));
    const int64_t want[4] = {P.B, P.H, P.Nq, P.Nk};
    const char* axis[4] = {"B", "H", "Nq", "Nk"};
    for (int i = 0; i < 4; ++i)
      if (!(int64_t(b.shape(i)) == want[i] || (i < 3 && b.shape(i) == 1)))
        value_error("bias: axis " + std::to_string(i) + " must be " + (i < 3 ? "1 or " : "") + axis[i] + "=" +
                    std::to_string(want[i]) + ", got shape " + shape_str(b));
    P.bias = strided4(b);
    P.has_bias = true;
  }
  // Each mod is a qkv._native.KernelMod, a tuple (kind, c, table, m): kind a ModKind, c the constant of
  // MUL / SOFTCAP, table the slopes of ALIBI or the table of RELBIAS, m RELBIAS's clip radius M.
  if (!nb::isinstance<nb::sequence>(mods)) type_error("mods must be a sequence of qkv._native.KernelMod");
  nb::sequence ms = nb::borrow<nb::sequence>(mods);
  const size_t nm = nb::len(ms);
  if (nm > size_t(kMaxMods)) value_error("at most " + std::to_string(kMaxMods) + " mods, got " + std::to_string(nm));
  c.tables.reserve(nm);
  static const char* const kModNames[] = {"mul", "softcap", "alibi", "relbias"};  // ModKind order
  for (size_t x = 0; x < nm; ++x) {
    nb::object item = ms[x];
    if (!nb::isinstance<nb::tuple>(item) || nb::len(item) != 4 ||
        !nb::isinstance<nb::int_>(nb::borrow<nb::tuple>(item)[0]))
      type_error("mods[" + std::to_string(x) + "] must be a qkv._native.KernelMod (kind, c, table, m), got " +
                 nb::cast<std::string>(nb::repr(item)));
    nb::tuple t = nb::borrow<nb::tuple>(item);
    const int64_t kind = nb::cast<int64_t>(t[0]);
    if (kind < MOD_MUL || kind > MOD_RELBIAS)
      value_error("mods[" + std::to_string(x) + "]: unknown mod kind " + std::to_string(kind) +
                  "; expected a ModKind (MUL, SOFTCAP, ALIBI or RELBIAS)");
    Mod& m = P.mods[x];
    m.kind = int(kind);
    const std::string where = "mods[" + std::to_string(x) + "] (" + kModNames[kind] + ")";
    if (m.kind == MOD_MUL || m.kind == MOD_SOFTCAP) {
      m.c = number(t[1], where + ": c");
      if (!std::isfinite(m.c) || (m.kind == MOD_SOFTCAP && !(m.c > 0)))
        value_error(where + ": c must be finite" + (m.kind == MOD_SOFTCAP ? std::string(" and > 0") : std::string()));
      if (!t[2].is_none()) value_error(where + ": takes no table");
    } else {
      const bool alibi = m.kind == MOD_ALIBI;
      In a = as_array(t[2], "mods table");
      keep.push_back(a);
      DType tdt;
      if (!float_dtype(a.dtype(), tdt)) type_error(where + ": table must be float, got " + dtype_name(a.dtype()));
      int64_t nb_ = 1, nh = 0, width = 1;
      if (alibi) {
        if (a.ndim() == 1)
          nh = int64_t(a.shape(0));
        else if (a.ndim() == 2) {
          nb_ = int64_t(a.shape(0));
          nh = int64_t(a.shape(1));
        } else
          value_error(where + ": slopes must be (Hm,) or (Bm, Hm), got shape " + shape_str(a));
        if (!(nb_ == 1 || nb_ == P.B))
          value_error(where + ": slopes axis 0 must be 1 or B=" + std::to_string(P.B) + ", got " + shape_str(a));
      } else {
        if (!nb::isinstance<nb::int_>(t[3])) type_error(where + ": M must be an int");
        m.m = nb::cast<int64_t>(t[3]);
        if (m.m < 0) value_error(where + ": M must be >= 0, got " + std::to_string(m.m));
        if (a.ndim() != 2) value_error(where + ": table must be (Hm, 2M+1), got shape " + shape_str(a));
        nh = int64_t(a.shape(0));
        width = int64_t(a.shape(1));
        if (width != 2 * m.m + 1)
          value_error(where + ": table axis 1 must be 2M+1=" + std::to_string(2 * m.m + 1) + ", got shape " +
                      shape_str(a));
      }
      if (!(nh == 1 || nh == P.H))
        value_error(where + ": head axis must be 1 or H=" + std::to_string(P.H) + ", got shape " + shape_str(a));
      // tiny: copy to contiguous float64 (B x H x width at most)
      std::vector<double> buf(size_t(nb_ * nh * width));
      const Strided s = [&] {
        Strided r;
        r.data = a.data();
        r.s0 = stride_of(a, 0);
        r.s1 = a.ndim() > 1 ? stride_of(a, 1) : 0;
        return r;
      }();
      for (int64_t x0 = 0; x0 < (alibi ? nb_ : nh); ++x0)
        for (int64_t x1 = 0; x1 < (alibi ? nh : width); ++x1) {
          const int64_t off = a.ndim() == 1 ? x1 * s.s0 : x0 * s.s0 + x1 * s.s1;
          buf[size_t(x0 * (alibi ? nh : width) + x1)] = [&] {
            switch (tdt) {
              case DType::f32:
                return double(static_cast<const float*>(s.data)[off]);
              case DType::f64:
                return static_cast<const double*>(s.data)[off];
              default: {
                uint16_t u = static_cast<const uint16_t*>(s.data)[off];
                if (tdt == DType::bf16) {
                  uint32_t w = uint32_t(u) << 16;
                  float f;
                  std::memcpy(&f, &w, 4);
                  return double(f);
                }
                // float16 -> float
                const uint32_t sign = uint32_t(u & 0x8000u) << 16, e = (u >> 10) & 0x1fu, mm = u & 0x3ffu;
                if (e == 0) return (sign ? -1.0 : 1.0) * double(mm) * 5.9604644775390625e-08;
                uint32_t w = e == 31 ? (sign | 0x7f800000u | (mm << 13)) : (sign | ((e + 112u) << 23) | (mm << 13));
                float f;
                std::memcpy(&f, &w, 4);
                return double(f);
              }
            }
          }();
        }
      for (double x : buf)
        if (!std::isfinite(x)) value_error(where + ": the table holds NaN or inf");
      c.tables.push_back(std::move(buf));
      m.table = c.tables.back().data();
      if (alibi) {
        m.tb_b = nb_ == 1 ? 0 : nh;
        m.tb_h = nh == 1 ? 0 : 1;
      } else {
        m.tb_b = 0;
        m.tb_h = nh == 1 ? 0 : width;
      }
    }
  }
  P.n_mods = int(nm);
}

void check_out(const Out& a, const char* name, const std::vector<int64_t>& want, const char* axes, DType dt,
               const char* dtname) {
  need_ndim(a, name, want.size(), axes);
  need_shape(a, name, want, axes);
  DType got;
  if (!float_dtype(a.dtype(), got) || got != dt)
    type_error(std::string(name) + " must be " + dtname + ", got " + dtype_name(a.dtype()));
  if (!c_contiguous(a)) value_error(std::string(name) + " must be C-contiguous (it is written in place)");
}

const char* dtype_str(DType d) {
  return d == DType::f32 ? "float32" : d == DType::f64 ? "float64" : d == DType::f16 ? "float16" : "bfloat16";
}

// Both entries return (rows written NaN for a non-finite input, rows whose finite inputs overflowed).
using Counts = std::tuple<int64_t, int64_t>;

Counts forward(const In& q, const In& k, const In& v, const Out& out, const Out& lse, double scale,
               const nb::object& tile_class, const nb::object& rows, const nb::object& bitmap_index,
               const nb::object& bitmaps, const nb::object& mods, const nb::object& bias, double dropout_p,
               uint64_t seed, int threads) {
  KernelCall c;
  Params& P = c.P;
  std::vector<In> keep;
  check_qkv(P, q, k, v);
  check_options(c, scale, tile_class, rows, bitmap_index, bitmaps, mods, bias, dropout_p, seed, threads, keep);
  const DType acc = P.dtype == DType::f64 ? DType::f64 : DType::f32;
  check_out(out, "out", {P.B, P.H, P.Nq, P.Dv}, "(B, H, Nq, Dv)", P.dtype, dtype_str(P.dtype));
  check_out(lse, "lse", {P.B, P.H, P.Nq}, "(B, H, Nq)", acc, dtype_str(acc));
  P.out = out.data();
  P.lse = lse.data();
  int64_t counts[2] = {0, 0};
  P.counts = counts;
  std::vector<uint8_t> kv_state(size_t(P.B * P.Hkv * P.nbk), 0);  // the K/V tiles' verdicts (finite.hpp)
  P.kv_state = kv_state.data();
  const KernelTable* t = current();
  bool ok;
  {
    nb::gil_scoped_release release;
    ok = t->forward(P);
  }
  if (!ok) throw std::bad_alloc();
  return {counts[0], counts[1]};
}

Counts backward(const In& q, const In& k, const In& v, const In& out, const In& lse, const In& dout, const Out& dq,
                const Out& dk, const Out& dv, const nb::object& dlse, double scale, const nb::object& tile_class,
                const nb::object& rows, const nb::object& bitmap_index, const nb::object& bitmaps,
                const nb::object& mods, const nb::object& bias, double dropout_p, uint64_t seed, int threads) {
  KernelCall c;
  Params& P = c.P;
  std::vector<In> keep;
  check_qkv(P, q, k, v);
  check_options(c, scale, tile_class, rows, bitmap_index, bitmaps, mods, bias, dropout_p, seed, threads, keep);
  const DType acc = P.dtype == DType::f64 ? DType::f64 : DType::f32;
  DType got;
  need_ndim(out, "out", 4, "(B, H, Nq, Dv)");
  need_shape(out, "out", {P.B, P.H, P.Nq, P.Dv}, "(B, H, Nq, Dv)");
  if (!float_dtype(out.dtype(), got) || got != P.dtype)
    type_error(std::string("out must have q's dtype ") + dtype_str(P.dtype));
  need_last_unit(out, "out");
  need_ndim(dout, "dout", 4, "(B, H, Nq, Dv)");
  need_shape(dout, "dout", {P.B, P.H, P.Nq, P.Dv}, "(B, H, Nq, Dv)");
  if (!float_dtype(dout.dtype(), got) || got != P.dtype)
    type_error(std::string("dout must have q's dtype ") + dtype_str(P.dtype));
  need_last_unit(dout, "dout");
  need_ndim(lse, "lse", 3, "(B, H, Nq)");
  need_shape(lse, "lse", {P.B, P.H, P.Nq}, "(B, H, Nq)");
  if (!float_dtype(lse.dtype(), got) || got != acc) type_error(std::string("lse must be ") + dtype_str(acc));
  if (!dlse.is_none()) {
    In d = as_array(dlse, "dlse");
    keep.push_back(d);
    need_ndim(d, "dlse", 3, "(B, H, Nq)");
    need_shape(d, "dlse", {P.B, P.H, P.Nq}, "(B, H, Nq)");
    if (!float_dtype(d.dtype(), P.dlse_dtype))
      type_error(std::string("dlse must be float, got ") + dtype_name(d.dtype()));
    P.dlse = d.data();
    P.dlse_s.s0 = stride_of(d, 0);
    P.dlse_s.s1 = stride_of(d, 1);
    P.dlse_s.s2 = stride_of(d, 2);
  }
  check_out(dq, "dq", {P.B, P.H, P.Nq, P.Dk}, "(B, H, Nq, Dk)", acc, dtype_str(acc));
  check_out(dk, "dk", {P.B, P.Hkv, P.Nk, P.Dk}, "(B, Hkv, Nk, Dk)", acc, dtype_str(acc));
  check_out(dv, "dv", {P.B, P.Hkv, P.Nk, P.Dv}, "(B, Hkv, Nk, Dv)", acc, dtype_str(acc));
  P.out_s = strided4(out);
  P.dout = dout.data();
  P.dout_s = strided4(dout);
  P.lse_s.data = lse.data();
  P.lse_s.s0 = stride_of(lse, 0);
  P.lse_s.s1 = stride_of(lse, 1);
  P.lse_s.s2 = stride_of(lse, 2);
  P.dq = dq.data();
  P.dk = dk.data();
  P.dv = dv.data();
  int64_t counts[2] = {0, 0};
  P.counts = counts;
  const KernelTable* t = current();
  bool ok;
  {
    nb::gil_scoped_release release;
    ok = t->backward(P);
  }
  if (!ok) throw std::bad_alloc();
  return {counts[0], counts[1]};
}

void philox_keep_into(const Out& keep, uint64_t seed, int64_t b, int64_t h, int64_t i0, int64_t j0, double p) {
  if (keep.ndim() != 2 || !is_dtype(keep.dtype(), nb::dlpack::dtype_code::Bool, 8) || !c_contiguous(keep))
    value_error("keep must be a C-contiguous 2-D bool array");
  if (!(p >= 0.0 && p < 1.0)) value_error("p must be in [0, 1), got " + std::to_string(p));
  if (b < 0 || h < 0 || i0 < 0 || j0 < 0 || b > 0xffffffffLL || h > 0xffffffffLL ||
      i0 + int64_t(keep.shape(0)) > 0x100000000LL || j0 + int64_t(keep.shape(1)) > 0x400000000LL)
    value_error("philox_keep: b, h, i, j out of range");
  const uint32_t thr = dropout_threshold(p);
  uint8_t* d = static_cast<uint8_t*>(keep.data());
  const int64_t ni = int64_t(keep.shape(0)), nj = int64_t(keep.shape(1));
  for (int64_t r = 0; r < ni; ++r)
    philox_row(seed, uint32_t(b), uint32_t(h), uint32_t(i0 + r), j0, j0 + nj, thr,
               [&](int64_t j, bool k) { d[r * nj + (j - j0)] = k ? 1 : 0; });
}

nb::tuple philox4x32(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  const Philox4 r = philox4x32_10(c0, c1, c2, c3, k0, k1);
  return nb::make_tuple(r.w[0], r.w[1], r.w[2], r.w[3]);
}

}  // namespace

NB_MODULE(_ext, m) {  // NOLINT(cppcoreguidelines-pro-type-cstyle-cast): nanobind's macro
  m.doc() = "qkv's compiled attention kernel (see qkv._native for the Python API)";
  // The facts Python shares with the kernels, written once here (params.hpp) and read by qkv._native.
  m.attr("EMPTY") = int(EMPTY);
  m.attr("PARTIAL") = int(PARTIAL);
  m.attr("FULL") = int(FULL);
  m.attr("MAX_THREADS") = kMaxThreads;
  m.attr("DECODE_MAX_NQ") = kDecodeMaxNq;
  m.attr("LANES") = kLanes;
  m.attr("BLOCK_Q") = kBlockQ;
  m.attr("BLOCK_K") = kBlockK;
  // The score mods the kernel runs (mods.hpp); qkv._native._facts.ModKind is generated from this.
  nb::enum_<ModKind>(m, "ModKind", nb::is_arithmetic())
      .value("MUL", MOD_MUL)
      .value("SOFTCAP", MOD_SOFTCAP)
      .value("ALIBI", MOD_ALIBI)
      .value("RELBIAS", MOD_RELBIAS);
  m.def("isa", [] { return std::string(current()->name); });
  m.def("isas", [] {
    std::vector<std::string> r;
    for (const KernelTable* t : runnable()) r.emplace_back(t->name);
    return r;
  });
  m.def(
      "set_isa",
      [](const std::string& name) {
        const KernelTable* t = find_table(name.c_str());
        if (!t) value_error("ISA path '" + name + "' cannot run on this CPU (or was not compiled)");
        set_current(t);
      },
      nb::arg("name"));
  m.def(
      "tile_shape",
      [](int64_t nq, int64_t nk, int64_t dk, int64_t dv, const std::string& dtype) {
        if (nq < 1 || nk < 1 || dk < 1 || dv < 1) value_error("tile_shape: sizes must be >= 1");
        if (dtype != "float32" && dtype != "float64" && dtype != "float16" && dtype != "bfloat16")
          value_error("tile_shape: dtype must be float32, float64, float16 or bfloat16, got " + dtype);
        return std::make_tuple(int64_t(nq <= kDecodeMaxNq ? kDecodeMaxNq : kBlockQ), int64_t(kBlockK));
      },
      nb::arg("nq"), nb::arg("nk"), nb::arg("dk"), nb::arg("dv"), nb::arg("dtype"));
  m.def("forward", &forward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"), nb::kw_only(),
        nb::arg("scale"), nb::arg("tile_class").none() = nb::none(), nb::arg("rows").none() = nb::none(),
        nb::arg("bitmap_index").none() = nb::none(), nb::arg("bitmaps").none() = nb::none(),
        nb::arg("mods") = nb::tuple(), nb::arg("bias").none() = nb::none(), nb::arg("dropout_p") = 0.0,
        nb::arg("seed") = 0, nb::arg("threads") = 1);
  m.def("backward", &backward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"),
        nb::arg("dout"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::kw_only(),
        nb::arg("dlse").none() = nb::none(), nb::arg("scale"), nb::arg("tile_class").none() = nb::none(),
        nb::arg("rows").none() = nb::none(), nb::arg("bitmap_index").none() = nb::none(),
        nb::arg("bitmaps").none() = nb::none(), nb::arg("mods") = nb::tuple(), nb::arg("bias").none() = nb::none(),
        nb::arg("dropout_p") = 0.0, nb::arg("seed") = 0, nb::arg("threads") = 1);
  m.def("philox_keep_into", &philox_keep_into, nb::arg("keep"), nb::arg("seed"), nb::arg("b"), nb::arg("h"),
        nb::arg("i0"), nb::arg("j0"), nb::arg("p"));
  m.def("_microbench", [](int kind, int64_t reps) {
    if (kind < 0 || kind > 4 || reps < 1) value_error("_microbench(kind in 0..4, reps >= 1)");
    const KernelTable* t = current();
    nb::gil_scoped_release release;
    return t->microbench(kind, reps);
  });
  m.def("philox4x32", &philox4x32);
  // jax.ffi's handlers (ffi.cpp), as the capsules jax.ffi.register_ffi_target takes; absent when the
  // build found no jaxlib FFI header
#ifdef QKV_HAVE_XLA_FFI
  m.def("ffi_handlers",
        [] { return nb::make_tuple(nb::capsule(ffi_forward_handler()), nb::capsule(ffi_backward_handler())); });
#endif
}
