"""Modern Hopfield retrieval as iterated attention (Ramsauer et al., "Hopfield Networks is All
You Need", arXiv:2008.02217).

The update rule of the continuous modern Hopfield network, for stored patterns ``X (M, D)`` and
a state ``ξ``, is ``ξ ← Xᵀ softmax(β X ξ)``; written row-wise for many states at once it is
one attention call with ``q = ξ``, ``k = v = X`` and ``scale = β``. A large ``β`` makes the
softmax a hard lookup (a corrupted pattern converges to the stored one in one step); a small
``β`` retrieves the mean of the patterns (a metastable state).
"""

import math
from typing import Any

import numpy as np

from ._backend import as_array
from ._core import attention
from ._typing import Array
from .errors import ArgumentError, ShapeError


def hopfield(query: Array, patterns: Array, beta: float = 1.0, steps: int = 1) -> Array:
    """Retrieve stored ``patterns (..., M, D)`` from ``query (..., Nq, D)``; returns ``(..., Nq, D)``.

    Each of ``steps`` updates is ``ξ ← softmax(β ξ patternsᵀ) patterns``, i.e.
    ``qkv.attention(ξ, patterns, patterns, scale=beta)``. NumPy in -> NumPy out, torch in ->
    torch out (differentiable).

    >>> x = np.eye(3)
    >>> hopfield(np.array([[0.9, 0.2, 0.0]]), x, beta=50.0).round(3)
    array([[1., 0., 0.]])
    """
    query, patterns = as_array(query, "query"), as_array(patterns, "patterns")
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ArgumentError(f"steps must be an integer >= 1, got {steps!r}")
    try:
        b = float(beta)
    except (TypeError, ValueError):
        raise ArgumentError(f"beta must be a positive finite number, got {beta!r}") from None
    if not (b > 0 and math.isfinite(b)):
        raise ArgumentError(f"beta must be a positive finite number, got {beta!r}")
    if query.ndim >= 1 and patterns.ndim >= 1 and query.shape[-1] != patterns.shape[-1]:
        raise ShapeError(
            f"patterns have D={patterns.shape[-1]} on their last axis but query has D={query.shape[-1]} "
            f"(query: {tuple(query.shape)}, patterns: {tuple(patterns.shape)})"
        )
    xi: Any = query
    for _ in range(int(steps)):
        xi = attention(xi, patterns, patterns, scale=b)
    return xi
