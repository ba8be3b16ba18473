"""``estimate``: FLOPs, materialised scores, peak memory and KV cache of one attention call.

What each impl computes and keeps is described in ``qkv.complexity``'s docstring.
"""

import math
import os
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .. import _native as native
from .. import masks
from .._checks import check_flag, check_impl
from .._core import dispatch
from .._impls import build_call, native_reason, threads
from .._impls.flash import BLOCK_K, BLOCK_Q, choose_tiles
from ..errors import MaskError
from ._model import ITEMSIZE, MAX_SIZE, check_countable, check_sizes, compute_itemsize, flops, runnable, tile_pairs


@dataclass(frozen=True)
class Estimate:
    """Predicted cost of one call (see the module docstring for every formula)."""

    impl: str  # the impl counted ("auto" resolved)
    batch: int
    heads: int
    kv_heads: int
    n_q: int
    n_k: int
    d_k: int
    d_v: int
    dtype: str
    mask: str | None
    backward: bool
    pairs: int  # (query, key) pairs computed per head
    kept_fraction: float  # pairs / (n_q · n_k)
    tiles: tuple[int, int] | None  # flash tile sizes (block_q, block_k)
    flops: int
    score_bytes: int
    peak_bytes: int
    kv_cache_bytes: int
    input_bytes: int
    output_bytes: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict of every field."""
        d = asdict(self)
        d["tiles"] = None if self.tiles is None else list(self.tiles)
        return d


def _as_mask(mask: Any) -> masks.Mask | None:
    if mask is None or isinstance(mask, masks.Mask):
        return mask
    if isinstance(mask, np.ndarray) and mask.dtype == bool:
        return masks.from_dense(mask)
    raise MaskError(f"mask must be a qkv.masks.Mask, a boolean NumPy array or None, got {type(mask).__name__}")


def _shaped(b: int, h: int, hkv: int, nq: int, nk: int, dk: int, dv: int) -> tuple[Any, Any, Any]:
    """NumPy ``q, k, v`` of these shapes holding no memory (one zero broadcast: stride 0), so that
    the real ``qkv.dispatch`` and the flash kernel's tile choice can be asked about a configuration."""
    zero = np.zeros((), dtype=np.float32)
    return (
        np.broadcast_to(zero, (b, h, nq, dk)),
        np.broadcast_to(zero, (b, hkv, nk, dk)),
        np.broadcast_to(zero, (b, hkv, nk, dv)),
    )


def _torch_split(nq: int) -> tuple[int, int]:
    """Tile sizes of torch's CPU flash kernel (``aten/src/ATen/native/cpu/FlashAttentionKernel.cpp``)."""
    return (256 if nq >= 768 else 64 if nq >= 192 else 32), 512


def _native_peak(
    lanes: int, kv_lanes: int, nq: int, nk: int, dk: int, dv: int, bk: int, c: int, s: int, bits: int, backward: bool
) -> int:
    """Peak bytes of the compiled engine (``src/qkv/_native``): per thread, one key tile of K and V
    widened to the compute type plus ``LANES``-row score and accumulator strips; ``lse``; a PARTIAL
    tile's bit per cell when the mask has no row intervals. Backward: per thread the score, dP
    and gradient strips (K and V are read in place unless half precision widens them; dQ is
    added in key-tile order into its output, D = rowsum(dO∘O) recomputed per block), ``lse``, a
    bit per row, and for half precision the compute-type gradients the outputs are cast from."""
    workers = threads()
    g = native.LANES  # rows of a score / accumulator strip
    forward = (2 * bk * (dk + dv) + 2 * g * bk + 4 * g * (dk + dv)) * c
    if not backward:
        return workers * forward + lanes * nq * c + bits
    scratch = (2 * g * 4 * (dk + dv) + 5 * g * bk) * c + (2 * bk * (dk + dv) * c if c != s else 0)
    rows = lanes * nq
    peak = workers * scratch + rows * c + rows // 8 + bits
    if c != s:  # dq, dk, dv accumulate in float32 and are cast to the outputs' dtype
        peak += (rows * dk + kv_lanes * nk * (dk + dv)) * c
    return peak


def estimate(
    n_q: int,
    n_k: int | None = None,
    d_k: int = 64,
    d_v: int | None = None,
    heads: int = 1,
    kv_heads: int | None = None,
    batch: int = 1,
    dtype: str = "float32",
    impl: str = "reference",
    mask: Any = None,
    backward: bool = False,
) -> Estimate:
    """Predicted FLOPs and bytes of ``qkv.attention`` (and its backward) for one configuration.

    ``n_k`` defaults to ``n_q``, ``d_v`` to ``d_k``, ``kv_heads`` to ``heads`` (GQA: fewer; MQA:
    1). ``mask``: a ``qkv.masks.Mask`` or a boolean array (True = may attend); ``impl`` as in
    ``qkv.attention``. Formulas and what each impl computes: the module docstring. Any positive
    sizes (Python ints): beyond what one call can index (``2**31 - 1`` per axis) the estimate is
    its formulas alone, ``"auto"`` counted as ``"flash"``; a mask's kept tiles are counted up to
    ``MAX_TILE_ROWS`` rows of tiles.

    >>> e = estimate(2048, heads=32, batch=8)
    >>> e.score_bytes / 1e9                      # 8 · 32 · 2048² · 4 B
    4.294967296
    >>> estimate(8192, impl="flash", mask=masks.causal()).kept_fraction
    >>> estimate(10**12).flops                   # 4 · 10²⁴ · 64: a calculator, not a call
    """
    sizes = check_sizes(n_q, n_k, d_k, d_v, heads, kv_heads, batch, dtype)
    nq, nk, dk, dv, h, hkv, b, dtype = sizes
    check_impl(impl)
    check_flag(backward, "backward")
    m = _as_mask(mask)
    name = None if m is None else m.name
    if runnable(sizes):  # ask the very plan qkv.attention would make for NumPy inputs of these shapes
        q, k, v = _shaped(b, h, hkv, nq, nk, dk, dv)
        call = build_call(q, k, v, mask=m)  # the same normalisation as qkv.attention (drops a mask hiding nothing)
        m = call.mask
        if impl == "auto":
            impl = dispatch(q, k, v, mask=m).impl
        on_native = impl == "flash" and call.engine != "array" and native_reason(call) is None
        array_tiles = choose_tiles(call) if impl == "flash" else (0, 0)
    else:  # no call of this size can run (the kernels' limits are the call's errors): formulas alone
        impl = "flash" if impl == "auto" else impl  # what auto runs for long sequences
        on_native = impl == "flash" and native.available()
        array_tiles = (BLOCK_Q, BLOCK_K)
    s = ITEMSIZE[dtype]
    c = compute_itemsize(dtype)
    lanes = b * h
    mask_batch = 1 if m is None else math.prod(m.blocks(nq, nk, nq, nk).shape[:-2])
    mask_pairs = 0 if m is None else mask_batch * nq * nk
    tiles = None
    if on_native:
        bq, bk = native.tile_shape(min(nq, MAX_SIZE), min(nk, MAX_SIZE), min(dk, MAX_SIZE), min(dv, MAX_SIZE), dtype)
        if m is not None:
            check_countable(m, nq, nk, bq, bk)
        pairs, partial = tile_pairs(m, nq, nk, bq, bk)
        tiles = (bq, bk)
        bits = 0 if m is None or m.rows is not None else mask_pairs // 8  # at most one bit per cell
        peak = _native_peak(lanes, b * hkv, nq, nk, dk, dv, bk, c, s, bits, backward)
        score = 0
    elif impl == "flash":
        bq, bk = array_tiles
        if m is not None:
            check_countable(m, nq, nk, bq, bk)
        pairs, partial = tile_pairs(m, nq, nk, bq, bk)
        tiles = (bq, bk)
        row_tiles = 1  # the kernel frees each tile before allocating the next
        peak = (row_tiles * lanes * bq * bk + lanes * bq * (dk + 4 * dv) + lanes * nq) * c  # + lse
        peak += 13 * bq * bk if partial else 0  # a PARTIAL tile's mask: index grid, booleans, 0/-inf bias
        if backward:
            # a, dP = dO Vᵀ and dS = a ∘ (dP − D) of this tile
            bwd = (2 * row_tiles + 1) * lanes * bq * bk + 2 * lanes * bq * (dk + dv) + lanes * nq
            if c != s:  # half precision: the float32 gradient accumulators are not the outputs
                bwd += lanes * nq * dk + b * hkv * nk * (dk + dv)
            peak = max(peak, bwd * c + (13 * bq * bk if partial else 0))  # dQ, dK, dV are the outputs
        score = 0
    else:
        pairs = nq * nk
        if impl == "reference":
            score = lanes * nq * nk * c
            peak = (7 if backward else 3) * score + mask_pairs
            if c != s:  # half precision: q, k, v computed in float32 copies
                peak += (lanes * nq * dk + b * hkv * nk * (dk + dv)) * c
        else:
            qs, ks = _torch_split(nq)
            workers = os.cpu_count() or 1
            peak = workers * ((4 if backward else 1) * qs * ks + qs * dv) * c + lanes * nq * 4
            peak += lanes * nq * dk * s if backward else 0
            plain_causal = m is masks.causal() and nq == nk  # SDPA's is_causal: no mask tensor
            peak += 0 if (m is None or plain_causal) else (4 + c) * mask_pairs
            score = 0
    return Estimate(
        impl=impl,
        batch=b,
        heads=h,
        kv_heads=hkv,
        n_q=nq,
        n_k=nk,
        d_k=dk,
        d_v=dv,
        dtype=dtype,
        mask=name,
        backward=backward,
        pairs=pairs,
        kept_fraction=pairs / (nq * nk),
        tiles=tiles,
        flops=flops(lanes, pairs, dk, dv, backward),
        score_bytes=score,
        peak_bytes=int(peak),
        kv_cache_bytes=b * hkv * nk * (dk + dv) * s,
        input_bytes=(lanes * nq * dk + b * hkv * nk * (dk + dv)) * s,
        output_bytes=lanes * nq * dv * s,
    )
