"""The reference implementation: scores materialised, every step a named function.

This is the code to open to learn what ``qkv.attention`` means (Vaswani et al.,
arXiv:1706.03762, eq. 1):

    S = Q Kᵀ                    scores          (*B, H, Nq, Nk)
    S = S · scale               scaled
    S = score_mod(S)            modded          positions aligned bottom-right
    S = S + bias                biased
    S = where(mask, S, -inf)    masked          True = may attend
    A = softmax(S)              normalised      all -inf row -> zeros, lse = -inf; sinks join the sum
    A = dropout(A)              dropped
    O = A V                     output          (*B, H, Nq, Dv)

and backward, for ``L`` with upstream gradient ``dO``:

    A = exp(S − lse)            recomputed      dV = Aᵀ dO       grad_values
    dA = dO Vᵀ                  grad_weights    D = rowsum(dO ∘ O)   rowsum
    dS = A ∘ (dA − D)           grad_scores     dS ∘ ds'/ds      through_mod
    dQ = dS K · scale           grad_queries    dK = dSᵀ Q · scale   grad_keys

``forward`` and ``backward`` below compose these steps; ``qkv.explain`` replays the very same
functions and records each value. Half-precision inputs are computed in float32. Grouped-query
heads view ``q`` as ``(*B, Hkv, H/Hkv · Nq, Dk)`` (``qkv._heads``): one matmul per kv head,
K and V never copied.
"""

from typing import Any

import numpy as np

from .._backend import compute_dtype, from_numpy, namespace, rand_uniform, unbroadcast
from .._finite import bad_rows, hidden_to_inf, zeroed
from .._heads import cast, group_q, ungroup
from .._philox import index_grids, keep_mask
from .._softmax import softmax_lse
from .._typing import Array, Result
from ..masks import Mask
from ..scores import ScoreMod, through
from ._call import Call
from ._nonfinite import poisoned, poisoned_rows

# --------------------------------------------------------------------------- forward steps


def scores(xp: Any, c: Call, q: Array, k: Array) -> Array:
    """``S = Q Kᵀ``: every query against every key, ``(*B, H, Nq, Nk)``."""
    return ungroup(xp, group_q(xp, q, c.dims) @ k.mT, c.dims)


def scaled(s: Array, c: Call) -> Array:
    """``S · scale`` (``1/√Dk`` unless given)."""
    return s * c.scale


def modded(s: Array, score_mod: ScoreMod | None) -> tuple[Array, Any]:
    """``(score_mod(S), ds'/ds)``; unchanged (and derivative None) without a score mod."""
    if score_mod is None:
        return s, None
    nq, nk = s.shape[-2], s.shape[-1]
    return score_mod.with_grad(s, np.arange(nq)[:, None], np.arange(nk)[None, :], nq, nk)


def biased(xp: Any, s: Array, bias: Array | None) -> Array:
    """``S + bias`` (the float mask), when there is one."""
    return s if bias is None else s + cast(xp, bias, s.dtype)


def masked(xp: Any, s: Array, mask: Mask | None) -> Array:
    """``where(mask, S, -inf)``: a hidden key scores ``-inf`` and so gets exactly zero weight."""
    if mask is None:
        return s
    return hidden_to_inf(xp, s, ~from_numpy(mask.dense(s.shape[-2], s.shape[-1]), s))


def normalised(xp: Any, s: Array, sinks: Array | None = None) -> tuple[Array, Array]:
    """``(A = softmax(S), lse)``; a row with nothing to attend gives zeros and ``lse = -inf``.

    ``sinks (*B, H, 1)``: one logit per head in every row's denominator, with no value (gpt-oss).
    """
    return softmax_lse(xp, s, sinks=None if sinks is None else sinks[..., None])


def dropped(xp: Any, a: Array, c: Call) -> Array:
    """Inverted dropout (Srivastava et al. 2014): kept weights scaled by ``1/(1 − p)``, so
    ``E[dropped(A)] = A``; the mask is drawn from ``c.rng``: a generator of the array library,
    or an int seed of the counter-based generator the flash kernel uses (``qkv._philox``: the
    same seed gives the same mask on every impl)."""
    if c.dropout == 0:
        return a
    if isinstance(c.rng, (int, np.integer)) and not isinstance(c.rng, (bool, np.bool_)):
        b, h = index_grids(c.dims.score_shape[:-2], c.dims.has_heads)
        i, j = np.arange(c.dims.nq)[:, None], np.arange(c.dims.nk)[None, :]
        keep = from_numpy(np.broadcast_to(keep_mask(int(c.rng), c.dropout, b, h, i, j), tuple(a.shape)), a)
    else:
        keep = rand_uniform(c.rng, a, tuple(a.shape)) >= c.dropout
    return xp.where(keep, a / (1.0 - c.dropout), xp.zeros_like(a))


def output(xp: Any, a: Array, v: Array, c: Call) -> Array:
    """``O = A V``: each output row is the A-weighted average of the value rows.

    A value row holding NaN or inf is read only by the rows that attend it (``qkv._finite``).
    """
    ag = group_q(xp, a, c.dims)
    bad = bad_rows(xp, v)
    if bad is None:
        return ungroup(xp, ag @ v, c.dims)
    reads = xp.any((ag > 0) & bad[..., None, :], axis=-1)  # rows that attend a non-finite value
    return ungroup(xp, xp.where(reads[..., None], ag @ v, ag @ zeroed(xp, v, bad)), c.dims)


def final_scores(xp: Any, c: Call, q: Array, k: Array) -> tuple[Array, Any]:
    """``S`` after scale, score mod, bias and mask, with the mod's ``ds'/ds``."""
    s, grad = modded(scaled(scores(xp, c, q, k), c), c.score_mod)
    return masked(xp, biased(xp, s, c.bias), c.mask), grad


# --------------------------------------------------------------------------- backward steps


def recomputed(xp: Any, s: Array, lse: Array) -> Array:
    """``A = exp(S − lse)`` from the saved ``lse (..., Nq)``; rows with ``lse = -inf`` (nothing
    to attend) give zeros; a NaN ``lse`` stays NaN."""
    lse = lse[..., None]
    empty = lse == -float("inf")
    a = xp.exp(s - xp.where(empty, xp.zeros_like(lse), lse))  # empty rows: exp(-inf - 0) = 0
    return xp.where(empty, xp.zeros_like(a), a)


def grad_values(xp: Any, a: Array, do: Array, c: Call) -> Array:
    """``dV = Aᵀ dO``, summed over each kv head's query heads."""
    return group_q(xp, a, c.dims).mT @ group_q(xp, do, c.dims)


def grad_weights(xp: Any, do: Array, v: Array, c: Call) -> Array:
    """``dA = dO Vᵀ`` (a non-finite value row counts as 0: its weight is 0 wherever it is hidden,
    and a row attending it has a NaN output, so a NaN ``D``, already)."""
    return ungroup(xp, group_q(xp, do, c.dims) @ zeroed(xp, v, bad_rows(xp, v)).mT, c.dims)


def rowsum(xp: Any, do: Array, o: Array) -> Array:
    """``D = rowsum(dO ∘ O)``, which equals ``Σⱼ A ∘ dA``: what the softmax subtracts."""
    return xp.sum(do * o, axis=-1)


def grad_scores(a: Array, da: Array, big_d: Array) -> Array:
    """``dS = A ∘ (dA − D)``: through the softmax; 0 wherever ``A`` is 0."""
    return a * (da - big_d[..., None])


def through_mod(ds: Array, grad: Any) -> Array:
    """``dS ∘ ds'/ds``: the chain rule through the score mod."""
    return through(ds, grad)


def grad_queries(xp: Any, ds: Array, k: Array, c: Call) -> Array:
    """``dQ = dS K · scale`` (a non-finite key row counts as 0: ``dS`` is 0 where it is hidden
    and NaN where it was attended)."""
    return ungroup(xp, group_q(xp, ds, c.dims) @ zeroed(xp, k, bad_rows(xp, k)), c.dims) * c.scale


def grad_keys(xp: Any, ds: Array, q: Array, c: Call) -> Array:
    """``dK = dSᵀ Q · scale``, summed over each kv head's query heads."""
    return (group_q(xp, ds, c.dims).mT @ group_q(xp, q, c.dims)) * c.scale


# --------------------------------------------------------------------------- the impl


def forward(c: Call) -> Result:
    xp = namespace(q=c.q, k=c.k, v=c.v)
    ct = compute_dtype(xp, c.q)
    q, k, v = (cast(xp, x, ct) for x in (c.q, c.k, c.v))
    s, _ = final_scores(xp, c, q, k)
    a, lse = normalised(xp, s, c.sinks)
    a = dropped(xp, a, c)
    out = output(xp, a, v, c)
    weights = cast(xp, a, c.q.dtype) if c.want_weights else None
    return poisoned(xp, Result(cast(xp, out, c.q.dtype), weights, lse), poisoned_rows(xp, c))


def backward(dout: Array, c: Call, out: Array, lse: Array) -> tuple[Array, Array, Array]:
    """The analytic gradients (without dropout), reduced to the shapes of ``q``, ``k``, ``v``.

    GQA gradients sum over the query heads of each kv head; broadcast batch axes sum too.
    """
    xp = namespace(dout=dout, q=c.q, k=c.k, v=c.v, out=out, lse=lse)
    ct = compute_dtype(xp, c.q)
    q, k, v, do, o, lse = (cast(xp, x, ct) for x in (c.q, c.k, c.v, dout, out, lse))
    s, grad = final_scores(xp, c, q, k)
    a = recomputed(xp, s, lse)
    dv = grad_values(xp, a, do, c)
    ds = through_mod(grad_scores(a, grad_weights(xp, do, v, c), rowsum(xp, do, o)), grad)
    dq, dk = grad_queries(xp, ds, k, c), grad_keys(xp, ds, q, c)
    return tuple(cast(xp, unbroadcast(xp, g, tuple(x.shape)), x.dtype) for g, x in ((dq, c.q), (dk, c.k), (dv, c.v)))
