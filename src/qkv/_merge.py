"""Merging partial attention results computed over disjoint key sets: ``qkv.merge_attention``.

Attention over the union of key sets ``K = K_1 ∪ ... ∪ K_P`` is a weighted mean of the
attention over each part: with ``lse_p = log Σ_{j ∈ K_p} exp(s_j)``,

    lse = log Σ_p exp(lse_p)        out = Σ_p exp(lse_p − lse) · out_p

This is the online-softmax rescaling of Milakov & Gimelshein (arXiv:1805.02867) applied to
whole partial results; flash attention applies it tile by tile (arXiv:2205.14135), ring
attention block by block across devices (Liu et al., arXiv:2310.01889), split-KV decoding
across cache chunks. Subtracting the largest ``lse_p`` keeps ``exp`` in range; a part with
``lse = -inf`` (no key of that part may be attended) gets weight exactly 0, and a row whose
every part is empty gives zeros and ``lse = -inf`` without ``-inf − (-inf)``.
"""

from collections.abc import Sequence
from typing import Any

from ._backend import as_array, compute_dtype, dtype_name, is_floating, namespace
from ._typing import Array
from .errors import ArgumentError, DTypeError, ShapeError


def _check(outs: Sequence[Any], lses: Sequence[Any]) -> tuple[list[Array], list[Array]]:
    if isinstance(outs, (str, bytes)) or not hasattr(outs, "__len__") or not hasattr(lses, "__len__"):
        raise ArgumentError("outs and lses must be sequences (lists or tuples) of arrays, one entry per part")
    outs = [as_array(o, f"outs[{p}]") for p, o in enumerate(outs)]
    lses = [as_array(s, f"lses[{p}]") for p, s in enumerate(lses)]
    if len(outs) != len(lses):
        raise ArgumentError(f"outs has {len(outs)} parts but lses has {len(lses)}; pass one lse per partial output")
    if not outs:
        raise ArgumentError("merge_attention needs at least one part, got outs=[] and lses=[]")
    namespace(**{f"outs[{p}]": o for p, o in enumerate(outs)}, **{f"lses[{p}]": s for p, s in enumerate(lses)})
    first = tuple(outs[0].shape)
    if len(first) < 2:
        raise ShapeError(f"outs[0] has shape {first}; partial outputs are (..., Nq, Dv)")
    for p, (o, s) in enumerate(zip(outs, lses, strict=True)):
        for name, x in ((f"outs[{p}]", o), (f"lses[{p}]", s)):
            if not is_floating(x):
                raise DTypeError(f"{name} has dtype {dtype_name(x)}; partial results must be floating-point")
        if tuple(o.shape) != first:
            raise ShapeError(
                f"outs[{p}] has shape {tuple(o.shape)} but outs[0] has {first}; every part covers "
                "the same queries (..., Nq, Dv)"
            )
        if tuple(s.shape) != first[:-1]:
            raise ShapeError(
                f"lses[{p}] has shape {tuple(s.shape)} but outs[{p}] has {first}; lse is (..., Nq), "
                "the output's shape without Dv"
            )
    return outs, lses


def merge_attention(outs: Sequence[Array], lses: Sequence[Array]) -> tuple[Array, Array]:
    """Merge partial attention results over disjoint key sets into the result over their union.

    ``outs[p] (..., Nq, Dv)`` and ``lses[p] (..., Nq)`` (natural-log log-sum-exp of each score
    row, as ``qkv.attention(..., return_lse=True)`` gives) for parts ``p = 0 .. P-1``.
    Returns ``(out (..., Nq, Dv), lse (..., Nq))``, the same kind of array (differentiable for
    torch). A part with ``lse = -inf`` contributes nothing; a row where every part is empty
    gives zeros and ``lse = -inf`` (never NaN). Half precision is merged in float32; ``out``
    comes back in the dtype of ``outs``, ``lse`` in float32 (as ``qkv.attention`` gives it).

    >>> o1, l1 = qkv.attention(q, k[..., :5, :], v[..., :5, :], return_lse=True)
    >>> o2, l2 = qkv.attention(q, k[..., 5:, :], v[..., 5:, :], return_lse=True)
    >>> out, lse = qkv.merge_attention([o1, o2], [l1, l2])   # == qkv.attention(q, k, v, return_lse=True)
    """
    outs, lses = _check(outs, lses)
    xp = namespace(out=outs[0])
    ct = compute_dtype(xp, outs[0])
    o = xp.stack([x if x.dtype == ct else xp.astype(x, ct) for x in outs])  # (P, ..., Nq, Dv)
    lse = xp.stack([x if x.dtype == ct else xp.astype(x, ct) for x in lses])[..., None]  # (P, ..., Nq, 1)
    m = xp.max(lse, axis=0)
    m = xp.where(xp.isfinite(m), m, xp.zeros_like(m))  # every part empty: shift by 0, so exp(-inf) = 0
    w = xp.exp(lse - m)  # each part's share, up to the common factor exp(m)
    z = xp.sum(w, axis=0)
    nonempty = z > 0
    safe_z = xp.where(nonempty, z, xp.ones_like(z))
    out = xp.sum(w * o, axis=0) / safe_z
    merged = xp.where(nonempty, xp.log(safe_z) + m, xp.full_like(z, -float("inf")))
    return (out if out.dtype == outs[0].dtype else xp.astype(out, outs[0].dtype)), merged[..., 0]
