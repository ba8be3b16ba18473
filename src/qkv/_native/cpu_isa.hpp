// Which paths this CPU runs: the one statement of each path's CPU features, shared by dispatch.cpp
// (the path picked at load time) and host_isa.cpp (the configure-time probe of QKV_QUICK_BUILD).
#pragma once
#include <cstring>

namespace qkv_native {

// hidden (dispatch.cpp's QKV_NATIVE_HIDE): paths to treat as missing, and with them those needing them.
inline bool cpu_runs(const char* isa, bool (*hidden)(const char*) = nullptr) {
  if (hidden && hidden(isa)) return false;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (!std::strcmp(isa, "avx2"))
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  if (!std::strcmp(isa, "avx512"))
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("f16c") &&
           __builtin_cpu_supports("fma");
  if (!std::strcmp(isa, "avx512bf16")) return cpu_runs("avx512", hidden) && __builtin_cpu_supports("avx512bf16");
#endif
#if defined(__aarch64__)
  if (!std::strcmp(isa, "neon")) return true;  // Advanced SIMD is part of every AArch64 CPU
#endif
  return !std::strcmp(isa, "portable");
}

}  // namespace qkv_native
