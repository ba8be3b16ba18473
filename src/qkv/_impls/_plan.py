"""One decision per call: which implementation runs it, how, and why (``Plan``).

``plan(impl, c)`` is the only place that decides. It reads the call's shapes, dtypes, device,
the mask's structure and the score mod's kind — never the arrays' values (non-finite numbers
are found by the compiled kernel inside its own pass, ``_native/finite.hpp``) — and returns the
plan the chosen implementation then runs: the impl, for flash its engine, the tiles, the thread
count and the mask's plan (``masks.plan``), and the reason, one sentence. ``qkv.dispatch``
reports it (``Dispatch``) without running anything.

``impl="auto"`` follows this decision table, measured in BENCHMARKS.md:

    C. the compiled engine runs the call (the kernel is level with or ahead of SDPA's CPU kernel
       from the smallest calls up: a (1, 8, 128, 64) causal call takes 0.11 ms against SDPA's
       0.25 ms on Zen 5; it skips the tiles a mask hides, returns lse, takes score mods,
       grouped heads and the non-finite contract without a pass of its own), unless its ISA
       path is not one measured faster than SDPA on dense work (FASTER_THAN_SDPA; the portable
       path runs at ~0.11x) and SDPA can run the call: then rules 1-6         -> "flash"
    1. torch tensors, fewer than SMALL score entries per head (Nq · Nk), SDPA supports
       the call                                                                -> "torch"
    2. fewer than SMALL score entries, where tiling only adds overhead         -> "reference"
    3. torch tensors, SDPA supports the call, and no mask or the plain causal mask with
       Nq == Nk (SDPA's own fused kernel, ~1.4x the array engine)              -> "torch"
    4. the flash kernel supports the call and its mask hides at least half the
       tiles (or SDPA cannot run it)                                           -> "flash"
    5. SDPA supports the call (dense work, explicit mask)                      -> "torch"
    6. otherwise                                                               -> "reference"

    J. JAX arrays the compiled engine cannot take (instead of 1-6, after C; traced ones it takes
       through XLA's FFI, ``_jax_ffi``): none traced by ``jax.grad`` / ``jax.jit``
       (differentiating the array engine's tile loop op by op ran 1.4x slower than the
       reference's gradient at N = 2048 causal, and saves every tile anyway), the flash kernel
       supports the call and the score matrix holds at least JAX_FLASH_BYTES  -> "flash"
       otherwise                                                               -> "reference"

Rules 1-6 and J are what runs where the compiled engine cannot: no C++ build, tensors on
another device, dtypes it does not take, weights asked for, opaque score mods.
"""

import math
import os

from .. import _native as native
from .. import _torch, masks
from .._backend import HALF, dtype_name, is_jax, is_torch, is_traced
from .._checks import check_impl
from .._native import MAX_THREADS
from .._typing import Dims
from ..errors import ArgumentError
from . import flash, torch_sdpa
from ._call import Call, Plan, dequantized

SMALL = 256 * 256
"""Below this many score entries per head the reference impl beats the array engine's tiles
(BENCHMARKS.md); only where the compiled engine cannot run the call."""

FASTER_THAN_SDPA = frozenset({"avx2", "avx512", "avx512bf16"})
"""The compiled engine's ISA paths measured faster than SDPA on dense work (benchmarks/LOG.md, "ISA
paths against SDPA"; Zen 5: AVX-512 1.98x dense, AVX2 1.18x; "avx512bf16" is the AVX-512 path
plus vdpbf16ps for bfloat16, the same float32 code). Under any other path rule C leaves SDPA the
calls it can run: "portable" (x86 without AVX2, other CPUs) measured 0.11x; "neon" (arm64) is
checked under emulation only and stays out until measured on arm64 hardware."""

JAX_FLASH_BYTES = 32 * 2**20
"""From this many bytes of scores (B·H·Nq·Nk in the compute dtype) the array engine beats the
reference on eager JAX arrays: float32 (1, 4, N, 64) causal, flash / reference time 3.7 at
N = 1024 (16 MiB), 0.59 at N = 1536 (36 MiB), 0.62 at N = 2048; (1, 8, 1024, 64) 0.66."""


def threads() -> int:
    """The compiled kernel's worker count: torch's when torch is loaded (one pool's worth, never two
    fighting), else ``OMP_NUM_THREADS``, else the CPUs this process may use; at most the
    kernel's own cap (``qkv._native.MAX_THREADS``)."""
    cap = MAX_THREADS
    torch = _torch.loaded()
    if torch is not None:
        return max(1, min(torch.get_num_threads(), cap))
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return min(int(env), cap)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cpus, cap))


def _traced(c: Call) -> bool:
    arrays = (c.q, c.k, c.v, c.bias, *(c.score_mod.tensors if c.score_mod is not None else ()))
    return any(is_traced(x) for x in arrays if x is not None)


def native_reason(c: Call) -> str | None:
    """Why the compiled engine cannot run ``c`` (None: it can). Structure only, never values."""
    if not native.available():
        return native.reason()
    if c.tiles is not None:
        return "tiles were forced (the compiled engine has its own)"
    if _traced(c):
        from . import _jax_ffi

        why = _jax_ffi.reason(c)
        if why is not None:
            return why
    if is_torch(c.q) and c.q.device.type != "cpu":
        return f"the compiled kernel runs on the CPU, the tensors are on {c.q.device}"
    if dtype_name(c.q) not in native.DTYPES:
        return f"the compiled kernel takes {', '.join(native.DTYPES)}, not {dtype_name(c.q)}"
    if is_jax(c.q) and dtype_name(c.q) == "bfloat16" and not _traced(c):
        return "JAX bfloat16 arrays stay on the array engine"
    if c.want_weights:
        return "the weights are rebuilt tile by tile by the array engine"
    if c.score_mod is not None and c.score_mod.native is None:
        return f"score_mod {c.score_mod.name} has no compiled form"
    if c.bias is not None and getattr(c.bias, "requires_grad", False):
        return "a bias that needs its gradient goes through the array engine"
    if c.kv is not None:
        return _kv_reason(c)
    return None


def _kv_reason(c: Call) -> str | None:
    """Why the compiled kernel cannot read ``c``'s quantized cache in place (None: it can)."""
    assert c.kv is not None
    if getattr(c.q, "requires_grad", False):
        return "q needs its gradient, which the compiled kernel's backward does not give against a quantized cache"
    if _traced(c):
        return "a quantized cache inside a traced JAX program is dequantized by the program (the FFI takes float K/V)"
    return None


def _engine(c: Call) -> tuple[str, str | None]:
    """``("native", None)`` when the compiled engine runs ``c``, else ``("array", why)``; a forced
    ``c.engine`` wins (``"native"`` raises ``ArgumentError`` with the reason when it cannot)."""
    if c.engine == "array":
        return "array", "engine='array' was asked for"
    why = native_reason(c)
    if why is None:
        return "native", None
    if c.engine == "native":
        raise ArgumentError(f"engine='native' cannot run this call: {why}")
    return "array", why


def _kept_fraction(c: Call) -> float:
    assert c.mask is not None
    classes = masks.shared_classes(c.mask, c.dims.nq, c.dims.nk, *flash.choose_tiles(c))
    return float((classes != masks.EMPTY).mean())


def _auto_jax(c: Call, flash_why: str | None) -> tuple[str, str]:
    """Rule J of the decision table (after rule C)."""
    d = c.dims
    score_bytes = math.prod(d.score_shape) * (4 if dtype_name(c.q) in HALF else c.q.dtype.itemsize)
    mib, floor = score_bytes / 2**20, JAX_FLASH_BYTES >> 20
    if score_bytes < JAX_FLASH_BYTES:
        return "reference", f"JAX arrays with {mib:.3g} MiB of scores, under the {floor} MiB where tiles pay (rule J)"
    if _traced(c):
        return "reference", "JAX arrays traced by jax.grad or jax.jit: tiles would be differentiated op by op (rule J)"
    if flash_why is not None:
        return "reference", f"JAX arrays, and {flash_why} (rule J)"
    return "flash", f"JAX arrays with {mib:.3g} MiB of scores; from {floor} MiB the tile loop wins (rule J)"


def _auto(c: Call, native_ok: bool) -> tuple[str, str]:
    """``(impl name, reason)``: the fastest exact impl for ``c`` (the module's decision table)."""
    d = c.dims
    flash_why = flash.supports(c)
    if flash_why is None and native_ok and (native.isa() in FASTER_THAN_SDPA or torch_sdpa.supports(c) is not None):
        if _traced(c):
            return "flash", (
                "the compiled flash engine runs this call inside the traced JAX program (XLA's FFI custom call, "
                "its backward for jax.grad): fused tiles, hidden tiles skipped (rule C)"
            )
        return "flash", "the compiled flash engine runs this call: fused tiles, hidden tiles skipped (rule C)"
    if is_jax(c.q):
        return _auto_jax(c, flash_why)
    sdpa_why = torch_sdpa.supports(c)
    if d.nq * d.nk < SMALL:
        small = f"Nq·Nk = {d.nq * d.nk} < {SMALL} score entries per head, where tiling only adds overhead"
        return ("torch", f"{small}: SDPA (rule 1)") if sdpa_why is None else ("reference", f"{small} (rule 2)")
    plain = c.mask is None or (c.mask is masks.causal() and d.nq == d.nk)
    if sdpa_why is None and plain:
        return "torch", "torch tensors, no mask or the plain causal mask: SDPA's fused kernel (rule 3)"
    if flash_why is None:
        if sdpa_why is not None:
            return "flash", f"{d.nq}x{d.nk} scores per head, which SDPA cannot run ({sdpa_why}) (rule 4)"
        kept = _kept_fraction(c)
        if kept <= 0.5:
            return "flash", f"the mask hides {1 - kept:.0%} of the tiles, which the flash kernel skips (rule 4)"
    if sdpa_why is None:
        return "torch", "dense work with an explicit mask: SDPA (rule 5)"
    return "reference", f"the flash kernel cannot run this call ({flash_why}) (rule 6)"


SUPPORTS = {"reference": lambda c: None, "torch": torch_sdpa.supports, "flash": flash.supports}


def empty_axis(d: Dims) -> str | None:
    """The first of ``B``, ``H``, ``Dk``, ``Dv`` that is 0 (``"Dk = 0"``), or None."""
    for name, n in (("B", math.prod(d.batch)), ("H", d.h), ("Dk", d.dk), ("Dv", d.dv)):
        if n == 0:
            return f"{name} = 0"
    return None


def plan(impl: str, c: Call) -> Plan:
    """Decide how ``c`` runs for ``impl=`` (``"auto"`` chooses): the one decision of the call.

    A named impl that cannot give the contract's exact semantics for ``c`` raises
    ``ArgumentError`` with the reason. A call with an empty axis (``B``, ``H``, ``Dk`` or ``Dv``
    of 0) gets SDPA's answer whatever the impl: the reference's steps compute it (empty arrays, or
    for ``Dk = 0`` zero scores: uniform weights over the keys each row may attend); no kernel
    takes a zero-size axis.
    """
    check_impl(impl)
    c = _dropped_if_hiding_nothing(c)
    fmt = None if c.kv is None else c.kv.format
    empty = empty_axis(c.dims)
    if empty is not None:  # SDPA's answer whatever the impl: no kernel takes a zero-size axis
        c = dequantized(c)
        why = None if impl in ("auto", "reference") else SUPPORTS[impl](c)
        if why is not None:
            raise ArgumentError(f"impl={impl!r} cannot run this call exactly: {why}; use impl='auto' or 'reference'")
        reason = f"{empty}: an empty axis, SDPA's answer from the reference's steps"
        return Plan(c, "reference", None, reason, kv_format=fmt)
    engine, engine_why = _engine(c) if impl in ("auto", "flash") else ("array", None)
    if engine != "native":  # every engine but the compiled kernel reads the cache dequantized
        c = dequantized(c)
    if impl == "auto":
        name, reason = _auto(c, engine == "native")
    else:
        why = SUPPORTS[impl](c)
        if why is not None:
            raise ArgumentError(f"impl={impl!r} cannot run this call exactly: {why}; use impl='auto' or 'reference'")
        name, reason = impl, f"impl={impl!r} was asked for"
    if name != "flash":
        if fmt is not None:
            c, reason = dequantized(c), _joined(reason, f"the {fmt} K/V dequantized to q's dtype first")
        return Plan(c, name, None, reason, kv_format=fmt)
    d = c.dims
    if engine == "native" and d.nq * d.nk == 0:  # nothing to attend: qkv.attention answers without a kernel
        return Plan(c, "flash", "native", reason, None, threads(), kv_format=fmt)
    if engine == "native":
        tiles = native.tile_shape(d.nq, d.nk, d.dk, d.dv, dtype_name(c.q))
        lead = d.score_shape[:-2] if d.has_heads else ()
        mask_plan = None if c.mask is None else masks.plan(c.mask, d.nq, d.nk, lead, *tiles)
        if fmt is not None:
            reason = _joined(reason, f"the {fmt} K/V read in place, dequantized in registers")
        if d.nq <= native.DECODE_MAX_NQ:  # the decode loop; its prefetch target depends on the CPU
            reason = _joined(reason, f"the decode loop, K/V prefetched into {native.decode_prefetch().upper()}")
        return Plan(c, "flash", "native", reason, tiles, threads(), mask_plan, kv_format=fmt)
    # the engine's reason joins the rule's parentheses: still one sentence
    reason = _joined(reason, f"array engine: {engine_why}")
    if fmt is not None:
        reason = _joined(reason, f"the {fmt} K/V dequantized to q's dtype first")
    return Plan(c, "flash", "array", reason, flash.choose_tiles(c), kv_format=fmt)


def _joined(reason: str, note: str) -> str:
    """``note`` inside the reason's closing parentheses (``"... (rule C)"`` -> ``"... (rule C; note)"``):
    still one sentence."""
    return f"{reason[:-1]}; {note})" if reason.endswith(")") else f"{reason} ({note})"


def _dropped_if_hiding_nothing(c: Call) -> Call:
    """``c`` without its mask when the mask hides nothing at this size (e.g. causal for one query
    against a cache): every impl then runs its unmasked path. Read from the mask's plan (cached)
    where its tiles are classified analytically; no mask is ever evaluated cell by cell here."""
    m, d = c.mask, c.dims
    if m is None or (m.rows is None and m.tiles is None) or _traced(c) or d.nq * d.nk == 0 or empty_axis(d):
        return c
    lead = d.score_shape[:-2] if d.has_heads else ()
    if m.rows is not None:
        hides_nothing = masks.plan(m, d.nq, d.nk, lead, *_plan_tiles(c)).hides_nothing
    else:
        hides_nothing = bool((m.blocks(d.nq, d.nk, d.nq, d.nk) == masks.FULL).all())
    return c._replace(mask=None) if hides_nothing else c


def _plan_tiles(c: Call) -> tuple[int, int]:
    """The tiles a mask plan is keyed by: the kernel's where it is built, else the defaults (a plan
    with rows does not depend on them)."""
    d = c.dims
    if native.available():
        return native.tile_shape(d.nq, d.nk, d.dk, d.dv, "float32")
    return flash.BLOCK_Q, flash.BLOCK_K
