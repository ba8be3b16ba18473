"""Masks that carry data: sequence lengths, document ids, global positions, random blocks, arrays, functions.

Masks whose data has a batch axis (``padding`` lengths ``(B,)``, ``document`` ids ``(B, Nk)``)
give arrays of shape ``(B, 1, Nq, Nk)``: they follow the ``(B, H, Nq, Nk)`` layout.
"""

import inspect
import math
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from .._backend import is_bool, to_numpy
from .._checks import check_int
from ..errors import MaskError
from ._mask import EMPTY, FULL, PARTIAL, Mask, from_counts, unbound
from ._positions import aligned, check_offset, length, shift
from ._recipe import recorded


@recorded
def document(doc_ids: Any, *, offset: int | None = None) -> Mask:
    """Tokens attend only within their own document (packed sequences); combine with ``causal()``.

    ``doc_ids``: ints ``(Nk,)`` or ``(B, Nk)``; query ``i`` belongs to ``doc_ids[..., p]`` with
    ``p = i + offset`` (None: ``Nk - Nq``, bottom-right; 0: top-left). Tile classes are exact
    for sorted (packed) ids and conservative otherwise. For queries and keys packed with
    different lengths, ``masks.packed``.
    """
    offset = check_offset(offset, "document")
    ids = np.array(to_numpy(doc_ids))  # a copy: the mask must not change if the caller's array does
    if ids.ndim not in (1, 2) or not np.issubdtype(ids.dtype, np.integer):
        raise MaskError(f"doc_ids must be integers of shape (Nk,) or (B, Nk), got shape {ids.shape} {ids.dtype}")

    def checked(nq: int, nk: int) -> np.ndarray:
        o = shift(offset, nq, nk)
        if ids.shape[-1] != nk or o < 0 or nq + o > nk:
            raise MaskError(
                f"doc_ids has {ids.shape[-1]} positions on its last axis but the keys have Nk={nk}, and the "
                f"queries' positions i + offset for Nq={nq} (offset {o}) must lie within them (doc_ids: {ids.shape})"
            )
        return ids

    def lift(a: np.ndarray) -> np.ndarray:
        return a[:, None] if ids.ndim == 2 else a  # (B, Nq, Nk) -> (B, 1, Nq, Nk)

    def allowed(i, j, nq, nk):
        d = checked(nq, nk)
        return lift(d[..., i + shift(offset, nq, nk)] == d[..., j])

    def tiles(q0, q1, k0, k1, nq, nk):
        d = checked(nq, nk)
        o = shift(offset, nq, nk)
        qd = d[..., o : o + nq]  # the ids the Nq queries carry
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
        p = i + shift(offset, nq, nk)
        lo = np.stack([np.searchsorted(row, row[p], "left") for row in flat])
        hi = np.stack([np.searchsorted(row, row[p], "right") for row in flat])
        return lift(lo.reshape(*d.shape[:-1], -1)), lift(hi.reshape(*d.shape[:-1], -1))

    packed = bool((np.diff(ids, axis=-1) >= 0).all())
    name = "document" if offset is None else f"document(offset={offset})"
    return Mask(allowed, name, tiles, (ids.shape[-1], ids.shape[-1]), rows if packed else None)


@recorded
def global_tokens(indices: Sequence[int] | np.ndarray) -> Mask:
    """Global positions attend every key and are attended by every query (Longformer).

    Query ``i`` is global when its aligned position ``p`` is in ``indices``; key ``j`` when
    ``j`` is.
    """
    idx = np.array(to_numpy(indices) if not isinstance(indices, (list, tuple)) else indices).reshape(-1)
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


@recorded
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


@recorded
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


def from_fn(fn: Callable[..., Any], name: str | None = None) -> Mask:
    """A mask from a predicate over index arrays: ``fn(q_idx, kv_idx)`` or ``fn(b, h, q_idx, kv_idx)``
    (FlexAttention's ``mask_mod`` order), returning booleans (True = may attend).

    ``fn`` is called vectorised, once per tile or batch of tiles, on broadcasting int arrays:
    ``q_idx (rows, 1)``, ``kv_idx (1, cols)`` (absolute row and column indices), and for the
    four-argument form ``b (*B, 1, 1, 1)`` (the flattened batch index) and ``h (H, 1, 1)``. Its
    result must broadcast to ``(rows, cols)`` (or ``(*B, H, rows, cols)``); anything else is a
    ``MaskError`` naming what it returned. The four-argument form is bound by
    ``qkv.attention`` to the call's ``(*B, H)``; tiles are classified by evaluating the
    predicate, once per mask and size.

    >>> even = from_fn(lambda i, j: (i + j) % 2 == 0)
    >>> per_head_window = from_fn(lambda b, h, i, j: (i - j >= 0) & (i - j < 4 * (h + 1)))
    """
    label = name or f"from_fn({getattr(fn, '__name__', 'fn')})"
    arity = _positional_arity(fn, label)

    def checked(r: Any, want: tuple[int, ...], grids: str, full: bool = False) -> np.ndarray:
        a = np.asarray(to_numpy(r) if hasattr(r, "shape") else r)
        if a.dtype != np.bool_:
            raise MaskError(
                f"{label} returned dtype {a.dtype}; a mask function returns booleans (True = may attend), "
                "e.g. lambda i, j: j <= i"
            )
        try:
            fits = np.broadcast_shapes(a.shape, want)[-len(want) :] == want
        except ValueError:
            fits = False
        extra = a.shape[: max(0, a.ndim - len(want))]
        if full and any(n != 1 for n in extra):  # fn(b, h, i, j) is called on the whole (*B, H, rows, cols)
            fits = False
        if not fits:
            more = " (more axes than the call's (*B, H, rows, cols))" if full and any(n != 1 for n in extra) else ""
            raise MaskError(
                f"{label} returned shape {a.shape}, which does not broadcast to {want}{more} "
                f"of the index grids it was called on ({grids})"
            )
        return a

    def allowed(i, j, nq, nk):
        return checked(fn(i, j), (i.shape[0], j.shape[-1]), f"i: {i.shape}, j: {j.shape}")

    if arity == 2:
        return Mask(allowed, label)

    def bind(lead: tuple[int, ...]) -> Mask:
        *batch, heads = lead if lead else (1,)
        b = np.arange(math.prod(batch), dtype=np.int64).reshape(*batch, 1, 1, 1)
        h = np.arange(heads, dtype=np.int64).reshape(heads, 1, 1)

        def allowed_bh(i, j, nq, nk):
            want = (*lead, i.shape[0], j.shape[-1])
            a = checked(fn(b, h, i, j), want, f"b: {b.shape}, h: {h.shape}, i: {i.shape}, j: {j.shape}", True)
            a = np.broadcast_to(a, np.broadcast_shapes(a.shape, want))
            return a.reshape(want)  # 2-D calls (no head axis): the size-1 batch and head axes go

        return Mask(allowed_bh, f"{label}@{tuple(lead)}")

    return unbound(label, bind)


def _positional_arity(fn: Any, label: str) -> int:
    """2 (``fn(q_idx, kv_idx)``) or 4 (``fn(b, h, q_idx, kv_idx)``): the positional parameters ``fn`` takes."""
    if not callable(fn):
        raise MaskError(f"from_fn needs a function fn(q_idx, kv_idx) or fn(b, h, q_idx, kv_idx), got {fn!r}")
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: the two-argument form
        return 2
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in params if p.kind in kinds and p.default is inspect.Parameter.empty]
    if any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in params) or len(required) not in (2, 4):
        raise MaskError(
            f"{label} takes {len(required)} positional arguments; a mask function is fn(q_idx, kv_idx) "
            "or fn(b, h, q_idx, kv_idx)"
        )
    return len(required)
