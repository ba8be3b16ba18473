"""Numerically stable softmax and log-sum-exp whose all ``-inf`` rows give zeros and ``-inf``.

Subtracting the row maximum keeps ``exp`` from overflowing; a row whose maximum is ``-inf``
(nothing may be attended) is shifted by 0 instead, so ``exp(-inf - 0) = 0`` and no
``-inf - (-inf) = nan`` ever appears, in the forward pass or in autograd's backward.
"""

from typing import Any

from ._backend import as_array, compute_dtype, namespace
from ._typing import Array


def _stats(xp: Any, x: Array, axis: int) -> tuple[Array, Array, Array]:
    """Return ``(e, l, m)``: ``e = exp(x - m)``, ``l = sum(e)``, ``m`` the safe row max."""
    m = xp.max(x, axis=axis, keepdims=True)
    m = xp.where(xp.isfinite(m), m, xp.zeros_like(m))  # all -inf (or +inf) rows shift by 0
    e = xp.exp(x - m)
    return e, xp.sum(e, axis=axis, keepdims=True), m


def softmax_lse(xp: Any, x: Array, axis: int = -1) -> tuple[Array, Array]:
    """``(softmax(x), logsumexp(x))`` along ``axis`` in the dtype of ``x``; lse keeps no axis."""
    if x.shape[axis] == 0:  # an empty row: nothing to attend
        return x, xp.full(tuple(n for a, n in enumerate(x.shape) if a != axis % x.ndim), -float("inf"), dtype=x.dtype)
    e, l, m = _stats(xp, x, axis)
    nonempty = l > 0
    safe_l = xp.where(nonempty, l, xp.ones_like(l))
    a = e / safe_l
    lse = xp.where(nonempty, xp.log(safe_l) + m, xp.full_like(l, -float("inf")))
    return a, xp.squeeze(lse, axis=axis)


def softmax(x: Array, axis: int = -1) -> Array:
    """Stable softmax along ``axis``; a row that is all ``-inf`` gives zeros (never NaN).

    Half-precision input is computed in float32 and returned in its own dtype.

    >>> softmax(np.array([0.0, np.log(3.0)]))
    array([0.25, 0.75])
    """
    x = as_array(x, "x")
    xp = namespace(x=x)
    a, _ = softmax_lse(xp, xp.astype(x, compute_dtype(xp, x)), axis)
    return xp.astype(a, x.dtype)


def logsumexp(x: Array, axis: int = -1) -> Array:
    """Stable ``log(sum(exp(x)))`` along ``axis`` (removed); a row that is all ``-inf`` gives ``-inf``.

    Half-precision input is computed and returned in float32.
    """
    x = as_array(x, "x")
    xp = namespace(x=x)
    _, lse = softmax_lse(xp, xp.astype(x, compute_dtype(xp, x)), axis)
    return lse
