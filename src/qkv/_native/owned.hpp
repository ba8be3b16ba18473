// A block from malloc / calloc / aligned_alloc owned by one variable and freed with it (std::free):
// the kernels' buffers that outlive a function (per-call tables, per-thread scratch) move and are
// never copied, with no destructor or deleted copy written per struct.
#pragma once
#include <cstddef>
#include <cstdlib>
#include <memory>

namespace qkv_native {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
template <class T>
using Owned = std::unique_ptr<T[], FreeDeleter>;

// n elements of T, uninitialised (n > 0: malloc(0) may return null, read as out of memory)
template <class T>
inline Owned<T> owned_malloc(size_t n) {
  return Owned<T>(static_cast<T*>(std::malloc(sizeof(T) * n)));
}
// n elements of T, zero bytes (fresh pages stay unmapped until touched); n > 0 as above
template <class T>
inline Owned<T> owned_calloc(size_t n) {
  return Owned<T>(static_cast<T*>(std::calloc(n, sizeof(T))));
}

}  // namespace qkv_native
