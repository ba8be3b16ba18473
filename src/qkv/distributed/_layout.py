"""Which global sequence positions each rank holds: the ``"contiguous"`` and ``"zigzag"`` layouts.

A sequence of length ``N`` over ``W`` ranks:

- ``"contiguous"``: rank ``r`` holds positions ``[r·N/W, (r+1)·N/W)``. With a causal mask the
  last rank attends every key block and the first only its own, so causal work is unbalanced.
- ``"zigzag"``: the sequence is cut into ``2W`` chunks of ``N/2W`` and rank ``r`` holds chunks
  ``r`` and ``2W-1-r`` (in that order). Every rank then owns one early and one late chunk,
  so each does the same causal work (Brandon et al., Striped Attention, arXiv:2311.09431,
  balance the same way with stripes; zigzag is the chunked variant used by ring-attention
  implementations).

A rank's shard is a tuple of *segments* ``(start, length)`` in global positions, listed in the
order they are concatenated locally. NumPy only (plus the array API for slicing), no torch:
``qkv.complexity`` reads the same definitions to predict bytes and work.
"""

from typing import Any

import numpy as np

from .._backend import namespace
from .._checks import check_choice, check_int
from .._typing import Array
from ..errors import ShapeError

LAYOUTS = ("contiguous", "zigzag")

Segments = tuple[tuple[int, int], ...]


def segments(rank: int, world_size: int, n: int, layout: str) -> Segments:
    """Global ``(start, length)`` segments of rank ``rank``'s shard of a length-``n`` sequence."""
    if layout == "zigzag":
        c = n // (2 * world_size)
        return ((rank * c, c), ((2 * world_size - 1 - rank) * c, c))
    s = n // world_size
    return ((rank * s, s),)


def allowed_pairs(q_segs: Segments, kv_segs: Segments, causal: bool, nq: int, nk: int) -> int:
    """(query, key) pairs between the segments that may attend, per head: bottom-right causal on
    global positions (query ``qs + i`` sees key ``ks + j`` iff ``j <= i + qs - ks + Nk - Nq``)."""
    total = 0
    for qs, ql in q_segs:
        for ks, kl in kv_segs:
            seen = np.clip(np.arange(ql) + qs - ks + (nk - nq) + 1, 0, kl) if causal else np.full(ql, kl)
            total += int(seen.sum())
    return total


def check_layout(layout: Any) -> str:
    return check_choice(layout, "layout", LAYOUTS)


def check_world_size(world_size: Any) -> int:
    return check_int(world_size, "world_size", minimum=1)


def pieces(layout: str, world_size: int) -> int:
    """How many equal pieces the global sequence is cut into: ``W`` or ``2W`` (zigzag)."""
    return 2 * world_size if layout == "zigzag" else world_size


def check_global_length(name: str, n: int, world_size: int, layout: str, shape: tuple[int, ...]) -> None:
    """The global sequence length ``n`` (axis -2 of ``name``) must split into equal shards."""
    p = pieces(layout, world_size)
    if n % p:
        how = f"2 · world size = {p} chunks (zigzag layout)" if layout == "zigzag" else f"world size {p} shards"
        raise ShapeError(
            f"{name} has N={n} positions on axis -2, which does not divide into {how} "
            f"({name}: {shape}); pad the sequence to a multiple of {p}"
        )


def check_shard_length(name: str, n: int, world_size: int, layout: str, shape: tuple[int, ...]) -> None:
    """A rank's shard length ``n`` (axis -2): zigzag shards are two equal chunks, so ``n`` is even."""
    if layout == "zigzag" and n % 2:
        raise ShapeError(
            f"{name} has {n} positions on axis -2 on this rank, but a zigzag shard is two equal "
            f"chunks, so it must be even ({name}: {shape}, world size {world_size}); pad the "
            f"global sequence to a multiple of 2 · world size = {2 * world_size}"
        )


def local_ranges(segs: Segments) -> list[tuple[int, int]]:
    """Where each segment sits in the local (concatenated) shard: ``[(a, b), ...]``."""
    out, a = [], 0
    for _, length in segs:
        out.append((a, a + length))
        a += length
    return out


def shard(x: Array, rank: int, world_size: int, layout: str) -> Array:
    """Rank ``rank``'s shard of ``x (..., N, D)`` along axis -2 (NumPy or torch; a view when contiguous)."""
    segs = segments(rank, world_size, x.shape[-2], layout)
    parts = [x[..., s : s + n, :] for s, n in segs]
    return parts[0] if len(parts) == 1 else namespace(x=x).concat(parts, axis=-2)


def unshard(parts: list[Array], layout: str) -> Array:
    """Inverse of ``shard``: the global ``(..., N, D)`` from every rank's shard, ``parts[r]``."""
    xp = namespace(**{f"parts[{r}]": p for r, p in enumerate(parts)})
    w = len(parts)
    if layout == "contiguous":
        return xp.concat(parts, axis=-2)
    c = parts[0].shape[-2] // 2
    chunks = [p[..., :c, :] for p in parts] + [p[..., c:, :] for p in reversed(parts)]  # chunk r, then 2W-1-r
    assert len(chunks) == 2 * w
    return xp.concat(chunks, axis=-2)
