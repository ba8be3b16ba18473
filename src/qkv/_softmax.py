"""Softmax, log-sum-exp and merging partial results: the one home of the empty-row rule.

Subtracting the row maximum keeps ``exp`` from overflowing (Milakov & Gimelshein,
arXiv:1805.02867). A row whose maximum is ``-inf`` (nothing may be attended) is shifted by 0
instead (``safe_max``), so ``exp(-inf - 0) = 0`` and no ``-inf - (-inf) = nan`` ever appears,
in the forward pass or in autograd's backward. Every way qkv normalises ends in ``finalise``:
from a sum ``l`` of shifted exponentials, the weighted accumulator and the shift ``m``, it
gives the output and ``lse = log l + m``, or zeros and ``lse = -inf`` for an empty row
(``l = 0``). ``softmax_lse``, the flash kernel's tile loop and ``merge_attention`` all use it.

Merging partial results over disjoint key sets ``K = K_1 ∪ ... ∪ K_P`` is the same rescaling
applied to whole results: with ``lse_p = log Σ_{j ∈ K_p} exp(s_j)``,

    lse = log Σ_p exp(lse_p)        out = Σ_p exp(lse_p − lse) · out_p

flash attention applies it tile by tile (arXiv:2205.14135), ring attention block by block
across devices (Liu et al., arXiv:2310.01889), split-KV decoding across cache chunks.
"""

from collections.abc import Sequence
from typing import Any

from ._backend import as_array, compute_dtype, dtype_name, is_bool, is_floating, namespace
from ._checks import check_int
from ._typing import Array, Result
from .errors import ArgumentError, DTypeError, ShapeError


def safe_max(xp: Any, m: Array) -> Array:
    """The shift to subtract: the row maximum ``m``, or 0 where it is not finite (an empty row)."""
    return xp.where(xp.isfinite(m), m, xp.zeros_like(m))


def finalise(xp: Any, acc: Array, l: Array, m: Array) -> tuple[Array, Array]:
    """``(acc / l, log l + m)``; an empty row (``l = 0``) gives zeros and ``lse = -inf``.

    ``acc (..., N, D)`` is the sum of ``exp(s - m) · value`` (the weights themselves for
    softmax), ``l (..., N, 1)`` the sum of ``exp(s - m)``, ``m (..., N, 1)`` the shift used
    (not yet made safe). ``lse`` keeps the trailing axis of ``l``. A NaN reaching ``l`` (a NaN
    score that was attended) stays NaN in both: ``-inf`` means "nothing to attend" and nothing else.
    """
    empty = l == 0
    safe_l = xp.where(empty, xp.ones_like(l), l)
    lse = xp.where(empty, xp.full_like(l, -float("inf")), xp.log(safe_l) + safe_max(xp, m))
    return acc / safe_l, lse


def empty_result(
    xp: Any, lead: tuple[int, ...], nk: int, dv: int, dtype: Any, lse_dtype: Any, device: Any, weights: bool = True
) -> Result:
    """The result of rows that attend nothing: zero ``out (*lead, Dv)``, zero ``weights
    (*lead, Nk)`` (when asked for) and ``lse (*lead) = -inf``."""
    out = xp.zeros((*lead, dv), dtype=dtype, device=device)
    w = xp.zeros((*lead, nk), dtype=dtype, device=device) if weights else None
    return Result(out, w, xp.full(lead, -float("inf"), dtype=lse_dtype, device=device))


def softmax_lse(xp: Any, x: Array, axis: int = -1, sinks: Array | None = None) -> tuple[Array, Array]:
    """``(softmax(x), logsumexp(x))`` along ``axis`` in the dtype of ``x``; lse keeps no axis.

    ``sinks`` (broadcasting to ``x`` with ``axis`` of size 1): one more logit per row that joins
    the denominator and gets no weight of its own (attention sinks; ``-inf``: none).
    """
    if x.shape[axis] == 0 and sinks is None:  # an empty row: nothing to attend
        return x, xp.full(tuple(n for a, n in enumerate(x.shape) if a != axis % x.ndim), -float("inf"), dtype=x.dtype)
    m = (
        xp.max(x, axis=axis, keepdims=True)
        if x.shape[axis]
        else xp.full_like(xp.sum(x, axis=axis, keepdims=True), -float("inf"))
    )
    if sinks is not None:
        sinks = xp.astype(sinks, x.dtype)
        m = xp.maximum(m, sinks)
    e = xp.exp(x - safe_max(xp, m))
    l = xp.sum(e, axis=axis, keepdims=True)
    if sinks is not None:
        l = l + xp.exp(sinks - safe_max(xp, m))
    a, lse = finalise(xp, e, l, m)
    return a, xp.squeeze(lse, axis=axis)


def with_sinks(xp: Any, res: Result, sinks: Array) -> Result:
    """``res`` (attention without sinks) with one extra logit per row in every denominator:
    ``lse' = log(exp(lse) + exp(sink))``, ``out' = out · exp(lse − lse')`` (weights likewise).

    The sink is a part with no value, merged like ``merge_attention`` merges parts; written with
    the library's own ops, so autograd reaches ``sinks`` (and ``out``, ``lse`` of the impl).
    """
    lse = res.lse
    assert lse is not None  # every impl without sinks of its own returns lse
    sink = xp.astype(sinks, lse.dtype)
    m = safe_max(xp, xp.maximum(lse, sink))
    lse2 = xp.log(xp.exp(lse - m) + xp.exp(sink - m)) + m
    nothing = lse == -float("inf")
    scale = xp.where(nothing, xp.zeros_like(lse), xp.exp(xp.where(nothing, xp.zeros_like(lse), lse) - lse2))
    out = res.out * xp.astype(scale[..., None], res.out.dtype)
    weights = None if res.weights is None else res.weights * xp.astype(scale[..., None], res.weights.dtype)
    return Result(out, weights, lse2)


def _numbers(x: Any, axis: Any) -> tuple[Any, Array, int]:
    """``(xp, x in its compute dtype, axis)``: integers are computed in float64 (NumPy's float, as
    ``scipy.special.softmax`` does), half precision in float32; bools and other kinds refused."""
    x = as_array(x, "x")
    xp = namespace(x=x)
    if is_bool(x) or not (is_floating(x) or _is_integer(x)):
        raise DTypeError(f"x has dtype {dtype_name(x)}; softmax and logsumexp need numbers (floats or integers)")
    if x.ndim == 0:
        raise ShapeError("x is a scalar (0-d); softmax and logsumexp need at least one axis")
    try:
        check_int(axis, "axis", minimum=-x.ndim, maximum=x.ndim - 1, error=ShapeError)
    except ShapeError:
        raise ShapeError(
            f"axis={axis!r} is not an axis of x of shape {tuple(x.shape)}: give an integer in {-x.ndim}..{x.ndim - 1}"
        ) from None
    ct = xp.float64 if _is_integer(x) else compute_dtype(xp, x)
    return xp, xp.astype(x, ct), int(axis)


def _is_integer(x: Array) -> bool:
    return dtype_name(x).startswith(("int", "uint"))


def softmax(x: Array, axis: int = -1) -> Array:
    """Stable softmax along ``axis``; a row that is all ``-inf`` gives zeros (never NaN).

    Half-precision input is computed in float32 and returned in its own dtype; integer input
    is computed and returned in float64.

    >>> softmax(np.array([0.0, np.log(3.0)]))
    array([0.25, 0.75])
    """
    x = as_array(x, "x")
    xp, xc, axis = _numbers(x, axis)
    a, _ = softmax_lse(xp, xc, axis)
    return a if _is_integer(x) or a.dtype == x.dtype else xp.astype(a, x.dtype)


def logsumexp(x: Array, axis: int = -1) -> Array:
    """Stable ``log(sum(exp(x)))`` along ``axis`` (removed); a row that is all ``-inf`` gives ``-inf``.

    Half-precision input is computed and returned in float32, integer input in float64.
    """
    xp, xc, axis = _numbers(x, axis)
    return softmax_lse(xp, xc, axis)[1]


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
    w = xp.exp(lse - safe_max(xp, m))  # each part's share, up to the common factor exp(m)
    out, merged = finalise(xp, xp.sum(w * o, axis=0), xp.sum(w, axis=0), m)
    return (out if out.dtype == outs[0].dtype else xp.astype(out, outs[0].dtype)), merged[..., 0]
