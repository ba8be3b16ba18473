"""The attention implementations and the one decision that picks one (``_plan``).

JAX arrays run on ``"reference"`` and ``"flash"`` (the compiled kernel reads concrete JAX
arrays through NumPy views; the array engine writes its tiles with JAX's functional
``x.at[rows].set``); SDPA is torch's. The decision table of ``impl="auto"`` is in ``_plan``.

Each ``Implementation`` provides ``forward(call, plan)`` and ``backward``; ``sinks`` says it
applies ``call.sinks`` itself (otherwise ``qkv.attention`` merges them into its ``(out, lse)``,
``_softmax.with_sinks``). Whether one can run a call exactly is ``_plan.SUPPORTS``.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

from .._typing import Result
from . import flash, reference, torch_sdpa
from ._autograd import with_autograd as with_autograd
from ._call import Call as Call
from ._call import Dispatch as Dispatch
from ._call import Plan as Plan
from ._call import build_call as build_call
from ._call import check_mask_covers as check_mask_covers
from ._call import dequantized as dequantized
from ._call import split_mask as split_mask
from ._compiled import compiled_attention as compiled_attention
from ._compiled import operator_reason as operator_reason
from ._jax_ffi import handler_reason as handler_reason
from ._lean import lean_attention as lean_attention
from ._nonfinite import empty_rows_overflowed as empty_rows_overflowed
from ._plan import SMALL as SMALL
from ._plan import native_reason as native_reason
from ._plan import plan as plan
from ._plan import threads as threads


class Implementation(NamedTuple):
    """An implementation: ``forward(call, plan) -> Result`` and its ``backward``; ``sinks``: it
    applies ``call.sinks`` itself."""

    name: str
    forward: Callable[[Call, Plan], Result]
    backward: Callable[..., Any]
    sinks: bool = False


def _reference_forward(c: Call, p: Plan) -> Result:
    return reference.forward(c)


def _reference_backward(dout: Any, c: Call, p: Plan, out: Any, lse: Any) -> Any:
    return reference.backward(dout, c, out, lse)


def _sdpa_backward(dout: Any, c: Call, p: Plan, out: Any, lse: Any) -> Any:
    return torch_sdpa.backward(dout, c, out, lse)


_flash_autograd = with_autograd(flash.forward, flash.backward, flash.forward_saved)


def _flash_forward(c: Call, p: Plan) -> Result:
    # eager torch calls record gradients with the autograd.Function: routing them through the
    # operator too made torchrun's children die at exit (std::terminate) in about half of the runs
    # of examples/ring_torchrun.py, cause not found; the operator serves traced programs
    return _flash_autograd(flash.seeded(c), p)  # a dropout seed drawn now: the backward redraws the same masks


REGISTRY: dict[str, Implementation] = {
    "reference": Implementation("reference", _reference_forward, _reference_backward, sinks=True),
    "torch": Implementation("torch", lambda c, p: torch_sdpa.forward(c), _sdpa_backward),
    "flash": Implementation("flash", _flash_forward, flash.backward),
}
"""Name -> implementation (the names are ``_typing.IMPLS`` without ``"auto"``)."""

DEFAULT_TILES = (flash.BLOCK_Q, flash.BLOCK_K)
"""The array engine's tiles ``(block_q, block_k)`` for dense work (``flash.choose_tiles`` may pick
smaller ones along a narrow mask)."""
