"""Attention rollout (Abnar & Zuidema, "Quantifying Attention Flow in Transformers", arXiv:2005.00928).

Attention alone ignores the residual connection around it: a token's next representation is
half its own previous one, half what it attended to. Rollout models that by mixing each layer's
head-averaged weights with the identity, ``Â_l = rownorm(0.5 · A_l + 0.5 · I)``, and follows the
flow through the layers: ``R = Â_L · ... · Â_2 · Â_1``. Row ``i`` of ``R`` says how much of the
last layer's token ``i`` comes from each input token, if information mixed only by attention.
"""

from typing import Any

import numpy as np

from ..errors import ArgumentError, ShapeError


def rollout(weights: Any, residual: float = 0.5) -> np.ndarray:
    """Rollout ``(N, N)`` of every layer's weights ``(L, H, N, N)`` (heads averaged per layer).

    ``residual`` is the identity's share (0.5 in the paper). Rows of zeros (a query that may
    attend nothing, e.g. padding) keep only the identity. Computed in float64.

    >>> a = np.array([[[[1.0, 0.0], [0.5, 0.5]]]])  # one layer, one head
    >>> rollout(a)
    array([[1.  , 0.  ],
           [0.25, 0.75]])
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 4 or w.shape[-1] != w.shape[-2]:
        raise ShapeError(f"weights must have shape (layers, heads, N, N), got {w.shape}")
    if not 0.0 <= residual <= 1.0:
        raise ArgumentError(f"residual must be in [0, 1], got {residual!r}")
    n = w.shape[-1]
    eye = np.eye(n)
    flow = eye
    for layer in w:
        mixed = residual * eye + (1.0 - residual) * layer.mean(0)
        total = mixed.sum(-1, keepdims=True)
        mixed = np.divide(mixed, total, out=np.zeros_like(mixed), where=total > 0)
        flow = mixed @ flow  # the later layer applies to what the earlier ones produced
    return flow
