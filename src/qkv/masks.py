"""Masks: which keys each query may attend, as small composable predicates.

A ``Mask`` answers "may query row ``i`` attend key column ``j``?" on broadcast index grids
(``i (Nq, 1)``, ``j (1, Nk)`` or any tile of them), so the same object gives the dense boolean
matrix, one tile of it for the flash kernel, and (analytically, without materialising it) the
classification of every tile as EMPTY, PARTIAL or FULL. **True means "may attend"** (PyTorch
SDPA's convention). Masks compose with ``&``, ``|`` and ``~`` (flex attention's ``mask_mod``
idea, arXiv:2412.05496).

Alignment: masks that relate query and key positions use the query's *aligned* position
``p = i + (Nk - Nq)`` (bottom-right), so one new query against a KV cache sits after every
cached key. Masks whose data has a batch axis (``padding``, ``document`` with 2-D ids) give
arrays of shape ``(B, 1, Nq, Nk)``: they follow the ``(B, H, Nq, Nk)`` layout.

    >>> longformer = sliding_window(256, causal=False) | global_tokens([0])
    >>> bigbird = longformer | random_blocks(64, per_row=3, seed=0)
"""

import math
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from ._backend import is_bool, to_numpy
from ._mask import EMPTY as EMPTY
from ._mask import FULL as FULL
from ._mask import PARTIAL as PARTIAL
from ._mask import Mask as Mask
from ._mask import _from_counts
from ._mask import picture as picture
from .errors import MaskError


def _offset(nq: int, nk: int) -> int:
    """Shift from a query row to its aligned position (bottom-right): ``p = i + (nk - nq)``."""
    return nk - nq


def _band(lo: int, hi: int, offset: int | None, name: str) -> Mask:
    """Keys at distance ``d = i + offset - j`` with ``lo <= d <= hi`` (offset None: Nk - Nq)."""

    def off(nq: int, nk: int) -> int:
        # an offset beyond [-nq, nk] hides or shows the same keys as the bound (hi is only finite with
        # offset None): clipping keeps int64 index arithmetic exact for any Python int
        return _offset(nq, nk) if offset is None else min(max(offset, -nq), nk)

    def allowed(i, j, nq, nk):
        d = i + off(nq, nk) - j
        return (d >= lo) & (d <= hi)

    def tiles(q0, q1, k0, k1, nq, nk):
        o = off(nq, nk)
        dmin, dmax = q0 + o - (k1 - 1), (q1 - 1) + o - k0  # d takes every value in between
        return np.where((dmax < lo) | (dmin > hi), EMPTY, np.where((dmin >= lo) & (dmax <= hi), FULL, PARTIAL))

    return Mask(allowed, name, tiles)


MAX_LENGTH = 2**31 - 1
"""Largest size a mask parameter may take: far beyond any sequence, and int64 index arithmetic
(``i + offset - j``, ``window · dilation``) cannot overflow below it."""


def _positive_int(value: Any, name: str, minimum: int = 1, maximum: int | None = MAX_LENGTH) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise MaskError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise MaskError(f"{name} must be at most {maximum}, got {value!r}")
    return int(value)


def causal(offset: int | None = None) -> Mask:
    """Query ``i`` may attend key ``j`` iff ``j <= i + offset``; ``offset=None`` means ``Nk - Nq``.

    None is bottom-right aligned: the last query sees every key (a KV-cache decode step);
    ``offset=0`` is PyTorch's top-left ``is_causal``. Nq=3, Nk=4, offset None:

        █ █ · ·
        █ █ █ ·
        █ █ █ █
    """
    if offset is not None and (isinstance(offset, bool) or not isinstance(offset, (int, np.integer))):
        raise MaskError(f"causal offset must be an integer or None, got {offset!r}")
    if offset is None:
        return _CAUSAL
    return _band(0, np.iinfo(np.int64).max, int(offset), f"causal(offset={offset})")


_CAUSAL = _band(0, np.iinfo(np.int64).max, None, "causal")  # one object: impls recognise it by identity


def sliding_window(size: int, causal: bool = True) -> Mask:
    """Keys within ``size`` positions of the query's aligned position ``p``; ``d = p - j``.

    ``causal=True``: ``0 <= d < size``, the ``size`` most recent keys including itself
    (Mistral's window). ``causal=False``: ``|d| < size``, ``size - 1`` keys on each side
    (Longformer, arXiv:2004.05150). Nq=Nk=5, size=2, causal:

        █ · · · ·
        █ █ · · ·
        · █ █ · ·
        · · █ █ ·
        · · · █ █
    """
    size = _positive_int(size, "sliding_window size")
    if causal:
        return _band(0, size - 1, None, f"sliding_window({size})")
    return _band(-(size - 1), size - 1, None, f"sliding_window({size}, causal=False)")


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

    name = "padding" if ql is None else "padding(with q_lengths)"
    return Mask(allowed, name, tiles)


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
        return lift(d[..., i + _offset(nq, nk)] == d[..., j])

    def tiles(q0, q1, k0, k1, nq, nk):
        d = checked(nq, nk)
        qd = d[..., _offset(nq, nk) :]  # the ids the Nq queries carry
        qlo = np.minimum.reduceat(qd, q0[:, 0], axis=-1)[..., :, None]
        qhi = np.maximum.reduceat(qd, q0[:, 0], axis=-1)[..., :, None]
        klo = np.minimum.reduceat(d, k0[0], axis=-1)[..., None, :]
        khi = np.maximum.reduceat(d, k0[0], axis=-1)[..., None, :]
        empty = (qhi < klo) | (khi < qlo)  # no id can be shared
        full = (qlo == qhi) & (klo == khi) & (qlo == klo)  # one document on both sides
        return lift(np.where(empty, EMPTY, np.where(full, FULL, PARTIAL)))

    return Mask(allowed, "document", tiles, (ids.shape[-1], ids.shape[-1]))


def prefix_lm(prefix_len: int) -> Mask:
    """Every query sees the first ``prefix_len`` keys (bidirectional prefix), the rest causally.

    Allowed iff ``j < prefix_len`` or ``j <= p`` (T5 / UniLM prefix LM, arXiv:1910.10683).
    """
    n = _positive_int(prefix_len, "prefix_len", minimum=0)

    def allowed(i, j, nq, nk):
        return (j < n) | (j <= i + _offset(nq, nk))

    def tiles(q0, q1, k0, k1, nq, nk):
        o = _offset(nq, nk)
        some = (k0 < n) | (k0 <= q1 - 1 + o)  # the smallest j is allowed in the last row
        hidden = (k1 - 1 >= n) & (k1 - 1 > q0 + o)  # the largest j is hidden from the first row
        return np.where(~some, EMPTY, np.where(hidden, PARTIAL, FULL))

    return Mask(allowed, f"prefix_lm({n})", tiles)


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
        return np.isin(i + _offset(nq, nk), idx) | np.isin(j, idx)

    def tiles(q0, q1, k0, k1, nq, nk):
        o = _offset(nq, nk)
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
    block = _positive_int(block, "random_blocks block")
    per_row = _positive_int(per_row, "random_blocks per_row", minimum=0)
    seed = _positive_int(seed, "random_blocks seed", minimum=0, maximum=None)  # numpy's seeds are non-negative

    @lru_cache(maxsize=8)
    def table(nq: int, nk: int) -> np.ndarray:
        nqb, nkb = math.ceil(nq / block), math.ceil(nk / block)
        rng = np.random.default_rng(seed)
        t = np.zeros((nqb, nkb), dtype=bool)
        for r in range(nqb):
            t[r, rng.choice(nkb, size=min(per_row, nkb), replace=False)] = True
        return t

    def allowed(i, j, nq, nk):
        return table(nq, nk)[i // block, j // block]

    def tiles(q0, q1, k0, k1, nq, nk):
        t = table(nq, nk).astype(np.int64)
        cum = np.zeros((t.shape[0] + 1, t.shape[1] + 1), dtype=np.int64)
        cum[1:, 1:] = t.cumsum(0).cumsum(1)
        a, b = q0 // block, (q1 - 1) // block + 1  # query blocks the tile touches
        c, d = k0 // block, (k1 - 1) // block + 1
        count = cum[b, d] - cum[a, d] - cum[b, c] + cum[a, c]
        return _from_counts(count, (b - a) * (d - c))

    return Mask(allowed, f"random_blocks({block}, per_row={per_row}, seed={seed})", tiles)


def dilated(window: int, dilation: int) -> Mask:
    """Every ``dilation``-th key within ``window · dilation`` positions on either side:
    ``|d| < window · dilation`` and ``d % dilation == 0`` (Longformer's dilated window).

    Symmetric; combine with ``causal()`` for the causal form.
    """
    window = _positive_int(window, "dilated window")
    dilation = _positive_int(dilation, "dilated dilation")
    reach = window * dilation - 1
    band = _band(-reach, reach, None, "band")

    def allowed(i, j, nq, nk):
        d = i + _offset(nq, nk) - j
        return (np.abs(d) <= reach) & (d % dilation == 0)

    def tiles(q0, q1, k0, k1, nq, nk):
        c = band._classify(q0, q1, k0, k1, nq, nk)
        if dilation == 1:
            return c
        single = (q1 - q0 == 1) & (k1 - k0 == 1)  # a one-cell tile is all or nothing
        cell = allowed(q0, k0, nq, nk)
        return np.where(c == EMPTY, EMPTY, np.where(single, np.where(cell, FULL, EMPTY), PARTIAL))

    return Mask(allowed, f"dilated({window}, dilation={dilation})", tiles)


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

    ``i`` and ``j`` are absolute row and column indices (tiles pass sub-ranges).

    >>> even = from_fn(lambda i, j: (i + j) % 2 == 0)
    """

    def allowed(i, j, nq, nk):
        return np.asarray(fn(i, j), dtype=bool)

    return Mask(allowed, name or f"from_fn({getattr(fn, '__name__', 'fn')})")
