"""The flash kernel, ``impl="flash"``: exact attention by tiles with the online softmax, O(N) memory.

FlashAttention (Dao et al., arXiv:2205.14135; FlashAttention-2, arXiv:2307.08691): for each
block of queries, walk the key blocks keeping a running row maximum, a running sum and an
accumulator rescaled as the maximum grows; the ``Nq x Nk`` matrix never exists. ``Mask.blocks``
classifies tiles: EMPTY tiles are skipped, FULL tiles run without the mask, PARTIAL tiles
apply it. The backward pass recomputes each tile's weights from the saved ``lse``.

Two engines run the same tile loop: the compiled one (``_flash_native``, ``qkv._native``: the
fused C++ kernel) whenever it supports the call, and the array engine (``_flash_array``:
array-API code on NumPy, torch or JAX) for everything else. This module chooses the tiles and
the engine in the call's plan (``_plan``); ``Call.engine`` forces one (``"array"`` /
``"native"``: tests and benchmarks)."""

import math
from typing import Any

import numpy as np

from .. import masks
from .._backend import is_jax, is_torch
from .._typing import Array, Result
from ..errors import DTypeError
from ..masks import full_pairs, kept_pairs, row_tiles, tile_counts
from . import _flash_array as array_engine
from . import _flash_native as native_engine
from ._call import Call, Plan

BLOCK_Q = 256
BLOCK_K = 512
"""Default tile sizes (see benchmarks/LOG.md: 256 x 512 float32 scores are 512 KiB per head, and
large enough that per-tile Python overhead stays under a few percent). A call forces others
with ``Call.tiles`` (``build_call(..., tiles=(bq, bk))``: tests and benchmarks)."""


def tile_sizes(nq: int, nk: int, block_q: int | None = None, block_k: int | None = None) -> tuple[int, int]:
    """``(block_q, block_k)`` for a call: the defaults, widened along Nk when Nq is short.

    A decode step (Nq = 1) gets the tile area of a full tile in one row, so a 32k cache is
    a handful of tiles rather than 64 tiny ones dominated by per-tile overhead.
    """
    bq = max(1, min(block_q or BLOCK_Q, nq))
    if block_k is not None:
        return bq, max(1, min(block_k, nk))
    return bq, max(1, min(nk, max(BLOCK_K, (BLOCK_Q * BLOCK_K) // bq)))


CANDIDATES = ((BLOCK_Q, BLOCK_K), (128, 256), (128, 128))
PARTIAL_COST = 1.7  # a PARTIAL tile costs ~1.7x a FULL one per entry (mask tile built and added; benchmarks/LOG.md)
TILE_OVERHEAD = 43_000  # per-tile Python and dispatch cost, in entry-heads (~90 us at ~2 ns per entry-head)


def choose_tiles(c: Call) -> tuple[int, int]:
    """Tile sizes for ``c``: ``c.tiles`` when given, else the candidate with the lowest modelled cost.

    Dense calls keep the large default tiles; a narrow band (sliding window, causal documents)
    is followed more closely by small tiles, which keep fewer hidden entries (benchmarks/LOG.md:
    128 x 128 is ~1.8x faster than 256 x 512 on a 256-wide window). Only masks whose tiles
    are classified analytically are modelled, so choosing costs no mask evaluation.
    """
    d = c.dims
    if c.tiles is not None:
        return tile_sizes(d.nq, d.nk, *c.tiles)
    if c.mask is None or c.mask.tiles is None:
        return tile_sizes(d.nq, d.nk)
    heads = math.prod(d.score_shape[:-2])
    best: tuple[float, tuple[int, int]] | None = None
    for bq, bk in CANDIDATES:
        sizes = tile_sizes(d.nq, d.nk, bq, bk)
        kept, full, n_kept = _tile_work(c, *sizes)
        cost = heads * (full + PARTIAL_COST * (kept - full)) + TILE_OVERHEAD * n_kept
        if best is None or cost < best[0]:
            best = (cost, sizes)
    assert best is not None
    return best[1]


def _tile_work(c: Call, bq: int, bk: int) -> tuple[int, int, int]:
    """``(pairs in kept tiles, pairs in FULL tiles, kept tiles)`` per head: from the rows' key
    intervals in O(tile rows) where the mask has them, else from the tile classes."""
    d = c.dims
    assert c.mask is not None
    rt = row_tiles(c.mask, d.nq, d.nk, bq, bk)
    if rt is not None:
        return kept_pairs(rt, d.nk, bk), full_pairs(rt, d.nk, bk), tile_counts(rt)[0]
    classes = masks.shared_classes(c.mask, d.nq, d.nk, bq, bk)
    area = (
        np.diff(np.minimum(np.arange(classes.shape[0] + 1) * bq, d.nq))[:, None]
        * np.diff(np.minimum(np.arange(classes.shape[1] + 1) * bk, d.nk))[None, :]
    )
    kept = classes != masks.EMPTY
    return int(area[kept].sum()), int(area[classes == masks.FULL].sum()), int(kept.sum())


def is_seed(rng: Any) -> bool:
    """An int seed of the counter-based dropout generator (not a bool, not a Generator)."""
    return isinstance(rng, (int, np.integer)) and not isinstance(rng, (bool, np.bool_))


def seeded(c: Call) -> Call:
    """``c`` with its dropout seed drawn now (``rng=None``), so the backward pass redraws the same
    masks: from torch's global generator for torch tensors, else from NumPy's entropy."""
    if c.dropout == 0 or c.rng is not None:
        return c
    if is_jax(c.q):  # JAX has no global generator: the key (or an int seed) is the caller's to give
        raise DTypeError(
            "rng is NoneType; dropout on JAX arrays needs a JAX PRNG key, e.g. rng=jax.random.key(0), "
            "or an int seed of the flash kernel's counter-based generator"
        )
    if is_torch(c.q):
        import torch

        return c._replace(rng=int(torch.randint(0, 2**62, (), dtype=torch.int64)))
    return c._replace(rng=int(np.random.default_rng().integers(0, 2**62)))


def _autograd(c: Call) -> bool:
    return any(getattr(x, "requires_grad", False) for x in (c.q, c.k, c.v))


def supports(c: Call) -> str | None:
    if c.dropout > 0 and not (c.rng is None or is_seed(c.rng)):
        return (
            f"the flash kernel redraws its dropout masks from an int seed (counter-based), but rng is a "
            f"{type(c.rng).__name__}: pass rng=<int> (or None)"
        )
    if c.want_weights and any(getattr(x, "requires_grad", False) for x in (c.q, c.k, c.v)):
        return "the flash kernel's rebuilt weights carry no gradient"
    if c.score_mod is not None and any(getattr(t, "requires_grad", False) for t in c.score_mod.tensors):
        return "the flash kernel gives no gradient to a score mod's learnable tensors"
    if c.score_mod is not None and c.score_mod.opaque and _autograd(c):
        return (
            f"score_mod {c.score_mod.name} is a plain function that may close over tensors needing "
            "gradients, which only torch autograd through impl='reference' can follow"
        )
    return None


def forward(c: Call, p: Plan) -> Result:
    """``Result(out, weights, lse)`` of the call, by tiles, on the plan's engine."""
    if p.engine == "native":
        return native_engine.forward(c, p)
    assert p.tiles is not None
    return array_engine.forward(c, p.tiles[0], p.tiles[1], _classes(c, p))


def forward_saved(c: Call, p: Plan) -> tuple[Result, Array | None]:
    """``forward`` for a result saved for the backward: ``(result, lse_lo)``, the compiled engine's
    residual of lse's rounding (None from the array engine, whose backward needs none)."""
    if p.engine == "native":
        return native_engine.forward_saved(c, p)
    return forward(c, p), None


def _classes(c: Call, p: Plan) -> np.ndarray:
    d = c.dims
    assert p.tiles is not None
    bq, bk = p.tiles
    if c.mask is None:
        return np.full((-(-d.nq // bq), -(-d.nk // bk)), masks.FULL, dtype=np.int8)
    return masks.shared_classes(c.mask, d.nq, d.nk, bq, bk)


def backward(
    dout: Array,
    c: Call,
    p: Plan,
    out: Array,
    lse: Array,
    dlse: Array | None = None,
    dbias: bool = False,
    lse_lo: Array | None = None,
) -> tuple[Array, ...]:
    """Gradients by tiles, recomputing ``A = exp(S - lse)`` (FlashAttention-2, Algorithm 2); a
    bias's gradient (``dbias``) comes from the array engine. ``lse_lo``: the compiled forward's
    residual of lse's rounding (``forward_saved``), read by the compiled backward."""
    if not dbias and p.engine == "native":
        return native_engine.backward(dout, c, p, out, lse, dlse, lse_lo)
    tiles = p.tiles if p.engine == "array" and p.tiles is not None else choose_tiles(c)
    p = p._replace(tiles=tiles)
    return array_engine.backward(dout, c, out, lse, dlse, dbias, tiles[0], tiles[1], _classes(c, p))
