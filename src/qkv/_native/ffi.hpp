// What binding.cpp needs from ffi.cpp (built where jaxlib's FFI header was found: QKV_HAVE_XLA_FFI).
#pragma once

namespace qkv_native {
void* ffi_forward_handler();   // XLA_FFI_Handler* of the forward custom call
void* ffi_backward_handler();  // and of the backward
}  // namespace qkv_native
