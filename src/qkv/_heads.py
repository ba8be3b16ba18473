"""Grouped-query heads without copies: the reshapes every implementation shares.

With ``H`` query heads and ``Hkv`` key/value heads (``H % Hkv == 0``), kv head ``g`` serves the
``r = H / Hkv`` consecutive query heads ``g·r … g·r + r − 1`` (the ``repeat_interleave``
order; GQA, Ainslie et al., arXiv:2305.13245). Rather than repeating K and V per query head,
the query side is reshaped so that one plain matmul per kv head serves its whole group.
"""

from typing import Any

from ._typing import Array, Dims


def cast(xp: Any, x: Array, dtype: Any) -> Array:
    """``x`` in ``dtype``, without a copy when it already is."""
    return x if x.dtype == dtype else xp.astype(x, dtype)


def group_q(xp: Any, x: Array, dims: Dims) -> Array:
    """``(*B, H, N, D) -> (*B, Hkv, H/Hkv · N, D)`` for grouped heads; otherwise unchanged.

    Each kv head's query heads are stacked along the rows, so one plain matmul per kv head
    serves the whole group: K and V are neither copied nor broadcast (a broadcast batched
    matmul materialises K once per query head, ~9x slower for a decode step).
    """
    if not dims.grouped:
        return x
    r = dims.h // dims.hkv
    return xp.reshape(x, (*x.shape[:-3], dims.hkv, r * x.shape[-2], x.shape[-1]))


def ungroup(xp: Any, x: Array, dims: Dims) -> Array:
    """Inverse of ``group_q``: ``(*B, Hkv, H/Hkv · N, D) -> (*B, H, N, D)``."""
    if not dims.grouped:
        return x
    r = dims.h // dims.hkv
    return xp.reshape(x, (*x.shape[:-3], dims.h, x.shape[-2] // r, x.shape[-1]))


def split_heads(xp: Any, x: Array, dims: Dims) -> Array:
    """``(*B, H, N, F) -> (*B, Hkv, H/Hkv, N, F)`` for grouped heads, so that a kv-side array
    with a new axis ``-3`` (``(*B, Hkv, 1, N, F)``) broadcasts over the group uncopied."""
    if not dims.grouped:
        return x
    return xp.reshape(x, (*x.shape[:-3], dims.hkv, dims.h // dims.hkv, *x.shape[-2:]))


def merge_heads(xp: Any, x: Array, dims: Dims) -> Array:
    """Inverse of ``split_heads``: ``(*B, Hkv, H/Hkv, N, F) -> (*B, H, N, F)``."""
    if not dims.grouped:
        return x
    return xp.reshape(x, (*x.shape[:-4], dims.h, *x.shape[-2:]))
