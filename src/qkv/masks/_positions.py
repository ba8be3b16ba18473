"""Masks that relate a query's position to a key's: causal, sliding window, prefix LM, dilated.

Every one is a band of relative distances ``d = p - j`` between the query's *aligned*
position ``p = i + (Nk - Nq)`` (bottom-right, so one new query against a KV cache sits after
every cached key) and the key ``j``; tiles are classified analytically from the smallest and
largest ``d`` a tile holds, without evaluating a single cell.
"""

import math
from dataclasses import replace

import numpy as np

from .._checks import check_flag, check_int
from ..errors import MaskError
from ._mask import EMPTY, FULL, PARTIAL, Mask
from ._recipe import compiling, lazy, recorded
from ._sequences import UNBOUNDED, window_sides

MAX_LENGTH = 2**31 - 1
"""Largest size a mask parameter may take: far beyond any sequence, and int64 index arithmetic
(``i + offset - j``, ``window · dilation``) cannot overflow below it."""


def aligned(nq: int, nk: int) -> int:
    """Shift from a query row to its aligned position (bottom-right): ``p = i + (nk - nq)``."""
    return nk - nq


def shift(offset: int | None, nq: int, nk: int) -> int:
    """The query's aligned position is ``p = i + shift``: ``Nk - Nq`` for ``offset=None`` (bottom-right),
    else ``offset`` clipped to ``[-Nq, Nk]``. Exact for one-sided tests ``j <= p`` (beyond that range
    every key is hidden or shown alike, and int64 index arithmetic stays exact for any Python int);
    a two-sided band clips each side on its own (``reach``)."""
    return aligned(nq, nk) if offset is None else min(max(offset, -nq), nk)


def reach(offset: int | None, lo: float, hi: float, nq: int, nk: int) -> tuple[int, int]:
    """``(b, a)`` with ``lo <= i + offset - j <= hi``  iff  ``i + b <= j <= i + a``, for every row
    ``0 <= i < Nq`` and key ``0 <= j < Nk``.

    ``a = offset - lo`` and ``b = offset - hi`` are each clipped to ``[-Nq, Nk]``: a bound beyond
    it admits every key or none on that side, so the result is exact for any Python int offset
    and any band, and the arithmetic stays small. (Clipping the offset itself, as ``shift`` does,
    is exact only for one-sided bands: a window far to one side would slide back onto the keys.)
    """
    o = aligned(nq, nk) if offset is None else int(offset)
    return int(min(max(o - hi, -nq), nk)), int(min(max(o - lo, -nq), nk))  # int: a finite float band


def check_offset(offset: object, name: str) -> int | None:
    """``None`` (bottom-right) or an integer: the ``offset=`` of every position mask."""
    return None if offset is None else check_int(offset, f"{name} offset", error=MaskError)


def suffix(offset: int | None) -> str:
    return "" if offset is None else f", offset={offset}"


def length(value: object, name: str, minimum: int = 1) -> int:
    """A mask size parameter: an integer in ``minimum..MAX_LENGTH`` (``MaskError`` otherwise)."""
    return check_int(value, name, minimum=minimum, maximum=MAX_LENGTH, error=MaskError)


def _band(lo: float, hi: float, offset: int | None, name: str) -> Mask:
    """Keys at distance ``d = i + offset - j`` with ``lo <= d <= hi`` (offset None: Nk - Nq)."""

    def allowed(i, j, nq, nk):
        b, a = reach(offset, lo, hi, nq, nk)
        return (j >= i + b) & (j <= i + a)

    def tiles(q0, q1, k0, k1, nq, nk):
        b, a = reach(offset, lo, hi, nq, nk)
        smin, smax = k0 - (q1 - 1), (k1 - 1) - q0  # j - i takes every value in between
        return np.where((smax < b) | (smin > a), EMPTY, np.where((smin >= b) & (smax <= a), FULL, PARTIAL))

    def rows(i, nq, nk):
        b, a = reach(offset, lo, hi, nq, nk)  # allowed: i + b <= j <= i + a
        first = np.clip(i.astype(np.int64) + b, 0, nk)
        return first, np.maximum(first, np.clip(i.astype(np.int64) + a + 1, 0, nk))

    return Mask(allowed, name, tiles, rows=rows)


def causal(offset: int | None = None) -> Mask:
    """Query ``i`` may attend key ``j`` iff ``j <= i + offset``; ``offset=None`` means ``Nk - Nq``.

    None is bottom-right aligned: the last query sees every key (a KV-cache decode step);
    ``offset=0`` is PyTorch's top-left ``is_causal``. Nq=3, Nk=4, offset None:

        █ █ · ·
        █ █ █ ·
        █ █ █ █
    """
    offset = check_offset(offset, "causal")
    if offset is None:
        return _CAUSAL
    if compiling():
        return lazy("causal", ("causal", (int(offset),), {}))
    return replace(
        _band(0, math.inf, int(offset), f"causal(offset={offset})"),
        recipe=("causal", (int(offset),), {}),
    )


# one object: impls recognise it by identity, and its plans are cached once
_CAUSAL = replace(_band(0, math.inf, None, "causal"), recipe=("causal", (), {}))


@recorded
def sliding_window(size: int | tuple[int, int], causal: bool = True, *, offset: int | None = None) -> Mask:
    """Keys within ``size`` positions of the query's aligned position ``p``; ``d = p - j``.

    ``causal=True``: ``0 <= d < size``, the ``size`` most recent keys including itself
    (Mistral's window). ``causal=False``: ``|d| < size``, ``size - 1`` keys on each side
    (Longformer, arXiv:2004.05150). ``size`` may also be flash-attn's ``window_size`` pair
    ``(left, right)``: ``-right <= d <= left``, ``-1`` for an unbounded side; ``causal=True``
    intersects it with ``causal()`` (right becomes 0, as in flash-attn). ``p = i + offset``;
    ``offset=None`` is ``Nk - Nq`` (bottom-right), ``0`` top-left, as for ``causal``.
    Nq=Nk=5, size=2 (the same as ``(1, 0)``), causal:

        █ · · · ·
        █ █ · · ·
        · █ █ · ·
        · · █ █ ·
        · · · █ █

    >>> sliding_window((2, -1), causal=False)  # two keys back, every key ahead
    """
    offset = check_offset(offset, "sliding_window")
    causal = check_flag(causal, "sliding_window causal", error=MaskError)
    if isinstance(size, (tuple, list)):
        left, right = window_sides(tuple(size), causal, "sliding_window", "size")
        lo, hi = (-math.inf if right == UNBOUNDED else -right), (math.inf if left == UNBOUNDED else left)
        shown = f"({_side(size[0])}, {_side(right if causal else size[1])})"
        return _band(lo, hi, offset, f"sliding_window({shown}{'' if causal else ', causal=False'}{suffix(offset)})")
    size = length(size, "sliding_window size")
    if causal:
        return _band(0, size - 1, offset, f"sliding_window({size}{suffix(offset)})")
    return _band(-(size - 1), size - 1, offset, f"sliding_window({size}, causal=False{suffix(offset)})")


@recorded
def chunked(size: int, *, offset: int | None = None) -> Mask:
    """Causal attention within fixed chunks of ``size`` positions: the query at aligned position
    ``p`` sees the keys ``j`` with ``j <= p`` in its own chunk, ``j // size == p // size`` (Llama
    4's chunked attention; FlashAttention-3's ``attention_chunk``). Chunks are counted from key 0;
    ``p = i + offset``, ``offset=None`` is ``Nk - Nq`` (bottom-right), ``0`` top-left, as for
    ``causal``. Each row attends one interval of keys and tile classes are exact, so the kernels
    skip every tile outside the chunks. Nq=Nk=5, size=2:

        █ · · · ·
        █ █ · · ·
        · · █ · ·
        · · █ █ ·
        · · · · █
    """
    size = length(size, "chunked size")
    offset = check_offset(offset, "chunked")

    def at(nq: int, nk: int) -> int:
        # beyond [-Nq - 1, Nk + size] every row attends nothing either way: small int64 arithmetic
        o = aligned(nq, nk) if offset is None else offset
        return min(max(o, -nq - 1), nk + size)

    def start(p: np.ndarray) -> np.ndarray:  # the first position of p's chunk (floor: p may be negative)
        return p - p % size

    def allowed(i, j, nq, nk):
        p = i + at(nq, nk)
        return (j <= p) & (j >= start(p))

    def tiles(q0, q1, k0, k1, nq, nk):
        o = at(nq, nk)
        p0, p1 = q0 + o, q1 - 1 + o
        # some row p of the tile sees key j iff start(p) <= j <= p, i.e. p in [j, end of j's chunk]:
        # the best candidate is the largest key the last row can see
        j = np.minimum(k1 - 1, p1)
        some = (j >= k0) & (start(j) + size - 1 >= p0)
        full = (p0 >= k1 - 1) & (start(p1) <= k0)  # the first row reaches the last key; the last chunk starts by k0
        return np.where(~some, EMPTY, np.where(full, FULL, PARTIAL))

    def rows(i, nq, nk):
        p = i.astype(np.int64) + at(nq, nk)
        lo = np.clip(start(p), 0, nk)
        return lo, np.maximum(np.clip(p + 1, 0, nk), lo)

    return Mask(allowed, f"chunked({size}{suffix(offset)})", tiles, rows=rows)


def _side(x: object) -> int:
    return -1 if x in (-1, UNBOUNDED) else int(x)  # type: ignore[call-overload]


@recorded
def prefix_lm(prefix_len: int, *, offset: int | None = None) -> Mask:
    """Every query sees the first ``prefix_len`` keys (bidirectional prefix), the rest causally.

    Allowed iff ``j < prefix_len`` or ``j <= p`` (T5 / UniLM prefix LM, arXiv:1910.10683), with
    ``p = i + offset`` aligned as for ``causal`` (None: bottom-right).
    """
    n = length(prefix_len, "prefix_len", minimum=0)
    offset = check_offset(offset, "prefix_lm")

    def allowed(i, j, nq, nk):
        return (j < n) | (j <= i + shift(offset, nq, nk))

    def tiles(q0, q1, k0, k1, nq, nk):
        o = shift(offset, nq, nk)
        some = (k0 < n) | (k0 <= q1 - 1 + o)  # the smallest j is allowed in the last row
        hidden = (k1 - 1 >= n) & (k1 - 1 > q0 + o)  # the largest j is hidden from the first row
        return np.where(~some, EMPTY, np.where(hidden, PARTIAL, FULL))

    def rows(i, nq, nk):
        p = i.astype(np.int64) + shift(offset, nq, nk)
        return np.zeros_like(p), np.clip(np.maximum(n, p + 1), 0, nk)

    return Mask(allowed, f"prefix_lm({n}{suffix(offset)})", tiles, rows=rows)


@recorded
def dilated(window: int, dilation: int, *, offset: int | None = None) -> Mask:
    """Every ``dilation``-th key within ``window · dilation`` positions on either side:
    ``|d| < window · dilation`` and ``d % dilation == 0`` (Longformer's dilated window), with
    ``d = i + offset - j`` aligned as for ``causal`` (None: bottom-right).

    Symmetric; combine with ``causal()`` for the causal form. Tile classes are exact.
    """
    window = length(window, "dilated window")
    dilation = length(dilation, "dilated dilation")
    offset = check_offset(offset, "dilated")
    r = window * dilation - 1
    band = _band(-r, r, offset, "band")

    def allowed(i, j, nq, nk):
        o = aligned(nq, nk) if offset is None else offset % dilation  # d mod dilation, with small numbers
        return band.allowed(i, j, nq, nk) & ((i + o - j) % dilation == 0)

    def tiles(q0, q1, k0, k1, nq, nk):
        if dilation == 1:
            return band._classify(q0, q1, k0, k1, nq, nk)
        # the tile's cells in the band have j - i in [lo, hi]; one of them is allowed iff that
        # range holds an s with s = o (mod dilation), o the offset's residue
        b, a = reach(offset, -r, r, nq, nk)
        lo, hi = np.maximum(k0 - (q1 - 1), b), np.minimum((k1 - 1) - q0, a)
        o = aligned(nq, nk) if offset is None else offset % dilation
        some = lo + (o - lo) % dilation <= hi
        single = (q1 - q0 == 1) & (k1 - k0 == 1)  # only a one-cell tile can be FULL
        return np.where(some, np.where(single, FULL, PARTIAL), EMPTY)

    return Mask(allowed, f"dilated({window}, dilation={dilation}{suffix(offset)})", tiles)
