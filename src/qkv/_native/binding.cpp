// The only file that knows Python: an adapter from nanobind onto the kernel's entrance
// (entrance.hpp). Every array arrives as an nb::ndarray (NumPy through the buffer protocol, torch /
// JAX through DLPack; no copies) and becomes an ArrayView; the entrance checks the call (ndim,
// shape, dtype, strides, index ranges) and a refusal raises ValueError / TypeError with its message.
// Then the GIL is released and the kernel runs.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <initializer_list>
#include <limits>
#include <new>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dispatch.hpp"
#include "entrance.hpp"
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

std::string type_of(nb::handle o) { return nb::type_name(o.type()).c_str(); }

[[noreturn]] void value_error(const std::string& m) { throw nb::value_error(m.c_str()); }
[[noreturn]] void type_error(const std::string& m) { throw nb::type_error(m.c_str()); }

// A refusal of the entrance as the qkv.errors class it names (each derives from ValueError or
// TypeError, so callers that catch those still do).
[[noreturn]] void raise(const Status& s) {
  const nb::object cls = nb::module_::import_("qkv.errors").attr(s.error_class());
  PyErr_SetString(cls.ptr(), s.message.c_str());
  throw nb::python_error();
}

// The element type of a DLPack dtype, from its code and width.
Elem elem(nb::dlpack::dtype t) {
  using C = nb::dlpack::dtype_code;
  const int w = t.bits == 8 ? 0 : t.bits == 16 ? 1 : t.bits == 32 ? 2 : t.bits == 64 ? 3 : -1;
  if (t.lanes != 1 || w < 0) return Elem::other;
  static constexpr Elem kFloat[] = {Elem::other, Elem::f16, Elem::f32, Elem::f64};
  static constexpr Elem kInt[] = {Elem::i8, Elem::i16, Elem::i32, Elem::i64};
  static constexpr Elem kUInt[] = {Elem::u8, Elem::u16, Elem::u32, Elem::u64};
  switch (C(t.code)) {
    case C::Float:
      return kFloat[w];
    case C::Int:
      return kInt[w];
    case C::UInt:
      return kUInt[w];
    case C::Bfloat:
      return w == 1 ? Elem::bf16 : Elem::other;
    case C::Bool:
      return w == 0 ? Elem::boolean : Elem::other;
    default:
      return Elem::other;
  }
}

template <class A>
ArrayView view(const A& a) {
  ArrayView v;
  v.data = a.data();
  v.type = elem(a.dtype());
  v.rank = int(a.ndim());
  for (int i = 0; i < v.rank && i < kMaxRank; ++i) {
    v.shape[i] = int64_t(a.shape(size_t(i)));
    v.strides[i] = int64_t(a.stride(size_t(i)));
  }
  return v;
}

// An optional array argument (None: absent), kept alive in `keep` while the kernel reads it.
ArrayView optional(const nb::object& o, const char* name, std::vector<In>& keep) {
  if (o.is_none()) return ArrayView{};
  try {
    keep.push_back(nb::cast<In>(o));
  } catch (const std::exception&) {
    type_error(std::string(name) + " must be a CPU array (NumPy, torch or JAX), got " + type_of(o));
  }
  return view(keep.back());
}

// An optional result passed by keyword (the forward's lse_lo): writable, kept alive in `keep`.
ArrayView written(const nb::object& o, const char* name, std::vector<Out>& keep) {
  if (o.is_none()) return ArrayView{};
  try {
    keep.push_back(nb::cast<Out>(o));
  } catch (const std::exception&) {
    type_error(std::string(name) + " must be a writable CPU array (NumPy, torch or JAX), got " + type_of(o));
  }
  return view(keep.back());
}

// Each mod is a qkv._native.KernelMod, a tuple (kind, c, table, m) of Python objects; their values
// are the entrance's to check.
std::vector<ModArg> mod_args(const nb::object& mods, std::vector<In>& keep) {
  if (!nb::isinstance<nb::sequence>(mods)) type_error("mods must be a sequence of qkv._native.KernelMod");
  nb::sequence ms = nb::borrow<nb::sequence>(mods);
  const size_t nm = nb::len(ms);
  std::vector<ModArg> out(nm);
  for (size_t x = 0; x < nm; ++x) {
    nb::object item = ms[x];
    const std::string where = "mods[" + std::to_string(x) + "]";
    if (!nb::isinstance<nb::tuple>(item) || nb::len(item) != 4 ||
        !nb::isinstance<nb::int_>(nb::borrow<nb::tuple>(item)[0]))
      type_error(where + " must be a qkv._native.KernelMod (kind, c, table, m), got " +
                 nb::cast<std::string>(nb::repr(item)));
    nb::tuple t = nb::borrow<nb::tuple>(item);
    const nb::handle c = t[1], m = t[3];
    if (!(nb::isinstance<nb::float_>(c) || nb::isinstance<nb::int_>(c)) || nb::isinstance<nb::bool_>(c))
      type_error(where + ": c must be a number, got " + type_of(c));
    if (!nb::isinstance<nb::int_>(m) || nb::isinstance<nb::bool_>(m)) type_error(where + ": M must be an int");
    out[x] =
        ModArg{nb::cast<int64_t>(t[0]), nb::cast<double>(c), optional(t[2], "mods table", keep), nb::cast<int64_t>(m)};
  }
  return out;
}

double number(nb::handle o, const char* name) {
  if (!(nb::isinstance<nb::float_>(o) || nb::isinstance<nb::int_>(o)) || nb::isinstance<nb::bool_>(o))
    type_error(std::string(name) + " must be a number, got " + type_of(o));
  return nb::cast<double>(o);
}

template <class I>
I integer(nb::handle o, const char* name) {
  I x = 0;
  if (nb::isinstance<nb::int_>(o) && !nb::isinstance<nb::bool_>(o) && nb::try_cast<I>(o, x)) return x;
  type_error(std::string(name) + " must be an int in [" + std::to_string(std::numeric_limits<I>::min()) + ", " +
             std::to_string(std::numeric_limits<I>::max()) + "], got " + nb::cast<std::string>(nb::repr(o)));
}

// The keywords of both directions onto `a` (dlse: the backward's only; lse_lo: a result of the
// forward, an input of the backward), the arrays among them kept alive in `keep` (the forward's
// lse_lo, written, in `keep_out`). One table for both: a keyword absent keeps CallArgs' default;
// scale is required.
void keywords(CallArgs& a, const nb::kwargs& kw, bool backward, std::vector<In>& keep, std::vector<Out>& keep_out) {
  static const std::pair<std::string_view, ArrayView CallArgs::*> kArrays[] = {
      {"tile_class", &CallArgs::tile_class}, {"rows", &CallArgs::rows}, {"bitmap_index", &CallArgs::bitmap_index},
      {"bitmaps", &CallArgs::bitmaps},       {"bias", &CallArgs::bias}, {"k_scale", &CallArgs::k_scale},
      {"v_scale", &CallArgs::v_scale},       {"dlse", &CallArgs::dlse}, {"lse_lo", &CallArgs::lse_lo}};
  bool scale = false;
  for (auto [key, value] : kw) {
    const std::string_view k = nb::borrow<nb::str>(key).c_str();
    if (k == "scale") {
      a.scale = number(value, "scale");
      scale = true;
    } else if (k == "dropout_p") {
      a.dropout_p = number(value, "dropout_p");
    } else if (k == "seed") {
      a.seed = integer<uint64_t>(value, "seed");
    } else if (k == "threads") {
      a.threads = integer<int64_t>(value, "threads");
    } else if (k == "kv_format") {
      a.kv_format = integer<int64_t>(value, "kv_format");
    } else if (k == "mods") {
      a.mods = mod_args(nb::borrow<nb::object>(value), keep);
    } else {
      bool found = false;
      for (const auto& [name, field] : kArrays)
        if (k == name && (backward || name != "dlse")) {
          const nb::object o = nb::borrow<nb::object>(value);
          a.*field = !backward && name == "lse_lo" ? written(o, "lse_lo", keep_out)
                                                   : optional(o, std::string(name).c_str(), keep);
          found = true;
        }
      if (!found)
        type_error(std::string(backward ? "backward" : "forward") + "() got an unexpected keyword argument '" +
                   std::string(k) + "'");
    }
  }
  if (!scale) type_error(std::string(backward ? "backward" : "forward") + "() needs the keyword argument scale");
}

// Both entries return (rows written NaN for a non-finite input, rows whose finite inputs overflowed).
using Counts = std::tuple<int64_t, int64_t>;

// The positional arrays of both entries, in order: the forward takes the first five.
constexpr ArrayView CallArgs::* kPositional[] = {&CallArgs::q,   &CallArgs::k,   &CallArgs::v,
                                                 &CallArgs::out, &CallArgs::lse, &CallArgs::dout,
                                                 &CallArgs::dq,  &CallArgs::dk,  &CallArgs::dv};

// One call of either direction: its arrays and keywords onto CallArgs, checked at the entrance,
// then run with the GIL released.
Counts call(std::initializer_list<ArrayView> arrays, const nb::kwargs& kw, bool backward) {
  CallArgs a;
  std::vector<In> keep;
  std::vector<Out> keep_out;
  const ArrayView* x = arrays.begin();
  for (size_t i = 0; i < arrays.size(); ++i) a.*kPositional[i] = x[i];
  keywords(a, kw, backward, keep, keep_out);
  KernelCall c;
  const Status s = backward ? build_backward(a, c) : build_forward(a, c);
  if (s.kind != Status::ok) raise(s);
  int64_t counts[2];
  bool ok;
  {
    nb::gil_scoped_release release;
    ok = backward ? run_backward(c.P, counts) : run_forward(c.P, counts);
  }
  if (!ok) throw std::bad_alloc();
  return {counts[0], counts[1]};
}

Counts forward(const In& q, const In& k, const In& v, const Out& out, const Out& lse, const nb::kwargs& kw) {
  return call({view(q), view(k), view(v), view(out), view(lse)}, kw, false);
}

Counts backward(const In& q, const In& k, const In& v, const In& out, const In& lse, const In& dout, const Out& dq,
                const Out& dk, const Out& dv, const nb::kwargs& kw) {
  return call({view(q), view(k), view(v), view(out), view(lse), view(dout), view(dq), view(dk), view(dv)}, kw, true);
}

void philox_keep_into(const Out& keep, uint64_t seed, int64_t b, int64_t h, int64_t i0, int64_t j0, double p) {
  const ArrayView kv = view(keep);
  if (kv.rank != 2 || kv.type != Elem::boolean || !kv.c_contiguous())
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
  // The dtypes q, k, v may have (params.hpp's DType, in its order).
  nb::list dtypes;
  for (const char* n : kDTypeNames) dtypes.append(n);
  m.attr("DTYPES") = nb::tuple(dtypes);
  // The mask arrays a call carries (entrance.hpp): the FFI's `mask` attribute.
  nb::enum_<MaskKind>(m, "MaskKind", nb::is_arithmetic())
      .value("NONE", MASK_NONE)
      .value("ROWS", MASK_ROWS)
      .value("TILES", MASK_TILES);
  // How K and V are stored (params.hpp): the `kv_format` argument.
  nb::enum_<KvFormat>(m, "KvFormat", nb::is_arithmetic())
      .value("NATIVE", KvFormat::native)
      .value("I8", KvFormat::i8)
      .value("E4M3", KvFormat::e4m3)
      .value("E5M2", KvFormat::e5m2);
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
  // The decode loop's prefetch target (dispatch.cpp): "l1" or "l2", picked once from the CPU.
  m.def("decode_prefetch", [] { return std::string(decode_prefetch() == Prefetch::l2 ? "l2" : "l1"); });
  m.def(
      "set_decode_prefetch",
      [](const std::string& name) {
        if (name != "l1" && name != "l2") value_error("decode prefetch must be 'l1' or 'l2', got '" + name + "'");
        set_decode_prefetch(name == "l2" ? Prefetch::l2 : Prefetch::l1);
      },
      nb::arg("name"));
  m.def(
      "tile_shape",
      [](int64_t nq, int64_t nk, int64_t dk, int64_t dv, const std::string& dtype) {
        if (nq < 1 || nk < 1 || dk < 1 || dv < 1) value_error("tile_shape: sizes must be >= 1");
        bool known = false;
        for (const char* n : kDTypeNames) known = known || dtype == n;
        if (!known) value_error("tile_shape: dtype must be float32, float64, float16 or bfloat16, got " + dtype);
        return std::make_tuple(int64_t(tile_rows(nq)), int64_t(kBlockK));
      },
      nb::arg("nq"), nb::arg("nk"), nb::arg("dk"), nb::arg("dv"), nb::arg("dtype"));
  // The keywords (scale, tile_class, rows, bitmap_index, bitmaps, mods, bias, dropout_p, seed, threads,
  // kv_format, k_scale, v_scale; the backward's dlse) are read by keywords() above, documented in
  // qkv._native.forward.
  m.def("forward", &forward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"), nb::arg("kw"));
  m.def("backward", &backward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"),
        nb::arg("dout"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::arg("kw"));
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
