// A small persistent thread pool. Workers are created lazily (up to the largest count asked for)
// and live for the process; between calls they sleep on a condition variable (no spinning: the
// machine is shared, and a spinning pool would steal the other process's core). One pool for the
// process, never one per call. Calls are serialised by a mutex: two Python threads calling the
// kernel at once (the GIL is released) take turns instead of oversubscribing the cores.
#pragma once
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "params.hpp"

namespace qkv_native {

class ThreadPool {
 public:
  static ThreadPool& instance();
  // fn(ctx, tid) for tid in [0, n): tid 0 on the calling thread, 1..n-1 on workers.
  void run(int n, TaskFn fn, void* ctx);
  ThreadPool() = default;
  ThreadPool(const ThreadPool&) = delete;  // owns threads: one pool, never copied
  ThreadPool& operator=(const ThreadPool&) = delete;
  ~ThreadPool();

 private:
  void worker(int id);
  std::mutex call_mu_;  // one run() at a time
  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  TaskFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int active_ = 0;   // workers taking part in this run (ids 1..active_)
  int pending_ = 0;  // workers of this run not finished yet
  unsigned long generation_ = 0;
  bool stop_ = false;
};

}  // namespace qkv_native
