"""The cost model ``qkv.complexity`` and ``qkv.bench`` share: FLOPs per (query, key) pair, pair counts, itemsizes.

FLOPs count the two (forward) or five (backward) matrix products, a multiply-add as 2; the
softmax's exp, max and sums are O(Nq·Nk) without a factor D and are not counted:

    forward  = 2 · L · P · (Dk + Dv)            4·B·H·Nq·Nk·Dk when dense with Dv = Dk
    backward = 2 · L · P · (3·Dk + 2·Dv)        S = QKᵀ recomputed, dV = AᵀdO, dP = dO Vᵀ,
                                                dQ = dS K, dK = dSᵀQ: 2.5x the forward
                                                (FlashAttention-2, arXiv:2307.08691)

with ``L = B·H`` heads and ``P`` the (query, key) pairs per head that are computed: every
pair the mask allows (``mask_pairs``: the useful work, the same credit for every
implementation), or every pair of every tile a tiled kernel keeps (``tile_pairs``).
"""

import math
from typing import Any, NamedTuple

import numpy as np

from .. import masks
from .._checks import check_choice, check_int
from ..errors import ArgumentError, DTypeError, ShapeError
from ..masks import full_pairs, kept_pairs, row_tiles

ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}
"""Bytes per element of the dtypes qkv computes in."""

CHUNK = 1 << 20
"""Tiles classified at once by ``tile_pairs``: memory stays a few MiB for any sequence length."""


class Sizes(NamedTuple):
    """One configuration's sizes, checked: ``Nq, Nk, Dk, Dv, H, Hkv, B`` and the dtype."""

    nq: int
    nk: int
    dk: int
    dv: int
    h: int
    hkv: int
    b: int
    dtype: str


MAX_SIZE = 2**31 - 1
"""Largest size a call takes on any axis: what the kernels index per axis (and the masks'
``MAX_LENGTH``). Beyond it (or beyond ``MAX_ELEMENTS``) no call can run: the estimate then
answers from its formulas alone (``runnable``), never from a call's plan."""
MAX_ELEMENTS = 2**62
"""Largest element count of one input a call can index (int64)."""
MAX_TILE_ROWS = 2**25
"""Most rows of tiles (``Nq / block_q``: 2.1e9 queries in 64-row tiles) whose kept tiles an estimate
counts for a mask with row intervals (as many tiles for one without): ``CHUNK`` at a time, seconds
at most. A masked estimate beyond it is refused (``ArgumentError``); an unmasked one is a formula
at any size."""


def check_sizes(
    n_q: Any, n_k: Any, d_k: Any, d_v: Any, heads: Any, kv_heads: Any, batch: Any, dtype: Any, q_name: str = "n_q"
) -> Sizes:
    """Validate a configuration (defaults: ``n_k = n_q``, ``d_v = d_k``, ``kv_heads = heads``):
    positive integers of any size (Python ints: an estimate is a calculator)."""

    def size(value: Any, name: str) -> int:
        return check_int(value, name, minimum=1)

    nq = size(n_q, q_name)
    nk = nq if n_k is None else size(n_k, "n_k")
    dk = size(d_k, "d_k")
    dv = dk if d_v is None else size(d_v, "d_v")
    h, b = size(heads, "heads"), size(batch, "batch")
    hkv = h if kv_heads is None else size(kv_heads, "kv_heads")
    if h % hkv:
        raise ShapeError(f"heads={h} is not a multiple of kv_heads={hkv}: each kv head serves H // Hkv query heads")
    check_choice(dtype, "dtype", tuple(ITEMSIZE), error=DTypeError)
    return Sizes(nq, nk, dk, dv, h, hkv, b, dtype)


def runnable(s: Sizes) -> bool:
    """Whether a call of these sizes could run at all (every axis and input within what a call
    indexes); else the estimate is its formulas alone."""
    shapes = ((s.b, s.h, s.nq, s.dk), (s.b, s.hkv, s.nk, s.dk), (s.b, s.hkv, s.nk, s.dv), (s.b, s.h, s.nq, s.dv))
    return max(*s[:7]) <= MAX_SIZE and all(math.prod(x) <= MAX_ELEMENTS for x in shapes)


def check_countable(mask: Any, nq: int, nk: int, block_q: int, block_k: int) -> None:
    """``ArgumentError`` when counting the tiles ``mask`` keeps would classify more than
    ``MAX_TILE_ROWS`` rows of tiles (or, for a mask without row intervals, as many tiles)."""
    rows = -(-nq // block_q)
    tiles = rows if mask.rows is not None else rows * -(-nk // block_k)
    if tiles > MAX_TILE_ROWS:
        what = "rows of tiles" if mask.rows is not None else "tiles"
        raise ArgumentError(
            f"counting the tiles mask {mask.name} keeps at Nq = {nq}, Nk = {nk} would classify {tiles:.3g} {what} "
            f"({block_q} x {block_k} tiles), beyond the {MAX_TILE_ROWS} an estimate counts: estimate without the "
            "mask (every pair: an upper bound) or at a smaller size"
        )


def compute_itemsize(dtype: str) -> int:
    """Bytes per element arithmetic runs in: float32 for half precision (API.md), else the dtype's."""
    return 4 if dtype in ("float16", "bfloat16") else ITEMSIZE[dtype]


def flops(lanes: int, pairs: int, d_k: int, d_v: int, backward: bool = False) -> int:
    """FLOPs of attention over ``pairs`` (query, key) pairs in each of ``lanes = B·H`` heads."""
    forward = 2 * lanes * pairs * (d_k + d_v)
    return forward + (2 * lanes * pairs * (3 * d_k + 2 * d_v) if backward else 0)


def edges(n: int, block: int) -> np.ndarray:
    """Lengths of the tiles of ``block`` along an axis of ``n`` (the last may be shorter)."""
    return np.diff(np.minimum(np.arange(0, n + block, block), n))


def tile_pairs(mask: Any, nq: int, nk: int, block_q: int, block_k: int) -> tuple[int, bool]:
    """``(pairs, partial)``: the pairs in every tile that is not EMPTY for some batch element
    (a tiled kernel runs each tile for all batch elements at once), and whether any tile is
    PARTIAL. O(tile rows) from the rows' key intervals where the mask has them; otherwise the
    tiles are classified ``CHUNK`` at a time (bounded memory, time O(tiles))."""
    if mask is None:
        return nq * nk, False
    nbq, nbk = -(-nq // block_q), -(-nk // block_k)
    if mask.rows is not None:  # CHUNK rows of tiles at a time: bounded memory at any length
        kept = full = 0
        for r0 in range(0, nbq, CHUNK):
            rt = row_tiles(mask, nq, nk, block_q, block_k, (r0, min(nbq, r0 + CHUNK)))
            assert rt is not None
            kept += kept_pairs(rt, nk, block_k)
            full += full_pairs(rt, nk, block_k)
        return kept, kept > full
    cols = edges(nk, block_k)
    step = max(1, CHUNK // nbk)
    pairs, partial = 0, False
    for r0 in range(0, nbq, step):
        c = mask.blocks(nq, nk, block_q, block_k, rows=(r0, r0 + step))
        c = c.reshape(-1, *c.shape[-2:])
        kept_tiles = (c != masks.EMPTY).any(axis=0)
        rows = edges(nq, block_q)[r0 : r0 + step]
        pairs += int((kept_tiles * rows[:, None] * cols[None, :]).sum())
        partial = partial or bool((kept_tiles & ~(c == masks.FULL).all(axis=0)).any())
    return pairs, partial


def mask_pairs(mask: Any, nq: int, nk: int, block: int = 512) -> int:
    """The (query, key) pairs ``mask`` allows in one ``nq x nk`` head: FULL tiles counted
    whole, PARTIAL ones evaluated, EMPTY ones skipped (first batch element)."""
    if mask is None:
        return nq * nk
    cls = mask.blocks(nq, nk, block, block)
    cls = cls.reshape(-1, *cls.shape[-2:])[0]
    rows, cols = edges(nq, block), edges(nk, block)
    total = int((np.outer(rows, cols) * (cls == masks.FULL)).sum())
    for bi, bj in zip(*np.nonzero(cls == masks.PARTIAL), strict=True):
        q0, k0 = int(bi) * block, int(bj) * block
        t = mask.tile(q0, min(q0 + block, nq), k0, min(k0 + block, nk), nq, nk)
        total += int(t.reshape(-1, *t.shape[-2:])[0].sum())
    return total
