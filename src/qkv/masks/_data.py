"""Masks that carry data: sequence lengths, document ids, global positions, random blocks, arrays, functions.

Masks whose data has a batch axis (``padding`` lengths ``(B,)``, ``document`` ids ``(B, Nk)``)
give arrays of shape ``(B, 1, Nq, Nk)``: they follow the ``(B, H, Nq, Nk)`` layout.
"""

import math
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from .._backend import is_bool, to_numpy
from .._checks import check_int
from ..errors import MaskError
from ._mask import EMPTY, FULL, PARTIAL, Mask, from_counts
from ._positions import aligned, length


def _lengths(x: Any, name: str) -> np.ndarray:
    a = to_numpy(x) if not isinstance(x, (int, np.integer)) else np.asarray(x)
    a = np.asarray(a)
    if a.ndim > 1 or not np.issubdtype(a.dtype, np.integer) or (a < 0).any():
        raise MaskError(f"{name} must be non-negative integers of shape (B,) or a single integer, got {a!r}")
    return a.reshape(-1, 1, 1, 1) if a.ndim == 1 else a  # (B, 1, 1, 1): the (B, H, Nq, Nk) layout


def padding(kv_lengths: Any, q_lengths: Any = None) -> Mask:
    """Batch element ``b`` has ``kv_lengths[b]`` real keys (and ``q_lengths[b]`` real queries).

    Keys at or past the length are padding; query rows past ``q_lengths[b]`` attend nothing
    (their outputs are zeros). Lengths of shape ``(B,)`` give a ``(B, 1, Nq, Nk)`` mask.
    """
    kl = _lengths(kv_lengths, "kv_lengths")
    ql = None if q_lengths is None else _lengths(q_lengths, "q_lengths")

    def allowed(i, j, nq, nk):
        ok = j < kl
        return ok if ql is None else ok & (i < ql)

    def tiles(q0, q1, k0, k1, nq, nk):
        full, empty = k1 <= kl, k0 >= kl
        if ql is not None:
            full, empty = full & (q1 <= ql), empty | (q0 >= ql)
        return np.where(empty, EMPTY, np.where(full, FULL, PARTIAL))

    def rows(i, nq, nk):
        k = np.minimum(kl, nk)
        k = k[..., 0] if k.ndim else k  # (B, 1, 1): the (B, H, Nq) layout
        if ql is None:
            return np.zeros_like(k) + np.zeros_like(i), k + np.zeros_like(i)
        real = i < (ql[..., 0] if ql.ndim else ql)
        return np.where(real, 0, k), k + np.zeros_like(i)  # a padded query: the empty interval [k, k)

    name = "padding" if ql is None else "padding(with q_lengths)"
    return Mask(allowed, name, tiles, rows=rows)


def document(doc_ids: Any) -> Mask:
    """Tokens attend only within their own document (packed sequences); combine with ``causal()``.

    ``doc_ids``: ints ``(Nk,)`` or ``(B, Nk)``; query ``i`` belongs to ``doc_ids[..., p]``.
    Tile classes are exact for sorted (packed) ids and conservative otherwise.
    """
    ids = np.asarray(to_numpy(doc_ids))
    if ids.ndim not in (1, 2) or not np.issubdtype(ids.dtype, np.integer):
        raise MaskError(f"doc_ids must be integers of shape (Nk,) or (B, Nk), got shape {ids.shape} {ids.dtype}")

    def checked(nq: int, nk: int) -> np.ndarray:
        if ids.shape[-1] != nk or nq > nk:
            raise MaskError(
                f"doc_ids has {ids.shape[-1]} positions on its last axis but the keys have Nk={nk} "
                f"(and Nq={nq} must not exceed it) (doc_ids: {ids.shape})"
            )
        return ids

    def lift(a: np.ndarray) -> np.ndarray:
        return a[:, None] if ids.ndim == 2 else a  # (B, Nq, Nk) -> (B, 1, Nq, Nk)

    def allowed(i, j, nq, nk):
        d = checked(nq, nk)
        return lift(d[..., i + aligned(nq, nk)] == d[..., j])

    def tiles(q0, q1, k0, k1, nq, nk):
        d = checked(nq, nk)
        qd = d[..., aligned(nq, nk) :]  # the ids the Nq queries carry
        qlo = np.minimum.reduceat(qd, q0[:, 0], axis=-1)[..., :, None]
        qhi = np.maximum.reduceat(qd, q0[:, 0], axis=-1)[..., :, None]
        klo = np.minimum.reduceat(d, k0[0], axis=-1)[..., None, :]
        khi = np.maximum.reduceat(d, k0[0], axis=-1)[..., None, :]
        empty = (qhi < klo) | (khi < qlo)  # no id can be shared
        full = (qlo == qhi) & (klo == khi) & (qlo == klo)  # one document on both sides
        return lift(np.where(empty, EMPTY, np.where(full, FULL, PARTIAL)))

    def rows(i, nq, nk):  # packed (sorted) ids: a document is one run of positions
        d = checked(nq, nk)
        flat = d.reshape(-1, d.shape[-1])
        p = i + aligned(nq, nk)
        lo = np.stack([np.searchsorted(row, row[p], "left") for row in flat])
        hi = np.stack([np.searchsorted(row, row[p], "right") for row in flat])
        return lift(lo.reshape(*d.shape[:-1], -1)), lift(hi.reshape(*d.shape[:-1], -1))

    packed = bool((np.diff(ids, axis=-1) >= 0).all())
    return Mask(allowed, "document", tiles, (ids.shape[-1], ids.shape[-1]), rows if packed else None)


def global_tokens(indices: Sequence[int] | np.ndarray) -> Mask:
    """Global positions attend every key and are attended by every query (Longformer).

    Query ``i`` is global when its aligned position ``p`` is in ``indices``; key ``j`` when
    ``j`` is.
    """
    idx = np.asarray(to_numpy(indices) if not isinstance(indices, (list, tuple)) else indices).reshape(-1)
    if idx.size == 0:
        idx = idx.astype(np.int64)  # np.asarray([]) is float64: no index array
    if idx.size and (not np.issubdtype(idx.dtype, np.integer) or (idx < 0).any()):
        raise MaskError(f"global_tokens indices must be non-negative integers, got {idx!r}")

    def allowed(i, j, nq, nk):
        return np.isin(i + aligned(nq, nk), idx) | np.isin(j, idx)

    def tiles(q0, q1, k0, k1, nq, nk):
        o = aligned(nq, nk)
        n = max(nq + o, nk) + 1
        marks = np.zeros(n, dtype=np.int64)
        marks[idx[idx < n]] = 1
        cum = np.concatenate([[0], np.cumsum(marks)])  # cum[x] = global positions below x

        def below(x: np.ndarray) -> np.ndarray:
            return cum[np.clip(x, 0, n)]  # aligned positions may be negative when Nq > Nk

        rows = below(q1 + o) - below(q0 + o)
        cols = below(k1) - below(k0)
        full = (rows == q1 - q0) | (cols == k1 - k0)
        return np.where(full, FULL, np.where((rows > 0) | (cols > 0), PARTIAL, EMPTY))

    return Mask(allowed, f"global_tokens({idx.tolist()})", tiles)


def random_blocks(block: int, per_row: int, seed: int) -> Mask:
    """BigBird's random attention (arXiv:2007.14062): each query block attends ``per_row``
    key blocks of ``block`` positions, drawn without replacement from ``seed``.

    The draw depends only on ``(block, per_row, seed, Nq, Nk)``, so it is the same on every
    call, tile by tile.
    """
    block = length(block, "random_blocks block")
    per_row = length(per_row, "random_blocks per_row", minimum=0)
    seed = check_int(seed, "random_blocks seed", minimum=0, error=MaskError)  # numpy's seeds are non-negative

    @lru_cache(maxsize=8)
    def chosen(nq: int, nk: int) -> np.ndarray:
        """The key blocks each query block attends, sorted: int64 ``(ceil(Nq / block), per_row')``,
        O(blocks · per_row) memory (not the block grid: ``block=1`` at N = 8192 would be 64 M cells)."""
        nqb, nkb = math.ceil(nq / block), math.ceil(nk / block)
        rng = np.random.default_rng(seed)
        picks = [np.sort(rng.choice(nkb, size=min(per_row, nkb), replace=False)) for _ in range(nqb)]
        return np.array(picks, dtype=np.int64).reshape(nqb, min(per_row, nkb))

    def allowed(i, j, nq, nk):
        picks = chosen(nq, nk)[i // block]  # (rows, 1, per_row)
        return (picks == (j // block)[..., None]).any(axis=-1)

    def tiles(q0, q1, k0, k1, nq, nk):
        picks = chosen(nq, nk)
        a, b = q0[:, 0] // block, (q1[:, 0] - 1) // block + 1  # query blocks each row of tiles touches
        c, d = k0[0] // block, (k1[0] - 1) // block + 1  # key blocks each column of tiles touches
        count = np.empty((a.size, c.size), dtype=np.int64)
        for r in range(a.size):  # chosen (query, key) block pairs inside each tile
            kbs = np.sort(picks[a[r] : b[r]].ravel())
            count[r] = np.searchsorted(kbs, d) - np.searchsorted(kbs, c)
        return from_counts(count, (b - a)[:, None] * (d - c)[None, :])

    return Mask(allowed, f"random_blocks({block}, per_row={per_row}, seed={seed})", tiles)


def from_dense(bool_array: Any) -> Mask:
    """Wrap a boolean array ``(..., Nq, Nk)`` (True = may attend); size-1 axes broadcast."""
    if hasattr(bool_array, "dtype") and not is_bool(bool_array):
        raise MaskError(f"from_dense needs a boolean array, got dtype {bool_array.dtype}")
    a = np.asarray(to_numpy(bool_array), dtype=bool)
    if a.ndim < 2:
        raise MaskError(f"mask has shape {a.shape}; a dense mask needs at least 2 axes (..., Nq, Nk)")

    def allowed(i, j, nq, nk):
        for axis, n, name in ((-2, nq, "Nq"), (-1, nk, "Nk")):
            if a.shape[axis] not in (1, n):
                raise MaskError(
                    f"mask has {a.shape[axis]} on axis {axis} but the scores have {name}={n} (mask: {a.shape})"
                )
        full = np.broadcast_to(a, (*a.shape[:-2], nq, nk))
        return full[..., i, j]

    return Mask(allowed, f"from_dense{a.shape}", size=(a.shape[-2], a.shape[-1]))


def from_fn(fn: Callable[[np.ndarray, np.ndarray], Any], name: str | None = None) -> Mask:
    """A mask from ``fn(i, j) -> bool array``, called on int grids ``i (rows, 1)``, ``j (1, cols)``.

    ``i`` and ``j`` are absolute row and column indices (tiles pass sub-ranges). ``fn`` must
    return booleans (True = may attend) that broadcast to ``(rows, cols)``; anything else is a
    ``MaskError`` naming what it returned.

    >>> even = from_fn(lambda i, j: (i + j) % 2 == 0)
    """
    label = name or f"from_fn({getattr(fn, '__name__', 'fn')})"

    def allowed(i, j, nq, nk):
        a = np.asarray(to_numpy(r) if hasattr(r := fn(i, j), "shape") else r)
        if a.dtype != np.bool_:
            raise MaskError(
                f"{label} returned dtype {a.dtype}; a mask function returns booleans (True = may attend), "
                "e.g. lambda i, j: j <= i"
            )
        want = (i.shape[0], j.shape[-1])
        try:
            fits = np.broadcast_shapes(a.shape, want)[-2:] == want
        except ValueError:
            fits = False
        if not fits:
            raise MaskError(
                f"{label} returned shape {a.shape}, which does not broadcast to the (rows, cols) = {want} "
                f"of the index grids it was called on (i: {i.shape}, j: {j.shape})"
            )
        return a

    return Mask(allowed, label)
