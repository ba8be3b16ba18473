// Configure-time probe of QKV_QUICK_BUILD (CMakeLists.txt): prints the best x86 path this CPU runs,
// so that a quick build compiles only that unit (and the portable one every build has).
#include <cstdio>
#include <initializer_list>

#include "cpu_isa.hpp"

int main() {
  for (const char* isa : {"avx512bf16", "avx512", "avx2"})
    if (qkv_native::cpu_runs(isa)) return std::printf("%s", isa) < 0;
  return std::printf("portable") < 0;
}
