"""The registry of attention implementations and the ``impl="auto"`` choice.

JAX arrays run on ``"reference"`` and ``"flash"`` (which writes its tiles with JAX's
functional ``x.at[rows].set``); SDPA is torch's. ``"auto"`` on JAX arrays (rule J below)
picks flash only where it measured faster: each eager JAX op costs a dispatch, so the tile
loop loses to the reference's few large ops until the score matrix reaches tens of MiB.

Each ``Impl`` says whether it can give the contract's exact semantics for a call
(``supports`` returns None, or the reason it cannot), and provides ``forward`` and
``backward``. ``"auto"`` follows this decision table, measured in BENCHMARKS.md
(``benchmarks/auto.py``):

    0. grouped heads (1 < Hkv < H) with few queries (Nq <= 16, a decode step) and the flash
       kernel supports the call (SDPA's GQA path copies K and V per query head)   -> "flash"
    1. torch tensors, fewer than SMALL score entries per head (Nq · Nk), SDPA supports
       the call                                                                -> "torch"
    2. fewer than SMALL score entries, where tiling only adds overhead         -> "reference"
    C. the flash kernel's compiled engine runs the call (level with SDPA's CPU flash kernel
       on dense and causal work, 0.9-1.07x on a quiet Zen 1, 1.05-1.3x under contention; it
       skips the tiles a mask hides, returns lse, takes score mods and grouped heads)  -> "flash"
    3. torch tensors, SDPA supports the call, and no mask or the plain causal mask with
       Nq == Nk (SDPA's own fused kernel, ~1.4x the array engine)              -> "torch"
    4. the flash kernel supports the call and its mask hides at least half the
       tiles (or SDPA cannot run it)                                           -> "flash"
    5. SDPA supports the call (dense work, explicit mask)                      -> "torch"
    6. otherwise                                                               -> "reference"

    J. JAX arrays (instead of 0-6): concrete ones of at least SMALL entries that the compiled
       engine runs -> "flash"; otherwise, none traced by ``jax.grad`` / ``jax.jit``
       (differentiating the array engine's tile loop op by op ran 1.4x slower than the
       reference's gradient at N = 2048 causal, and saves every tile anyway), the flash kernel
       supports the call and the score matrix holds at least JAX_FLASH_BYTES  -> "flash"
       otherwise                                                               -> "reference"
"""

import math
from collections.abc import Callable
from typing import Any, NamedTuple

from .. import masks
from .._backend import HALF, dtype_name, is_jax, is_traced
from .._checks import check_impl
from .._typing import Result
from ..errors import ArgumentError
from . import flash, reference, torch_sdpa
from ._autograd import with_autograd
from ._call import Call as Call
from ._call import build_call as build_call
from ._flash_native import decode as decode

_flash_autograd = with_autograd(flash.forward, flash.backward)


class Impl(NamedTuple):
    """An implementation: ``supports(call)`` is None or the reason it cannot run ``call`` exactly;
    ``sinks``: it applies ``call.sinks`` itself (otherwise ``qkv.attention`` merges them into its
    ``(out, lse)``, ``_softmax.with_sinks``)."""

    name: str
    supports: Callable[[Call], str | None]
    forward: Callable[[Call], Result]
    backward: Callable[..., Any]
    sinks: bool = False


IMPLS: dict[str, Impl] = {
    "reference": Impl("reference", lambda c: None, reference.forward, reference.backward, sinks=True),
    "torch": Impl("torch", torch_sdpa.supports, torch_sdpa.forward, torch_sdpa.backward),
    "flash": Impl("flash", flash.supports, lambda c: _flash_autograd(flash.seeded(c)), flash.backward),
}


class Dispatch(NamedTuple):
    """What runs a call: ``impl`` (``"reference"``, ``"flash"`` or ``"torch"``), for flash its
    ``engine`` (``"native"``: the compiled tile loop; ``"array"``: array-API code; None for the
    others) and the ``reason``, one sentence."""

    impl: str
    engine: str | None
    reason: str


DEFAULT_TILES = (flash.BLOCK_Q, flash.BLOCK_K)
"""The flash kernel's tiles ``(block_q, block_k)`` for dense work (``flash.choose_tiles`` may pick
smaller ones along a narrow mask)."""

SMALL = 256 * 256
"""Below this many score entries per head the reference impl beats the tiled one (BENCHMARKS.md)."""

JAX_FLASH_BYTES = 32 * 2**20
"""From this many bytes of scores (B·H·Nq·Nk in the compute dtype) the flash kernel beats the
reference on eager JAX arrays: float32 (1, 4, N, 64) causal, flash / reference time 3.7 at
N = 1024 (16 MiB), 0.59 at N = 1536 (36 MiB), 0.62 at N = 2048; (1, 8, 1024, 64) 0.66."""


def _kept_fraction(c: Call) -> float:
    if c.mask is None:
        return 1.0
    classes = flash.tile_classes(c, *flash.choose_tiles(c))
    return float((classes != 0).mean())


def _traced(c: Call) -> bool:
    arrays = (c.q, c.k, c.v, c.bias, *(c.score_mod.tensors if c.score_mod is not None else ()))
    return any(is_traced(x) for x in arrays)


def _auto_jax(c: Call) -> tuple[str, str]:
    """Rule J of the decision table."""
    d = c.dims
    if d.nq * d.nk >= SMALL and IMPLS["flash"].supports(c) is None and flash.engine(c)[0] == "native":
        return "flash", "concrete JAX arrays the compiled flash engine runs (rule J)"
    score_bytes = math.prod(d.score_shape) * (4 if dtype_name(c.q) in HALF else c.q.dtype.itemsize)
    mib, floor = score_bytes / 2**20, JAX_FLASH_BYTES >> 20
    if score_bytes < JAX_FLASH_BYTES:
        return "reference", f"JAX arrays with {mib:.3g} MiB of scores, under the {floor} MiB where tiles pay (rule J)"
    if _traced(c):
        return "reference", "JAX arrays traced by jax.grad or jax.jit: tiles would be differentiated op by op (rule J)"
    why = IMPLS["flash"].supports(c)
    if why is not None:
        return "reference", f"JAX arrays, and {why} (rule J)"
    return "flash", f"JAX arrays with {mib:.3g} MiB of scores; from {floor} MiB the tile loop wins (rule J)"


def auto(c: Call) -> tuple[str, str]:
    """``(impl name, reason)``: the fastest exact impl for ``c`` (decision table in the module docstring)."""
    d = c.dims
    if is_jax(c.q):
        return _auto_jax(c)
    sdpa_why = IMPLS["torch"].supports(c)
    flash_why = IMPLS["flash"].supports(c)
    if d.grouped and d.nq <= 16 and flash_why is None:
        return "flash", f"a grouped decode step (Hkv={d.hkv} < H={d.h}, Nq={d.nq} <= 16): K, V read once (rule 0)"
    if d.nq * d.nk < SMALL:
        small = f"Nq·Nk = {d.nq * d.nk} < {SMALL} score entries per head, where tiling only adds overhead"
        return ("torch", f"{small}: SDPA (rule 1)") if sdpa_why is None else ("reference", f"{small} (rule 2)")
    if flash_why is None and flash.engine(c)[0] == "native":
        return "flash", "the compiled flash engine runs this call: fused tiles, hidden tiles skipped (rule C)"
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


def dispatch(impl: str, c: Call) -> tuple[Impl, Dispatch]:
    """The impl that runs ``c`` for ``impl=`` (``"auto"`` decides) and the ``Dispatch`` that says why.

    A named impl that cannot give the contract's exact semantics for ``c`` raises
    ``ArgumentError`` with the reason.
    """
    check_impl(impl)
    if impl == "auto":
        name, reason = auto(c)
    else:
        why = IMPLS[impl].supports(c)
        if why is not None:
            raise ArgumentError(f"impl={impl!r} cannot run this call exactly: {why}; use impl='auto' or 'reference'")
        name, reason = impl, f"impl={impl!r} was asked for"
    if name != "flash":
        return IMPLS[name], Dispatch(name, None, reason)
    engine, why = flash.engine(c)
    if why is not None:  # the engine's reason joins the rule's parentheses: still one sentence
        reason = f"{reason[:-1]}; array engine: {why})" if reason.endswith(")") else f"{reason} (array engine: {why})"
    return IMPLS[name], Dispatch(name, engine, reason)
