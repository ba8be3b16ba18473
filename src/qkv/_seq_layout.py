"""Which global positions a rank holds, and how many (query, key) pairs two shards share.

Torch-free, so both ``qkv.distributed`` (which shards and runs) and ``qkv.complexity`` (which
predicts bytes and work) read the one definition. Layouts over ``W`` ranks of a length-``N``
sequence: ``"contiguous"`` gives rank ``r`` ``[r·N/W, (r+1)·N/W)``; ``"zigzag"`` cuts ``2W``
chunks and gives rank ``r`` chunks ``r`` and ``2W-1-r``. A shard is a tuple of segments
``(start, length)`` in global positions, in the order they are concatenated locally.
"""

import numpy as np

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
