// decode_ab.sh's driver: each registered variant of the decode loop on one decode call, and a plain
// AVX-512 read of the same K+V bytes on the same threads (the floor: one stream, or K and V as two
// streams at once, whichever is faster), called in turn (A B C .. A B C ..), min or median per
// variant (MINSTAT=1: the minimum, for a busy machine).
//   -H heads -G kv heads -D head dim -q queries -n keys -t f32|bf16|f16 -k i8|e4m3|e5m2 (a
//   quantized cache, bf16 / f32 / f16 q) -T threads -r rounds -i name,name (variants to run)
//   -p l1,l2 (the prefetch targets each variant runs with, Params::prefetch: both by default)
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dispatch.hpp"
#include "params.hpp"

using namespace qkv_native;
using Fn = bool (*)(const Params&);

static std::vector<std::pair<const char*, Fn>>& variants() {
  static std::vector<std::pair<const char*, Fn>> v;
  return v;
}
void register_variant(const char* name, Fn fn) { variants().push_back({name, fn}); }
// dispatch.cpp (built without QKV_HAVE_*) needs the portable table; the variants do not use it
namespace qkv_native {
extern const KernelTable kTablePortable;
const KernelTable kTablePortable = {"portable", nullptr, nullptr, nullptr};
}  // namespace qkv_native

struct Read {
  const char* p;
  size_t n;
  int threads;
  float sink[256 * 16];
};
__attribute__((target("avx512f"))) static void read_part(void* c, int tid) {
  Read& R = *static_cast<Read*>(c);
  const size_t per = R.n / size_t(R.threads) / 256 * 256;
  const char* a = R.p + per * size_t(tid);
  __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (size_t i = 0; i + 256 <= per; i += 256) {
    s0 = _mm512_add_ps(s0, _mm512_loadu_ps(reinterpret_cast<const float*>(a + i)));
    s1 = _mm512_add_ps(s1, _mm512_loadu_ps(reinterpret_cast<const float*>(a + i + 64)));
    s2 = _mm512_add_ps(s2, _mm512_loadu_ps(reinterpret_cast<const float*>(a + i + 128)));
    s3 = _mm512_add_ps(s3, _mm512_loadu_ps(reinterpret_cast<const float*>(a + i + 192)));
  }
  R.sink[tid * 16] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

// The same bytes as two streams at once (K's and V's parts of each thread, interleaved), as a decode
// step reads them: one thread on Zen 4 read 256 MiB 1.15-1.18x faster this way than as one stream.
__attribute__((target("avx512f"))) static void read2_part(void* c, int tid) {
  Read& R = *static_cast<Read*>(c);
  const size_t half = R.n / 2;
  const size_t per = half / size_t(R.threads) / 128 * 128;
  const char* a = R.p + per * size_t(tid);
  const char* b = a + half;
  __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (size_t i = 0; i + 128 <= per; i += 128) {
    s0 = _mm512_add_ps(s0, _mm512_loadu_ps(reinterpret_cast<const float*>(a + i)));
    s1 = _mm512_add_ps(s1, _mm512_loadu_ps(reinterpret_cast<const float*>(b + i)));
    s2 = _mm512_add_ps(s2, _mm512_loadu_ps(reinterpret_cast<const float*>(a + i + 64)));
    s3 = _mm512_add_ps(s3, _mm512_loadu_ps(reinterpret_cast<const float*>(b + i + 64)));
  }
  R.sink[tid * 16] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
static uint16_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return uint16_t(u >> 16);
}

int main(int argc, char** argv) {
  int H = 8, Hkv = 8, D = 64, Nq = 1, rounds = 15, threads = 2;
  int64_t Nk = 32768;
  std::string dt = "f32", only, kq, targets = "l1,l2";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "-H")
      H = std::stoi(v);
    else if (a == "-G")
      Hkv = std::stoi(v);
    else if (a == "-D")
      D = std::stoi(v);
    else if (a == "-q")
      Nq = std::stoi(v);
    else if (a == "-n")
      Nk = std::stoll(v);
    else if (a == "-t")
      dt = v;
    else if (a == "-k")
      kq = v;
    else if (a == "-r")
      rounds = std::stoi(v);
    else if (a == "-T")
      threads = std::stoi(v);
    else if (a == "-i")
      only = v;
    else if (a == "-p")
      targets = v;
  }
  const DType dtype = dt == "f32" ? DType::f32 : dt == "bf16" ? DType::bf16 : DType::f16;
  const size_t es = kq.empty() ? (dtype == DType::f32 ? 4 : 2) : 1, n = size_t(Hkv) * size_t(Nk) * size_t(D);
  const size_t qs = dtype == DType::f32 ? 4 : 2;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::vector<char> kv(2 * n * es), q(size_t(H) * size_t(Nq) * size_t(D) * qs), out(q.size());
  std::vector<float> scales(2 * size_t(Hkv) * size_t(Nk), 1.0f / 64);
  for (size_t i = 0; i < 2 * n; ++i) {
    const float x = nd(rng);
    if (!kq.empty()) {  // finite codes: magnitude bits below 0x78 (E4M3's NaN is 0x7f, E5M2's inf from 0x7c)
      const int m = int(rng() % 0x78), neg = int(rng() & 1);
      kv[i] = char(kq == "i8" ? (neg ? -m : m) : (m | (neg << 7)));
    } else if (es == 4) {
      std::memcpy(&kv[i * 4], &x, 4);
    } else {
      const uint16_t b = bf16_bits(x);  // (float16 runs read these bits as float16: finite, fine)
      std::memcpy(&kv[i * 2], &b, 2);
    }
  }
  for (size_t i = 0; i < q.size() / qs; ++i) {
    const float x = nd(rng);
    if (qs == 4)
      std::memcpy(&q[i * 4], &x, 4);
    else {
      const uint16_t b = bf16_bits(x);
      std::memcpy(&q[i * 2], &b, 2);
    }
  }
  std::vector<float> lse(size_t(H) * size_t(Nq));
  Params P;
  P.dtype = dtype;
  P.B = 1;
  P.H = H;
  P.Hkv = Hkv;
  P.Nq = Nq;
  P.Nk = Nk;
  P.Dk = P.Dv = D;
  P.q = {q.data(), int64_t(H) * Nq * D, int64_t(Nq) * D, D, 1};
  P.k = {kv.data(), int64_t(Hkv) * Nk * D, Nk * D, D, 1};
  P.v = {kv.data() + n * es, int64_t(Hkv) * Nk * D, Nk * D, D, 1};
  if (!kq.empty()) {
    P.kv_format = kq == "i8" ? KvFormat::i8 : kq == "e4m3" ? KvFormat::e4m3 : KvFormat::e5m2;
    P.k_scale = {scales.data(), int64_t(Hkv) * Nk, Nk, 1, 0};
    P.v_scale = {scales.data() + size_t(Hkv) * size_t(Nk), int64_t(Hkv) * Nk, Nk, 1, 0};
  }
  P.scale = 1.0 / std::sqrt(double(D));
  P.bk = kBlockK;
  P.nbk = (Nk + P.bk - 1) / P.bk;
  P.out = out.data();
  P.lse = lse.data();
  P.threads = threads;
  P.parallel = parallel_fn();
  int64_t counts[2] = {0, 0};
  P.counts = counts;
  std::vector<uint8_t> kv_state(size_t(Hkv) * size_t(P.nbk));
  P.kv_state = kv_state.data();
  const size_t bytes = kv.size() + (kq.empty() ? 0 : 4 * scales.size());
  struct Entry {
    std::string name;
    Fn fn;
    Prefetch pf;
  };
  std::vector<Entry> run;
  for (auto& v : variants())
    if (only.empty() || ("," + only + ",").find("," + std::string(v.first) + ",") != std::string::npos)
      for (const char* pf : {"l1", "l2"})
        if (("," + targets + ",").find("," + std::string(pf) + ",") != std::string::npos)
          run.push_back({std::string(v.first) + "/" + pf, v.second, pf[1] == '2' ? Prefetch::l2 : Prefetch::l1});
  Read R{kv.data(), kv.size(), threads, {}};
  std::vector<std::vector<double>> t(run.size() + 2);
  for (int r = -1; r < rounds; ++r)
    for (size_t i = 0; i <= run.size() + 1; ++i) {
      const double t0 = now();
      if (i == run.size()) {
        parallel_fn()(threads, read_part, &R);
      } else if (i == run.size() + 1) {
        parallel_fn()(threads, read2_part, &R);
      } else {
        std::fill(kv_state.begin(), kv_state.end(), 0);
        P.prefetch = run[i].pf;
        run[i].fn(P);
      }
      if (r >= 0) t[i].push_back(now() - t0);
    }
  const bool min = std::getenv("MINSTAT") != nullptr;
  const auto stat = [&](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return min ? v[0] : v[v.size() / 2];
  };
  const double f1 = stat(t[run.size()]), f2 = stat(t[run.size() + 1]);
  std::printf("  one stream %.1f GB/s, two streams %.1f GB/s\n", double(kv.size()) / f1 / 1e9,
              double(kv.size()) / f2 / 1e9);
  const double fl = std::min(f1, f2) * double(bytes) / double(kv.size());  // the scales read at the codes' rate
  std::printf("H=%d Hkv=%d D=%d Nq=%d Nk=%ld %s%s%s, %d threads: K+V %.1f MiB, floor %.3f ms (%.1f GB/s), %s\n", H, Hkv,
              D, Nq, long(Nk), dt.c_str(), kq.empty() ? "" : " q, cache ", kq.c_str(), threads,
              double(bytes) / 1048576.0, fl * 1e3, double(bytes) / fl / 1e9, min ? "min" : "median");
  for (size_t i = 0; i < run.size(); ++i) {
    const double x = stat(t[i]);
    std::printf("  %-16s %.3f ms  %.1f GB/s  fraction of floor %.2f\n", run[i].name.c_str(), x * 1e3,
                double(bytes) / x / 1e9, fl / x);
  }
}
