"""Score mods: functions of the scaled scores applied before masking, with their derivatives.

A ``ScoreMod`` maps the scaled scores ``s (..., H, Nq, Nk)`` (or any tile of them) to new
scores, knowing each entry's query row ``i`` and key column ``j``; it also returns
``ds'/ds`` so the analytic backward pass can apply the chain rule (flex attention's
``score_mod``, arXiv:2412.05496). Mods chain with ``+``: ``alibi() + softcap(50)`` adds the
ALiBi bias, then caps. Positions are aligned bottom-right like the masks: query row ``i``
sits at ``p = i + (Nk - Nq)``.

Scoring functions beyond the dot product live in ``_scoring`` and are re-exported here:
``general`` (Luong) and ``additive`` (Bahdanau), with their analytic backward passes.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._backend import from_numpy, is_jax, is_torch, kind, namespace, to_numpy
from ._typing import Array
from .errors import ArgumentError, ShapeError

Grad = Array | float | None
"""``ds'/ds``: an array, a constant, or None for 1 (a pure bias)."""

ModFn = Callable[[Any, Array, np.ndarray, np.ndarray, int, int], tuple[Array, Grad]]
"""``(xp, s, i, j, nq, nk) -> (s', ds'/ds)`` with ``i (rows, 1)``, ``j (1, cols)`` NumPy ints."""


@dataclass(frozen=True, eq=False)
class ScoreMod:
    """A function of the scaled scores and their positions; ``bias`` is set for pure biases
    (``s' = s + bias(i, j)``), which lets impls hand them to kernels as an additive mask."""

    fn: ModFn
    name: str
    bias: Callable[[Any, Array, np.ndarray, np.ndarray, int, int], Array] | None = None
    tensors: tuple[Array, ...] = ()  # learnable arrays it closes over (kernels without autograd decline them)

    def __call__(self, s: Array, i: np.ndarray, j: np.ndarray, nq: int, nk: int) -> Array:
        """``s'`` for scores ``s`` at rows ``i (rows, 1)`` and columns ``j (1, cols)``."""
        return self.with_grad(s, i, j, nq, nk)[0]

    def with_grad(self, s: Array, i: np.ndarray, j: np.ndarray, nq: int, nk: int) -> tuple[Array, Grad]:
        """``(s', ds'/ds)``; the derivative is None when it is 1 everywhere."""
        return self.fn(namespace(s=s), s, i, j, nq, nk)

    def __add__(self, other: "ScoreMod") -> "ScoreMod":
        """Chain: apply ``self``, then ``other``."""
        if not isinstance(other, ScoreMod):
            return NotImplemented
        a, b = self, other

        def fn(xp, s, i, j, nq, nk):
            s1, g1 = a.fn(xp, s, i, j, nq, nk)
            s2, g2 = b.fn(xp, s1, i, j, nq, nk)
            return s2, _mul(g1, g2)

        both = None
        if a.bias is not None and b.bias is not None:
            ab, bb = a.bias, b.bias

            def both(xp, like, i, j, nq, nk):
                return ab(xp, like, i, j, nq, nk) + bb(xp, like, i, j, nq, nk)

        return ScoreMod(fn, f"{a.name} + {b.name}", both, a.tensors + b.tensors)

    then = __add__

    def __repr__(self) -> str:
        return f"ScoreMod({self.name})"


def _mul(a: Grad, b: Grad) -> Grad:
    if a is None:
        return b
    if b is None:
        return a
    return a * b


def _additive(
    bias: Callable[[Any, Array, np.ndarray, np.ndarray, int, int], Array], name: str, tensors: tuple[Array, ...] = ()
) -> ScoreMod:
    def fn(xp, s, i, j, nq, nk):
        return s + bias(xp, s, i, j, nq, nk), None

    return ScoreMod(fn, name, bias, tensors)


def _is_array(x: Any) -> bool:
    """A torch tensor or JAX array (kept as is, so autograd and ``jax.grad`` reach it)."""
    return is_torch(x) or is_jax(x)


def _is_traced(x: Any) -> bool:
    """A JAX tracer (inside ``jax.grad`` / ``jit``): it has no concrete values to show."""
    return is_jax(x) and type(x).__name__.endswith("Tracer")


def _heads(s: Array) -> int:
    return s.shape[-3] if s.ndim >= 3 else 1


def _per_head(xp: Any, values: Array, like: Array, what: str) -> Array:
    """``values (H, ...)`` in the library and dtype of ``like``, checked against its head axis."""
    h = _heads(like)
    if values.shape[0] not in (1, h):
        raise ShapeError(
            f"{what} has {values.shape[0]} heads on axis 0 but the scores have H={h} on axis -3 "
            f"({what}: {tuple(values.shape)}, scores: {tuple(like.shape)})"
        )
    if kind(like) != kind(values):  # a NumPy table on torch / JAX scores, or the reverse
        values = from_numpy(to_numpy(values), like)
    return xp.astype(values, like.dtype)


def alibi(slopes: Any = None, n_heads: int | None = None) -> ScoreMod:
    """ALiBi (arXiv:2108.12409): add ``-slopes[h] · |p - j|`` to head ``h``'s scores.

    ``slopes (H,)``; by default ``qkv.positional.alibi_slopes(H)`` with ``H = n_heads`` or,
    if that is None too, the size of the scores' head axis. With a causal mask this is the
    paper's ``-m · (i - j)``; without one it is symmetric.
    """
    from .positional import alibi_slopes

    if slopes is not None and n_heads is not None and len(slopes) != n_heads:
        raise ShapeError(f"alibi got {len(slopes)} slopes but n_heads={n_heads}")

    def bias(xp, s, i, j, nq, nk):
        h = _heads(s)
        if n_heads is not None and n_heads != h:
            raise ShapeError(
                f"alibi(n_heads={n_heads}) but the scores have H={h} heads on axis -3 (scores: {tuple(s.shape)})"
            )
        m = alibi_slopes(h) if slopes is None else slopes
        m = _per_head(xp, m if _is_array(m) else np.asarray(m, dtype=np.float64), s, "alibi slopes")
        dist = from_numpy(np.abs(i + (nk - nq) - j).astype(np.float64), s, s.dtype)
        b = -xp.reshape(m, (-1, 1, 1)) * dist
        return b if s.ndim >= 3 else b[0]

    if slopes is None:
        return _additive(bias, "alibi")
    shown = "traced" if _is_traced(slopes) else np.round(np.asarray(to_numpy(slopes), dtype=float), 4).tolist()
    return _additive(bias, f"alibi(slopes={shown})", (slopes,) if _is_array(slopes) else ())


def relative_bias(table: Any, max_distance: int) -> ScoreMod:
    """A learned bias per clipped relative distance (Shaw et al., arXiv:1803.02155; T5).

    ``table (2M + 1,)`` or ``(H, 2M + 1)`` with ``M = max_distance``; head ``h`` adds
    ``table[h, clip(j - p, -M, M) + M]``. A torch table that requires grad gets gradients
    through torch autograd.
    """
    m = int(max_distance)
    if m < 0:
        raise ArgumentError(f"relative_bias max_distance must be >= 0, got {max_distance}")
    t = table if _is_array(table) else np.asarray(table, dtype=np.float64)
    if t.ndim not in (1, 2) or t.shape[-1] != 2 * m + 1:
        raise ShapeError(
            f"relative_bias table has shape {tuple(t.shape)} but needs (2M + 1,) or (H, 2M + 1) "
            f"with 2M + 1 = {2 * m + 1} on its last axis"
        )

    def bias(xp, s, i, j, nq, nk):
        idx = np.clip(j - (i + (nk - nq)), -m, m) + m
        tab = _per_head(xp, t if t.ndim == 2 else t[None], s, "relative_bias table")
        b = tab[:, from_numpy(idx, s)] if is_torch(s) else tab[:, idx]  # NumPy and JAX index with NumPy ints
        if t.ndim == 1 or s.ndim < 3:
            b = b[0]
        return b

    return _additive(bias, f"relative_bias(max_distance={m})", (t,) if _is_array(t) else ())


def softcap(c: float) -> ScoreMod:
    """``s -> c · tanh(s / c)``: scores squashed into ``(-c, c)`` (Gemma 2, arXiv:2408.00118)."""
    c = float(c)
    if not (c > 0 and math.isfinite(c)):
        raise ArgumentError(f"softcap needs a positive finite cap c, got {c}")

    def fn(xp, s, i, j, nq, nk):
        t = xp.tanh(s / c)
        return c * t, 1 - t * t

    return ScoreMod(fn, f"softcap({c:g})")


def temperature(t: float) -> ScoreMod:
    """``s -> s / t``: ``t > 1`` flattens the weights, ``t < 1`` sharpens them."""
    t = float(t)
    if not (t > 0 and math.isfinite(t)):
        raise ArgumentError(f"temperature must be positive and finite, got {t}")

    def fn(xp, s, i, j, nq, nk):
        return s / t, 1.0 / t

    return ScoreMod(fn, f"temperature({t:g})")


from ._scoring import additive as additive  # noqa: E402
from ._scoring import additive_backward as additive_backward  # noqa: E402
from ._scoring import general as general  # noqa: E402
from ._scoring import general_backward as general_backward  # noqa: E402
