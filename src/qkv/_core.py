"""``qkv.attention`` and ``qkv.attention_backward``: validate, normalise, dispatch.

The first lines turn the contract's shortcuts into one ``Mask``, one float bias and one
``ScoreMod`` (``_impls._call.Call``); the impl computes ``Result(out, weights, lse)``; only
the last line picks the tuple API.md promises.
"""

from typing import Any, Literal, overload

from . import masks
from ._backend import as_array, compute_dtype, device, is_bool, is_floating, namespace
from ._checks import check_covers, check_dropout, check_qkv, check_scale
from ._impls import Call, choose
from ._impls._autograd import with_autograd
from ._typing import Array, Result
from .errors import DTypeError, MaskError, ShapeError
from .masks import Mask
from .scores import ScoreMod


def _split_mask(mask: Any, causal: bool) -> tuple[Mask | None, Array | None]:
    """``mask=`` and ``causal=`` -> ``(Mask or None, float bias or None)``."""
    bias = None
    if mask is None or isinstance(mask, Mask):
        m = mask
    elif hasattr(mask, "dtype") and hasattr(mask, "shape"):
        if is_bool(mask):
            m = masks.from_dense(mask)
        elif is_floating(mask):
            m, bias = None, mask
        else:
            raise MaskError(
                f"mask has dtype {str(mask.dtype).removeprefix('torch.')} and shape {tuple(mask.shape)}; "
                "pass a boolean array (True = may attend), a float bias or a qkv.masks.Mask"
            )
    else:
        raise MaskError(f"mask must be a boolean array, a float array or a qkv.masks.Mask, got {type(mask).__name__}")
    if causal:
        m = masks.causal() if m is None else m & masks.causal()
    return m, bias


def _call(q, k, v, mask, causal, scale, score_mod, dropout=0.0, rng=None, weights=False, lse=False) -> Call:
    q, k, v = as_array(q, "q"), as_array(k, "k"), as_array(v, "v")
    arrays = {"q": q, "k": k, "v": v}
    if mask is not None and not isinstance(mask, Mask) and hasattr(mask, "shape"):
        arrays["mask"] = mask
    namespace(**arrays)  # mixed NumPy / torch -> DTypeError (a TypeError)
    dims = check_qkv(q, k, v)
    m, bias = _split_mask(mask, causal)
    if m is not None:
        lead = m.tile(0, 1, 0, 1, dims.nq, dims.nk).shape[:-2]  # a 1x1 tile: batch axes, cheaply
        check_covers("mask", (*lead, dims.nq, dims.nk), dims.score_shape)
        if m.tiles is not None and (m.blocks(dims.nq, dims.nk, dims.nq, dims.nk) == masks.FULL).all():
            m = None  # hides nothing here (e.g. causal for one query against a cache): no mask at all
    if bias is not None:
        check_covers("mask", tuple(bias.shape), dims.score_shape)
    if score_mod is not None and not isinstance(score_mod, ScoreMod):
        raise DTypeError(f"score_mod must be a qkv.scores.ScoreMod, got {type(score_mod).__name__}")
    return Call(
        q, k, v, dims, m, bias, score_mod, check_scale(scale, dims.dk), check_dropout(dropout), rng, weights, lse
    )


def _no_keys_or_queries(c: Call) -> Result:
    """Nq = 0 or Nk = 0: every query row attends nothing, so zeros and ``lse = -inf``."""
    xp, d = namespace(q=c.q), c.dims
    dev = device(c.q)
    out = xp.zeros((*d.score_shape[:-1], d.dv), dtype=c.q.dtype, device=dev)
    weights = xp.zeros(d.score_shape, dtype=c.q.dtype, device=dev)
    lse = xp.full(d.score_shape[:-1], -float("inf"), dtype=compute_dtype(xp, c.q), device=dev)
    return Result(out, weights, lse)


def _no_gradients(dout: Array, c: Call, out: Array, lse: Array, dlse: Array | None = None) -> tuple[Array, ...]:
    xp = namespace(q=c.q)
    return tuple(xp.zeros_like(x) for x in (c.q, c.k, c.v))


_no_keys_or_queries_autograd = with_autograd(_no_keys_or_queries, _no_gradients)


def _empty(c: Call) -> Result:
    """``_no_keys_or_queries`` as one autograd node for torch (zero gradients, not a detached result)."""
    res = _no_keys_or_queries_autograd(c)
    return res if res.weights is not None else res._replace(weights=_no_keys_or_queries(c).weights)


@overload
def attention(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Any = ...,
    causal: bool = ...,
    scale: float | None = ...,
    score_mod: ScoreMod | None = ...,
    dropout: float = ...,
    rng: Any = ...,
    impl: str = ...,
    return_weights: Literal[False] = ...,
    return_lse: Literal[False] = ...,
) -> Array: ...
@overload
def attention(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Any = ...,
    causal: bool = ...,
    scale: float | None = ...,
    score_mod: ScoreMod | None = ...,
    dropout: float = ...,
    rng: Any = ...,
    impl: str = ...,
    return_weights: bool = ...,
    return_lse: bool = ...,
) -> Any: ...


def attention(
    q,
    k,
    v,
    *,
    mask=None,
    causal=False,
    scale=None,
    score_mod=None,
    dropout=0.0,
    rng=None,
    impl="auto",
    return_weights=False,
    return_lse=False,
):
    """Exact softmax attention ``softmax(q kᵀ · scale + bias) v``.

    q (*B, H, Nq, Dk), k (*B, Hkv, Nk, Dk), v (*B, Hkv, Nk, Dv) -> out (*B, H, Nq, Dv).
    Leading axes broadcast; ``H % Hkv == 0`` (grouped / multi-query heads, each kv head
    serving ``H // Hkv`` consecutive query heads). NumPy in -> NumPy out, torch in -> torch
    out (same dtype and device); half precision accumulates in float32.

    - ``mask``: boolean array (True = may attend), float array (added to the scores) or a
      ``qkv.masks.Mask``; broadcasts to ``(*B, H, Nq, Nk)``. ``causal=True`` adds
      ``masks.causal()`` (bottom-right: query ``i`` sees key ``j <= i + Nk - Nq``).
    - ``score_mod``: a ``qkv.scores.ScoreMod`` applied to the scaled scores before masking.
    - ``dropout``: inverted dropout on the weights, drawn from ``rng``.
    - Returns ``out``, or ``(out, weights)``, ``(out, lse)``, ``(out, weights, lse)``;
      ``weights (*B, H, Nq, Nk)`` are those multiplied into ``v`` (after dropout);
      ``lse (*B, H, Nq)`` is float32 for half inputs. A row with nothing to attend gives
      zeros, zero weights and ``lse = -inf``.

    >>> out = attention(q, k, v, causal=True)
    >>> out, lse = attention(q, k, v, mask=masks.sliding_window(128), return_lse=True)
    """
    c = _call(q, k, v, mask, causal, scale, score_mod, dropout, rng, return_weights, return_lse)
    chosen = choose(impl, c)
    res = _empty(c) if c.dims.nq * c.dims.nk == 0 else chosen.forward(c)
    picked = [res.out]
    if return_weights:
        picked.append(res.weights)
    if return_lse:
        picked.append(res.lse)
    return tuple(picked) if len(picked) > 1 else res.out  # API.md order: out, weights, lse


def attention_backward(dout, q, k, v, out, lse, *, mask=None, causal=False, scale=None, score_mod=None, impl="auto"):
    """The analytic backward pass of ``attention`` (without dropout): ``(dq, dk, dv)``.

    ``dout``, ``out (*B, H, Nq, Dv)`` and ``lse (*B, H, Nq)`` come from the forward pass with
    the same ``mask``, ``causal``, ``scale`` and ``score_mod``. Gradients have the shapes of
    ``q``, ``k``, ``v`` (summed over the query heads of each kv head and over broadcast axes).
    Rows with nothing to attend get zero gradients.

        dV = Aᵀ dO    dA = dO Vᵀ    dS = A ∘ (dA − rowsum(dO ∘ O))
        dQ = dS K · scale           dK = dSᵀ Q · scale
    """
    c = _call(q, k, v, mask, causal, scale, score_mod)
    dout, out, lse = as_array(dout, "dout"), as_array(out, "out"), as_array(lse, "lse")
    namespace(q=c.q, dout=dout, out=out, lse=lse)
    expected = (*c.dims.score_shape[:-1], c.dims.dv)
    for name, x, shape in (("dout", dout, expected), ("out", out, expected), ("lse", lse, expected[:-1])):
        if tuple(x.shape) != shape:
            raise ShapeError(
                f"{name} has shape {tuple(x.shape)} but the forward pass gives {shape} "
                f"(q: {tuple(c.q.shape)}, k: {tuple(c.k.shape)}, v: {tuple(c.v.shape)})"
            )
    chosen = choose(impl, c)
    if c.dims.nq * c.dims.nk == 0:  # nothing attended: every gradient is zero
        xp = namespace(q=c.q)
        return tuple(xp.zeros_like(x) for x in (c.q, c.k, c.v))
    return tuple(chosen.backward(dout, c, out, lse))
