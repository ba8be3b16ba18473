"""``qkv.explain``: the reference computation replayed step by step, every intermediate kept.

The arithmetic is ``_impls.reference``'s own: each recorded value comes from calling the same
named step function the impl calls (``scores``, ``scaled``, ``modded``, ``biased``, ``masked``,
``normalised``, ``output``, and backward ``grad_values`` … ``grad_keys``), in the same order
(Vaswani et al., arXiv:1706.03762, eq. 1):

    S = Q Kᵀ  ->  S · scale  ->  score_mod  ->  + bias  ->  where(mask, S, −∞)
      ->  A = softmax(S)  ->  O = A V                 (and, with grad=True, the backward pass)

Only observations (row maxima, row sums, entropies) are computed here. Inputs are converted
to NumPy (float32 for half precision, otherwise their own dtype).
"""

import math
from typing import Any

import numpy as np

from .._backend import HALF, as_array, dtype_name, is_torch, namespace, to_numpy, unbroadcast
from .._finite import check_overflow
from .._impls import Call, build_call, dequantized, plan
from .._impls import reference as ref
from ..diagnostics import entropy
from ..errors import ArgumentError, ShapeError
from ._trace import Step, Trace

EXAMPLE = {
    "q": [[1.0, 0.0], [0.0, 1.0]],  # (Nq, Dk) = (2, 2)
    "k": [[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]],  # (Nk, Dk) = (3, 2)
    "v": [[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]],  # (Nk, Dv) = (3, 2)
}
"""The built-in worked example; its output is ``O = [[0.5989, 1.0000], [0.5989, 1.2033]]``."""


def explain(
    q: Any = None,
    k: Any = None,
    v: Any = None,
    *,
    mask: Any = None,
    causal: bool = False,
    scale: float | None = None,
    score_mod: Any = None,
    dropout: float = 0.0,
    grad: bool = False,
    dout: Any = None,
    bias: Any = None,
    sinks: Any = None,
) -> Trace:
    """Replay ``qkv.attention(q, k, v, ...)`` on the reference path, recording every step.

    q (*B, H, Nq, Dk), k (*B, Hkv, Nk, Dk), v (*B, Hkv, Nk, Dv), as for ``qkv.attention``, whose
    checks and errors apply; with q, k, v all None, the built-in 2×2 / 3×2 / 3×2 example. ``mask``,
    ``causal``, ``scale``, ``score_mod``, ``bias`` and ``sinks`` mean what they mean there (a sink
    is recorded as a step of its own); dropout is not replayed
    (``ArgumentError`` if > 0). ``grad=True`` (implied by ``dout``) adds the backward steps for
    ``dO = dout`` (ones by default); their dQ, dK, dV equal ``qkv.attention_backward``'s.

    >>> explain().out.round(4)
    array([[0.5989, 1.    ],
           [0.5989, 1.2033]])
    >>> explain(q, k, v, causal=True, grad=True)["dS"].shape     # (*B, H, Nq, Nk)
    """
    example = q is None and k is None and v is None
    if example:
        q, k, v = (np.array(EXAMPLE[n]) for n in ("q", "k", "v"))
    elif q is None or k is None or v is None:
        missing = ", ".join(n for n, x in (("q", q), ("k", k), ("v", v)) if x is None)
        raise ArgumentError(
            f"explain needs q, k and v together (missing: {missing}), or none of them for the built-in example"
        )
    c = build_call(
        q, k, v, mask=mask, causal=causal, scale=scale, score_mod=score_mod, dropout=dropout, bias=bias, sinks=sinks
    )
    if c.dropout > 0:
        raise ArgumentError(
            f"explain replays the deterministic computation; dropout={c.dropout} is not "
            "supported (explain with dropout=0)"
        )
    n = _numpy_call(dequantized(c))  # a quantized cache: the steps show the values it stands for
    with np.errstate(all="ignore"):  # overflow is an error below, never a warning
        steps, mod_grad = _forward(n, default_scale=scale is None)
        check_overflow(np, next(s.value for s in steps if s.name == "O"), n.q, n.k, n.v, n.bias, scale=n.scale)
        if grad or dout is not None:
            steps += _backward(n, _dout(dout, c, n), steps, mod_grad)
    inputs = {"q": c.q.shape, "k": c.k.shape, "v": c.v.shape}
    if c.bias is not None:
        inputs["bias"] = c.bias.shape
    if c.sinks is not None:
        inputs["sinks"] = c.sinks.shape[:-1]
    options = {
        "example": example,
        "causal": bool(causal),
        "scale": n.scale,
        "default_scale": scale is None,
        "mask": None if n.mask is None else n.mask.name,
        "bias": c.bias is not None,
        "score_mod": None if n.score_mod is None else n.score_mod.name,
        "grad": bool(grad or dout is not None),
        "dtype": dtype_name(n.q),
        "dispatch": plan("auto", c).report()._asdict(),  # what qkv.attention(impl="auto") runs for this call
    }
    return Trace(tuple(steps), {name: tuple(int(x) for x in s) for name, s in inputs.items()}, options)


def _numpy(x: Any) -> np.ndarray:
    """NumPy copy of an input in the dtype the reference computes in (float32 for half precision)."""
    if is_torch(x) and dtype_name(x) in HALF:
        x = x.float()  # NumPy has no bfloat16
    a = to_numpy(x)
    return a.astype(np.float32) if dtype_name(a) in HALF else a


def _numpy_call(c: Call) -> Call:
    q, k, v = (_numpy(x) for x in (c.q, c.k, c.v))
    bias = None if c.bias is None else _numpy(c.bias).astype(q.dtype, copy=False)
    sinks = None if c.sinks is None else _numpy(c.sinks).astype(q.dtype, copy=False)
    return c._replace(q=q, k=k, v=v, bias=bias, sinks=sinks)


def _dout(dout: Any, c: Call, n: Call) -> np.ndarray:
    """``dO (*B, H, Nq, Dv)``: the given one (checked like ``attention_backward``'s) or ones."""
    shape = (*c.dims.score_shape[:-1], c.dims.dv)
    if dout is None:
        return np.ones(shape, dtype=n.q.dtype)
    dout = as_array(dout, "dout")
    namespace(q=c.q, dout=dout)  # mixed NumPy / torch -> DTypeError
    if tuple(dout.shape) != shape:
        raise ShapeError(
            f"dout has shape {tuple(dout.shape)} but the forward pass gives {shape} "
            f"(q: {tuple(c.q.shape)}, k: {tuple(c.k.shape)}, v: {tuple(c.v.shape)})"
        )
    return _numpy(dout).astype(n.q.dtype, copy=False)


def _forward(c: Call, default_scale: bool) -> tuple[list[Step], Any]:
    """The forward steps and the score mod's derivative ``ds'/ds`` (None when there is none or it is 1)."""
    xp, d = namespace(q=c.q), c.dims
    steps = [
        Step("Q", "Q", c.q, "queries: one row per query position (..., Nq, Dk)"),
        Step("K", "K", c.k, "keys: one row per key position (..., Nk, Dk)"),
        Step("V", "V", c.v, "values: one row per key position (..., Nk, Dv)"),
    ]
    s = ref.scores(xp, c, c.q, c.k)
    steps.append(Step("S", "S = Q Kᵀ", s, "dot product of every query with every key"))
    s = ref.scaled(s, c)
    why = f"the default 1/√Dk with Dk = {d.dk}" if default_scale else "as given"
    steps.append(Step("S_scaled", f"S · scale (scale = {c.scale:.4f})", s, f"scale is {why}"))
    s, mod_grad = ref.modded(s, c.score_mod)
    if c.score_mod is not None:
        steps.append(
            Step(
                "S_mod",
                f"score_mod(S) (score_mod = {c.score_mod.name})",
                s,
                "the score mod, applied to the scaled scores",
            )
        )
    if c.bias is not None:
        s = ref.biased(xp, s, c.bias)
        steps.append(Step("S_bias", "S + bias", s, "the float mask, added to the scores"))
    if c.mask is not None:
        s = ref.masked(xp, s, c.mask)
        note = f"mask = {c.mask.name}; True = may attend; a hidden key scores −∞, weight 0"
        steps.append(Step("S_masked", "where(mask, S, −∞)", s, note))
    steps.append(
        Step(
            "row_max",
            "m = maxⱼ S",
            np.max(s, axis=-1, initial=-np.inf),
            "subtracted before exp so it cannot overflow; −∞ = nothing to attend (shift by 0)",
        )
    )
    if c.sinks is not None:
        steps.append(
            Step("sinks", "sink logit per head", c.sinks[..., 0], "joins every row's Σ exp in A; carries no value")
        )
    a, lse = ref.normalised(xp, s, c.sinks)
    steps.append(Step("A", "A = softmax(S)", a, "exp(S − m) / Σⱼ exp(S − m): how much each query reads each key"))
    steps.append(Step("row_sum", "Σⱼ A", np.sum(a, axis=-1), "1 for every row; 0 for a row with nothing to attend"))
    steps.append(
        Step(
            "entropy",
            "H = −Σⱼ A log A",
            entropy(a).nats,
            f"nats per row: 0 = one key, log Nk = {math.log(max(d.nk, 1)):.4f} = uniform",
        )
    )
    o = ref.output(xp, a, c.v, c)
    steps.append(Step("O", "O = A V", o, "each output row is the A-weighted average of the value rows"))
    steps.append(Step("lse", "lse = log Σⱼ exp S", lse, "kept for the backward pass; −∞ for an empty row"))
    return steps, mod_grad


def _backward(c: Call, do: np.ndarray, forward: list[Step], mod_grad: Any) -> list[Step]:
    """The analytic backward steps for ``L = Σ dO ∘ O``, reduced to the shapes of q, k, v."""
    xp, d = namespace(q=c.q), c.dims
    a, o = (next(s.value for s in forward if s.name == n) for n in ("A", "O"))
    dv = unbroadcast(xp, ref.grad_values(xp, a, do, c), tuple(c.v.shape))
    da = ref.grad_weights(xp, do, c.v, c)
    big_d = ref.rowsum(xp, do, o)
    ds = ref.grad_scores(a, da, big_d)
    steps = [
        Step("dO", "dO", do, "the upstream gradient ∂L/∂O (ones unless dout is given)"),
        Step("dV", "dV = Aᵀ dO", dv, _summed(a.shape[:-2] + (d.nk, d.dv), c.v.shape)),
        Step("dA", "dA = dO Vᵀ", da, "∂L/∂A"),
        Step("D", "D = rowsum(dO ∘ O)", big_d, "equals Σⱼ A ∘ dA: what the softmax subtracts"),
        Step("dS", "dS = A ∘ (dA − D)", ds, "∂L/∂S through the softmax; 0 where A is 0"),
    ]
    if mod_grad is not None:
        ds = ref.through_mod(ds, mod_grad)
        steps.append(Step("dS_mod", "dS ∘ ∂score_mod/∂S", ds, "chain rule through the score mod"))
    dq = unbroadcast(xp, ref.grad_queries(xp, ds, c.k, c), tuple(c.q.shape))
    dk = unbroadcast(xp, ref.grad_keys(xp, ds, c.q, c), tuple(c.k.shape))
    steps += [
        Step("dQ", "dQ = dS K · scale", dq, _summed(a.shape[:-1] + (d.dk,), c.q.shape)),
        Step("dK", "dK = dSᵀ Q · scale", dk, _summed(a.shape[:-2] + (d.nk, d.dk), c.k.shape)),
    ]
    return steps


def _summed(full: tuple[int, ...], shape: tuple[int, ...]) -> str:
    if tuple(full) == tuple(shape):
        return ""
    return f"summed from {tuple(full)} over the heads / batch axes this input is shared by"
