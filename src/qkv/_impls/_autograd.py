"""Torch autograd for impls with their own backward pass (flash-attn's ``FlashAttnFunc`` pattern).

``with_autograd(forward, backward)`` gives a forward that, for torch tensors requiring grad,
runs inside a ``torch.autograd.Function`` saving only ``q, k, v, out, lse`` (and the compiled
kernel's ``lse_lo``, lse's rounding residual, where a ``saving`` forward gives one); the backward
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
Saving = Callable[[Call, Plan], tuple[Result, Array | None]]
Backward = Callable[..., tuple[Array, ...]]


@cache
def _function(forward: Saving, backward: Backward) -> Any:
    import torch

    class AttentionFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, bias, call, plan):
            c = call._replace(q=q, k=k, v=v, want_weights=False)
            if bias is not None:
                c = c._replace(bias=bias)
            res, lse_lo = forward(c, plan)
            ctx.save_for_backward(q, k, v, res.out, res.lse, bias, lse_lo)
            ctx.call, ctx.plan = call, plan
            # an unused lse gets None, not a (B, H, Nq) tensor of zeros (the kernel takes dlse=None)
            ctx.set_materialize_grads(False)
            return res.out, res.lse

        @staticmethod
        def backward(ctx, dout, dlse):
            q, k, v, out, lse, bias, lse_lo = ctx.saved_tensors
            if dout is None:  # only lse was used
                dout = torch.zeros_like(out)
            c = ctx.call._replace(q=q, k=k, v=v)
            lo = {} if lse_lo is None else {"lse_lo": lse_lo}
            if bias is None:
                return (*backward(dout, c, ctx.plan, out, lse, dlse, **lo), None, None, None)
            return (*backward(dout, c._replace(bias=bias), ctx.plan, out, lse, dlse, dbias=True, **lo), None, None)

    return AttentionFunction


def with_autograd(forward: Forward, backward: Backward, saving: Saving | None = None) -> Forward:
    """``forward`` that records one autograd node (``backward``) for torch tensors needing grads.

    A float bias that requires grad is an input of the node too: ``backward(..., dbias=True)``
    returns its gradient as a fourth array. ``saving`` (default: ``forward`` and no residual) is
    the forward run when the result is saved for the node: ``(result, lse_lo)``, the residual
    (None, or lse's rounding, ``_native``'s ``lse_lo``) passed back as ``backward(..., lse_lo=)``.
    """

    def run(c: Call, p: Plan) -> Result:
        learned_bias = c.bias is not None and getattr(c.bias, "requires_grad", False)
        if not is_torch(c.q) or not (learned_bias or any(x.requires_grad for x in (c.q, c.k, c.v))):
            return forward(c, p)
        import torch

        if not torch.is_grad_enabled():
            return forward(c, p)
        fn = _function(saving or _no_residual(forward), backward)
        out, lse = fn.apply(c.q, c.k, c.v, c.bias if learned_bias else None, c, p)
        return Result(out, None, lse)  # impls wrapped here decline want_weights with autograd

    return run


@cache
def _no_residual(forward: Forward) -> Saving:
    def run(c: Call, p: Plan) -> tuple[Result, None]:
        return forward(c, p), None

    return run
