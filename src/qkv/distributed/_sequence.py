"""``shard_sequence`` and ``gather_sequence``: this rank's part of a sequence, and back.

Gradients: ``shard_sequence`` is a slice (its gradient is the shard's gradient in place, zeros
elsewhere, on this rank only); ``gather_sequence``'s gradient is this rank's slice of the
gathered tensor's gradient. Both assume what the usual training loop does: the tensor fed to
``shard_sequence`` and the computation after ``gather_sequence`` are the same on every rank,
and gradients of replicated parameters are summed (all-reduced) across ranks afterwards.

``gather_sequence`` is a collective: the ranks first compare their shards' shapes, dtypes and
layout (``_agree``), since ``all_gather`` fills each rank's buffer with whatever bytes arrive.
``shard_sequence`` sends nothing (it slices what this rank holds), so it costs no collective;
a rank that sharded a tensor of another shape is caught by the next call that communicates.
"""

from typing import Any

import torch
import torch.distributed as dist

from .._backend import as_array
from ..errors import ShapeError
from ._agree import Choice, Field, Signature, agree
from ._comm import Group, require_torch, resolve, talking
from ._layout import LAYOUTS, check_global_length, check_layout, check_shard_length, shard, unshard

X_AXES = {-1: "D", -2: "N"}
ADVICE = "Every rank must pass its own shard with the same shape, dtype, device type and layout (docs/distributed.md)"


def shard_sequence(x: Any, group: Any = None, layout: str = "contiguous") -> Any:
    """This rank's shard of ``x (..., N, D)`` along the sequence axis -2: ``(..., N/W, D)``.

    ``layout="contiguous"``: rank ``r`` gets positions ``[r·N/W, (r+1)·N/W)``;
    ``"zigzag"``: chunks ``r`` and ``2W-1-r`` of ``2W`` (balanced causal work for
    ``ring_attention``). ``N`` must divide by ``W`` (zigzag: ``2W``). NumPy or torch.
    """
    layout = check_layout(layout)
    x = as_array(x, "x")
    g = resolve(group, "shard_sequence")
    if x.ndim < 2:
        raise ShapeError(f"x has shape {tuple(x.shape)}; shard_sequence splits axis -2 of (..., N, D)")
    check_global_length("x", x.shape[-2], g.size, layout, tuple(x.shape))
    return shard(x, g.rank, g.size, layout)


def _gather(g: Group, x: torch.Tensor, layout: str) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(g.size)]
    with talking("gather_sequence", f"the all-gather (rank {g.rank} of {g.size})"):
        dist.all_gather(parts, x.contiguous(), group=g.group)
    return unshard(parts, layout)


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, g: Group, layout: str) -> torch.Tensor:
        ctx.g, ctx.layout = g, layout
        return _gather(g, x, layout)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return shard(grad, ctx.g.rank, ctx.g.size, ctx.layout), None, None


def gather_sequence(x: torch.Tensor, group: Any = None, layout: str = "contiguous") -> torch.Tensor:
    """The whole sequence ``(..., N, D)`` on every rank from each rank's shard ``x (..., N/W, D)``.

    The inverse of ``shard_sequence`` with the same ``layout``. Every rank's shard must have the
    same shape, dtype and device type: the ranks compare them first (one small all-gather) and
    all raise the same ``DistributedError`` if they differ. Differentiable: the gradient of a
    rank's shard is its slice of the gathered tensor's gradient (the computation after the
    gather is assumed the same on every rank).
    """
    require_torch("gather_sequence", x=x)
    g = resolve(group, "gather_sequence")

    def check() -> tuple[Signature, str]:
        checked = check_layout(layout)
        if x.ndim < 2:
            raise ShapeError(f"x has shape {tuple(x.shape)}; gather_sequence joins axis -2 of (..., N/W, D)")
        check_shard_length("x", x.shape[-2], g.size, checked, tuple(x.shape))
        sig = Signature("gather_sequence").add(Field("world_size"), g.size).tensor("x", x, X_AXES)
        return sig.add(Choice("layout", LAYOUTS), checked), checked

    layout = agree(g, "gather_sequence", check, x.device, ADVICE)
    if g.size == 1:
        return x
    if torch.is_grad_enabled() and x.requires_grad:
        return _Gather.apply(x, g, layout)
    return _gather(g, x, layout)
