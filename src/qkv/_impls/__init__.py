"""The registry of attention implementations and the ``impl="auto"`` choice.

JAX arrays run on ``"reference"`` only (``"auto"`` picks it): the flash kernel writes its
output tiles in place, which immutable JAX arrays do not allow, and SDPA is torch's.

Each ``Impl`` says whether it can give the contract's exact semantics for a call
(``supports`` returns None, or the reason it cannot), and provides ``forward`` and
``backward``. ``"auto"`` follows this decision table, measured in BENCHMARKS.md
(``benchmarks/auto.py``):

    0. grouped heads (1 < Hkv < H) with few queries (Nq <= 16, a decode step) and the flash
       kernel supports the call (SDPA's GQA path copies K and V per query head; flash
       ran 1.66x SDPA at L = 32k, GQA 8/2)                                     -> "flash"
    1. torch tensors, SDPA supports the call, and no mask or the plain causal mask with
       Nq == Nk (SDPA's own fused kernel, ~1.4x the tiled kernel)           -> "torch"
    2. fewer than SMALL score entries (Nq · Nk), where tiling only adds overhead:
       "torch" if it supports the call, else                                   -> "reference"
    3. the flash kernel supports the call and its mask hides at least half the
       tiles (or SDPA cannot run it)                                           -> "flash"
    4. SDPA supports the call (dense work, explicit mask)                      -> "torch"
    5. otherwise                                                               -> "reference"
"""

from collections.abc import Callable
from typing import Any, NamedTuple

from .. import masks
from .._backend import is_jax
from .._typing import Array, Result
from ..errors import ArgumentError
from . import flash, reference, torch_sdpa
from ._autograd import with_autograd
from ._call import Call as Call


class Impl(NamedTuple):
    name: str
    supports: Callable[[Call], str | None]
    forward: Callable[[Call], Result]
    backward: Callable[[Array, Call, Array, Array], Any]


def _flash_supports(c: Call) -> str | None:
    if is_jax(c.q):
        return "the flash kernel writes its output tiles in place and JAX arrays are immutable"
    return flash.supports(c)


IMPLS: dict[str, Impl] = {
    "reference": Impl("reference", lambda c: None, reference.forward, reference.backward),
    "torch": Impl("torch", torch_sdpa.supports, torch_sdpa.forward, torch_sdpa.backward),
    "flash": Impl("flash", _flash_supports, with_autograd(flash.forward, flash.backward), flash.backward),
}
SMALL = 256 * 256
"""Below this many score entries per head the reference impl beats the tiled one (BENCHMARKS.md)."""


def _kept_fraction(c: Call) -> float:
    if c.mask is None:
        return 1.0
    classes = flash.tile_classes(c, *flash.choose_tiles(c))
    return float((classes != 0).mean())


def auto(c: Call) -> Impl:
    """The fastest exact impl for ``c`` (decision table in the module docstring)."""
    d = c.dims
    if is_jax(c.q):
        return IMPLS["reference"]
    sdpa = IMPLS["torch"].supports(c) is None
    if d.grouped and d.nq <= 16 and IMPLS["flash"].supports(c) is None:
        return IMPLS["flash"]
    plain = c.mask is None or (c.mask is masks.causal() and d.nq == d.nk)
    if sdpa and plain:
        return IMPLS["torch"]
    if d.nq * d.nk < SMALL:
        return IMPLS["torch" if sdpa else "reference"]
    if IMPLS["flash"].supports(c) is None and (not sdpa or _kept_fraction(c) <= 0.5):
        return IMPLS["flash"]
    return IMPLS["torch" if sdpa else "reference"]


def choose(impl: str, call: Call) -> Impl:
    """The impl named ``impl`` (or the one ``"auto"`` picks); raises if it cannot run ``call``."""
    if impl == "auto":
        return auto(call)
    if impl not in IMPLS:
        raise ArgumentError(f"impl must be one of {['auto', *IMPLS]}, got {impl!r}")
    why = IMPLS[impl].supports(call)
    if why is not None:
        raise ArgumentError(f"impl={impl!r} cannot run this call exactly: {why}; use impl='auto' or 'reference'")
    return IMPLS[impl]
