"""Ring attention over ``torch.distributed`` (Liu, Zaharia & Abbeel, arXiv:2310.01889).

Each of ``W`` ranks holds a shard of the sequence (axis -2) of ``q``, ``k`` and ``v``. For
``W`` steps every rank attends its queries to the K/V block it holds, while that block is
already travelling to the next rank (``r -> r+1``) and the previous rank's block is arriving;
the partial ``(out, lse)`` of each step merges into a running result (``qkv.merge_attention``).
After ``W`` steps every query has seen every key: the result is exact attention, with no rank
ever holding more than two K/V blocks.

The backward pass is the same ring run again: K/V blocks travel with accumulators for their
gradients ``dK``, ``dV``; each rank adds its queries' share (rebuilt from the global ``out``
and ``lse``) and passes them on; one last hop brings each accumulator home. Only K/V heads
travel (``Hkv`` of them): grouped query heads are served by the flash kernel without copies.
"""

from typing import Any, NamedTuple

import torch

from .._backend import compute_dtype
from .._checks import check_qkv, check_scale
from .._softmax import merge_attention
from ..errors import ArgumentError
from ._agree import K_AXES, Q_AXES, V_AXES, Choice, Field, Flag, Real, Signature, agree
from ._blocks import block_backward, block_forward, ring_source
from ._comm import Group, require_torch, resolve, ring_exchange, wait
from ._layout import LAYOUTS, Segments, check_layout, check_shard_length, segments

ADVICE = (
    "Every rank must pass its own shard with the same shapes, dtypes, device type, causal, layout "
    "and scale (docs/distributed.md)"
)


class Plan(NamedTuple):
    g: Group
    causal: bool
    layout: str
    scale: float
    nq: int  # global lengths
    nk: int

    def q_segs(self) -> Segments:
        return segments(self.g.rank, self.g.size, self.nq, self.layout)

    def kv_segs(self, step: int) -> Segments:
        return segments(ring_source(self.g.rank, step, self.g.size), self.g.size, self.nk, self.layout)

    def kw(self) -> dict[str, Any]:
        return {"causal": self.causal, "scale": self.scale, "nq": self.nq, "nk": self.nk}


def _ct(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x if x.dtype == dtype else x.to(dtype)


def ring_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: Plan) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)`` of this rank's queries against every rank's keys; ``lse`` in the compute dtype."""
    ct = compute_dtype(torch, q)
    qc = _ct(q, ct)
    w = plan.g.size
    kv = [k.contiguous(), v.contiguous()]  # sent as given (half stays half on the wire)
    acc: tuple[torch.Tensor, torch.Tensor] | None = None
    for step in range(w):
        pending = ring_exchange(plan.g, kv) if step < w - 1 else None  # overlaps the computation below
        o, lse, computed = block_forward(
            qc, _ct(kv[0], ct), _ct(kv[1], ct), plan.q_segs(), plan.kv_segs(step), **plan.kw()
        )
        if computed:
            acc = (o, lse) if acc is None else merge_attention([acc[0], o], [acc[1], lse])
        if pending is not None:
            wait(plan.g, pending[1], f"forward step {step + 1} of {w}, passing K/V blocks on")
            kv = pending[0]
    if acc is None:  # every block hidden from every query of this rank: zeros and -inf
        acc = (o, lse)
    return acc[0].to(q.dtype), acc[1]


def ring_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    plan: Plan,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` for this rank's shards; dK/dV accumulators travel the ring with their block."""
    ct = compute_dtype(torch, q)
    qc, doc, oc = _ct(q, ct), _ct(dout, ct), _ct(out, ct)
    w = plan.g.size
    kv = [k.contiguous(), v.contiguous()]
    dq = torch.zeros_like(qc)
    dkv = [torch.zeros(k.shape, dtype=ct, device=k.device), torch.zeros(v.shape, dtype=ct, device=v.device)]
    for step in range(w):
        pending = ring_exchange(plan.g, kv) if step < w - 1 else None  # K/V need no gradient: send now
        g = block_backward(
            doc, qc, _ct(kv[0], ct), _ct(kv[1], ct), oc, lse, plan.q_segs(), plan.kv_segs(step), **plan.kw()
        )
        if g is not None:
            dq += g[0]
            dkv[0] += g[1]
            dkv[1] += g[2]
        if w > 1:  # the accumulators move on with their block; after the last step they are home
            grads, reqs = ring_exchange(plan.g, dkv, first_tag=2)  # K/V (tags 0, 1) may be in flight
            wait(plan.g, reqs, f"backward step {step + 1} of {w}, passing dK/dV accumulators on")
            dkv = grads
        if pending is not None:
            wait(plan.g, pending[1], f"backward step {step + 1} of {w}, passing K/V blocks on")
            kv = pending[0]
    return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: Plan) -> torch.Tensor:
        out, lse = ring_forward(q, k, v, plan)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.plan = plan
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[Any, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        return (*ring_backward(dout, q, k, v, out, lse, ctx.plan), None)


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    group: Any = None,
    causal: bool = False,
    layout: str = "contiguous",
    scale: float | None = None,
) -> torch.Tensor:
    """Exact attention over a sequence sharded across the ranks of ``group`` (ring attention).

    Every rank passes its shard: ``q (*B, H, Nq/W, Dk)``, ``k (*B, Hkv, Nk/W, Dk)``,
    ``v (*B, Hkv, Nk/W, Dv)`` (from ``shard_sequence`` with the same ``layout``) and gets its
    shard of ``out (*B, H, Nq/W, Dv)``, equal to ``qkv.attention`` on the gathered tensors.
    ``causal`` is on global positions (bottom-right aligned); the ``"contiguous"`` layout skips
    blocks a query shard cannot see, ``"zigzag"`` also balances that work across ranks.
    Differentiable (one ``torch.autograd.Function``; the backward pass is a second ring).

    Every rank must call it with the same shapes, dtypes, device type, ``causal``, ``layout``
    and ``scale``, and all or none of them with gradients. Before the first transfer the ranks
    compare their calls (one small all-gather); if they differ, every rank raises the same
    ``DistributedError`` naming the ranks, the field and both values.

    >>> out = ring_attention(shard_sequence(q), shard_sequence(k), shard_sequence(v), causal=True)
    """
    require_torch("ring_attention", q=q, k=k, v=v)
    g = resolve(group, "ring_attention")

    def check() -> tuple[Signature, tuple[Plan, bool]]:
        check_layout(layout)
        dims = check_qkv(q, k, v)
        if not isinstance(causal, bool):
            raise ArgumentError(f"causal must be True or False, got {causal!r}")
        for name, x in (("q", q), ("k", k)):
            check_shard_length(name, x.shape[-2], g.size, layout, tuple(x.shape))
        plan = Plan(g, causal, layout, check_scale(scale, dims.dk), dims.nq * g.size, dims.nk * g.size)
        grad = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
        sig = Signature("ring_attention").add(Field("world_size"), g.size)
        for name, x, axes in (("q", q, Q_AXES), ("k", k, K_AXES), ("v", v, V_AXES)):
            sig.tensor(name, x, axes)
        sig.add(Flag("causal"), causal).add(Choice("layout", LAYOUTS), layout).add(Real("scale"), plan.scale)
        sig.add(Flag("grad", "q, k or v requires grad with grad mode on: the backward ring needs every rank"), grad)
        return sig, (plan, grad)

    plan, grad = agree(g, "ring_attention", check, q.device, ADVICE)
    if grad:
        return _RingAttention.apply(q, k, v, plan)
    return ring_forward(q, k, v, plan)[0]
