// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a
// counter-based generator, so the dropout keep-bit of any cell (b, h, i, j) is a pure function of
// (seed, b, h, i, j). The backward pass regenerates exactly the forward's mask without storing it,
// in any tile order and on any thread; philox_keep() exposes the same bits to Python.
//
// key = (seed & 0xffffffff, seed >> 32); counter = (j >> 2, i, h, b); the 4 output words serve
// keys j & ~3 ... (j & ~3) + 3 (word j & 3). Keep iff word >= threshold(p).
//
// Functions are `static inline`: every translation unit (each compiled with other -m flags) gets
// its own copy, never one merged by the linker across ISAs.
#pragma once
#include <cstdint>

#include "params.hpp"

namespace qkv_native {
inline namespace QKV_NS {

struct Philox4 {
  uint32_t w[4];
};

static inline Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  const uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;  // Random123's multipliers
  const uint32_t W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;  // Weyl key increments (golden ratio, sqrt 3)
  for (int r = 0; r < 10; ++r) {
    const uint64_t p0 = uint64_t(M0) * c0, p1 = uint64_t(M1) * c2;
    const uint32_t hi0 = uint32_t(p0 >> 32), lo0 = uint32_t(p0);
    const uint32_t hi1 = uint32_t(p1 >> 32), lo1 = uint32_t(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += W0;
    k1 += W1;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// T = uint32(min(p * 2^32, 2^32 - 1)) in double: keep iff x >= T, so P(keep) = 1 - T / 2^32.
static inline uint32_t dropout_threshold(double p) {
  double t = p * 4294967296.0;
  if (t > 4294967295.0) t = 4294967295.0;
  if (t < 0.0) t = 0.0;
  return uint32_t(t);
}

// keep bits of one row segment: keys [j0, j1) of query i; writes out[j - j0] = 0/1.
template <class F>
static inline void philox_row(uint64_t seed, uint32_t b, uint32_t h, uint32_t i, int64_t j0, int64_t j1, uint32_t thr,
                              F&& emit) {
  const uint32_t k0 = uint32_t(seed & 0xffffffffu), k1 = uint32_t(seed >> 32);
  int64_t j = j0;
  while (j < j1) {
    const Philox4 r = philox4x32_10(uint32_t(j >> 2), i, h, b, k0, k1);
    for (int w = int(j & 3); w < 4 && j < j1; ++w, ++j) emit(j, r.w[w] >= thr);
  }
}

}  // namespace QKV_NS
}  // namespace qkv_native
