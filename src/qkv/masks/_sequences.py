"""Several sequences in one call: padded batches and packed (varlen) sequences, each aligned to itself.

flash-attn's varlen and KV-cache semantics (``cu_seqlens``, ``cache_seqlens``, ``cache_leftpad``):
a query attends only keys of its own sequence, and a causal mask or a window is aligned
bottom-right *per sequence*: local query ``ii`` of a sequence with ``Lq`` queries and ``Lk``
keys sits at ``p = ii + Lk - Lq`` and sees local key ``jj`` iff ``-right <= p - jj <= left``
(``causal``: ``right = 0``). Every row is one interval of keys, so these masks are
``Mask.rows`` masks: their tiles are classified from two rows per tile row, and the compiled
kernel masks them with per-row intervals.
"""

from typing import Any

import numpy as np

from .._backend import to_numpy
from .._checks import check_flag, check_int
from ..errors import MaskError
from ._mask import EMPTY, FULL, PARTIAL, Mask, Rows
from ._recipe import recorded

UNBOUNDED = 2**62
"""A window side without a bound: beyond any sequence, and ``p ± UNBOUNDED`` stays inside int64."""


def window_sides(window: Any, causal: bool, name: str, arg: str = "window") -> tuple[int, int]:
    """``(left, right)``: keys at most ``left`` before and ``right`` after the aligned position.

    ``window=None``: unbounded (``causal`` caps ``right`` at 0); an int ``w`` means what
    ``sliding_window(w, causal)`` means (``w`` keys ending at the query when causal, ``w - 1``
    on each side otherwise); a pair ``(left, right)`` is flash-attn's ``window_size``: ``-1``
    leaves that side unbounded (``UNBOUNDED``), and ``causal`` intersects it with the causal
    mask (``right`` becomes 0, as flash-attn does).
    """
    causal = check_flag(causal, f"{name} causal", error=MaskError)
    if window is None:
        left, right = UNBOUNDED, UNBOUNDED
    elif isinstance(window, (tuple, list)):
        if len(window) != 2:
            raise MaskError(f"{name} {arg} must be an integer or a pair (left, right), got {window!r}")
        left, right = (_side(x, f"{name} {arg} {side}") for x, side in zip(window, ("left", "right"), strict=True))
    else:
        w = check_int(window, f"{name} {arg}", minimum=1, maximum=UNBOUNDED, error=MaskError)
        left, right = w - 1, (0 if causal else w - 1)
    return left, (0 if causal else right)


def _side(x: Any, name: str) -> int:
    """One side of a ``(left, right)`` window: ``0 … UNBOUNDED``, or ``-1`` for unbounded (flash-attn)."""
    v = check_int(x, name, maximum=UNBOUNDED, error=MaskError)
    if v < -1:
        raise MaskError(
            f"{name} must be an integer >= 0, or -1 for an unbounded side (flash-attn's window_size), got {v}"
        )
    return UNBOUNDED if v == -1 else v


def rows_in_sequences(
    i: np.ndarray, q_start: Any, q_len: Any, k_start: Any, k_len: Any, left: int, right: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(lo, hi)`` of rows ``i`` in the sequences given per row (queries ``[q_start, q_start +
    q_len)``, keys ``[k_start, k_start + k_len)``); a row outside its sequence's queries is the
    empty interval at the edge that keeps ``lo`` and ``hi`` non-decreasing."""
    ii = i - q_start
    p = ii + k_len - q_len  # bottom-right within the sequence
    lo = np.clip(p - left, 0, k_len)
    hi = np.maximum(lo, np.clip(p + right + 1, 0, k_len))
    before, after = ii < 0, ii >= q_len
    lo = np.where(before, 0, np.where(after, k_len, lo))
    hi = np.where(before, 0, np.where(after, k_len, hi))
    return k_start + lo, k_start + hi


def shift_in_sequences(
    i: np.ndarray, q_start: Any, q_len: Any, k_start: Any, k_len: Any, nq: int, nk: int
) -> np.ndarray:
    """``Mask.align`` of rows ``i``: the query ``ii`` of a sequence sits at key ``k_start + ii + k_len
    - q_len``, i.e. ``i + (k_start + k_len) - (q_start + q_len)``: its sequence's ends aligned. Rows
    outside their sequence's queries attend nothing; they get the call's ``Nk - Nq``."""
    ii = i - q_start
    inside = (ii >= 0) & (ii < q_len)
    return np.where(inside, (k_start + k_len) - (q_start + q_len), nk - nq).astype(np.int64)


def interval_mask(rows: Rows, name: str, size: tuple[int, int] | None = None, align: Any = None) -> Mask:
    """A ``Mask`` given by its rows' key intervals: the predicate and the tile classes follow."""

    def allowed(i, j, nq, nk):
        lo, hi = rows(i[:, 0], nq, nk)
        return (np.asarray(lo)[..., None] <= j) & (j < np.asarray(hi)[..., None])

    def tiles(q0, q1, k0, k1, nq, nk):
        lo0, hi0 = (np.asarray(x)[..., None] for x in rows(q0[:, 0], nq, nk))
        lo1, hi1 = (np.asarray(x)[..., None] for x in rows(q1[:, 0] - 1, nq, nk))
        empty = (hi1 <= lo0) | (k1 <= lo0) | (k0 >= hi1)  # exact where consecutive rows' intervals touch
        full = (lo1 <= k0) & (k1 <= hi0)  # every row of the tile allows every key of it
        return np.where(empty, EMPTY, np.where(full, FULL, PARTIAL))

    return Mask(allowed, name, tiles, size, rows, align=align)


def _lengths(x: Any, name: str) -> np.ndarray:
    """Lengths ``(B,)`` (or one for every batch element) as int64 ``(B, 1, 1)``: the ``(B, H, Nq)`` layout."""
    a = np.array(to_numpy(x) if hasattr(x, "shape") else x)
    if a.ndim > 1 or not np.issubdtype(a.dtype, np.integer) or (a < 0).any():
        raise MaskError(f"{name} must be non-negative integers of shape (B,) or a single integer, got {a!r}")
    if a.size and int(a.max()) > UNBOUNDED:  # uint64 beyond int64 would wrap to a negative length
        raise MaskError(f"{name} must be at most {UNBOUNDED} (far beyond any sequence), got {int(a.max())}")
    return a.astype(np.int64).reshape(-1, 1, 1) if a.ndim == 1 else a.astype(np.int64)


@recorded
def padding(
    kv_lengths: Any,
    q_lengths: Any = None,
    *,
    causal: bool = False,
    window: Any = None,
    left: bool = False,
) -> Mask:
    """Batch element ``b`` has ``kv_lengths[b]`` real keys (and ``q_lengths[b]`` real queries).

    Right padding (``left=False``): the real keys are ``[0, Lk)`` and the real queries the
    first ``Lq`` rows; left padding: the last ``Lk`` keys and the last ``Lq`` rows. ``q_lengths``
    None: every query row is real (a decoding step against caches of ``kv_lengths``). Padded
    query rows attend nothing (their outputs are zeros). ``causal`` and ``window`` are aligned
    to each sequence's own lengths (flash-attn's ``cache_seqlens`` / ``cache_leftpad``): local
    query ``ii`` sees local key ``jj <= ii + Lk - Lq``. Lengths ``(B,)`` give a ``(B, 1, Nq, Nk)``
    mask. Right padding, ``Nq = Nk = 4``, ``kv_lengths = q_lengths = 3``, causal:

        █ · · ·
        █ █ · ·
        █ █ █ ·
        · · · ·
    """
    kl = _lengths(kv_lengths, "kv_lengths")
    ql = None if q_lengths is None else _lengths(q_lengths, "q_lengths")
    if ql is not None and ql.ndim == kl.ndim == 3 and len(ql) != len(kl) and 1 not in (len(ql), len(kl)):
        raise MaskError(
            f"q_lengths has B={len(ql)} entries on axis 0 but kv_lengths has B={len(kl)}; they give one "
            f"sequence per batch element (q_lengths: ({len(ql)},), kv_lengths: ({len(kl)},))"
        )
    lw, rw = window_sides(window, causal, "padding")
    left = check_flag(left, "padding left", error=MaskError)

    def sequences(nq: int, nk: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        k_len = np.minimum(kl, nk)
        q_len = np.full_like(k_len, nq) if ql is None else np.minimum(ql, nq)
        q_start = nq - q_len if left else np.zeros_like(q_len)
        k_start = nk - k_len if left else np.zeros_like(k_len)
        return q_start, q_len, k_start, k_len

    def rows(i, nq, nk):
        return rows_in_sequences(i.astype(np.int64), *sequences(nq, nk), lw, rw)

    def align(i, nq, nk):
        return shift_in_sequences(i.astype(np.int64), *sequences(nq, nk), nq, nk)

    options = [
        f"{k}={v}"
        for k, v, default in (
            ("q_lengths", "given", ql is None),
            ("causal", True, not causal),
            ("window", window, window is None),
            ("left", True, not left),
        )
        if not default
    ]
    return interval_mask(rows, f"padding({', '.join(options)})" if options else "padding", align=align)


def _cumulative(x: Any, name: str) -> np.ndarray:
    c = np.array(to_numpy(x) if hasattr(x, "shape") else x)
    if c.ndim != 1 or c.size < 2 or not np.issubdtype(c.dtype, np.integer) or c[0] != 0 or (np.diff(c) < 0).any():
        raise MaskError(
            f"{name} must be cumulative sequence lengths: integers (S + 1,) starting at 0 and never "
            f"decreasing (e.g. [0, 3, 7] for sequences of 3 and 4 tokens), got {c!r}"
        )
    return c.astype(np.int64)


@recorded
def packed(cu_seqlens_q: Any, cu_seqlens_k: Any = None, *, causal: bool = False, window: Any = None) -> Mask:
    """Sequences packed along the token axis: sequence ``s`` owns queries ``[cu_q[s], cu_q[s+1])``
    and keys ``[cu_k[s], cu_k[s+1])`` (flash-attn's varlen ``cu_seqlens``; ``cu_seqlens_k``
    None: the same as the queries, self-attention). A query attends only keys of its own
    sequence; ``causal`` and ``window`` (an int as in ``sliding_window``, or flash-attn's
    ``(left, right)``) align bottom-right per sequence. The call must have
    ``Nq = cu_q[-1]`` and ``Nk = cu_k[-1]``. ``cu_seqlens_q = [0, 2, 5]``, causal:

        █ · · · ·
        █ █ · · ·
        · · █ · ·
        · · █ █ ·
        · · █ █ █
    """
    cq = _cumulative(cu_seqlens_q, "cu_seqlens_q")
    ck = cq if cu_seqlens_k is None else _cumulative(cu_seqlens_k, "cu_seqlens_k")
    if ck.size != cq.size:
        raise MaskError(
            f"cu_seqlens_k describes {ck.size - 1} sequences but cu_seqlens_q {cq.size - 1}; they must pair up "
            f"(cu_seqlens_q: {cq.tolist()[:8]}, cu_seqlens_k: {ck.tolist()[:8]})"
        )
    lw, rw = window_sides(window, causal, "packed")
    nq_, nk_ = int(cq[-1]), int(ck[-1])

    def sequences(i: np.ndarray, nq: int, nk: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        if (nq, nk) != (nq_, nk_):
            raise MaskError(
                f"packed sequences cover Nq={nq_} queries and Nk={nk_} keys (cu_seqlens' last entries), "
                f"but the call has Nq={nq}, Nk={nk}"
            )
        s = np.searchsorted(cq, i, side="right") - 1  # the sequence holding row i (empty ones skipped)
        s = np.minimum(s, cq.size - 2)
        return cq[s], cq[s + 1] - cq[s], ck[s], ck[s + 1] - ck[s]

    def rows(i, nq, nk):
        return rows_in_sequences(i.astype(np.int64), *sequences(i, nq, nk), lw, rw)

    def align(i, nq, nk):
        return shift_in_sequences(i.astype(np.int64), *sequences(i, nq, nk), nq, nk)

    options = (", causal=True" if causal else "") + ("" if window is None else f", window={window}")
    lengths = np.diff(cq)
    shown = f"{lengths[:4].tolist()}{'…' if lengths.size > 4 else ''}".replace(" ", "")
    return interval_mask(rows, f"packed({lengths.size} sequences {shown}{options})", (nq_, nk_), align)
