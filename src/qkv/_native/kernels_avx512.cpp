// AVX-512 F/BW/DQ/VL path (used only if the CPU has all four). 16 lanes = one zmm for float,
// two for double; masks are k-registers (simd_avx512.hpp). Compiled everywhere; tests/native runs
// it wherever the CPU has the four (CI requires it through QKV_REQUIRE_ISAS).
#define QKV_NS avx512
#include "simd_avx512.hpp"

#include "kernels_impl.hpp"

namespace qkv_native {
extern const KernelTable kTableAvx512 = {"avx512", &avx512::forward_entry, &avx512::backward_entry,
                                         &avx512::microbench};
}
