"""Rows of tiles from per-row key intervals: what a tiled kernel keeps, counted in O(tile rows).

For a mask whose rows are intervals ``[lo_i, hi_i)`` that never move left as ``i`` grows
(``Mask.rows``), a row of tiles ``[q0, q1)`` needs keys ``[lo(q0), hi(q1 - 1))`` (the union of its
rows' intervals) and every one of its rows allows ``[lo(q1 - 1), hi(q0))`` (their
intersection). Two evaluations per row of tiles give the kept and the FULL key tiles, so a
cost model over a sequence of 10⁷ tokens needs a few MB, not the tile grid.
"""

from typing import Any, NamedTuple

import numpy as np

from ._mask import Mask


class RowTiles(NamedTuple):
    """Per row of ``block_q x block_k`` tiles (int64 ``(nbq,)`` each): the key tiles
    ``[first, end)`` not EMPTY for some batch element, and ``[full_first, full_end)`` FULL for
    all of them (``full_end <= full_first``: none); ``height`` is the row of tiles' query count."""

    first: np.ndarray
    end: np.ndarray
    full_first: np.ndarray
    full_end: np.ndarray
    height: np.ndarray


def row_tiles(
    mask: Mask, nq: int, nk: int, block_q: int, block_k: int, tile_rows: tuple[int, int] | None = None
) -> RowTiles | None:
    """The kept and FULL key tiles of each row of tiles (of the rows of tiles ``[r0, r1)`` when
    ``tile_rows`` is given), or None when ``mask`` has no ``rows``."""
    if mask.rows is None:
        return None
    r0, r1 = (0, -(-nq // block_q)) if tile_rows is None else tile_rows
    q0 = np.arange(r0, r1, dtype=np.int64) * block_q
    q_last = np.minimum(q0 + block_q, nq) - 1
    lo0, hi0 = (np.asarray(x, dtype=np.int64) for x in mask.rows(q0, nq, nk))
    lo1, hi1 = (np.asarray(x, dtype=np.int64) for x in mask.rows(q_last, nq, nk))

    def over_batch(x: np.ndarray, reduce: Any) -> np.ndarray:
        x = np.broadcast_to(x, np.broadcast_shapes(x.shape, q0.shape))
        return reduce(x.reshape(-1, q0.size), axis=0)

    some = np.broadcast_to(hi1 > lo0, np.broadcast_shapes(lo0.shape, hi1.shape))  # not all rows empty
    big = np.iinfo(np.int64).max
    a = over_batch(np.where(some, lo0, big), np.min)  # union over rows and batch elements
    b = over_batch(np.where(some, hi1, -1), np.max)
    fa, fb = over_batch(lo1, np.max), over_batch(hi0, np.min)  # intersection
    kept = b > a
    first = np.where(kept, a // block_k, 0)
    end = np.where(kept, -(-b // block_k), 0)
    full_first = -(-fa // block_k)  # the first tile starting at or after fa
    full_end = np.where(fb >= nk, -(-nk // block_k), fb // block_k)  # tiles ending by fb (the last one is short)
    full_end = np.where(fb > fa, np.minimum(full_end, end), full_first)
    return RowTiles(first, end, full_first, np.maximum(full_end, full_first), q_last + 1 - q0)


def kept_pairs(rt: RowTiles, nk: int, block_k: int) -> int:
    """(query, key) pairs in the kept tiles, per head."""
    width = np.minimum(rt.end * block_k, nk) - rt.first * block_k
    return int((rt.height * np.where(rt.end > rt.first, width, 0)).sum())


def full_pairs(rt: RowTiles, nk: int, block_k: int) -> int:
    """(query, key) pairs in the FULL tiles, per head."""
    width = np.minimum(rt.full_end * block_k, nk) - rt.full_first * block_k
    return int((rt.height * np.where(rt.full_end > rt.full_first, width, 0)).sum())


def tile_counts(rt: RowTiles) -> tuple[int, int]:
    """``(kept tiles, FULL tiles)``."""
    return int((rt.end - rt.first).sum()), int((rt.full_end - rt.full_first).sum())
