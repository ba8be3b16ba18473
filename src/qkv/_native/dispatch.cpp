// Runtime CPU dispatch and the thread pool: the only non-ISA C++ besides the binding.
// The path is picked once, at load time, from __builtin_cpu_supports; QKV_NATIVE_ISA (or use_isa()
// from Python) may force any path the CPU can run, for tests.
#include <cstdlib>
#include <cstring>
#include <string>

#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "cpu_isa.hpp"
#include "dispatch.hpp"
#include "threads.hpp"

namespace qkv_native {

extern const KernelTable kTablePortable;
#ifdef QKV_HAVE_AVX2
extern const KernelTable kTableAvx2;
#endif
#ifdef QKV_HAVE_AVX512
extern const KernelTable kTableAvx512;
#endif
#ifdef QKV_HAVE_AVX512BF16
extern const KernelTable kTableAvx512Bf16;
#endif
#ifdef QKV_HAVE_NEON
extern const KernelTable kTableNeon;
#endif

// ------------------------------------------------------------------ thread pool

ThreadPool& ThreadPool::instance() {
  // Leaked on purpose: joining threads from a static destructor at interpreter exit can deadlock.
  // After fork() (multiprocessing, DataLoader workers) the child has none of the parent's worker
  // threads and maybe a mutex locked by one of them: it gets a fresh pool, the old one is leaked.
  static ThreadPool* pool = nullptr;
  static pid_t owner = 0;
  static std::mutex mu;  // two Python threads (GIL released) may arrive here first together
  std::lock_guard<std::mutex> lk(mu);
  const pid_t me = getpid();
  if (!pool || owner != me) {
    pool = new ThreadPool();
    owner = me;
  }
  return *pool;
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker(int id) {
  unsigned long seen = 0;
  for (;;) {
    TaskFn fn;
    void* ctx;
    {
      std::unique_lock<std::mutex> lk(mu_);
      wake_.wait(lk, [&] { return stop_ || (generation_ != seen && id <= active_); });
      if (stop_) return;
      seen = generation_;
      fn = fn_;
      ctx = ctx_;
    }
    fn(ctx, id);
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (--pending_ == 0) done_.notify_one();
    }
  }
}

void ThreadPool::run(int n, TaskFn fn, void* ctx) {
  if (n <= 1) {
    fn(ctx, 0);
    return;
  }
  std::lock_guard<std::mutex> call(call_mu_);
  {
    std::lock_guard<std::mutex> lk(mu_);
    while (int(workers_.size()) < n - 1) {
      const int id = int(workers_.size()) + 1;
      workers_.emplace_back([this, id] { worker(id); });
    }
    fn_ = fn;
    ctx_ = ctx;
    active_ = n - 1;
    pending_ = n - 1;
    ++generation_;
  }
  wake_.notify_all();
  fn(ctx, 0);
  std::unique_lock<std::mutex> lk(mu_);
  done_.wait(lk, [&] { return pending_ == 0; });
}

static void parallel(int n, TaskFn fn, void* ctx) { ThreadPool::instance().run(n, fn, ctx); }
ParallelFn parallel_fn() { return &parallel; }

// ------------------------------------------------------------------ ISA selection

// QKV_NATIVE_HIDE="avx512bf16,avx2" makes the listed paths (and those needing them) unsupported, as on
// a CPU without them: the tests of the selection logic run on any machine.
static bool hidden(const char* isa) {
  const char* env = std::getenv("QKV_NATIVE_HIDE");
  return env && (std::string(",") + env + ",").find(std::string(",") + isa + ",") != std::string::npos;
}

static bool cpu_has(const char* isa) { return cpu_runs(isa, &hidden); }

std::vector<const KernelTable*> runnable() {
  std::vector<const KernelTable*> r;
#ifdef QKV_HAVE_AVX512BF16
  if (cpu_has("avx512bf16")) r.push_back(&kTableAvx512Bf16);  // avx512 plus vdpbf16ps for bf16
#endif
#ifdef QKV_HAVE_AVX512
  if (cpu_has("avx512")) r.push_back(&kTableAvx512);
#endif
#ifdef QKV_HAVE_AVX2
  if (cpu_has("avx2")) r.push_back(&kTableAvx2);
#endif
#ifdef QKV_HAVE_NEON
  if (cpu_has("neon")) r.push_back(&kTableNeon);
#endif
  r.push_back(&kTablePortable);
  return r;
}

static const KernelTable* g_current = nullptr;

const KernelTable* find_table(const char* name) {
  for (const KernelTable* t : runnable())
    if (!std::strcmp(t->name, name)) return t;
  return nullptr;
}

const KernelTable* current() {
  if (!g_current) {
    g_current = runnable().front();  // best first
    if (const char* env = std::getenv("QKV_NATIVE_ISA")) {
      if (const KernelTable* t = find_table(env)) g_current = t;
    }
  }
  return g_current;
}

void set_current(const KernelTable* t) { g_current = t; }

// ------------------------------------------------------------------ the decode loop's prefetch

// Decode streams K and V once (decode.hpp) and prefetches kDecodePrefetch keys ahead. On AMD family
// 19h (Zen 4: EPYC family 25 model 17, measured; Zen 3 shares the family number) prefetching into
// L1 (prefetcht0) made the step slower than no prefetch at all, while prefetching into L2 only
// (prefetcht2; prefetcht1 measured alike) came close to the floor: benchmarks/decode_ab.sh, 2
// threads, Nk = 32768, interleaved medians on a loaded machine — fraction of the read floor L1 ->
// L2: bf16 MHA 8/8 D=64 0.38-0.44 -> 0.75-1.07 (four runs), GQA 32/8 D=128 0.45 -> 0.85, float32
// MHA 0.62 -> 0.93, int8 MHA 0.33-0.42 -> 0.52-0.64, E5M2 MHA 0.31 -> 0.49; E4M3 alike (its loop
// is bound by its own arithmetic). Zen 5 chose L1 against no prefetch (decode.hpp); other CPUs
// keep it until measured. QKV_DECODE_PREFETCH=l1|l2 (or set_decode_prefetch from
// Python) forces one, for tests and benchmarks.
static Prefetch cpu_prefetch() {
  if (const char* env = std::getenv("QKV_DECODE_PREFETCH")) {
    if (!std::strcmp(env, "l1")) return Prefetch::l1;
    if (!std::strcmp(env, "l2")) return Prefetch::l2;
  }
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_is("amd")) {
    unsigned a = 0, b = 0, c = 0, d = 0;
    __get_cpuid(1, &a, &b, &c, &d);
    const unsigned family = ((a >> 8) & 0xf) + (((a >> 8) & 0xf) == 0xf ? (a >> 20) & 0xff : 0);
    if (family == 0x19) return Prefetch::l2;
  }
#endif
  return Prefetch::l1;
}

static int g_prefetch = -1;  // unset: cpu_prefetch() on first use

Prefetch decode_prefetch() {
  if (g_prefetch < 0) g_prefetch = int(cpu_prefetch());
  return Prefetch(g_prefetch);
}

void set_decode_prefetch(Prefetch p) { g_prefetch = int(p); }

}  // namespace qkv_native
