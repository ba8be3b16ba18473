// What binding.cpp needs from dispatch.cpp.
#pragma once
#include <vector>

#include "params.hpp"

namespace qkv_native {
std::vector<const KernelTable*> runnable();       // best first; "portable" always last
const KernelTable* find_table(const char* name);  // nullptr if this CPU cannot run it
const KernelTable* current();
void set_current(const KernelTable* t);
ParallelFn parallel_fn();
Prefetch decode_prefetch();  // the decode loop's prefetch target for this CPU (or as set)
void set_decode_prefetch(Prefetch p);
}  // namespace qkv_native
