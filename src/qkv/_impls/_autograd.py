"""Torch autograd for impls with their own backward pass (flash-attn's ``FlashAttnFunc`` pattern).

``with_autograd(forward, backward)`` gives a forward that, for torch tensors requiring grad,
runs inside a ``torch.autograd.Function`` saving only ``q, k, v, out, lse``; the backward
pass recomputes what it needs, with the forward's plan. ``torch`` is imported only when a tensor
needs it.
"""

from collections.abc import Callable
from functools import cache
from typing import Any

from .._backend import is_torch
from .._typing import Array, Result
from ._call import Call, Plan

Forward = Callable[[Call, Plan], Result]
Backward = Callable[..., tuple[Array, ...]]


@cache
def _function(forward: Forward, backward: Backward) -> Any:
    import torch

    class AttentionFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, bias, call, plan):
            c = call._replace(q=q, k=k, v=v, want_weights=False)
            if bias is not None:
                c = c._replace(bias=bias)
            res = forward(c, plan)
            ctx.save_for_backward(q, k, v, res.out, res.lse, bias)
            ctx.call, ctx.plan = call, plan
            # an unused lse gets None, not a (B, H, Nq) tensor of zeros (the kernel takes dlse=None)
            ctx.set_materialize_grads(False)
            return res.out, res.lse

        @staticmethod
        def backward(ctx, dout, dlse):
            q, k, v, out, lse, bias = ctx.saved_tensors
            if dout is None:  # only lse was used
                dout = torch.zeros_like(out)
            c = ctx.call._replace(q=q, k=k, v=v)
            if bias is None:
                return (*backward(dout, c, ctx.plan, out, lse, dlse), None, None, None)
            return (*backward(dout, c._replace(bias=bias), ctx.plan, out, lse, dlse, dbias=True), None, None)

    return AttentionFunction


def with_autograd(forward: Forward, backward: Backward) -> Forward:
    """``forward`` that records one autograd node (``backward``) for torch tensors needing grads.

    A float bias that requires grad is an input of the node too: ``backward(..., dbias=True)``
    returns its gradient as a fourth array.
    """

    def run(c: Call, p: Plan) -> Result:
        learned_bias = c.bias is not None and getattr(c.bias, "requires_grad", False)
        if not is_torch(c.q) or not (learned_bias or any(x.requires_grad for x in (c.q, c.k, c.v))):
            return forward(c, p)
        import torch

        if not torch.is_grad_enabled():
            return forward(c, p)
        out, lse = _function(forward, backward).apply(c.q, c.k, c.v, c.bias if learned_bias else None, c, p)
        return Result(out, None, lse)  # impls wrapped here decline want_weights with autograd

    return run
