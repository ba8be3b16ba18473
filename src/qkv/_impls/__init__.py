"""The registry of attention implementations and the ``impl="auto"`` choice.

Each ``Impl`` says whether it can give the contract's exact semantics for a call
(``supports`` returns None, or the reason it cannot), and provides ``forward`` and
``backward``. ``"auto"`` takes the first impl in ``AUTO_ORDER`` that supports the call.

Decision table for ``"auto"`` (fastest exact first):

    torch tensors, no weights/lse wanted, no rng, only additive score mods  -> "torch" (SDPA)
    everything else                                                         -> "reference"
"""

from collections.abc import Callable
from typing import Any, NamedTuple

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


IMPLS: dict[str, Impl] = {
    "reference": Impl("reference", lambda c: None, reference.forward, reference.backward),
    "torch": Impl("torch", torch_sdpa.supports, torch_sdpa.forward, torch_sdpa.backward),
    "flash": Impl("flash", flash.supports, with_autograd(flash.forward, flash.backward), flash.backward),
}
AUTO_ORDER = ("torch", "reference")


def choose(impl: str, call: Call) -> Impl:
    """The impl named ``impl`` (or the one ``"auto"`` picks); raises if it cannot run ``call``."""
    if impl == "auto":
        for name in AUTO_ORDER:
            if IMPLS[name].supports(call) is None:
                return IMPLS[name]
        raise AssertionError("the reference impl supports every call")
    if impl not in IMPLS:
        raise ArgumentError(f"impl must be one of {['auto', *IMPLS]}, got {impl!r}")
    why = IMPLS[impl].supports(call)
    if why is not None:
        raise ArgumentError(f"impl={impl!r} cannot run this call exactly: {why}; use impl='auto' or 'reference'")
    return IMPLS[impl]
