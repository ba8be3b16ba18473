"""``simulate_ring``: ring attention in one process, a loop over virtual ranks, every step recorded.

It cuts the global ``q``, ``k``, ``v`` into the shards each rank would hold and runs the very
step function the real ring runs (``_blocks.block_forward``, then ``qkv.merge_attention``),
in the same order, so the docs and the lab can show how the ring assembles exact attention
one block at a time, and the tests can check the real ring against it.
"""

import contextlib
from typing import Any, NamedTuple

import numpy as np

from .._backend import as_array, compute_dtype, is_torch, namespace, to_numpy
from .._checks import check_qkv, check_scale
from .._softmax import merge_attention
from .._typing import Array
from ..errors import ArgumentError
from ._blocks import allowed_pairs, block_forward, ring_source
from ._layout import Segments, check_global_length, check_layout, check_world_size, segments, shard, unshard


class RingStep(NamedTuple):
    """What rank ``rank`` does at step ``step`` of the ring."""

    rank: int
    step: int
    kv_rank: int  # whose K/V block this rank holds at this step
    q_segments: Segments  # global (start, length) of this rank's queries
    kv_segments: Segments  # global (start, length) of the keys in the block
    skipped: bool  # the causal mask hides the whole block: nothing computed
    pairs: int  # (query, key) pairs of the block that may attend, per head
    out: Array  # partial output over this block (..., Nq/W, Dv); zeros when skipped
    lse: Array  # partial lse (..., Nq/W); -inf when skipped
    merged_out: Array  # running result after merging this step
    merged_lse: Array
    bytes_sent: int  # bytes this rank sends during the step (the K/V block it holds, to rank + 1)


def _json(x: Array) -> Any:
    a = to_numpy(x).astype(np.float64)
    return np.where(np.isfinite(a), a, np.nan).tolist() if a.size else a.tolist()


class RingSimulation(NamedTuple):
    """``out``, ``lse`` over the whole sequence (global order) and every ``RingStep``, rank by rank."""

    out: Array
    lse: Array
    steps: list[RingStep]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: arrays as nested lists, with ``-inf`` lse as ``None``."""

        def clean(v: Any) -> Any:
            if isinstance(v, list):
                return [clean(e) for e in v]
            return None if isinstance(v, float) and v != v else v

        steps = [
            {
                **s._asdict(),
                **{f: clean(_json(getattr(s, f))) for f in ("out", "lse", "merged_out", "merged_lse")},
                "q_segments": [list(p) for p in s.q_segments],
                "kv_segments": [list(p) for p in s.kv_segments],
            }
            for s in self.steps
        ]
        return {"out": clean(_json(self.out)), "lse": clean(_json(self.lse)), "steps": steps}


def _nbytes(x: Array) -> int:
    return int(np.prod(x.shape)) * x.dtype.itemsize


def simulate_ring(
    q: Any,
    k: Any,
    v: Any,
    world_size: int,
    causal: bool = False,
    *,
    layout: str = "contiguous",
    scale: float | None = None,
) -> RingSimulation:
    """Run ring attention on ``world_size`` virtual ranks in this process, recording each step.

    ``q (*B, H, Nq, Dk)``, ``k (*B, Hkv, Nk, Dk)``, ``v (*B, Hkv, Nk, Dv)`` are the *whole*
    sequences (NumPy or torch; not differentiable). Returns ``RingSimulation(out, lse, steps)``:
    ``out`` equals ``qkv.attention(q, k, v, causal=causal, scale=scale)`` and ``steps`` lists
    ``RingStep`` records, rank by rank, step by step. ``Nq`` and ``Nk`` must divide by
    ``world_size`` (``2 · world_size`` for ``layout="zigzag"``).

    >>> sim = simulate_ring(q, k, v, world_size=4, causal=True)
    >>> [(s.rank, s.kv_rank, s.skipped) for s in sim.steps if s.rank == 1]
    [(1, 1, False), (1, 0, False), (1, 3, True), (1, 2, True)]
    """
    q, k, v = as_array(q, "q"), as_array(k, "k"), as_array(v, "v")
    xp = namespace(q=q, k=k, v=v)
    dims = check_qkv(q, k, v)
    w = check_world_size(world_size)
    layout = check_layout(layout)
    if not isinstance(causal, bool):
        raise ArgumentError(f"causal must be True or False, got {causal!r}")
    check_global_length("q", dims.nq, w, layout, tuple(q.shape))
    check_global_length("k", dims.nk, w, layout, tuple(k.shape))
    kw: dict[str, Any] = {"causal": causal, "scale": check_scale(scale, dims.dk), "nq": dims.nq, "nk": dims.nk}
    ct = compute_dtype(xp, q)
    steps, outs, lses = [], [], []
    with _no_grad(q):
        for rank in range(w):
            qr, q_segs = xp.astype(shard(q, rank, w, layout), ct), segments(rank, w, dims.nq, layout)
            acc = None
            for step in range(w):
                src = ring_source(rank, step, w)
                kb, vb = shard(k, src, w, layout), shard(v, src, w, layout)
                kv_segs = segments(src, w, dims.nk, layout)
                o, lse, computed = block_forward(qr, xp.astype(kb, ct), xp.astype(vb, ct), q_segs, kv_segs, **kw)
                if computed:
                    acc = (o, lse) if acc is None else merge_attention([acc[0], o], [acc[1], lse])
                cur = (o, lse) if acc is None else acc
                steps.append(
                    RingStep(
                        rank,
                        step,
                        src,
                        q_segs,
                        kv_segs,
                        not computed,
                        allowed_pairs(q_segs, kv_segs, causal, dims.nq, dims.nk),
                        o,
                        lse,
                        cur[0],
                        cur[1],
                        _nbytes(kb) + _nbytes(vb) if step < w - 1 else 0,
                    )
                )
            final = (o, lse) if acc is None else acc
            outs.append(xp.astype(final[0], q.dtype))
            lses.append(final[1][..., None])
    return RingSimulation(unshard(outs, layout), unshard(lses, layout)[..., 0], steps)


def _no_grad(x: Array) -> Any:
    if is_torch(x):
        import torch

        return torch.no_grad()
    return contextlib.nullcontext()
