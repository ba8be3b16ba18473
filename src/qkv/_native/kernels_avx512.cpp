// AVX-512 F/BW/DQ/VL path (used only if the CPU has all four). 16 lanes = one zmm for float,
// two for double; masks are k-registers. NOT RUN on the development machine (AMD EPYC Zen 3,
// AVX2 only): compiled everywhere, tested by tests/native only where the CPU supports it.
#define QKV_NS avx512
#include "simd_avx512.hpp"

#include "kernels_impl.hpp"

namespace qkv_native {
extern const KernelTable kTableAvx512 = {"avx512", &avx512::forward_entry, &avx512::backward_entry,
                                         &avx512::microbench};
}
