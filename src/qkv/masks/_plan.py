"""A mask's plan for one call: what a tiled kernel needs, apart from the predicate that defines it.

As FlexAttention's ``BlockMask`` is to its ``mask_mod``: a ``Mask`` stays an immutable predicate
over index grids; ``plan(mask, nq, nk, lead, block_q, block_k)`` turns it, for one call size and
tile shape, into the arrays a kernel reads (per-row key intervals where the mask has them, else
tile classes and a bitmap per PARTIAL tile), laid out ``(Bm, Hm, ...)`` for the call's
``(*B, H)``. Plans, tile classes and bound masks are remembered in one bounded, thread-safe
cache (``_cache.cached``): a mask used by every layer of a model is planned once per size.
"""

import math
from typing import NamedTuple

import numpy as np

from ._cache import cached
from ._mask import EMPTY, FULL, PARTIAL, Mask


def lead_shape(mask: Mask, nq: int, nk: int) -> tuple[int, ...]:
    """The batch and head axes ``mask`` brings to a call of this size (``()`` for most masks;
    ``(B, 1)`` for per-sequence data): one 1x1 tile evaluated once per size."""
    return cached((mask, "lead", nq, nk), lambda: tuple(mask.tile(0, 1, 0, 1, nq, nk).shape[:-2]))


class BlockPlan(NamedTuple):
    """Mask ``mask`` for a call with scores ``(*lead, Nq, Nk)`` and tiles ``block_q x block_k``.

    ``rows``: int32 ``(Bm, Hm, Nq, 2)``, each query row's allowed keys ``[lo, hi)``, where the
    mask is one interval per row (else None). Without rows: ``classes`` int8
    ``(Bm, Hm, nbq, nbk)`` (EMPTY / PARTIAL / FULL), ``bitmap_index`` int32 of the same shape
    (-1: no bitmap) and ``bitmaps`` uint64 ``(n, block_q, ceil(block_k / 64))``, a bit per cell of
    each PARTIAL tile. ``Bm`` is 1 or the product of the batch axes, ``Hm`` 1 or ``H``.
    ``hides_nothing``: every query may attend every key (the mask can be dropped)."""

    rows: np.ndarray | None
    classes: np.ndarray | None
    bitmap_index: np.ndarray | None
    bitmaps: np.ndarray | None
    hides_nothing: bool


def bh(a: np.ndarray, lead: tuple[int, ...], trailing: int) -> np.ndarray:
    """``a (*alead, t...)`` (``trailing`` axes after the leading ones) as ``(Bm, Hm, t...)`` for a
    call whose scores lead with ``lead = (*B, H)`` (``()`` for a call without heads)."""
    alead, tail = a.shape[: a.ndim - trailing], a.shape[a.ndim - trailing :]
    if not lead:
        return a.reshape(1, 1, *tail)
    alead = (1,) * (len(lead) - len(alead)) + tuple(alead)
    a = a.reshape(*alead, *tail)
    return a.reshape(math.prod(alead[:-1]), alead[-1], *tail)


def plan(mask: Mask, nq: int, nk: int, lead: tuple[int, ...], block_q: int, block_k: int) -> BlockPlan:
    """The kernel's view of ``mask`` for this call (cached; see the module docstring)."""
    return cached((mask, "plan", nq, nk, lead, block_q, block_k), lambda: _plan(mask, nq, nk, lead, block_q, block_k))


def _plan(mask: Mask, nq: int, nk: int, lead: tuple[int, ...], bq: int, bk: int) -> BlockPlan:
    intervals = mask.intervals(nq, nk)
    if intervals is not None:
        lo, hi = intervals
        nothing = bool((lo <= 0).all() and (hi >= nk).all())
        rows = np.stack(np.broadcast_arrays(lo, hi), axis=-1).astype(np.int32)  # (*alead, Nq, 2)
        return BlockPlan(np.ascontiguousarray(bh(rows, lead, 2)), None, None, None, nothing)
    classes = np.ascontiguousarray(bh(mask.blocks(nq, nk, bq, bk), lead, 2))
    if (classes == FULL).all():
        return BlockPlan(None, classes, None, None, True)
    index, bitmaps = _bitmaps(mask, classes, nq, nk, lead, bq, bk)
    return BlockPlan(None, classes, index, bitmaps, False)


def _bitmaps(
    m: Mask, cls: np.ndarray, nq: int, nk: int, lead: tuple[int, ...], bq: int, bk: int
) -> tuple[np.ndarray, np.ndarray]:
    """A bit per cell of each PARTIAL tile: ``bitmap_index (Bm, Hm, nbq, nbk)`` int32 (-1: none) and
    ``bitmaps (n, bq, ceil(bk / 64))`` uint64, evaluating the mask one row of tiles at a time."""
    bm, hm, nbq, _ = cls.shape
    words = -(-bk // 64)
    index = np.full(cls.shape, -1, dtype=np.int32)
    chunks: list[np.ndarray] = []
    n = 0
    for r in range(nbq):
        cols = np.flatnonzero((cls[:, :, r, :] == PARTIAL).any(axis=(0, 1)))
        if cols.size == 0:
            continue
        q0, q1 = r * bq, min((r + 1) * bq, nq)
        dense = np.broadcast_to(bh(m.tile(q0, q1, 0, nk, nq, nk), lead, 2), (bm, hm, q1 - q0, nk))
        for c in cols:
            k0, k1 = c * bk, min((c + 1) * bk, nk)
            tile = np.zeros((bm, hm, bq, words * 64), dtype=bool)
            tile[:, :, : q1 - q0, : k1 - k0] = dense[:, :, :, k0:k1]
            bits = np.packbits(tile, axis=-1, bitorder="little").view(np.uint64)  # (bm, hm, bq, words)
            sel = cls[:, :, r, c] == PARTIAL
            index[:, :, r, c] = np.where(sel, n + np.arange(bm * hm).reshape(bm, hm), -1)
            chunks.append(bits.reshape(bm * hm, bq, words))
            n += bm * hm
    bitmaps = np.concatenate(chunks) if chunks else np.zeros((1, bq, words), dtype=np.uint64)
    return index, np.ascontiguousarray(bitmaps)


def shared_classes(mask: Mask, nq: int, nk: int, block_q: int, block_k: int) -> np.ndarray:
    """``(nbq, nbk)`` tile classes valid for every batch element and head: EMPTY / FULL only where
    all agree (what an engine that runs every batch element through one tile loop can skip)."""

    def build() -> np.ndarray:
        cls = mask.blocks(nq, nk, block_q, block_k)
        if cls.ndim > 2:
            flat = cls.reshape(-1, *cls.shape[-2:])
            cls = np.where((flat == EMPTY).all(0), EMPTY, np.where((flat == FULL).all(0), FULL, PARTIAL))
        cls = np.asarray(cls, dtype=np.int8)
        cls.flags.writeable = False
        return cls

    return cached((mask, "shared", nq, nk, block_q, block_k), build)
