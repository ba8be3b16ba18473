"""The reference implementation: scores materialised, every step plain to read.

This is the code to open to learn what ``qkv.attention`` means (Vaswani et al.,
arXiv:1706.03762, eq. 1):

    S = Q Kᵀ · scale            (*B, H, Nq, Nk)
    S = score_mod(S) + bias     positions aligned bottom-right
    S = where(mask, S, -inf)    True = may attend
    A = softmax(S)              all -inf row -> zeros, lse = -inf
    O = dropout(A) V            (*B, H, Nq, Dv)

Half-precision inputs are computed in float32. Grouped-query heads are handled by viewing
``q`` as ``(*B, Hkv, H/Hkv · Nq, Dk)``: one matmul per kv head, K and V never copied.
"""

from typing import Any

import numpy as np

from .._backend import compute_dtype, from_numpy, namespace, rand_uniform, unbroadcast
from .._softmax import softmax_lse
from .._typing import Array, Dims, Result
from ._call import Call


def cast(xp: Any, x: Array, dtype: Any) -> Array:
    """``x`` in ``dtype``, without a copy when it already is."""
    return x if x.dtype == dtype else xp.astype(x, dtype)


def group_q(xp: Any, x: Array, dims: Dims) -> Array:
    """``(*B, H, N, D) -> (*B, Hkv, H/Hkv · N, D)`` for grouped heads; otherwise unchanged.

    Each kv head's query heads are stacked along the rows, so one plain matmul per kv head
    serves the whole group: K and V are neither copied nor broadcast (a broadcast batched
    matmul materialises K once per query head, ~9x slower for a decode step).
    """
    if not dims.grouped:
        return x
    r = dims.h // dims.hkv
    return xp.reshape(x, (*x.shape[:-3], dims.hkv, r * x.shape[-2], x.shape[-1]))


def ungroup(xp: Any, x: Array, dims: Dims) -> Array:
    """Inverse of ``group_q``: ``(*B, Hkv, H/Hkv · N, D) -> (*B, H, N, D)``."""
    if not dims.grouped:
        return x
    r = dims.h // dims.hkv
    return xp.reshape(x, (*x.shape[:-3], dims.h, x.shape[-2] // r, x.shape[-1]))


def masked_scores(xp: Any, c: Call, q: Array, k: Array) -> tuple[Array, Any]:
    """``S`` after scale, score mod, bias and mask, ``(*B, H, Nq, Nk)``, with ``dS'/dS`` of the mod."""
    d = c.dims
    s = ungroup(xp, group_q(xp, q, d) @ k.mT, d) * c.scale
    grad = None
    if c.score_mod is not None:
        i, j = np.arange(d.nq)[:, None], np.arange(d.nk)[None, :]
        s, grad = c.score_mod.with_grad(s, i, j, d.nq, d.nk)
    if c.bias is not None:
        s = s + cast(xp, c.bias, s.dtype)
    if c.mask is not None:
        allowed = from_numpy(c.mask.dense(d.nq, d.nk), s)
        s = xp.where(allowed, s, xp.asarray(-float("inf"), dtype=s.dtype))
    return s, grad


def forward(c: Call) -> Result:
    xp = namespace(q=c.q, k=c.k, v=c.v)
    ct = compute_dtype(xp, c.q)
    q, k, v = (cast(xp, x, ct) for x in (c.q, c.k, c.v))
    s, _ = masked_scores(xp, c, q, k)
    a, lse = softmax_lse(xp, s)
    if c.dropout > 0:
        # inverted dropout (Srivastava et al. 2014): E[kept / (1 - p)] = A
        keep = rand_uniform(c.rng, s, tuple(a.shape)) >= c.dropout
        a = xp.where(keep, a / (1.0 - c.dropout), xp.zeros_like(a))
    out = ungroup(xp, group_q(xp, a, c.dims) @ v, c.dims)
    weights = cast(xp, a, c.q.dtype) if c.want_weights else None
    return Result(cast(xp, out, c.q.dtype), weights, lse)


def backward(dout: Array, c: Call, out: Array, lse: Array) -> tuple[Array, Array, Array]:
    """The analytic gradients (without dropout), reduced to the shapes of ``q``, ``k``, ``v``.

    ``dV = Aᵀ dO``, ``dA = dO Vᵀ``, ``dS = A ∘ (dA − rowsum(dO ∘ O))``, then through the score
    mod's derivative, ``dQ = dS K · scale``, ``dK = dSᵀ Q · scale``. GQA gradients sum over the
    query heads of each kv head; broadcast batch axes sum too.
    """
    xp = namespace(dout=dout, q=c.q, k=c.k, v=c.v, out=out, lse=lse)
    ct = compute_dtype(xp, c.q)
    q, k, v, do, o, lse = (cast(xp, x, ct) for x in (c.q, c.k, c.v, dout, out, lse))
    d = c.dims
    s, grad = masked_scores(xp, c, q, k)
    lse = lse[..., None]
    finite = xp.isfinite(lse)
    a = xp.exp(s - xp.where(finite, lse, xp.zeros_like(lse)))  # empty rows: exp(-inf) = 0
    a = xp.where(finite, a, xp.zeros_like(a))
    ag, dog = group_q(xp, a, d), group_q(xp, do, d)
    dv = ag.mT @ dog
    da = ungroup(xp, dog @ v.mT, d)
    ds = a * (da - xp.sum(do * o, axis=-1, keepdims=True))
    if grad is not None:
        ds = ds * grad
    dsg = group_q(xp, ds, d)
    dq = ungroup(xp, dsg @ k, d) * c.scale
    dk = (dsg.mT @ group_q(xp, q, d)) * c.scale
    return tuple(cast(xp, unbroadcast(xp, g, tuple(x.shape)), x.dtype) for g, x in ((dq, c.q), (dk, c.k), (dv, c.v)))
