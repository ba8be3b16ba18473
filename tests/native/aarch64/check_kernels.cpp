// Standalone check of every ISA path this CPU runs (on arm64: "neon" and "portable"), without
// Python: scripts/test-aarch64 cross-compiles it with the kernel sources and runs it under
// qemu-aarch64. Each case builds a Params by hand (the plain-data contract, params.hpp), runs the
// forward and the backward on random inputs and compares them with a naive float64 reference
// written here from the contract (README "Conventions", tests/native/_native_reference.py),
// independent of the kernel code; paths are also compared with each other. Exits 1 on a mismatch.
//
// Inputs are multiples of 1/64 in [-4, 4): exact in float16, bfloat16, float32 and float64, so
// every dtype sees the same numbers and the reference needs no rounding model of the inputs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dispatch.hpp"
#include "params.hpp"

using namespace qkv_native;

namespace {

// ------------------------------------------------------------------ storage encodings

size_t dsize(DType t) { return t == DType::f64 ? 8 : t == DType::f32 ? 4 : 2; }

uint32_t fbits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float bitsf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Exact for the inputs used here (normal float16 numbers or zero).
uint16_t to_half_exact(float f) {
  const uint32_t x = fbits(f), sign = (x >> 16) & 0x8000u;
  if ((x & 0x7fffffffu) == 0) return uint16_t(sign);
  if ((x & 0x7f800000u) == 0x7f800000u) return uint16_t(sign | 0x7c00u | ((x & 0x7fffffu) ? 0x200u : 0u));
  const int e = int((x >> 23) & 0xff) - 127 + 15;
  return uint16_t(sign | (uint32_t(e) << 10) | ((x & 0x7fffffu) >> 13));
}
double from_half(uint16_t h) {
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const double s = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 0) return s * std::ldexp(double(m), -24);
  if (e == 31) return m ? NAN : s * INFINITY;
  return s * std::ldexp(1024.0 + m, e - 25);
}

void put(void* base, size_t i, DType t, double x) {
  switch (t) {
    case DType::f64:
      static_cast<double*>(base)[i] = x;
      break;
    case DType::f32:
      static_cast<float*>(base)[i] = float(x);
      break;
    case DType::f16:
      static_cast<uint16_t*>(base)[i] = to_half_exact(float(x));
      break;
    default:
      static_cast<uint16_t*>(base)[i] = uint16_t(fbits(float(x)) >> 16);  // exact inputs: truncation is exact
  }
}
double get(const void* base, size_t i, DType t) {
  switch (t) {
    case DType::f64:
      return static_cast<const double*>(base)[i];
    case DType::f32:
      return static_cast<const float*>(base)[i];
    case DType::f16:
      return from_half(static_cast<const uint16_t*>(base)[i]);
    default:
      return bitsf(uint32_t(static_cast<const uint16_t*>(base)[i]) << 16);
  }
}

// A (d0, d1, d2, d3) array in dtype t, row stride d3 + pad (pad > 0: rows not packed).
struct Arr {
  DType t = DType::f32;
  int64_t d[4] = {1, 1, 1, 1};
  int64_t pad = 0;
  std::vector<unsigned char> bytes;
  std::vector<double> val;  // the values, packed (d0, d1, d2, d3)
  int64_t s2() const { return d[3] + pad; }
  int64_t s1() const { return d[2] * s2(); }
  int64_t s0() const { return d[1] * s1(); }
  double& at(int64_t a, int64_t b, int64_t c, int64_t e) { return val[size_t(((a * d[1] + b) * d[2] + c) * d[3] + e)]; }
  double at(int64_t a, int64_t b, int64_t c, int64_t e) const {
    return val[size_t(((a * d[1] + b) * d[2] + c) * d[3] + e)];
  }
  Strided strided() const {
    Strided s;
    s.data = bytes.data();
    s.s0 = s0();
    s.s1 = s1();
    s.s2 = s2();
    s.s3 = 1;
    return s;
  }
};

Arr make(DType t, int64_t a, int64_t b, int64_t c, int64_t e, int64_t pad, std::mt19937_64& rng) {
  Arr r;
  r.t = t;
  r.d[0] = a;
  r.d[1] = b;
  r.d[2] = c;
  r.d[3] = e;
  r.pad = pad;
  r.val.resize(size_t(a * b * c * e));
  r.bytes.assign(size_t(r.s0() * a) * dsize(t), 0);
  std::uniform_int_distribution<int> u(-256, 255);
  for (int64_t i0 = 0; i0 < a; ++i0)
    for (int64_t i1 = 0; i1 < b; ++i1)
      for (int64_t i2 = 0; i2 < c; ++i2)
        for (int64_t i3 = 0; i3 < e; ++i3) {
          const double x = u(rng) / 64.0;
          r.at(i0, i1, i2, i3) = x;
          put(r.bytes.data(), size_t(i0 * r.s0() + i1 * r.s1() + i2 * r.s2() + i3), t, x);
        }
  return r;
}

void set_value(Arr& r, int64_t a, int64_t b, int64_t c, int64_t e, double x) {
  r.at(a, b, c, e) = x;
  put(r.bytes.data(), size_t(a * r.s0() + b * r.s1() + c * r.s2() + e), r.t, x);
}

// ------------------------------------------------------------------ one test case

enum MaskKind { NONE, CAUSAL, WINDOW, RANDOM_ROWS, TILES, TILES_AND_ROWS };

struct Case {
  std::string name;
  DType dt;
  int64_t B, H, Hkv, Nq, Nk, Dk, Dv;
  MaskKind mask = NONE;
  int threads = 1;
  std::vector<Mod> mods;  // tables filled by setup
  bool bias = false, dlse = false, pad = false;
  int64_t window = 0;
  double dropout = 0.0;             // > 0: paths compared with each other only (the keep mask is the kernel's)
  bool nonfinite = false;           // forward only: NaN / inf planted in q, k, v
  KvFormat kvf = KvFormat::native;  // a quantized cache (forward only): codes and float32 scales
  bool head_scale = false;          // one scale per kv head (stride 0 over keys)
};

struct Mask {
  int bq = 0, bk = 0;
  int64_t nbq = 0, nbk = 0, Bm = 1, Hm = 1;
  std::vector<int8_t> tc;
  std::vector<int32_t> rows, bi;
  std::vector<uint64_t> bm;
  bool has_rows = false, has_tiles = false;
  bool allowed(int64_t b, int64_t h, int64_t i, int64_t j) const {
    b %= Bm;
    h %= Hm;
    bool iv = true;
    if (has_rows) {
      const int32_t lo = rows[size_t((b * Hm + h) * rows_nq * 2 + i * 2)];
      const int32_t hi = rows[size_t((b * Hm + h) * rows_nq * 2 + i * 2 + 1)];
      iv = j >= lo && j < hi;
    }
    if (!has_tiles) return iv;
    const size_t t = size_t(((b * Hm + h) * nbq + i / bq) * nbk + j / bk);
    if (tc[t] == FULL) return true;
    if (tc[t] == EMPTY) return false;
    if (bi[t] < 0) return iv;
    const uint64_t w = bm[size_t((int64_t(bi[t]) * bq + i % bq) * words + (j % bk) / 64)];
    return iv && ((w >> ((j % bk) % 64)) & 1u);
  }
  int64_t rows_nq = 0, words = 0;
};

Mask make_mask(const Case& c, std::mt19937_64& rng) {
  Mask m;
  m.bq = c.Nq <= kDecodeMaxNq ? kDecodeMaxNq : kBlockQ;  // the binding's grid (check_options)
  m.bk = kBlockK;
  m.nbq = (c.Nq + m.bq - 1) / m.bq;
  m.nbk = (c.Nk + m.bk - 1) / m.bk;
  m.words = (m.bk + 63) / 64;
  m.rows_nq = c.Nq;
  if (c.mask == NONE) return m;
  m.Bm = c.B;
  m.Hm = c.mask == TILES ? 1 : c.H;  // one broadcast axis, one full
  const int64_t off = c.Nk - c.Nq;   // bottom-right aligned, as the front end's causal
  if (c.mask != TILES) {
    m.has_rows = true;
    m.rows.resize(size_t(m.Bm * m.Hm * c.Nq * 2));
    std::uniform_int_distribution<int64_t> u(0, c.Nk);
    for (int64_t bh = 0; bh < m.Bm * m.Hm; ++bh)
      for (int64_t i = 0; i < c.Nq; ++i) {
        int64_t lo = 0, hi = c.Nk;
        if (c.mask == CAUSAL || c.mask == WINDOW || c.mask == TILES_AND_ROWS) hi = i + off + 1;
        if (c.mask == WINDOW) lo = hi - c.window;
        if (c.mask == RANDOM_ROWS) {  // any interval, empty ones included
          lo = u(rng);
          hi = u(rng);
          if (bh % 3 == 0 && i % 5 == 0) hi = lo;
        }
        m.rows[size_t((bh * c.Nq + i) * 2)] = int32_t(lo);
        m.rows[size_t((bh * c.Nq + i) * 2 + 1)] = int32_t(hi);
      }
  }
  if (c.mask == TILES || c.mask == TILES_AND_ROWS) {
    m.has_tiles = true;
    const size_t n = size_t(m.Bm * m.Hm * m.nbq * m.nbk);
    m.tc.resize(n);
    m.bi.resize(n);
    std::uniform_int_distribution<int> cls(0, 5), bit(0, 99);
    for (size_t t = 0; t < n; ++t) {
      const int r = cls(rng);
      m.tc[t] = int8_t(r == 0 ? EMPTY : r == 1 ? FULL : PARTIAL);
      m.bi[t] = -1;
      if (m.tc[t] == PARTIAL && r != 2) {  // a bitmap (density varies per tile); r == 2: intervals only
        m.bi[t] = int32_t(m.bm.size() / size_t(m.bq * m.words));
        const int density = bit(rng);
        for (int64_t x = 0; x < m.bq * m.words; ++x) {
          uint64_t w = 0;
          for (int b = 0; b < 64; ++b) w |= uint64_t(bit(rng) < density) << b;
          m.bm.push_back(w);
        }
      }
    }
    if (m.bm.empty()) m.bm.assign(size_t(m.bq * m.words), 0);
  }
  return m;
}

struct Setup {
  Case c;
  Mask m;
  Arr q, k, v, dout, bias;
  std::vector<float> ks, vs;  // quantized cache: (B, Hkv, Nk) scales, or (B, Hkv) with head_scale
  std::vector<double> dlse;   // (B, H, Nq), float64 (dlse_dtype f64)
  std::vector<std::vector<double>> tables;
  Mod mods[kMaxMods];
};

// Fills the Params of a forward call (outputs set by the caller).
Params params(const Setup& s, const KernelTable* t) {
  const Case& c = s.c;
  Params P;
  P.dtype = c.dt;
  P.B = c.B;
  P.H = c.H;
  P.Hkv = c.Hkv;
  P.Nq = c.Nq;
  P.Nk = c.Nk;
  P.Dk = c.Dk;
  P.Dv = c.Dv;
  P.q = s.q.strided();
  P.k = s.k.strided();
  P.v = s.v.strided();
  if (c.kvf != KvFormat::native) {
    P.kv_format = c.kvf;
    const int64_t per = c.head_scale ? 1 : c.Nk;
    P.k_scale = {s.ks.data(), c.Hkv * per, per, c.head_scale ? 0 : 1, 0};
    P.v_scale = {s.vs.data(), c.Hkv * per, per, c.head_scale ? 0 : 1, 0};
  }
  P.scale = 1.0 / std::sqrt(double(c.Dk));
  P.bq = s.m.bq;
  P.bk = s.m.bk;
  P.nbq = s.m.nbq;
  P.nbk = s.m.nbk;
  const int64_t plane = s.m.nbq * s.m.nbk;
  if (s.m.has_tiles) {
    P.tile_class = s.m.tc.data();
    P.tc_b = s.m.Bm > 1 ? s.m.Hm * plane : 0;
    P.tc_h = s.m.Hm > 1 ? plane : 0;
    P.bitmap_index = s.m.bi.data();
    P.bi_b = P.tc_b;
    P.bi_h = P.tc_h;
    P.bitmaps = s.m.bm.data();
    P.n_bitmaps = int64_t(s.m.bm.size()) / (s.m.bq * s.m.words);
    P.words = s.m.words;
  }
  if (s.m.has_rows) {
    P.rows = s.m.rows.data();
    P.rw_b = s.m.Bm > 1 ? s.m.Hm * c.Nq * 2 : 0;
    P.rw_h = s.m.Hm > 1 ? c.Nq * 2 : 0;
  }
  P.n_mods = int(c.mods.size());
  for (int x = 0; x < P.n_mods; ++x) P.mods[x] = s.mods[x];
  if (c.bias) {
    P.has_bias = true;
    P.bias_dtype = DType::f32;
    P.bias = s.bias.strided();
    P.bias.s1 = 0;  // (B, 1, Nq, Nk): broadcast over heads
  }
  P.dropout_p = c.dropout;
  P.seed = 1234;
  P.threads = c.threads;
  P.parallel = parallel_fn();
  (void)t;
  return P;
}

// ------------------------------------------------------------------ float64 reference

struct Ref {
  std::vector<double> out, lse, dq, dk, dv;
  std::vector<char> nan_row;  // nonfinite cases: the rows the contract writes as NaN
};

double mod_score(const Setup& s, int64_t b, int64_t h, int64_t i, int64_t j, double x, double& dfac) {
  const int64_t p = i + s.c.Nk - s.c.Nq;
  dfac = 1.0;
  for (size_t x_ = 0; x_ < s.c.mods.size(); ++x_) {
    const Mod& m = s.mods[x_];
    if (m.kind == MOD_MUL) {
      x *= m.c;
      dfac *= m.c;
    } else if (m.kind == MOD_SOFTCAP) {
      const double t = std::tanh(x / m.c);
      x = m.c * t;
      dfac *= 1 - t * t;
    } else if (m.kind == MOD_ALIBI) {
      x -= m.table[b * m.tb_b + h * m.tb_h] * double(std::llabs(p - j));
    } else {
      const int64_t r = std::max<int64_t>(-m.m, std::min<int64_t>(m.m, j - p)) + m.m;
      x += m.table[h * m.tb_h + r];
    }
  }
  return x;
}

Ref reference(const Setup& s, const std::vector<double>* kout = nullptr) {
  const Case& c = s.c;
  const double scale = 1.0 / std::sqrt(double(c.Dk));
  const int64_t grp = c.H / c.Hkv;
  Ref R;
  R.out.assign(size_t(c.B * c.H * c.Nq * c.Dv), 0.0);
  R.lse.assign(size_t(c.B * c.H * c.Nq), -INFINITY);
  R.dq.assign(size_t(c.B * c.H * c.Nq * c.Dk), 0.0);
  R.dk.assign(size_t(c.B * c.Hkv * c.Nk * c.Dk), 0.0);
  R.dv.assign(size_t(c.B * c.Hkv * c.Nk * c.Dv), 0.0);
  R.nan_row.assign(size_t(c.B * c.H * c.Nq), 0);
  std::vector<double> sc(size_t(c.Nk)), fac(size_t(c.Nk)), pr(size_t(c.Nk));
  std::vector<char> ok(size_t(c.Nk));
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h) {
      const int64_t g = h / grp;
      for (int64_t i = 0; i < c.Nq; ++i) {
        const size_t row = size_t((b * c.H + h) * c.Nq + i);
        double mx = -INFINITY;
        bool bad = false, any = false;
        for (int64_t j = 0; j < c.Nk; ++j) {
          ok[size_t(j)] = s.m.allowed(b, h, i, j);
          if (!ok[size_t(j)]) continue;
          any = true;
          double d = 0;
          for (int64_t e = 0; e < c.Dk; ++e) {
            d += s.q.at(b, h, i, e) * s.k.at(b, g, j, e);
            bad = bad || !std::isfinite(s.k.at(b, g, j, e));
          }
          for (int64_t e = 0; e < c.Dv; ++e) bad = bad || !std::isfinite(s.v.at(b, g, j, e));
          double x = mod_score(s, b, h, i, j, d * scale, fac[size_t(j)]);
          if (c.bias) x += s.bias.at(b, 0, i, j);
          sc[size_t(j)] = x;
          mx = std::max(mx, x);
        }
        for (int64_t e = 0; e < c.Dk; ++e) bad = bad || (any && !std::isfinite(s.q.at(b, h, i, e)));
        if (bad) {
          R.nan_row[row] = 1;
          continue;
        }
        if (mx == -INFINITY) continue;  // empty row: out = 0, lse = -inf
        double l = 0;
        for (int64_t j = 0; j < c.Nk; ++j) {
          pr[size_t(j)] = ok[size_t(j)] ? std::exp(sc[size_t(j)] - mx) : 0.0;
          l += pr[size_t(j)];
        }
        R.lse[row] = mx + std::log(l);
        for (int64_t j = 0; j < c.Nk; ++j) {
          pr[size_t(j)] /= l;
          for (int64_t e = 0; e < c.Dv; ++e)
            R.out[row * size_t(c.Dv) + size_t(e)] += pr[size_t(j)] * s.v.at(b, g, j, e);
        }
        if (!kout) continue;
        // backward: D = rowsum(dO o O) - dlse with the kernel's O (what the kernel is given)
        double D = 0;
        for (int64_t e = 0; e < c.Dv; ++e) D += s.dout.at(b, h, i, e) * (*kout)[row * size_t(c.Dv) + size_t(e)];
        if (c.dlse) D -= s.dlse[row];
        for (int64_t j = 0; j < c.Nk; ++j) {
          if (!ok[size_t(j)]) continue;
          double dp = 0;
          for (int64_t e = 0; e < c.Dv; ++e) {
            dp += s.dout.at(b, h, i, e) * s.v.at(b, g, j, e);
            R.dv[size_t(((b * c.Hkv + g) * c.Nk + j) * c.Dv + e)] += pr[size_t(j)] * s.dout.at(b, h, i, e);
          }
          const double ds = pr[size_t(j)] * (dp - D) * fac[size_t(j)] * scale;
          for (int64_t e = 0; e < c.Dk; ++e) {
            R.dq[row * size_t(c.Dk) + size_t(e)] += ds * s.k.at(b, g, j, e);
            R.dk[size_t(((b * c.Hkv + g) * c.Nk + j) * c.Dk + e)] += ds * s.q.at(b, h, i, e);
          }
        }
      }
    }
  return R;
}

// ------------------------------------------------------------------ running a path

struct Got {
  std::vector<double> out, lse, dq, dk, dv;
  int64_t counts[2] = {0, 0};
};

bool run(const Setup& s, const KernelTable* t, Got& G, bool backward) {
  const Case& c = s.c;
  const DType acc = c.dt == DType::f64 ? DType::f64 : DType::f32;
  const size_t no = size_t(c.B * c.H * c.Nq * c.Dv), nl = size_t(c.B * c.H * c.Nq);
  std::vector<unsigned char> out(no * dsize(c.dt)), lse(nl * dsize(acc));
  std::vector<uint8_t> kv_state(size_t(c.B * c.Hkv * s.m.nbk), 0);
  Params P = params(s, t);
  P.out = out.data();
  P.lse = lse.data();
  P.counts = G.counts;
  P.kv_state = kv_state.data();
  if (!t->forward(P)) return false;
  G.out.resize(no);
  G.lse.resize(nl);
  for (size_t x = 0; x < no; ++x) G.out[x] = get(out.data(), x, c.dt);
  for (size_t x = 0; x < nl; ++x) G.lse[x] = get(lse.data(), x, acc);
  if (!backward) return true;
  const size_t nq = size_t(c.B * c.H * c.Nq * c.Dk), nk = size_t(c.B * c.Hkv * c.Nk * c.Dk),
               nv = size_t(c.B * c.Hkv * c.Nk * c.Dv);
  std::vector<unsigned char> dq(nq * dsize(acc)), dk(nk * dsize(acc)), dv(nv * dsize(acc));
  Params Q = params(s, t);
  Q.out_s = {out.data(), c.H * c.Nq * c.Dv, c.Nq * c.Dv, c.Dv, 1};
  Q.lse_s = {lse.data(), c.H * c.Nq, c.Nq, 1, 0};
  Q.dout = s.dout.bytes.data();
  Q.dout_s = s.dout.strided();
  if (c.dlse) {
    Q.dlse = s.dlse.data();
    Q.dlse_s = {s.dlse.data(), c.H * c.Nq, c.Nq, 1, 0};
    Q.dlse_dtype = DType::f64;
  }
  Q.dq = dq.data();
  Q.dk = dk.data();
  Q.dv = dv.data();
  Q.counts = G.counts;
  if (!t->backward(Q)) return false;
  G.dq.resize(nq);
  G.dk.resize(nk);
  G.dv.resize(nv);
  for (size_t x = 0; x < nq; ++x) G.dq[x] = get(dq.data(), x, acc);
  for (size_t x = 0; x < nk; ++x) G.dk[x] = get(dk.data(), x, acc);
  for (size_t x = 0; x < nv; ++x) G.dv[x] = get(dv.data(), x, acc);
  return true;
}

// max |a - b| / (1 + max |b|); -inf must match -inf; NaN anywhere fails (returns inf)
double err(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0, scale = 0;
  for (size_t x = 0; x < a.size(); ++x) {
    if (std::isnan(a[x]) || std::isnan(b[x])) return INFINITY;
    if (std::isinf(a[x]) || std::isinf(b[x])) {
      if (a[x] != b[x]) return INFINITY;
      continue;
    }
    m = std::max(m, std::fabs(a[x] - b[x]));
    scale = std::max(scale, std::fabs(b[x]));
  }
  return m / (1.0 + scale);
}

double tolerance(DType t) {
  switch (t) {
    case DType::f64:
      return 1e-10;
    case DType::f32:
      return 2e-5;
    case DType::f16:
      return 4e-3;  // outputs rounded to float16 (2^-11), dO · O from the rounded O
    default:
      return 2e-2;  // bfloat16 (2^-8)
  }
}

const char* dname(DType t) {
  return t == DType::f64 ? "float64" : t == DType::f32 ? "float32" : t == DType::f16 ? "float16" : "bfloat16";
}

// The value of a code (exact, float64), as quant.hpp reads it.
double code_value(KvFormat f, uint8_t b) {
  if (f == KvFormat::i8) return double(int8_t(b));
  if (f == KvFormat::e5m2) return from_half(uint16_t(uint16_t(b) << 8));
  const double sg = (b & 0x80) ? -1.0 : 1.0;
  const int e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return NAN;
  return e == 0 ? sg * std::ldexp(double(m), -9) : sg * std::ldexp(8.0 + m, e - 10);
}

// a as a quantized cache: random finite codes (int8 in [-128, 127]; float8 with |value| <= 8,
// subnormals and zeros included) and scales (|values| < 4); val becomes code x scale, exact in
// float64 (the float32 paths round it once, well inside their tolerance).
void quantize(Arr& a, KvFormat f, bool head, std::vector<float>& scales, std::mt19937_64& rng) {
  const int64_t B = a.d[0], G = a.d[1], N = a.d[2], D = a.d[3];
  a.bytes.assign(size_t(a.s0() * B), 0);
  scales.resize(size_t(B * G * (head ? 1 : N)));
  std::uniform_real_distribution<float> us(0.004f, 0.03f);
  for (float& x : scales) x = f == KvFormat::i8 ? us(rng) : us(rng) * 8.0f;
  std::uniform_int_distribution<int> ub(0, 255);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t n = 0; n < N; ++n) {
        const float sc = scales[size_t((b * G + g) * (head ? 1 : N) + (head ? 0 : n))];
        for (int64_t e = 0; e < D; ++e) {
          uint8_t code;
          do code = uint8_t(ub(rng));
          while (!(std::fabs(code_value(f, code)) <= 8.0) && f != KvFormat::i8);  // |value| < 2: as make()
          a.bytes[size_t(b * a.s0() + g * a.s1() + n * a.s2() + e)] = code;
          a.at(b, g, n, e) = code_value(f, code) * double(sc);
        }
      }
}

// One key's K or V row made non-finite in a quantized cache: its scale (int8, or a per-key scale)
// or one code (the float8 NaN / inf patterns).
void plant(Arr& a, KvFormat f, std::vector<float>& scales, int64_t b, int64_t g, int64_t n, float bad_scale,
           uint8_t bad_code) {
  if (f == KvFormat::i8) {
    const size_t x = size_t((b * a.d[1] + g) * a.d[2] + n);
    scales[x] = bad_scale;
    for (int64_t e = 0; e < a.d[3]; ++e) {
      const double c = code_value(f, a.bytes[size_t(b * a.s0() + g * a.s1() + n * a.s2() + e)]);
      a.at(b, g, n, e) = c * double(bad_scale);
    }
  } else {
    a.bytes[size_t(b * a.s0() + g * a.s1() + n * a.s2())] = bad_code;
    a.at(b, g, n, 0) = code_value(f, bad_code);
  }
}

Setup setup(const Case& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Setup s;
  s.c = c;
  const int64_t pad = c.pad ? 3 : 0;
  s.q = make(c.dt, c.B, c.H, c.Nq, c.Dk, pad, rng);
  s.k = make(c.dt, c.B, c.Hkv, c.Nk, c.Dk, pad, rng);
  s.v = make(c.dt, c.B, c.Hkv, c.Nk, c.Dv, 0, rng);
  if (c.kvf != KvFormat::native) {
    quantize(s.k, c.kvf, c.head_scale, s.ks, rng);
    quantize(s.v, c.kvf, c.head_scale, s.vs, rng);
  }
  s.dout = make(c.dt, c.B, c.H, c.Nq, c.Dv, 0, rng);
  if (c.bias) s.bias = make(DType::f32, c.B, 1, c.Nq, c.Nk, 0, rng);
  std::uniform_real_distribution<double> u(-0.5, 0.5);
  s.dlse.resize(size_t(c.B * c.H * c.Nq));
  for (double& x : s.dlse) x = u(rng);
  s.m = make_mask(c, rng);
  s.tables.reserve(c.mods.size());
  for (size_t x = 0; x < c.mods.size(); ++x) {
    Mod m = c.mods[x];
    if (m.kind == MOD_ALIBI) {  // slopes (H,)
      s.tables.emplace_back(size_t(c.H));
      for (int64_t h = 0; h < c.H; ++h) s.tables.back()[size_t(h)] = std::exp2(-double(h + 1));
      m.tb_b = 0;
      m.tb_h = 1;
    } else if (m.kind == MOD_RELBIAS) {  // (H, 2M+1)
      s.tables.emplace_back(size_t(c.H * (2 * m.m + 1)));
      for (double& y : s.tables.back()) y = 2 * u(rng);
      m.tb_b = 0;
      m.tb_h = 2 * m.m + 1;
    } else {
      s.tables.emplace_back();
    }
    m.table = s.tables.back().data();
    s.mods[x] = m;
  }
  if (c.nonfinite && c.kvf != KvFormat::native) {  // a NaN v row, an inf k row (hidden by causal masks)
    plant(s.v, c.kvf, s.vs, 0, 0, c.Nk / 2, NAN, c.kvf == KvFormat::e4m3 ? 0xff : 0x7e);
    plant(s.k, c.kvf, s.ks, c.B - 1, c.Hkv - 1, c.Nk - 1, INFINITY, c.kvf == KvFormat::e4m3 ? 0x7f : 0x7c);
    set_value(s.q, 0, c.H - 1, c.Nq - 1, 0, NAN);
  } else if (c.nonfinite) {  // a NaN in one v row, +inf in one k row, NaN in one q row
    set_value(s.v, 0, 0, c.Nk / 2, 0, NAN);
    set_value(s.k, c.B - 1, c.Hkv - 1, c.Nk - 1, c.Dk - 1, INFINITY);
    set_value(s.q, 0, c.H - 1, c.Nq - 1, 0, NAN);
  }
  return s;
}

int failures = 0;

void check(const char* what, const std::string& name, const char* path, double e, double tol) {
  const bool ok = e <= tol;
  if (!ok) ++failures;
  std::printf("  %-4s %-9s %-5s err %.3g (tol %.1g)%s\n", ok ? "ok" : "FAIL", path, what, e, tol,
              ok ? "" : ("  <- " + name).c_str());
}

void run_case(const Case& c, uint64_t seed) {
  const Setup s = setup(c, seed);
  std::printf("%s [%s]\n", c.name.c_str(), dname(c.dt));
  const double tol = tolerance(c.dt);
  std::vector<Got> got;
  std::vector<const KernelTable*> tables = runnable();
  for (const KernelTable* t : tables) {
    Got G;
    if (!run(s, t, G, !c.nonfinite && c.kvf == KvFormat::native)) {
      std::printf("  FAIL %s: out of memory\n", t->name);
      ++failures;
      return;
    }
    got.push_back(G);
  }
  if (c.nonfinite) {
    const Ref R = reference(s);
    int64_t want = 0;
    for (char x : R.nan_row) want += x;
    for (size_t p = 0; p < tables.size(); ++p) {
      const Got& G = got[p];
      double e = 0;
      for (size_t row = 0; row < R.nan_row.size(); ++row) {
        const bool is_nan = std::isnan(G.lse[row]);
        if (is_nan != bool(R.nan_row[row])) e = INFINITY;
        for (int64_t d = 0; d < c.Dv; ++d)
          if (std::isnan(G.out[row * size_t(c.Dv) + size_t(d)]) != is_nan) e = INFINITY;
        if (!is_nan) {
          e = std::max(e, std::fabs(G.lse[row] - R.lse[row]) / (1 + std::fabs(R.lse[row])));
          for (int64_t d = 0; d < c.Dv; ++d) {
            const size_t x = row * size_t(c.Dv) + size_t(d);
            e = std::max(e, std::fabs(G.out[x] - R.out[x]) / 5.0);  // |values| < 4
          }
        }
      }
      check("nan", c.name, tables[p]->name, e, tol);
      check("count", c.name, tables[p]->name, double(std::llabs(G.counts[0] - want) + G.counts[1]), 0);
    }
    return;
  }
  for (size_t p = 0; p < tables.size(); ++p) {
    const Got& G = got[p];
    const char* pn = tables[p]->name;
    if (c.dropout > 0) continue;  // compared across paths below
    const Ref R = reference(s, &G.out);
    check("out", c.name, pn, err(G.out, R.out), tol);
    check("lse", c.name, pn, err(G.lse, R.lse), tol);
    if (c.kvf != KvFormat::native) continue;  // no backward with a quantized cache
    check("dq", c.name, pn, err(G.dq, R.dq), tol);
    check("dk", c.name, pn, err(G.dk, R.dk), tol);
    check("dv", c.name, pn, err(G.dv, R.dv), tol);
  }
  // every path against the last one ("portable"): the same numbers up to summation order
  const Got& base = got.back();
  for (size_t p = 0; p + 1 < tables.size(); ++p) {
    const Got& G = got[p];
    double e = std::max(
        {err(G.out, base.out), err(G.lse, base.lse), err(G.dq, base.dq), err(G.dk, base.dk), err(G.dv, base.dv)});
    check("=port", c.name, tables[p]->name, e, tol);
  }
}

Mod mod(int kind, double c, int64_t m = 0) {
  Mod r;
  r.kind = kind;
  r.c = c;
  r.m = m;
  return r;
}

}  // namespace

int main() {
  const DType f32 = DType::f32, f64 = DType::f64, f16 = DType::f16, bf = DType::bf16;
  // name, dtype, B, H, Hkv, Nq, Nk, Dk, Dv, mask, threads, mods, bias, dlse, pad, window, dropout, nonfinite
  const std::vector<Case> cases = {
      {"dense, tile edges", f32, 1, 2, 2, 129, 129, 64, 64, NONE, 1, {}, false, false, false},
      {"dense, 1 x 1", f32, 1, 1, 1, 1, 1, 1, 1, NONE, 1, {}},
      {"dense, 16 queries x 15 keys", f32, 2, 1, 1, 16, 15, 17, 15, NONE, 2, {}},
      {"dense, 17 x 63, strided rows", f64, 1, 2, 2, 17, 63, 33, 17, NONE, 1, {}, false, true, true},
      {"GQA causal, 3 threads", f32, 2, 4, 2, 65, 200, 40, 24, CAUSAL, 3, {}},
      {"GQA causal", bf, 1, 4, 2, 127, 127, 64, 64, CAUSAL, 2, {}},
      {"window 48, mul + softcap",
       f64,
       1,
       2,
       1,
       150,
       150,
       32,
       32,
       WINDOW,
       2,
       {mod(MOD_MUL, 0.7), mod(MOD_SOFTCAP, 5.0)},
       false,
       false,
       false,
       48},
      {"window 20", f16, 1, 2, 2, 130, 130, 16, 48, WINDOW, 1, {}, false, false, false, 20},
      {"random intervals, empty rows, dlse", f32, 2, 2, 2, 64, 128, 24, 24, RANDOM_ROWS, 2, {}, false, true},
      {"tiles + bitmaps, relbias, bias", f32, 2, 2, 1, 127, 257, 64, 32, TILES, 2, {mod(MOD_RELBIAS, 0, 5)}, true},
      {"tiles + bitmaps + causal rows", f64, 1, 2, 2, 70, 140, 20, 20, TILES_AND_ROWS, 1, {}},
      {"tiles + bitmaps", f16, 1, 2, 2, 65, 129, 32, 32, TILES, 2, {mod(MOD_SOFTCAP, 3.0)}},
      {"tiles + bitmaps", bf, 1, 1, 1, 63, 255, 48, 48, TILES, 1, {}},
      {"decode, 1 query, GQA 8/2", bf, 1, 8, 2, 1, 300, 64, 64, NONE, 2, {}},
      {"decode, 5 queries, causal, alibi", f16, 2, 8, 2, 5, 257, 64, 64, CAUSAL, 2, {mod(MOD_ALIBI, 0)}},
      {"decode, split keys", f32, 1, 4, 1, 1, 1100, 32, 32, NONE, 2, {}},
      // the thin path's score blocks (decode.hpp): 1 row at Dk 128 (known stride), 3 rows (2 + 1),
      // 7 rows (4 + 2 + 1); key counts ending mid-fold
      {"decode, 1 row, Dk 128", f32, 1, 1, 1, 1, 1031, 128, 128, NONE, 2, {}},
      {"decode, 3 rows", bf, 1, 3, 1, 1, 262, 64, 64, NONE, 1, {}},
      {"decode, 7 rows", f16, 1, 7, 1, 1, 131, 96, 48, NONE, 2, {}},
      {"decode, split keys, window", f64, 1, 2, 1, 3, 1100, 16, 16, WINDOW, 2, {}, false, false, false, 700},
      {"decode, tiles + bitmaps", f32, 1, 4, 4, 16, 300, 64, 64, TILES, 2, {mod(MOD_MUL, 1.5)}},
      {"dropout 0.25, causal", f32, 1, 2, 1, 80, 80, 32, 32, CAUSAL, 2, {}, false, false, false, 0, 0.25},
      {"non-finite inputs, causal", f32, 1, 2, 2, 40, 140, 16, 16, CAUSAL, 2, {}, false, false, false, 0, 0.0, true},
      {"non-finite inputs, decode", bf, 2, 4, 2, 2, 300, 16, 16, NONE, 2, {}, false, false, false, 0, 0.0, true},
  };
  // a quantized cache (quant.hpp), forward only: decode read in place (1, 3, 4 and 8 rows, FULL
  // tiles, key counts ending mid-fold), edge tiles and odd Dk / Dv through the dequantised copy,
  // the wide path (> 8 rows), prefill against a cache (causal, bottom-right, across tile edges),
  // per-head scales, non-finite codes and scales in attended and hidden slots
  const KvFormat i8 = KvFormat::i8, e4 = KvFormat::e4m3, e5 = KvFormat::e5m2;
  const std::vector<Case> quant = {
      {"int8 cache, decode, 1 row", f32, 1, 2, 2, 1, 1031, 64, 64, NONE, 2, {}, false, false, false, 0, 0.0, false, i8},
      {"int8 cache, decode, GQA 8/2",
       bf,
       1,
       8,
       2,
       1,
       300,
       128,
       128,
       NONE,
       1,
       {},
       false,
       false,
       false,
       0,
       0.0,
       false,
       i8},
      {"int8 cache, 3 rows, odd D", f16, 1, 3, 1, 1, 262, 33, 17, NONE, 2, {}, false, false, false, 0, 0.0, false, i8},
      {"e4m3 cache, decode, 8 rows", f32, 1, 8, 1, 1, 517, 64, 32, NONE, 2, {}, false, false, false, 0, 0.0, false, e4},
      {"e5m2 cache, decode, 4 rows, alibi",
       f32,
       1,
       4,
       1,
       1,
       300,
       64,
       64,
       NONE,
       2,
       {mod(MOD_ALIBI, 0)},
       false,
       false,
       false,
       0,
       0.0,
       false,
       e5},
      {"e4m3 cache, per-head scale, wide",
       bf,
       1,
       16,
       1,
       2,
       400,
       64,
       64,
       NONE,
       2,
       {},
       false,
       false,
       false,
       0,
       0.0,
       false,
       e4,
       true},
      {"e5m2 cache, prefill chunk, causal",
       f32,
       1,
       4,
       2,
       40,
       300,
       32,
       48,
       CAUSAL,
       2,
       {},
       false,
       false,
       false,
       0,
       0.0,
       false,
       e5},
      {"int8 cache, prefill chunk, causal",
       f16,
       1,
       2,
       1,
       130,
       260,
       64,
       64,
       CAUSAL,
       2,
       {},
       false,
       false,
       false,
       0,
       0.0,
       false,
       i8},
      {"int8 cache, non-finite, decode",
       f32,
       2,
       4,
       2,
       1,
       300,
       16,
       16,
       NONE,
       2,
       {},
       false,
       false,
       false,
       0,
       0.0,
       true,
       i8},
      {"e4m3 cache, non-finite, decode",
       f32,
       2,
       2,
       2,
       1,
       300,
       64,
       64,
       NONE,
       2,
       {},
       false,
       false,
       false,
       0,
       0.0,
       true,
       e4},
      {"e5m2 cache, non-finite, causal",
       bf,
       2,
       2,
       2,
       40,
       140,
       16,
       16,
       CAUSAL,
       2,
       {},
       false,
       false,
       false,
       0,
       0.0,
       true,
       e5},
      {"int8 cache, float64 q, decode",
       f64,
       1,
       4,
       1,
       1,
       300,
       64,
       64,
       NONE,
       2,
       {},
       false,
       false,
       false,
       0,
       0.0,
       false,
       i8},
      {"e4m3 cache, float64 q, wide",
       f64,
       1,
       16,
       1,
       1,
       200,
       32,
       32,
       NONE,
       1,
       {},
       false,
       false,
       false,
       0,
       0.0,
       false,
       e4},
  };
  std::printf("ISA paths:");
  for (const KernelTable* t : runnable()) std::printf(" %s", t->name);
  std::printf(" (default: %s)\n", current()->name);
#if defined(__aarch64__)
  // An arm64 build must check its NEON path, the one the module runs by default: a CPU detection
  // that fell back to "portable" would otherwise pass every case below on the portable path alone.
  if (!find_table("neon") || std::strcmp(current()->name, "neon") != 0) {
    std::printf("FAILED: an arm64 build must run the neon path, but runs %s\n", current()->name);
    return 1;
  }
#endif
  uint64_t seed = 1;
  for (const Case& c : cases) run_case(c, seed++);
  for (const Case& c : quant) run_case(c, seed++);
  std::printf(failures ? "%d FAILED\n" : "all passed\n", failures);
  return failures ? 1 : 0;
}
