// One build of the decode loop (decode.hpp) for decode_ab.sh: compiled with -DQKV_NS=<name> and the
// variant's -D / -m flags (QKV_DECODE_PREFETCH, QKV_DECODE_PF_LOCALITY, -DAVX2_UNIT for the AVX2
// vector types instead of AVX-512's), it registers its decode call with the driver under <name>.
#ifdef AVX2_UNIT
#include "avx2_unit.inc"  // kernels_avx2.cpp without its table (decode_ab.sh makes it)
#else
#include "simd_avx512.hpp"
#include "kernels_impl.hpp"
#endif
#define QKV_STR2(x) #x
#define QKV_STR(x) QKV_STR2(x)

void register_variant(const char* name, bool (*fn)(const qkv_native::Params&));

namespace {
bool run(const qkv_native::Params& P) {
  using namespace qkv_native::QKV_NS;
  switch (P.dtype) {
    case qkv_native::DType::f32:
      return decode_forward<float>(P);
    case qkv_native::DType::bf16:
      return decode_forward<bf16_t>(P);
    default:
      return decode_forward<f16_t>(P);
  }
}
struct Registered {
  Registered() { register_variant(QKV_STR(QKV_NS), &run); }
} registered;
}  // namespace
