"""DeepSpeed-Ulysses sequence parallelism (Jacobs et al., arXiv:2309.14509).

Each rank holds a sequence shard of every head. One all-to-all turns that into every
position of ``H / W`` heads (sequence shards -> head shards); each rank runs ordinary local
attention on its heads, with the whole sequence in view (so ``causal`` needs nothing
special); a second all-to-all turns the output back into sequence shards. Communication
per rank is ``O(N·D·H / W)`` whatever ``W``: each all-to-all sends ``(W − 1) / W`` of a shard.

The all-to-alls are autograd Functions whose backward pass is the inverse all-to-all, so the
local attention's own autograd (any qkv impl) supplies the rest of the gradient.
"""

from typing import Any

import torch

from .._checks import check_qkv, check_scale
from .._core import attention
from ..errors import ArgumentError, ShapeError
from ._agree import K_AXES, Q_AXES, V_AXES, Field, Flag, Real, Signature, agree
from ._comm import Group, all_to_all, require_torch, resolve

ADVICE = (
    "Every rank must pass its own shard with the same shapes, dtypes, device type, causal and scale "
    "(docs/distributed.md)"
)


def seq_to_head(g: Group, x: torch.Tensor) -> torch.Tensor:
    """``(*B, H, N/W, D)`` on every rank -> ``(*B, H/W, N, D)``: rank ``r`` gets head group ``r``."""
    w, lead, h, n, d = g.size, x.shape[:-3], x.shape[-3], x.shape[-2], x.shape[-1]
    pieces = x.reshape(*lead, w, h // w, n, d).movedim(-4, 0)  # (W, *B, H/W, N/W, D): piece s goes to rank s
    got = all_to_all(g, pieces)  # (W, *B, H/W, N/W, D): sequence shard s of my heads, from rank s
    return got.movedim(0, -3).reshape(*lead, h // w, w * n, d)


def head_to_seq(g: Group, x: torch.Tensor) -> torch.Tensor:
    """Inverse of ``seq_to_head``: ``(*B, H/W, N, D)`` -> ``(*B, H, N/W, D)``."""
    w, lead, hw, n, d = g.size, x.shape[:-3], x.shape[-3], x.shape[-2], x.shape[-1]
    pieces = x.reshape(*lead, hw, w, n // w, d).movedim(-3, 0)  # (W, *B, H/W, N/W, D): shard s goes to rank s
    got = all_to_all(g, pieces)  # (W, *B, H/W, N/W, D): head group s of my shard, from rank s
    return got.movedim(0, -4).reshape(*lead, w * hw, n // w, d)


class _Exchange(torch.autograd.Function):
    """One all-to-all, ``there`` (``seq_to_head`` or ``head_to_seq``), whose adjoint is ``back``,
    the inverse all-to-all."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, g: Group, there: Any, back: Any) -> torch.Tensor:
        ctx.g, ctx.back = g, back
        return there(g, x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return ctx.back(ctx.g, grad), None, None, None


def ulysses_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    group: Any = None,
    causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """Exact attention over a sequence sharded across ranks, by all-to-all over heads (Ulysses).

    Every rank passes its contiguous shard ``q (*B, H, Nq/W, Dk)``, ``k (*B, Hkv, Nk/W, Dk)``,
    ``v (*B, Hkv, Nk/W, Dv)`` (``shard_sequence`` with the default layout) and gets its shard
    of ``out (*B, H, Nq/W, Dv)``, equal to ``qkv.attention`` on the gathered tensors. ``H``
    and ``Hkv`` must be multiples of the world size ``W`` (a ``ShapeError`` says which is not);
    ``q``, ``k``, ``v`` must have the same leading axes. Differentiable.

    Every rank must call it with the same shapes, dtypes, device type, ``causal`` and ``scale``,
    and the same tensors requiring grad. Before the first all-to-all the ranks compare their
    calls (one small all-gather); if they differ, every rank raises the same
    ``DistributedError`` naming the ranks, the field and both values.

    >>> out = ulysses_attention(shard_sequence(q), shard_sequence(k), shard_sequence(v), causal=True)
    """
    require_torch("ulysses_attention", q=q, k=k, v=v)
    g = resolve(group, "ulysses_attention")

    def check() -> tuple[Signature, None]:
        dims = check_qkv(q, k, v)
        if not isinstance(causal, bool):
            raise ArgumentError(f"causal must be True or False, got {causal!r}")
        shapes = f"q: {tuple(q.shape)}, k: {tuple(k.shape)}, v: {tuple(v.shape)}"
        if min(x.ndim for x in (q, k, v)) < 3:
            raise ShapeError(f"ulysses_attention shards heads, so q, k, v need a head axis (*B, H, N, D) ({shapes})")
        if not q.shape[:-3] == k.shape[:-3] == v.shape[:-3] or k.shape[-3] != v.shape[-3]:
            raise ShapeError(
                f"ulysses_attention needs q, k, v with the same leading axes and k, v with the same "
                f"Hkv (no broadcasting across the all-to-all) ({shapes})"
            )
        for name, heads, n in (("q", q.shape[-3], "H"), ("k", k.shape[-3], "Hkv")):
            if heads % g.size:
                raise ShapeError(
                    f"{name} has {n}={heads} heads on axis -3, which does not divide by the world size "
                    f"{g.size}: Ulysses gives each rank {n} / {g.size} heads ({shapes}); use "
                    "ring_attention, or a world size that divides the head count"
                )
        sig = Signature("ulysses_attention").add(Field("world_size"), g.size)
        for name, x, axes in (("q", q, Q_AXES), ("k", k, K_AXES), ("v", v, V_AXES)):
            sig.tensor(name, x, axes)
        sig.add(Flag("causal"), causal).add(Real("scale"), check_scale(scale, dims.dk))
        grad = torch.is_grad_enabled()
        for name, x in (("q", q), ("k", k), ("v", v)):
            hint = f"with grad mode on: the backward pass of {name}'s all-to-all needs every rank"
            sig.add(Flag(f"{name}.requires_grad", hint), grad and x.requires_grad)
        return sig, None

    agree(g, "ulysses_attention", check, q.device, ADVICE)
    if g.size == 1:
        return attention(q, k, v, causal=causal, scale=scale)
    qh, kh, vh = (_Exchange.apply(x, g, seq_to_head, head_to_seq) for x in (q, k, v))
    out = attention(qh, kh, vh, causal=causal, scale=scale)  # (*B, H/W, Nq, Dv): whole sequence, my heads
    return _Exchange.apply(out, g, head_to_seq, seq_to_head)
