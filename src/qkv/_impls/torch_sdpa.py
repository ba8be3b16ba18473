"""Delegation to ``torch.nn.functional.scaled_dot_product_attention`` where its semantics match.

SDPA takes the same boolean polarity (True = may attend), additive float masks, ``scale``
and ``enable_gqa`` (repeat_interleave head order). Where it differs, this module adapts or
declines (``supports`` gives the reason):

- its ``is_causal`` is top-left; it is used only for the plain bottom-right causal mask when
  ``Nq == Nk`` (where the two agree), every other mask is passed as an explicit matrix;
- it returns neither weights nor ``lse``, and draws dropout from torch's global generator;
- a query row with no allowed key is given every key and its output zeroed afterwards, so
  neither its output nor its gradients depend on how a kernel treats an all ``-inf`` row;
- it reads every key, hidden or not: non-finite key and value rows are zeroed before it runs,
  and the rows that attend one are set to NaN after (``_nonfinite``), as on every impl.
"""

from typing import Any

import numpy as np

from .. import masks
from .._backend import compute_dtype, from_numpy, is_torch, namespace
from .._finite import bad_rows, zeroed
from .._typing import Array, Result
from ._call import Call
from ._nonfinite import poisoned_rows


def supports(c: Call) -> str | None:
    if not all(is_torch(x) for x in (c.q, c.k, c.v)):
        return "it needs torch tensors (this call has NumPy arrays)"
    if c.want_weights or c.want_lse:
        return "torch SDPA returns neither the weights nor lse"
    if c.sinks is not None:
        return "torch SDPA has no attention sinks (and returns no lse to merge them with)"
    if c.dropout > 0 and c.rng is not None:
        return "torch SDPA draws dropout from torch's global generator and cannot take an rng"
    if c.score_mod is not None and c.score_mod.bias is None:
        return f"score_mod {c.score_mod.name} is not an additive bias, which SDPA cannot apply"
    return None


def _inputs(c: Call) -> tuple[Array, Array, Array, bool]:
    """q, k, v expanded (as views) to common batch axes; GQA left to ``enable_gqa``."""
    d = c.dims
    q, k, v = c.q, c.k, c.v
    if not d.has_heads:
        return q, k, v, False
    lead = (*d.batch,)

    def expand(x: Array, heads: int) -> Array:
        x = x.reshape((1,) * (len(lead) + 3 - x.ndim) + tuple(x.shape))
        return x.expand(*lead, heads, *x.shape[-2:])

    return expand(q, d.h), expand(k, d.hkv), expand(v, d.hkv), d.grouped


def _attn_mask(c: Call, like: Array) -> tuple[Array | None, Array | None, bool]:
    """``(attn_mask, empty_rows, is_causal)`` in SDPA's terms."""
    import torch

    d = c.dims
    if c.mask is masks.causal() and c.bias is None and c.score_mod is None and d.nq == d.nk:
        return None, None, True
    bias = None
    if c.score_mod is not None:
        i, j = np.arange(d.nq)[:, None], np.arange(d.nk)[None, :]
        bias = c.score_mod.bias(namespace(q=like), like, i, j, d.nq, d.nk)  # type: ignore[misc]
    if c.bias is not None:
        b = c.bias.to(like.dtype)
        bias = b if bias is None else bias + b
    allowed = None
    if c.mask is not None:
        allowed = from_numpy(c.mask.dense(d.nq, d.nk), like)
    if bias is not None:
        hidden = ~torch.isfinite(bias) & (bias < 0)
        allowed = ~hidden if allowed is None else allowed & ~hidden
    if allowed is None:
        return None, None, False
    empty = ~allowed.any(dim=-1, keepdim=True)  # rows that may attend nothing
    allowed = allowed | empty
    if bias is None:
        return allowed, empty, False
    bias = torch.where(empty, torch.zeros((), dtype=bias.dtype, device=bias.device), bias)
    return bias.masked_fill(~allowed, -float("inf")), empty, False


def _run(c: Call) -> Array:
    import torch
    import torch.nn.functional as F

    rows = poisoned_rows(torch, c)
    if rows is not None:  # SDPA reads every key: the non-finite rows of k and v become zeros first
        xp = namespace(q=c.q)
        c = c._replace(k=zeroed(xp, c.k, bad_rows(xp, c.k)), v=zeroed(xp, c.v, bad_rows(xp, c.v)))
    q, k, v, gqa = _inputs(c)
    ct = compute_dtype(torch, c.q)
    attn_mask, empty, is_causal = _attn_mask(c, q.to(ct) if ct != q.dtype else q)
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        attn_mask = attn_mask.to(q.dtype)
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=attn_mask, dropout_p=c.dropout, is_causal=is_causal, scale=c.scale, enable_gqa=gqa
    )
    if empty is not None:
        out = torch.where(empty, torch.zeros((), dtype=out.dtype, device=out.device), out)
    if rows is not None:  # the rows that attend a non-finite input: NaN (_nonfinite)
        out = torch.where(rows[..., None], torch.full((), float("nan"), dtype=out.dtype), out)
    return out


def forward(c: Call) -> Result:
    return Result(_run(c), None, None)


def backward(dout: Array, c: Call, out: Array, lse: Array) -> Any:
    """Gradients by torch autograd through SDPA (recomputing the forward pass)."""
    import torch

    leaves = [x.detach().requires_grad_(True) for x in (c.q, c.k, c.v)]
    with torch.enable_grad():
        o = _run(c._replace(q=leaves[0], k=leaves[1], v=leaves[2]))
        return torch.autograd.grad(o, leaves, dout)
