"""What a CI run requires to be present, so that a missing piece fails the run instead of skipping.

Tests skip what this machine or build lacks (an ISA path, the JAX handler, the torch operator):
right on a laptop, wrong in CI, where a silent skip hides a build that lost a path. ``.ci/run``
sets the ``QKV_REQUIRE_*`` variables; ``tests/conftest.py`` checks them once, before any test:

    QKV_REQUIRE_NATIVE=1       the compiled kernel is built and loads
    QKV_REQUIRE_ISAS=cpu       every ISA path this CPU can run (read from /proc/cpuinfo, not from
                               the kernel's own detection) is one the kernel offers; or a list
                               such as "avx512bf16,avx512,avx2"
    QKV_REQUIRE_JAX_FFI=1      jax imports and the kernel has its XLA FFI handlers (ffi.cpp)
    QKV_REQUIRE_TORCH_OP=1     torch imports and torch.ops.qkv.attention / attention_backward exist
"""

import os
import platform
from pathlib import Path


def cpu_paths() -> list[str]:
    """The ISA paths this CPU can run, from the flags the OS reports (``dispatch.cpp``'s rules)."""
    if platform.machine() in ("aarch64", "arm64"):
        return ["neon", "portable"]
    info = Path("/proc/cpuinfo")
    flags = set()
    if info.exists():
        for line in info.read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    paths = []
    avx512 = {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags
    if avx512 and "avx512_bf16" in flags:
        paths.append("avx512bf16")
    if avx512:
        paths.append("avx512")
    if {"avx2", "fma", "f16c"} <= flags:
        paths.append("avx2")
    return [*paths, "portable"]


def missing() -> list[str]:
    """What the ``QKV_REQUIRE_*`` variables ask for and this run lacks (empty: all present)."""
    gaps = []
    want_isas = os.environ.get("QKV_REQUIRE_ISAS", "")
    needs_native = os.environ.get("QKV_REQUIRE_NATIVE") == "1" or want_isas or _flag("JAX_FFI") or _flag("TORCH_OP")
    from qkv import _native

    if needs_native and not _native.available():
        return [f"the compiled kernel ({_native.reason()})"]
    if want_isas:
        wanted = cpu_paths() if want_isas == "cpu" else [x.strip() for x in want_isas.split(",") if x.strip()]
        have = _native.isas()
        gaps += [f"the {p!r} ISA path (the kernel offers {list(have)})" for p in wanted if p not in have]
    if _flag("JAX_FFI"):
        try:
            import jax  # noqa: F401
        except ImportError as e:
            gaps.append(f"jax ({e})")
        else:
            if getattr(_native._need(), "ffi_handlers", None) is None:
                gaps.append("the kernel's jax.ffi handlers (built without jaxlib's FFI header)")
    if _flag("TORCH_OP"):
        try:
            import torch

            from qkv._impls import _torch_op  # noqa: F401  (registers the operators)

            for name in ("attention", "attention_backward"):
                getattr(torch.ops.qkv, name)
        except (ImportError, AttributeError, RuntimeError) as e:
            gaps.append(f"the torch operators torch.ops.qkv.* ({e})")
    return gaps


def _flag(name: str) -> bool:
    return os.environ.get(f"QKV_REQUIRE_{name}") == "1"
