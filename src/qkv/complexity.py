"""The cost of one attention call, predicted: FLOPs and bytes per implementation.

``estimate(...)`` counts what each impl of ``qkv.attention`` actually computes and keeps, so
the O(N²) everyone quotes can be checked against a program (``qkv complexity --measure``
runs the same configurations and prints prediction beside measurement).

FLOPs count the two (forward) or five (backward) matrix products, a multiply-add as 2; the
softmax's exp, max and sums are O(Nq·Nk) without a factor D and are not counted:

    forward  = 2 · B · H · P · (Dk + Dv)            4·B·H·Nq·Nk·Dk when dense with Dv = Dk
    backward = 2 · B · H · P · (3·Dk + 2·Dv)        S = QKᵀ recomputed, dV = AᵀdO, dP = dO Vᵀ,
                                                    dQ = dS K, dK = dSᵀQ: 2.5x the forward
                                                    (FlashAttention-2, arXiv:2307.08691)

``P`` is the number of (query, key) pairs per head the impl computes:

- ``"reference"``: ``Nq · Nk`` always: it materialises the whole score matrix and masks with a
  ``where`` (Vaswani et al., arXiv:1706.03762).
- ``"torch"``: ``Nq · Nk``: SDPA with an explicit mask computes every tile (its ``is_causal``
  fast path may skip some; then this is an upper bound).
- ``"flash"``: the pairs in every tile ``mask.blocks`` does not classify EMPTY at the tile
  sizes the kernel chooses for the call (``qkv._impls.flash.choose_tiles``: 256 x 512 when
  dense, smaller tiles along a narrow band); PARTIAL tiles count whole (FlashAttention,
  arXiv:2205.14135).
- ``"auto"`` resolves as ``qkv.attention`` does for NumPy inputs: ``"reference"`` below
  ``qkv._impls.SMALL`` score entries per head, ``"flash"`` above (for torch inputs, auto picks
  ``"torch"`` wherever SDPA can run the call: ask for ``impl="torch"``).

Bytes: ``c`` is the compute itemsize (float32 for half precision), ``L = B·H``.

- ``score_bytes``: one materialised ``(B, H, Nq, Nk)`` matrix, ``L·Nq·Nk·c``, for the
  reference; 0 for flash and torch (fused kernels never hold it).
- ``peak_bytes``: memory beyond the inputs and the output at the call's peak, as measured
  (BENCHMARKS.md): reference 3 score matrices forward (S, exp(S − m), A) and 7 with
  ``backward`` (torch autograd keeps exp(S − m) and A and builds the gradients beside them;
  NumPy's ``attention_backward`` needs 4), plus the dense boolean mask; flash the per-tile
  working set (one ``L x block_q x block_k`` score tile forward, three backward, a query
  block and its accumulators) and ``lse``; torch SDPA's per-thread tile buffers plus, with a mask
  other than plain causal, the dense mask qkv builds and the float copy SDPA makes of it. With
  ``backward``, torch SDPA adds one gradient-sized copy (torch's gradient accumulation copies a
  gradient it cannot take over); flash's gradients are the outputs (autograd takes them over).
- ``kv_cache_bytes``: K and V for ``kv_heads`` heads in ``dtype``, ``B·Hkv·Nk·(Dk + Dv)`` items.
"""

import math
import os
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from . import masks
from ._impls import SMALL, Call
from ._impls.flash import choose_tiles, tile_classes
from ._seq_layout import allowed_pairs, segments
from ._typing import Dims
from .errors import ArgumentError, DTypeError, MaskError, ShapeError

IMPLS = ("reference", "flash", "torch", "auto")
ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}


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


def _count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ArgumentError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def _as_mask(mask: Any) -> masks.Mask | None:
    if mask is None or isinstance(mask, masks.Mask):
        return mask
    if isinstance(mask, np.ndarray) and mask.dtype == bool:
        return masks.from_dense(mask)
    raise MaskError(f"mask must be a qkv.masks.Mask, a boolean NumPy array or None, got {type(mask).__name__}")


def _flash_tiles(
    b: int, h: int, hkv: int, nq: int, nk: int, dk: int, dv: int, mask: masks.Mask | None
) -> tuple[int, int, int, bool]:
    """``(pairs, block_q, block_k, partial)`` as the flash kernel runs the call: the tile sizes it
    chooses (``flash.choose_tiles``) and the tiles it keeps for any batch element."""
    call = Call(None, None, None, Dims((b,), h, hkv, nq, nk, dk, dv, True), mask, None, None, 1.0)
    bq, bk = choose_tiles(call)
    kept = tile_classes(call, bq, bk) != masks.EMPTY  # the kernel runs a tile for every batch element at once
    rows = np.minimum(np.arange(0, nq, bq) + bq, nq) - np.arange(0, nq, bq)
    cols = np.minimum(np.arange(0, nk, bk) + bk, nk) - np.arange(0, nk, bk)
    pairs = int((kept * rows[:, None] * cols[None, :]).sum())
    partial = mask is not None and bool((tile_classes(call, bq, bk) == masks.PARTIAL).any())
    return pairs, bq, bk, partial


def _torch_split(nq: int) -> tuple[int, int]:
    """Tile sizes of torch's CPU flash kernel (``aten/src/ATen/native/cpu/FlashAttentionKernel.cpp``)."""
    return (256 if nq >= 768 else 64 if nq >= 192 else 32), 512


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
    ``qkv.attention``. Formulas and what each impl computes: the module docstring.

    >>> e = estimate(2048, heads=32, batch=8)
    >>> e.score_bytes / 1e9                      # 8 · 32 · 2048² · 4 B
    4.294967296
    >>> estimate(8192, impl="flash", mask=masks.causal()).kept_fraction
    """
    nq = _count(n_q, "n_q")
    nk = nq if n_k is None else _count(n_k, "n_k")
    dk = _count(d_k, "d_k")
    dv = dk if d_v is None else _count(d_v, "d_v")
    h, b = _count(heads, "heads"), _count(batch, "batch")
    hkv = h if kv_heads is None else _count(kv_heads, "kv_heads")
    if h % hkv:
        raise ShapeError(f"heads={h} is not a multiple of kv_heads={hkv}: each kv head serves H // Hkv query heads")
    if dtype not in ITEMSIZE:
        raise DTypeError(f"dtype must be one of {list(ITEMSIZE)}, got {dtype!r}")
    if impl not in IMPLS:
        raise ArgumentError(f"impl must be one of {list(IMPLS)}, got {impl!r}")
    if not isinstance(backward, bool):
        raise ArgumentError(f"backward must be True or False, got {backward!r}")
    m = _as_mask(mask)
    name = None if m is None else m.name
    if m is not None and (m.blocks(nq, nk, nq, nk) == masks.FULL).all():
        m = None  # hides nothing at this size: qkv.attention drops it too
    if impl == "auto":
        impl = "reference" if nq * nk < SMALL else "flash"
    s = ITEMSIZE[dtype]
    c = 4 if dtype in ("float16", "bfloat16") else s
    lanes = b * h
    mask_batch = 1 if m is None else math.prod(m.blocks(nq, nk, nq, nk).shape[:-2])
    mask_pairs = 0 if m is None else mask_batch * nq * nk
    tiles = None
    if impl == "flash":
        pairs, bq, bk, partial = _flash_tiles(b, h, hkv, nq, nk, dk, dv, m)
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
            threads = os.cpu_count() or 1
            peak = threads * ((4 if backward else 1) * qs * ks + qs * dv) * c + lanes * nq * 4
            peak += lanes * nq * dk * s if backward else 0
            plain_causal = m is masks.causal() and nq == nk  # SDPA's is_causal: no mask tensor
            peak += 0 if (m is None or plain_causal) else (4 + c) * mask_pairs
            score = 0
    flops = 2 * lanes * pairs * (dk + dv) + (2 * lanes * pairs * (3 * dk + 2 * dv) if backward else 0)
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
        flops=flops,
        score_bytes=score,
        peak_bytes=int(peak),
        kv_cache_bytes=b * hkv * nk * (dk + dv) * s,
        input_bytes=(lanes * nq * dk + b * hkv * nk * (dk + dv)) * s,
        output_bytes=lanes * nq * dv * s,
    )


# --------------------------------------------------------------------------- sequence parallelism

SCHEMES = ("ring", "ulysses")
LAYOUTS = ("contiguous", "zigzag")


@dataclass(frozen=True)
class Communication:
    """Bytes each rank sends for one sequence-parallel attention call (``qkv.distributed``).

    ``bytes_per_step[t]`` is what every rank sends at communication step ``t`` (forward steps,
    then backward steps); ``bytes_per_rank`` their sum, ``total_bytes`` over all ranks.
    ``work_per_rank[r]`` counts the (batch, head, query, key) scores rank ``r`` attends, the
    useful work (diagonal tiles compute a little more): the causal balance of a layout.
    """

    scheme: str
    layout: str
    world_size: int
    n_q: int
    n_k: int
    d_k: int
    d_v: int
    heads: int
    kv_heads: int
    batch: int
    dtype: str
    causal: bool
    backward: bool
    steps: int
    bytes_per_step: tuple[int, ...]
    bytes_per_rank: int
    total_bytes: int
    work_per_rank: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict of every field."""
        d = asdict(self)
        d["bytes_per_step"], d["work_per_rank"] = list(self.bytes_per_step), list(self.work_per_rank)
        return d


def communication(
    n: int,
    d_k: int = 64,
    d_v: int | None = None,
    heads: int = 1,
    kv_heads: int | None = None,
    batch: int = 1,
    dtype: str = "float32",
    world_size: int = 2,
    scheme: str = "ring",
    causal: bool = False,
    layout: str = "contiguous",
    backward: bool = False,
    n_k: int | None = None,
) -> Communication:
    """Bytes each rank sends, per step, for ``ring_attention`` or ``ulysses_attention`` over ``world_size`` ranks.

    ``n`` is the whole sequence length (``n_k`` the key length if different); shards are
    ``n / world_size`` long. With ``s`` the itemsize of ``dtype``, ``c`` the compute itemsize
    (float32 for half precision), ``W`` the world size and ``kv = B·Hkv·(Nk/W)·(Dk + Dv)``:

    - ring (Liu et al., arXiv:2310.01889): forward ``W − 1`` steps, each sending the held K/V
      block, ``kv·s`` bytes (causal masking skips work, not transfers); backward ``W`` steps:
      ``W − 1`` send the block and its gradient accumulators, ``kv·(s + c)``, the last only
      the accumulators, ``kv·c``, home to their owner.
    - ulysses (Jacobs et al., arXiv:2309.14509): one all-to-all per tensor, each sending the
      ``(W − 1) / W`` of the rank's shard that other ranks' heads need: forward ``q``, ``k``,
      ``v`` then ``out``; backward ``dout`` then ``dq``, ``dk``, ``dv``.

    >>> communication(32768, d_k=128, heads=32, kv_heads=8, world_size=8, dtype="bfloat16").bytes_per_step[0]
    16777216
    """
    nq = _count(n, "n")
    nk = nq if n_k is None else _count(n_k, "n_k")
    dk = _count(d_k, "d_k")
    dv = dk if d_v is None else _count(d_v, "d_v")
    h, b, w = _count(heads, "heads"), _count(batch, "batch"), _count(world_size, "world_size")
    hkv = h if kv_heads is None else _count(kv_heads, "kv_heads")
    if h % hkv:
        raise ShapeError(f"heads={h} is not a multiple of kv_heads={hkv}: each kv head serves H // Hkv query heads")
    if dtype not in ITEMSIZE:
        raise DTypeError(f"dtype must be one of {list(ITEMSIZE)}, got {dtype!r}")
    if scheme not in SCHEMES:
        raise ArgumentError(f"scheme must be one of {list(SCHEMES)}, got {scheme!r}")
    if layout not in LAYOUTS or (scheme == "ulysses" and layout != "contiguous"):
        allowed = list(LAYOUTS) if scheme == "ring" else ["contiguous"]
        raise ArgumentError(f"layout must be one of {allowed} for scheme={scheme!r}, got {layout!r}")
    for flag, value in (("causal", causal), ("backward", backward)):
        if not isinstance(value, bool):
            raise ArgumentError(f"{flag} must be True or False, got {value!r}")
    pieces = 2 * w if layout == "zigzag" else w
    for name, length in (("n", nq), ("n_k", nk)):
        if length % pieces:
            raise ShapeError(
                f"{name}={length} does not divide into {pieces} equal pieces "
                f"(world_size={w}{', zigzag layout: 2 chunks per rank' if layout == 'zigzag' else ''})"
            )
    s = ITEMSIZE[dtype]
    c = 4 if dtype in ("float16", "bfloat16") else s
    if scheme == "ring":
        kv = b * hkv * (nk // w) * (dk + dv)
        steps = [kv * s] * (w - 1)
        if backward and w > 1:
            steps += [kv * (s + c)] * (w - 1) + [kv * c]
        work = tuple(
            b
            * h
            * sum(
                allowed_pairs(segments(r, w, nq, layout), segments(src, w, nk, layout), causal, nq, nk)
                for src in range(w)
            )
            for r in range(w)
        )
    else:
        for name, count in (("heads", h), ("kv_heads", hkv)):
            if count % w:
                raise ShapeError(
                    f"{name}={count} does not divide by world_size={w}: Ulysses gives each rank "
                    f"{name} / world_size heads"
                )

        def a2a(heads_: int, n_: int, d: int) -> int:  # one all-to-all of a (B, heads, n/W, d) shard
            return b * heads_ * (n_ // w) * d * s * (w - 1) // w

        steps = [] if w == 1 else [a2a(h, nq, dk), a2a(hkv, nk, dk), a2a(hkv, nk, dv), a2a(h, nq, dv)]
        if backward and w > 1:
            steps += [a2a(h, nq, dv), a2a(h, nq, dk), a2a(hkv, nk, dk), a2a(hkv, nk, dv)]
        work = (b * (h // w) * allowed_pairs(((0, nq),), ((0, nk),), causal, nq, nk),) * w
    return Communication(
        scheme=scheme,
        layout=layout,
        world_size=w,
        n_q=nq,
        n_k=nk,
        d_k=dk,
        d_v=dv,
        heads=h,
        kv_heads=hkv,
        batch=b,
        dtype=dtype,
        causal=causal,
        backward=backward,
        steps=len(steps),
        bytes_per_step=tuple(steps),
        bytes_per_rank=sum(steps),
        total_bytes=w * sum(steps),
        work_per_rank=work,
    )
