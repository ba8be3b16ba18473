"""The lab's pure handlers for Explain, Heatmap and Positional: request -> JSON-safe dict.

Every number comes from qkv (``qkv.explain``, ``qkv.attention``, ``qkv.diagnostics.entropy``,
``qkv.positional``, ``qkv.scores.alibi``); these functions only choose inputs, check the lab's
limits and shape the answer for the browser. No FastAPI here: testable without a socket.
"""

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

import qkv

from .. import diagnostics, positional, scores
from ..errors import QKVError
from ..masks.spec import MASK_KINDS, MASK_PARAMS, build_mask
from .schemas import ExplainRequest, HeatmapRequest, LabError, Limits, PositionalRequest

DIGITS = 7  # significant digits sent to the browser: far below what a colour or a printed cell shows
TINY = 1e-290  # below it a number is sent unrounded: 10 ** (exponent - DIGITS + 1) stays a normal float above it


def _rounded(x: np.ndarray) -> Any:
    """Nested lists of finite numbers to ``DIGITS`` significant digits; ``None`` where ``x`` is ±inf or NaN.

    Numbers below ``TINY`` in magnitude (subnormal weights, zero) are sent as they are: their
    rounding unit would underflow (a subnormal weight came out NaN and was sent as null)."""
    a = np.asarray(x, dtype=np.float64)
    finite = np.isfinite(a)
    normal = finite & (np.abs(np.where(finite, a, 0.0)) >= TINY)
    v = np.where(normal, a, 1.0)
    e = np.floor(np.log10(np.abs(v))) - (DIGITS - 1)  # the rounding unit is 10 ** e
    inv = 10.0 ** np.maximum(-e, 0)  # divide by an exact power of ten where the unit is below 1
    r = np.where(e < 0, np.round(v * inv) / inv, np.round(v / 10.0 ** np.maximum(e, 0)) * 10.0 ** np.maximum(e, 0))
    out = np.where(normal, r, np.where(finite, a, 0.0)).astype(object)
    out[~finite] = None
    return out.tolist()


def _at_most(value: int, limit: int, what: str, option: str = "") -> None:
    if value > limit:
        hint = f" (start the lab with a larger {option} to allow more)" if option else ""
        raise LabError(f"{what} is {value}, above the lab's limit of {limit}{hint}")


@contextlib.contextmanager
def mask_errors(kind: str, params: dict[str, Any]) -> Iterator[None]:
    """Turn what a mask's parameters can make qkv's mask code raise besides its own typed errors
    (NumPy's ``ValueError`` for a negative seed, ``IndexError`` for an empty list, ``OverflowError``
    for an integer past 64 bits) into a 422 naming the mask; the qkv errors pass through."""
    try:
        yield
    except QKVError:
        raise
    except (ValueError, TypeError, IndexError, OverflowError) as e:
        shown = ", ".join(f"{k}={v!r}"[:80] for k, v in params.items()) or "no parameters"
        raise LabError(f"mask {kind!r} cannot be built with {shown}: {type(e).__name__}: {e}"[:400]) from None


def _overflowed(what: str, fix: str) -> LabError:
    return LabError(f"{what} overflow float64 (the weights would be NaN): {fix}")


def mask_kinds() -> dict[str, Any]:
    """The mask kinds and their parameters (type, default, help) for the pages' controls."""
    return {
        "kinds": list(MASK_KINDS),
        "params": {
            kind: {
                name: {
                    "type": p.type,
                    "default": list(p.default) if isinstance(p.default, tuple) else p.default,
                    "help": p.help,
                }
                for name, p in params.items()
            }
            for kind, params in MASK_PARAMS.items()
        },
    }


def explain(req: ExplainRequest, limits: Limits) -> dict[str, Any]:
    """``qkv.explain(q, k, v, ...).to_dict()`` for 2-D ``q (Nq, Dk)``, ``k (Nk, Dk)``, ``v (Nk, Dv)``."""
    given = {n: m for n, m in (("q", req.q), ("k", req.k), ("v", req.v)) if m is not None}
    arrays: list[Any] = [None, None, None]
    if given:
        missing = [n for n in ("q", "k", "v") if n not in given]
        if missing:
            raise LabError(
                f"give q, k and v together (missing: {', '.join(missing)}), or none of them for the worked example"
            )
        arrays = [np.asarray(given[n], dtype=np.float64) for n in ("q", "k", "v")]
        for name, a in zip("qkv", arrays, strict=True):
            _at_most(a.shape[0], limits.max_n, f"the number of rows (positions) of {name}", "--max-n")
            _at_most(a.shape[1], limits.max_d, f"the number of columns (features) of {name}")
    n_q = 2 if arrays[0] is None else arrays[0].shape[0]
    n_k = 3 if arrays[1] is None else arrays[1].shape[0]
    with mask_errors(req.mask, req.mask_params), np.errstate(all="ignore"):
        mask = build_mask(req.mask, n_q, n_k, **req.mask_params)
        trace = qkv.explain(*arrays, mask=mask, causal=req.causal, scale=req.scale, grad=req.grad)
    # NaN is never a meaningful value of a step (−∞ is: a hidden key); it comes from scores that overflow
    if any(np.isnan(np.asarray(step.value, dtype=np.float64)).any() for step in trace):
        raise _overflowed(
            "the scores Q Kᵀ · scale (or their gradients)", "use smaller numbers in q and k, or a smaller scale"
        )
    return trace.to_dict()


def heatmap(req: HeatmapRequest, limits: Limits) -> dict[str, Any]:
    """Weights ``A (H, Nq, Nk)`` of random Gaussian q, k, v under the mask, scale and temperature,
    with the dense mask, row sums and per-row entropy (nats and normalised)."""
    n_q, n_k = req.n_q, req.n_q if req.n_k is None else req.n_k
    _at_most(n_q, limits.max_n, "n_q (query positions)", "--max-n")
    _at_most(n_k, limits.max_n, "n_k (key positions)", "--max-n")
    _at_most(req.d, limits.max_d, "d (features)")
    _at_most(req.heads, limits.max_heads, "heads")
    rng = np.random.default_rng(req.seed)
    q = rng.standard_normal((req.heads, n_q, req.d))
    k = rng.standard_normal((req.heads, n_k, req.d))
    v = rng.standard_normal((req.heads, n_k, req.d))
    mod = None if req.temperature == 1.0 else scores.temperature(req.temperature)
    with mask_errors(req.mask, req.mask_params), np.errstate(all="ignore"):
        mask = build_mask(req.mask, n_q, n_k, **req.mask_params)
        _, w = qkv.attention(q, k, v, mask=mask, scale=req.scale, score_mod=mod, impl="reference", return_weights=True)
        dense = None if mask is None else np.broadcast_to(mask.dense(n_q, n_k), (n_q, n_k))
    if np.isnan(w).any():
        raise _overflowed(
            f"the scores (scale={req.scale}, temperature={req.temperature})",
            "use a smaller scale or a larger temperature",
        )
    ent = diagnostics.entropy(w, mask=dense)
    return {
        "n_q": n_q,
        "n_k": n_k,
        "d": req.d,
        "heads": req.heads,
        "seed": req.seed,
        "scale": float(1 / np.sqrt(req.d)) if req.scale is None else req.scale,
        "temperature": req.temperature,
        "mask": req.mask,
        "mask_name": None if mask is None else mask.name,
        "allowed": None if dense is None else dense.astype(int).tolist(),
        "weights": _rounded(w),
        "row_sums": _rounded(w.sum(-1)),
        "entropy": _rounded(ent.nats),
        "entropy_normalised": _rounded(ent.normalised),
    }


def _similarity(table: np.ndarray) -> np.ndarray:
    """Cosine similarity of every pair of rows ``(n, n)`` (rows of zeros give 0)."""
    norm = np.linalg.norm(table, axis=-1, keepdims=True)
    unit = table / np.where(norm > 0, norm, 1.0)
    return unit @ unit.T


def positional_view(req: PositionalRequest, limits: Limits, learned: np.ndarray | None = None) -> dict[str, Any]:
    """What the Positional page draws for ``req.kind``: a ``table`` (rows = positions) and a
    ``similarity`` ``(n, n)`` between positions (ALiBi: ``biases (H, n, n)`` and ``slopes``)."""
    _at_most(req.n, limits.max_n, "n (positions)", "--max-n")
    _at_most(req.d, limits.max_d, "d (features)")
    out: dict[str, Any] = {"kind": req.kind, "n": req.n, "d": req.d, "base": req.base}
    if req.kind == "sinusoidal":
        table = positional.sinusoidal(req.n, req.d, base=req.base)
        out.update(
            table=_rounded(table),
            similarity=_rounded(table @ table.T),
            table_label="PE[pos, i]",
            similarity_label="PE[m] · PE[n]",
        )
    elif req.kind == "rope":
        if req.d % 2:
            raise LabError(f"RoPE pairs feature c with c + d/2, so d must be even, got d={req.d}")
        half = req.d // 2
        # The angle of pair c at position p, read back from rope itself: rotating the unit vector
        # e_c moves it to (cos θ, sin θ) in features (c, c + d/2).
        eye = np.broadcast_to(np.eye(req.d)[:half][:, None, :], (half, req.n, req.d))
        rot = positional.rope(np.ascontiguousarray(eye), base=req.base)  # (d/2, n, d)
        angles = np.arctan2(rot[np.arange(half), :, np.arange(half) + half], rot[np.arange(half), :, np.arange(half)])
        # One query vector and one key vector placed at every position: q·k depends on m - n only.
        rng = np.random.default_rng(req.seed)
        x = rng.standard_normal((2, 1, req.d)).repeat(req.n, axis=1)
        qr, kr = positional.rope(x, base=req.base)
        out.update(
            table=_rounded(np.unwrap(angles.T, axis=0)),
            similarity=_rounded(qr @ kr.T),
            table_label="θ[pos, c] (radians)",
            similarity_label="rope(q, m) · rope(k, n)",
        )
    elif req.kind == "alibi":
        _at_most(req.heads, limits.max_heads, "heads")
        z = np.zeros((req.heads, req.n, 1))
        trace = qkv.explain(z, z, z, score_mod=scores.alibi(n_heads=req.heads), causal=req.causal, scale=1.0)
        # the scores are 0, so what is left is the bias (−∞ where the causal mask hides a key)
        biases = trace["S_masked" if req.causal else "S_mod"].value
        out.update(
            slopes=_rounded(positional.alibi_slopes(req.heads)),
            biases=_rounded(biases),
            heads=req.heads,
            causal=req.causal,
        )
    else:
        if learned is None:
            raise LabError(
                "no learned positional table yet: train a model with pos='learned' on the Training page first",
                status=409,
            )
        table = learned[: req.n]
        out.update(
            n=int(table.shape[0]),
            d=int(table.shape[1]),
            table=_rounded(table),
            similarity=_rounded(_similarity(table)),
            table_label="P[pos, i] (trained)",
            similarity_label="cos(P[m], P[n])",
        )
    return out
