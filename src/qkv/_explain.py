"""``qkv.explain``: the reference computation replayed step by step, every intermediate kept.

The arithmetic is that of ``_impls.reference`` (Vaswani et al., arXiv:1706.03762, eq. 1), split
into named steps so each one can be printed, exported or checked:

    S = Q Kᵀ  ->  S · scale  ->  score_mod  ->  + bias  ->  where(mask, S, −∞)
      ->  A = softmax(S)  ->  O = A V                 (and, with grad=True, the backward pass)

Inputs are converted to NumPy (float32 for half precision, otherwise their own dtype); a
``Trace`` holds complete values even where its text and HTML renderings abbreviate them.
"""

import html
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, overload

import numpy as np

from ._backend import HALF, as_array, dtype_name, is_torch, namespace, to_numpy, unbroadcast
from ._core import _call
from ._impls._call import Call
from ._impls.reference import group_q, ungroup
from ._softmax import softmax_lse
from .errors import ArgumentError, ShapeError

EXAMPLE = {
    "q": [[1.0, 0.0], [0.0, 1.0]],  # (Nq, Dk) = (2, 2)
    "k": [[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]],  # (Nk, Dk) = (3, 2)
    "v": [[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]],  # (Nk, Dv) = (3, 2)
}
"""The built-in worked example; its output is ``O = [[0.5989, 1.0000], [0.5989, 1.2033]]``."""

EDGE = 4  # rendered rows / columns kept at each end of a long axis
MATRICES = 4  # rendered 2-D slices of an array with leading (batch, head) axes


@dataclass(frozen=True, eq=False)
class Step:
    """One intermediate: ``name`` (the key in the trace), ``formula``, read-only ``value``, ``note``."""

    name: str
    formula: str
    value: np.ndarray
    note: str = ""

    def __post_init__(self) -> None:
        value = np.array(self.value)  # a private copy, frozen like the record
        value.flags.writeable = False
        object.__setattr__(self, "value", value)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: ``value`` as nested lists, non-finite numbers as ``"-inf"``, ``"inf"``, ``"nan"``."""
        return {
            "name": self.name,
            "formula": self.formula,
            "shape": list(self.shape),
            "note": self.note,
            "value": _jsonable(self.value.tolist()),
        }


@dataclass(frozen=True, eq=False)
class Trace(Sequence[Step]):
    """The steps of one ``explain`` call, in order; index by position or by name (``trace["A"]``).

    ``str(trace)`` is aligned text (long axes abbreviated), ``to_dict()`` is JSON-safe and
    ``to_html()`` a self-contained HTML fragment.
    """

    steps: tuple[Step, ...]
    inputs: Mapping[str, tuple[int, ...]]
    options: Mapping[str, Any]

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", MappingProxyType(dict(self.inputs)))
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))

    @overload
    def __getitem__(self, key: int | str) -> Step: ...
    @overload
    def __getitem__(self, key: slice) -> tuple[Step, ...]: ...
    def __getitem__(self, key: int | str | slice) -> Step | tuple[Step, ...]:
        return self.step(key) if isinstance(key, str) else self.steps[key]

    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)

    def __contains__(self, item: object) -> bool:
        return item in self.names if isinstance(item, str) else item in self.steps

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.steps)

    def step(self, name: str) -> Step:
        """The step called ``name`` (``KeyError`` naming the available steps otherwise)."""
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(f"no step {name!r} in this trace; steps: {', '.join(self.names)}")

    @property
    def out(self) -> np.ndarray:
        """``O (*B, H, Nq, Dv)``."""
        return self.step("O").value

    @property
    def weights(self) -> np.ndarray:
        """``A (*B, H, Nq, Nk)``."""
        return self.step("A").value

    @property
    def lse(self) -> np.ndarray:
        """``lse (*B, H, Nq)``."""
        return self.step("lse").value

    @property
    def grads(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """``(dQ, dK, dV)`` with the shapes of ``q``, ``k``, ``v``, or None without ``grad=True``."""
        if "dQ" not in self:
            return None
        return self.step("dQ").value, self.step("dK").value, self.step("dV").value

    def to_dict(self) -> dict[str, Any]:
        """``{"inputs": {name: shape}, "options": {...}, "steps": [step.to_dict(), ...]}``, JSON-safe."""
        return {
            "inputs": {n: list(s) for n, s in self.inputs.items()},
            "options": dict(self.options),
            "steps": [s.to_dict() for s in self.steps],
        }

    def __str__(self) -> str:
        return _text(self)

    def __repr__(self) -> str:
        return f"Trace({len(self)} steps: {', '.join(self.names)})"

    def to_html(self) -> str:
        """A self-contained HTML fragment: a table per step, text escaped, no external assets."""
        return _html(self)


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
) -> Trace:
    """Replay ``qkv.attention(q, k, v, ...)`` on the reference path, recording every step.

    q (*B, H, Nq, Dk), k (*B, Hkv, Nk, Dk), v (*B, Hkv, Nk, Dv), as for ``qkv.attention``, whose
    checks and errors apply; with q, k, v all None, the built-in 2×2 / 3×2 / 3×2 example. ``mask``,
    ``causal``, ``scale`` and ``score_mod`` mean what they mean there; dropout is not replayed
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
    c = _call(q, k, v, mask, causal, scale, score_mod, dropout)
    if c.dropout > 0:
        raise ArgumentError(
            f"explain replays the deterministic computation; dropout={c.dropout} is not "
            "supported (explain with dropout=0)"
        )
    n = _numpy_call(c)
    steps, mod_grad = _forward(n, default_scale=scale is None)
    if grad or dout is not None:
        steps += _backward(n, _dout(dout, c, n), steps, mod_grad)
    inputs = {"q": c.q.shape, "k": c.k.shape, "v": c.v.shape}
    if c.bias is not None:
        inputs["bias"] = c.bias.shape
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
    return c._replace(q=q, k=k, v=v, bias=bias)


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
    s = ungroup(xp, group_q(xp, c.q, d) @ c.k.mT, d)
    steps.append(Step("S", "S = Q Kᵀ", s, "dot product of every query with every key"))
    s = s * c.scale
    why = f"the default 1/√Dk with Dk = {d.dk}" if default_scale else "as given"
    steps.append(Step("S_scaled", f"S · scale (scale = {c.scale:.4f})", s, f"scale is {why}"))
    mod_grad = None
    if c.score_mod is not None:
        i, j = np.arange(d.nq)[:, None], np.arange(d.nk)[None, :]
        s, mod_grad = c.score_mod.with_grad(s, i, j, d.nq, d.nk)
        steps.append(
            Step(
                "S_mod",
                f"score_mod(S) (score_mod = {c.score_mod.name})",
                s,
                "the score mod, applied to the scaled scores",
            )
        )
    if c.bias is not None:
        s = s + c.bias
        steps.append(Step("S_bias", "S + bias", s, "the float mask, added to the scores"))
    if c.mask is not None:
        s = np.where(c.mask.dense(d.nq, d.nk), s, -np.inf)
        steps.append(
            Step(
                "S_masked",
                "where(mask, S, −∞)",
                s,
                f"mask = {c.mask.name}; True = may attend; a hidden key scores −∞, weight 0",
            )
        )
    steps.append(
        Step(
            "row_max",
            "m = maxⱼ S",
            np.max(s, axis=-1, initial=-np.inf),
            "subtracted before exp so it cannot overflow; −∞ = nothing to attend (shift by 0)",
        )
    )
    a, lse = softmax_lse(xp, s)
    steps.append(Step("A", "A = softmax(S)", a, "exp(S − m) / Σⱼ exp(S − m): how much each query reads each key"))
    steps.append(Step("row_sum", "Σⱼ A", np.sum(a, axis=-1), "1 for every row; 0 for a row with nothing to attend"))
    steps.append(
        Step(
            "entropy",
            "H = −Σⱼ A log A",
            _entropy(a),
            f"nats per row: 0 = one key, log Nk = {math.log(max(d.nk, 1)):.4f} = uniform",
        )
    )
    o = ungroup(xp, group_q(xp, a, d) @ c.v, d)
    steps.append(Step("O", "O = A V", o, "each output row is the A-weighted average of the value rows"))
    steps.append(Step("lse", "lse = log Σⱼ exp S", lse, "kept for the backward pass; −∞ for an empty row"))
    return steps, mod_grad


def _backward(c: Call, do: np.ndarray, forward: list[Step], mod_grad: Any) -> list[Step]:
    """The analytic backward steps for ``L = Σ dO ∘ O``, reduced to the shapes of q, k, v."""
    xp, d = namespace(q=c.q), c.dims
    a, o = (next(s.value for s in forward if s.name == n) for n in ("A", "O"))
    ag, dog = group_q(xp, a, d), group_q(xp, do, d)
    dv = _reduce(xp, ag.mT @ dog, c.v, d)
    da = ungroup(xp, dog @ c.v.mT, d)
    big_d = np.sum(do * o, axis=-1)
    ds = a * (da - big_d[..., None])
    steps = [
        Step("dO", "dO", do, "the upstream gradient ∂L/∂O (ones unless dout is given)"),
        Step("dV", "dV = Aᵀ dO", dv, _summed(a.shape[:-2] + (d.nk, d.dv), c.v.shape)),
        Step("dA", "dA = dO Vᵀ", da, "∂L/∂A"),
        Step("D", "D = rowsum(dO ∘ O)", big_d, "equals Σⱼ A ∘ dA: what the softmax subtracts"),
        Step("dS", "dS = A ∘ (dA − D)", ds, "∂L/∂S through the softmax; 0 where A is 0"),
    ]
    if mod_grad is not None:
        ds = ds * mod_grad
        steps.append(Step("dS_mod", "dS ∘ ∂score_mod/∂S", ds, "chain rule through the score mod"))
    dsg = group_q(xp, ds, d)
    dq = unbroadcast(xp, ungroup(xp, dsg @ c.k, d) * c.scale, tuple(c.q.shape))
    dk = _reduce(xp, (dsg.mT @ group_q(xp, c.q, d)) * c.scale, c.k, d)
    steps += [
        Step("dQ", "dQ = dS K · scale", dq, _summed(a.shape[:-1] + (d.dk,), c.q.shape)),
        Step("dK", "dK = dSᵀ Q · scale", dk, _summed(a.shape[:-2] + (d.nk, d.dk), c.k.shape)),
    ]
    return steps


def _reduce(xp: Any, g: np.ndarray, x: np.ndarray, d: Any) -> np.ndarray:
    """Sum a kv gradient over broadcast axes (GQA groups are already summed by the grouped matmul)."""
    return unbroadcast(xp, g, tuple(x.shape))


def _summed(full: tuple[int, ...], shape: tuple[int, ...]) -> str:
    if tuple(full) == tuple(shape):
        return ""
    return f"summed from {tuple(full)} over the heads / batch axes this input is shared by"


def _entropy(a: np.ndarray) -> np.ndarray:
    """``−Σⱼ A log A`` per row with ``0 · log 0 = 0`` (no warning for empty rows)."""
    pos = a > 0
    return -np.sum(np.where(pos, a * np.log(np.where(pos, a, 1.0)), 0.0), axis=-1) + 0.0  # + 0.0: no -0.0


def _jsonable(x: Any) -> Any:
    if isinstance(x, list):
        return [_jsonable(e) for e in x]
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


# --------------------------------------------------------------------------- rendering


def _fmt(x: Any) -> str:
    text = f"{float(x):.4f}"
    return "0.0000" if text == "-0.0000" else text  # a tiny negative number is not news


def _cut(n: int) -> list[int | None]:
    """Indices shown along an axis of length ``n``; None marks the elided middle."""
    if n <= 2 * EDGE + 1:
        return list(range(n))
    return [*range(EDGE), None, *range(n - EDGE, n)]


def _matrices(value: np.ndarray) -> Iterator[tuple[str, list[list[str]]]]:
    """``(label, rows of cells)`` for each shown 2-D slice; "…" cells where axes are abbreviated."""
    m = value.reshape(1, 1) if value.ndim == 0 else value.reshape(1, -1) if value.ndim == 1 else value
    lead = list(np.ndindex(*m.shape[:-2]))
    for n, idx in enumerate(lead):
        if n == MATRICES:
            yield f"… {len(lead) - MATRICES} more {m.shape[-2]}×{m.shape[-1]} matrices", []
            return
        rows = [
            [("…" if j is None or i is None else _fmt(m[(*idx, i, j)])) for j in _cut(m.shape[-1])]
            for i in _cut(m.shape[-2])
        ]
        yield (f"[{', '.join(map(str, idx))}]" if idx else ""), rows


def _text(t: Trace) -> str:
    shapes = ", ".join(f"{n} {tuple(s)}" for n, s in t.inputs.items())
    what = f"{shapes} (the built-in example)" if t.options.get("example") else shapes
    lines = [f"qkv.explain: {what}; scale = {t.options['scale']:.4f}; dtype {t.options['dtype']}", ""]
    wn = max(len(s.name) for s in t)
    wf = max(len(s.formula) for s in t)
    ws = max(len(str(s.shape)) for s in t)
    for s in t:
        lines.append(f"{s.name:<{wn}}  {s.formula:<{wf}}  {str(s.shape):<{ws}}  {s.note}".rstrip())
        for label, rows in _matrices(s.value):
            if label:
                lines.append(f"    {label}")
            width = max((len(c) for r in rows for c in r), default=0)
            lines += ["    " + "  ".join(c.rjust(width) for c in r) for r in rows]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


_CSS = (
    ".qkv-trace{font-family:system-ui,sans-serif}.qkv-trace table{border-collapse:collapse;"
    "font-family:ui-monospace,monospace;margin:.25em 0 1em}.qkv-trace td{padding:0 .6em;text-align:right}"
    ".qkv-trace th{text-align:left;font-weight:normal;color:#666}.qkv-trace h3{margin:.5em 0 0}"
)


def _html(t: Trace) -> str:
    e = html.escape
    shapes = ", ".join(f"{n} {tuple(s)}" for n, s in t.inputs.items())
    dtype = e(str(t.options["dtype"]))
    parts = [
        f'<div class="qkv-trace"><style>{_CSS}</style>',
        f"<p>qkv.explain: {e(shapes)}; scale = {t.options['scale']:.4f}; dtype {dtype}</p>",
    ]
    for s in t:
        parts.append(
            f'<section class="qkv-step" data-step="{e(s.name)}">'
            f"<h3><code>{e(s.name)}</code> — {e(s.formula)}</h3>"
            f"<p>shape {e(str(s.shape))}{' — ' + e(s.note) if s.note else ''}</p><table>"
        )
        for label, rows in _matrices(s.value):
            if label:
                parts.append(f'<tr><th colspan="{max(len(rows[0]) if rows else 1, 1)}">{e(label)}</th></tr>')
            parts += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows]
        parts.append("</table></section>")
    parts.append("</div>")
    return "\n".join(parts)
