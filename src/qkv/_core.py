"""``qkv.attention``, ``qkv.attention_backward`` and ``qkv.dispatch``: validate, normalise, dispatch.

The first lines turn the contract's shortcuts into one ``Mask``, one float bias and one
``ScoreMod`` (``_impls.build_call``); ``_impls.plan`` decides the impl and engine and says why; the impl
computes ``Result(out, weights, lse)``; only the last line picks the tuple API.md promises.
"""

import math
from typing import Any

import numpy as np

from . import masks
from ._backend import as_array, compute_dtype, device, is_torch, is_traced, namespace, no_grad
from ._finite import check_overflow, overflow_error
from ._impls import (
    REGISTRY,
    Call,
    Dispatch,
    Plan,
    build_call,
    compiled_attention,
    empty_rows_overflowed,
    lean_attention,
    plan,
    with_autograd,
)
from ._quant import Quantized
from ._softmax import empty_result, with_sinks
from ._torch import autocast
from ._typing import Array, Result
from .errors import ArgumentError, ShapeError
from .scores import ScoreMod


def _nothing_attended(c: Call, p: Plan | None = None) -> Result:
    """Nq = 0 or Nk = 0: every query row attends nothing, so zeros and ``lse = -inf`` (B = 0 or
    H = 0: the empty arrays)."""
    xp, d = namespace(q=c.q), c.dims
    return empty_result(
        xp, d.score_shape[:-1], d.nk, d.dv, c.q.dtype, compute_dtype(xp, c.q), device(c.q), weights=c.want_weights
    )


def _zero_gradients(
    dout: Array, c: Call, p: Plan | None, out: Array, lse: Array, dlse: Array | None = None
) -> tuple[Array, ...]:
    xp = namespace(q=c.q)
    return tuple(xp.zeros_like(x) for x in (c.q, c.k, c.v))


_nothing_attended_autograd = with_autograd(_nothing_attended, _zero_gradients)


def _empty(c: Call, p: Plan) -> Result:
    """``_nothing_attended`` as one autograd node for torch (zero gradients, not a detached result)."""
    res = _nothing_attended_autograd(c, p)
    return res if res.weights is not None or not c.want_weights else res._replace(weights=_nothing_attended(c).weights)


def run(c: Call, impl: str = "auto") -> Result:
    """Run ``c`` on ``impl`` (``"auto"`` decides): ``Result(out, weights, lse)``.

    What ``attention`` does between its first line and its last; tests and benchmarks that
    build their own ``Call`` (e.g. with forced flash ``tiles``) run it here. One decision
    (``plan``), which the chosen implementation then runs.
    """
    p = plan(impl, c)
    c = p.call
    chosen = REGISTRY[p.impl]
    empty = math.prod(c.dims.score_shape) == 0  # Nq, Nk, B or H of 0: nothing to compute
    with np.errstate(all="ignore"):  # overflow is reported below, as an error, never as a warning
        res = _empty(c, p) if empty else chosen.forward(c, p)
        if c.sinks is not None and (empty or not chosen.sinks):
            res = with_sinks(namespace(q=c.q), res, c.sinks)
    if empty or p.engine == "native":  # the compiled kernel reports overflow itself, in its pass
        return res
    with no_grad(c.q):  # a check, not part of the graph (float() of a tensor that requires grad warns)
        xp = namespace(q=c.q)
        # sinks are inputs too: a NaN sink gives its head's rows NaN, as the compiled kernel does
        check_overflow(xp, res.out, c.q, c.k, c.v, c.bias, c.sinks, scale=c.scale, lse=res.lse, score_mod=c.score_mod)
        if res.lse is not None and empty_rows_overflowed(xp, c, res.lse):
            inputs = [x for x in (c.q, c.k, c.v, c.bias, c.sinks) if x is not None]
            if all(bool(xp.all(xp.isfinite(x))) for x in inputs):
                raise overflow_error(c.q, c.k, c.scale, score_mod=c.score_mod)
    return res


def dispatch(q: Array, k: Array, v: Array, *, impl: str = "auto", **attention_kwargs: Any) -> Dispatch:
    """What ``qkv.attention(q, k, v, impl=impl, **attention_kwargs)`` would run, without running it.

    Returns ``Dispatch(impl, engine, reason, tiles, threads, kv_format)``: ``impl`` is
    ``"reference"``, ``"flash"`` or ``"torch"``; ``engine`` says how flash runs (``"native"``, the
    compiled tile loop, or ``"array"``; None for the others); ``reason`` is one sentence; ``tiles``
    ``(block_q, block_k)`` and ``threads`` are the compiled engine's (None otherwise);
    ``kv_format`` names the format of a quantized ``k``/``v`` (None for float ones). It is the
    very plan ``attention`` makes and runs: read from shapes, dtypes, the device and the mask's
    structure, never from the arrays' values. The arguments are checked exactly as
    ``attention`` checks them (same errors); a named ``impl`` that cannot run the call raises
    the same ``ArgumentError``.

    >>> qkv.dispatch(q, k, v, causal=True)
    Dispatch(impl='flash', engine='native', reason='...', tiles=(64, 128), threads=2, kv_format=None)
    """
    kw = dict(attention_kwargs)
    want_weights, want_lse = kw.pop("return_weights", False), kw.pop("return_lse", False)
    c = build_call(q, k, v, want_weights=want_weights, want_lse=want_lse, **kw)
    return plan(impl, c).report()


def attention(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Any = None,
    causal: bool = False,
    scale: float | None = None,
    score_mod: ScoreMod | None = None,
    dropout: float = 0.0,
    rng: Any = None,
    impl: str = "auto",
    return_weights: bool = False,
    return_lse: bool = False,
    bias: Any = None,
    sinks: Any = None,
) -> Any:
    """Exact softmax attention ``softmax(q kᵀ · scale + bias) v``.

    q (*B, H, Nq, Dk), k (*B, Hkv, Nk, Dk), v (*B, Hkv, Nk, Dv) -> out (*B, H, Nq, Dv).
    Leading axes broadcast; ``H % Hkv == 0`` (grouped / multi-query heads, each kv head
    serving ``H // Hkv`` consecutive query heads). NumPy in -> NumPy out, torch in -> torch
    out (same dtype and device); half precision accumulates in float32.

    - ``k`` and ``v`` may be a quantized cache, both ``qkv.Quantized`` of one format
      (``qkv.quantize(k, "int8")``): the result is attention over the dequantized values
      ``values · scales``; the compiled kernel reads the 8-bit values in place, the other
      engines dequantize them to ``q``'s dtype first (``qkv.dispatch`` says which). A torch
      ``q`` that requires grad gets its gradient; the cache gets none.

    - ``mask``: boolean array (True = may attend), float array (added to the scores) or a
      ``qkv.masks.Mask``; broadcasts to ``(*B, H, Nq, Nk)``. ``causal=True`` adds
      ``masks.causal()`` (bottom-right: query ``i`` sees key ``j <= i + Nk - Nq``).
    - ``score_mod``: a ``qkv.scores.ScoreMod`` applied to the scaled scores before masking.
    - ``bias``: a float array added to the scores (after the score mod), broadcasting to
      ``(*B, H, Nq, Nk)`` (``(Nk,)`` means ``(1, Nk)``); it may sit beside a ``Mask`` in
      ``mask=``, which keeps its tile skipping. Gradients reach a torch ``bias``.
    - ``sinks``: one float logit per head, ``(H,)`` or broadcasting to ``(*B, H)``, that joins
      every row's softmax denominator and carries no value (gpt-oss attention sinks, flash-attn's
      ``learnable_sink``); a row with nothing to attend then has ``lse = sink``. Gradients
      reach a torch ``sinks``.
    - ``dropout``: inverted dropout on the weights, drawn from ``rng``.
    - ``impl``: ``"reference"``, ``"flash"``, ``"torch"`` or ``"auto"``; ``qkv.dispatch`` says
      which one ``"auto"`` picks for a call, and why.
    - Returns ``out``, or ``(out, weights)``, ``(out, lse)``, ``(out, weights, lse)``;
      ``weights (*B, H, Nq, Nk)`` are those multiplied into ``v`` (after dropout);
      ``lse (*B, H, Nq)`` is float32 for half inputs. A row with nothing to attend gives
      zeros, zero weights and ``lse = -inf``.

    >>> out = attention(q, k, v, causal=True)
    >>> out, lse = attention(q, k, v, mask=masks.sliding_window(128), return_lse=True)
    """
    if is_torch(q):
        q, k, v, autocast_off = autocast(q, k, v)
        if autocast_off is not None:  # under torch.autocast: computed in its dtype, as SDPA is
            with autocast_off:
                kw = dict(mask=mask, causal=causal, scale=scale, score_mod=score_mod, dropout=dropout, rng=rng)
                kw.update(impl=impl, return_weights=return_weights, return_lse=return_lse, bias=bias, sinks=sinks)
                return attention(q, k, v, **kw)
    if is_torch(q) and masks.compiling():  # torch.compile / torch.export: one operator node
        kw = dict(mask=mask, causal=causal, scale=scale, score_mod=score_mod, dropout=dropout, rng=rng, bias=bias)
        res = compiled_attention(q, k, v, want_weights=return_weights, sinks=sinks, **kw)
        if res is not None:
            return picked(res, False, return_lse)
        return _eager(q, k, v, impl=impl, return_weights=return_weights, return_lse=return_lse, sinks=sinks, **kw)
    if (
        mask is None
        and is_torch(q)
        and impl in ("auto", "flash")
        and score_mod is None
        and bias is None
        and sinks is None
        and not return_weights
        and type(dropout) in (int, float)
        and dropout == 0
    ):  # the calls most made: the lean road to the kernel (the same decision, a dozen tests)
        res = lean_attention(q, k, v, causal, scale)
        if res is not None:
            return picked(res, False, return_lse)
    c = build_call(
        q,
        k,
        v,
        mask=mask,
        causal=causal,
        scale=scale,
        score_mod=score_mod,
        dropout=dropout,
        rng=rng,
        want_weights=return_weights,
        want_lse=return_lse,
        bias=bias,
        sinks=sinks,
    )
    return picked(run(c, impl), return_weights, return_lse)


def _eager(q: Any, k: Any, v: Any, **kw: Any) -> Any:
    """``attention`` outside the traced graph: what the operator cannot express (an opaque Python
    mask or score mod, weights, a learned bias) runs eagerly, the graph broken around it."""
    import torch

    return torch.compiler.disable(_attention_body)(q, k, v, **kw)


def _attention_body(q: Any, k: Any, v: Any, *, impl: str, return_weights: bool, return_lse: bool, **kw: Any) -> Any:
    c = build_call(q, k, v, want_weights=return_weights, want_lse=return_lse, **kw)
    return picked(run(c, impl), return_weights, return_lse)


def picked(res: Result, weights: bool, lse: bool) -> Any:
    """The contract's return value: ``out``, or ``(out, weights)``, ``(out, lse)``, ``(out, weights, lse)``."""
    chosen = [res.out]
    if weights:
        chosen.append(res.weights)
    if lse:
        chosen.append(res.lse)
    return tuple(chosen) if len(chosen) > 1 else res.out  # API.md order: out, weights, lse


def check_saved(c: Call, dout: Any, out: Any, lse: Any) -> tuple[Array, Array, Array]:
    """``dout``, ``out (*B, H, Nq, Dv)`` and ``lse (*B, H, Nq)`` as arrays of ``c``'s kind, shapes checked."""
    dout, out, lse = as_array(dout, "dout"), as_array(out, "out"), as_array(lse, "lse")
    namespace(q=c.q, dout=dout, out=out, lse=lse)
    expected = (*c.dims.score_shape[:-1], c.dims.dv)
    for name, x, shape in (("dout", dout, expected), ("out", out, expected), ("lse", lse, expected[:-1])):
        if tuple(x.shape) != shape:
            raise ShapeError(
                f"{name} has shape {tuple(x.shape)} but the forward pass gives {shape} "
                f"(q: {tuple(c.q.shape)}, k: {tuple(c.k.shape)}, v: {tuple(c.v.shape)})"
            )
    return dout, out, lse


def attention_backward(
    dout, q, k, v, out, lse, *, mask=None, causal=False, scale=None, score_mod=None, impl="auto", bias=None, sinks=None
):
    """The analytic backward pass of ``attention`` (without dropout): ``(dq, dk, dv)``.

    ``dout``, ``out (*B, H, Nq, Dv)`` and ``lse (*B, H, Nq)`` come from the forward pass with
    the same ``mask``, ``causal``, ``scale`` and ``score_mod``. Gradients have the shapes of
    ``q``, ``k``, ``v`` (summed over the query heads of each kv head and over broadcast axes).
    Rows with nothing to attend get zero gradients. With ``bias`` or ``sinks``, ``out`` and
    ``lse`` are those the forward pass gave with them (the sinks are in ``lse``, so the same
    formulas hold); the gradients of ``bias`` and ``sinks`` themselves come from torch autograd.

        dV = Aᵀ dO    dA = dO Vᵀ    dS = A ∘ (dA − rowsum(dO ∘ O))
        dQ = dS K · scale           dK = dSᵀ Q · scale
    """
    if isinstance(k, Quantized) or isinstance(v, Quantized):
        raise ArgumentError(
            "attention_backward takes float k and v: a quantized cache (qkv.Quantized) is inference state, and "
            "its gradient would be one with respect to the dequantized values; pass qkv.dequantize(k), "
            "qkv.dequantize(v) if that is what you want"
        )
    c = build_call(q, k, v, mask=mask, causal=causal, scale=scale, score_mod=score_mod, bias=bias, sinks=sinks)
    return run_backward(c, dout, out, lse, impl)


def run_backward(c: Call, dout: Any, out: Any, lse: Any, impl: str = "auto") -> tuple[Array, Array, Array]:
    """``attention_backward`` for a built ``Call`` (``run``'s counterpart): ``(dq, dk, dv)``."""
    dout, out, lse = check_saved(c, dout, out, lse)
    p = plan(impl, c)
    c = p.call
    chosen = REGISTRY[p.impl]
    if math.prod(c.dims.score_shape) == 0:  # nothing attended (or no rows): every gradient is zero
        return _zero_gradients(dout, c, p, out, lse)
    xp = namespace(q=c.q)
    if not is_traced(lse) and bool(xp.any(xp.isnan(lse))):
        raise ArgumentError(
            "lse holds NaN: the forward pass gave NaN (NaN or inf in its inputs), which has no gradient; "
            "attention_backward needs the out and lse of a finite forward pass"
        )
    with np.errstate(all="ignore"), no_grad(c.q):  # an analytic backward: the gradients carry no graph
        grads = tuple(chosen.backward(dout, c, p, out, lse))
    if p.engine != "native":  # the compiled kernel reports overflow itself
        check_overflow(xp, grads[0], c.q, c.k, c.v, c.bias, c.sinks, dout, out, scale=c.scale, score_mod=c.score_mod)
    return grads
