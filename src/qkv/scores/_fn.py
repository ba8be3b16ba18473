"""``from_fn``: a score mod written as a plain function, FlexAttention's ``score_mod``.

``fn(score, b, h, q_idx, kv_idx) -> score`` is called vectorised on a tile of scores and
broadcasting index arrays of the same library (Dong et al., FlexAttention, arXiv:2412.05496).
The backward passes need ``d fn / d score`` for each entry (``fn`` must treat entries
independently): torch autograd or ``jax.grad`` give it for their arrays; for NumPy arrays the
caller passes ``grad`` (same signature), or the backward pass refuses, naming the mod.
"""

import inspect
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .._backend import from_numpy, is_jax, is_torch, namespace
from .._backend import kind as kind_of
from .._typing import Array
from ..errors import ArgumentError, DTypeError, ShapeError
from ._mod import Grad, ScoreMod


def _grids(s: Array, i: np.ndarray, j: np.ndarray) -> tuple[Array, Array, Array, Array]:
    """``b (*B, 1, 1, 1)`` (flattened batch index), ``h (H, 1, 1)``, ``q_idx (rows, 1)``,
    ``kv_idx (1, cols)`` as int arrays of ``s``'s library; 0 for the axes ``s`` does not have."""
    lead = tuple(s.shape[:-3]) if s.ndim >= 3 else ()
    heads = s.shape[-3] if s.ndim >= 3 else 1
    b = np.arange(math.prod(lead), dtype=np.int64).reshape(*lead, 1, 1, 1) if lead else np.zeros((), np.int64)
    h = np.arange(heads, dtype=np.int64).reshape(heads, 1, 1) if s.ndim >= 3 else np.zeros((), np.int64)
    return (
        from_numpy(b, s),
        from_numpy(h, s),
        from_numpy(np.ascontiguousarray(i), s),
        from_numpy(np.ascontiguousarray(j), s),
    )


def from_fn(fn: Callable[..., Any], grad: Callable[..., Any] | None = None, *, name: str | None = None) -> ScoreMod:
    """A score mod from ``fn(score, b, h, q_idx, kv_idx) -> score`` (FlexAttention's ``score_mod``).

    ``score`` is a tile of scaled scores ``(*B, H, rows, cols)`` (the array library of the call);
    ``b (*B, 1, 1, 1)``, ``h (H, 1, 1)``, ``q_idx (rows, 1)``, ``kv_idx (1, cols)`` are
    broadcasting int arrays of the same library (absolute row and column indices; ``b`` the
    flattened batch index). The result must broadcast to ``score``'s shape, in ``score``'s array
    library; a float result of another precision is cast to ``score``'s dtype, anything else
    (ints, bools, complex, another library's arrays, lists) is a ``DTypeError`` naming the mod. ``grad``, with the
    same signature, gives ``d fn / d score`` for NumPy arrays; torch and JAX differentiate
    ``fn`` themselves. With torch tensors that need gradients, only ``impl="reference"`` runs
    the mod (``fn`` may close over tensors autograd must see); ``"auto"`` picks it.

    >>> bias_per_head = from_fn(lambda s, b, h, i, j: s - 0.1 * h * (i - j))
    >>> doubled = from_fn(lambda s, b, h, i, j: 2 * s, grad=lambda s, b, h, i, j: 2 + 0 * s)
    """
    if not callable(fn) or (grad is not None and not callable(grad)):
        raise ArgumentError(f"from_fn needs functions fn(score, b, h, q_idx, kv_idx) (and grad), got {fn!r}")
    label = name or f"from_fn({getattr(fn, '__name__', 'fn')})"
    _check_arity(fn, label, "fn")
    if grad is not None:
        _check_arity(grad, label, "grad")

    def checked(out: Any, s: Array, what: str) -> Array:
        kind = _result_kind(out)
        if kind is not None:
            raise DTypeError(
                f"{label}: {what} returned {kind}; a score mod returns float scores of the score's shape, "
                "e.g. lambda score, b, h, q_idx, kv_idx: score - 0.1 * (q_idx - kv_idx)"
            )
        if not hasattr(out, "shape") or isinstance(out, np.generic):
            out = s * 0 + float(out)  # a constant (a Python or NumPy real)
        if kind_of(out) != kind_of(s):  # a NumPy array for torch scores, or the reverse: its ops would fail
            names = {"numpy": "a NumPy array", "torch": "a torch tensor", "jax": "a JAX array"}
            raise DTypeError(
                f"{label}: {what} returned {names[kind_of(out)]} for {kind_of(s)} scores; a score mod computes "
                f"with the score's own library (the index arrays b, h, q_idx, kv_idx are {kind_of(s)} too)"
            )
        if out.dtype != s.dtype:  # index arithmetic promotes (0.1 * (q_idx - kv_idx) is float64 in NumPy)
            out = namespace(s=s).astype(out, s.dtype)
        try:
            ok = tuple(np.broadcast_shapes(tuple(out.shape), tuple(s.shape))) == tuple(s.shape)
        except ValueError:
            ok = False
        if not ok:
            raise ShapeError(f"{label}: {what} returned shape {tuple(out.shape)} for scores of shape {tuple(s.shape)}")
        return out if tuple(out.shape) == tuple(s.shape) else out + s * 0

    def derivative(s: Array, grids: tuple[Array, ...]) -> Array:
        if grad is not None:
            return checked(grad(s, *grids), s, "grad")
        if is_torch(s):
            import torch

            with torch.enable_grad():
                x = s.detach().requires_grad_(True)
                y = checked(fn(x, *grids), x, "fn")
                (g,) = torch.autograd.grad(y, x, torch.ones_like(y), allow_unused=True)
            return torch.zeros_like(s) if g is None else g
        if is_jax(s):
            import jax
            import jax.numpy as jnp

            return jax.grad(lambda x: jnp.sum(checked(fn(x, *grids), x, "fn")))(s)
        raise ArgumentError(
            f"score mod {label} has no derivative on NumPy arrays: pass scores.from_fn(fn, grad=...) with "
            "grad(score, b, h, q_idx, kv_idx) = d fn / d score, or use torch or JAX arrays"
        )

    def mod(xp: Any, s: Array, i: np.ndarray, j: np.ndarray, nq: int, nk: int) -> tuple[Array, Grad]:
        grids = _grids(s, i, j)
        return checked(fn(s, *grids), s, "fn"), lambda: derivative(s, grids)

    return ScoreMod(mod, label, opaque=True)


def _check_arity(fn: Any, label: str, what: str) -> None:
    """``fn`` takes the five positional arguments ``(score, b, h, q_idx, kv_idx)`` (``ArgumentError``
    at construction otherwise, not a ``TypeError`` deep inside the first call)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: found out at the call
        return
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in params):
        return
    takes = [p for p in params if p.kind in positional]
    required = [p for p in takes if p.default is inspect.Parameter.empty]
    if not len(required) <= 5 <= len(takes):
        raise ArgumentError(
            f"{label}: {what} takes {len(required)} positional arguments; a score mod is "
            f"{what}(score, b, h, q_idx, kv_idx) (FlexAttention's score_mod)"
        )


def _result_kind(out: Any) -> str | None:
    """What is wrong with a score mod's result (None: a float array or a real number)."""
    if out is None:
        return "None (a function without a return?)"
    if isinstance(out, (bool, np.bool_)):
        return f"a bool ({out!r})"
    if isinstance(out, (complex, np.complexfloating)):
        return f"a complex number ({out!r})"
    if isinstance(out, (int, float, np.integer, np.floating)):
        return None if isinstance(out, (float, np.floating)) else f"an int ({out!r})"
    dtype = getattr(out, "dtype", None)
    if dtype is None:
        return f"a {type(out).__name__}"
    name = str(dtype).removeprefix("torch.")
    if "float" in name and "complex" not in name:
        return None
    return f"dtype {name}"
