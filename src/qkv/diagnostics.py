"""Diagnostics for attention weights and outputs: entropy, sanity checks, and the error of an approximation.

Rows are the last axis but one: ``weights (..., Nq, Nk)``, one distribution over keys per
query row; outputs ``(..., Nq, Dv)``. NumPy in -> NumPy out, torch in -> torch out (computed in
float32 for half precision, float64 stays float64). Every function is exact arithmetic on what
it is given: nothing renormalises the rows (``check`` says whether they sum to 1).

- ``entropy(weights, mask=None)``: nats per row, and normalised by ``log`` of the number of
  keys the row may attend (1 = uniform over them, 0 = one key).
- ``check(weights)``: row sums, finiteness, negative entries, empty rows; raises on request.
- ``compare(approx_out, exact_out)``: relative error per row and overall.
- ``kl(p_weights, q_weights)``: ``KL(p ‖ q)`` per row, in nats.
- ``mass_outside(weights, mask)``: the attention mass a sparse pattern leaves out.
- ``cache_error(q, k, v, dtype)``: what storing ``k`` and ``v`` in 8 bits changes, per head.

    >>> out, w = qkv.attention(q, k, v, return_weights=True)
    >>> qkv.diagnostics.check(w).ok
    True
    >>> qkv.diagnostics.compare(qkv.approx.performer(q, k, v), out).overall
"""

import math
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import numpy as np

from ._backend import (
    as_array,
    compute_dtype,
    device,
    dtype_name,
    from_numpy,
    is_bool,
    is_floating,
    namespace,
    to_numpy,
)
from ._typing import Array
from .errors import ArgumentError, DTypeError, MaskError, ShapeError
from .masks import Mask

TOLERANCE = {"float64": 1e-10, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}
"""Default bound on ``|row sum − 1|`` per dtype: a few units of the dtype's rounding of the
weights (half-precision weights are stored rounded, so their sums are off by up to ~1 ulp)."""


def _weights(x: Any, name: str) -> tuple[Any, Array]:
    x = as_array(x, name)
    if not is_floating(x):
        raise DTypeError(f"{name} has dtype {dtype_name(x)}; expected floating-point weights")
    if x.ndim < 1:
        raise ShapeError(f"{name} is a scalar; expected weights (..., Nq, Nk) with rows on the last axis")
    xp = namespace(**{name: x})
    ct = compute_dtype(xp, x)
    return xp, (x if x.dtype == ct else xp.astype(x, ct))


def _mask(m: Any, like: Array, name: str = "mask") -> Array:
    """A ``qkv.masks.Mask`` or boolean array (True = may attend) as a boolean array beside ``like``."""
    if isinstance(m, Mask):
        if like.ndim < 2:
            raise ShapeError(f"weights has shape {tuple(like.shape)}; a Mask needs weights (..., Nq, Nk)")
        m = np.asarray(m.dense(like.shape[-2], like.shape[-1]))
    m = as_array(m, name)
    if not is_bool(m):
        raise MaskError(f"{name} has dtype {dtype_name(m)}; pass a boolean array (True = may attend) or a Mask")
    if isinstance(m, np.ndarray):
        m = from_numpy(m, like)
    namespace(weights=like, **{name: m})
    try:
        shape = np.broadcast_shapes(tuple(m.shape), tuple(like.shape))
    except ValueError:
        shape = None
    if shape != tuple(like.shape):
        raise MaskError(
            f"{name} has shape {tuple(m.shape)}, which does not broadcast to the weights' "
            f"{tuple(like.shape)} (..., Nq, Nk)"
        )
    return m


class Entropy(NamedTuple):
    """Per-row entropy ``(..., Nq)``: ``nats`` and ``normalised`` (nats / log of the keys a row may attend)."""

    nats: Array
    normalised: Array


def entropy(weights: Array, mask: Any = None) -> Entropy:
    """``H = −Σⱼ A log A`` per row in nats (``0 · log 0 = 0``), and ``H / log n``.

    ``n`` is the number of keys each row may attend: those ``mask`` allows (a boolean array or
    a ``qkv.masks.Mask``), or without a mask the keys with non-zero weight (qkv gives a hidden
    key exactly zero weight, so this recovers the mask; keys whose weight underflowed to 0 count
    as hidden, which matters only for rows whose entropy is ~0 anyway). A row that may attend
    one key, and an empty row, have normalised entropy 0; uniform weights over the ``n`` keys
    have 1.

    >>> entropy(np.full((1, 4), 0.25)).normalised
    array([1.])
    """
    xp, a = _weights(weights, "weights")
    pos = a > 0
    nats = -xp.sum(xp.where(pos, a * xp.log(xp.where(pos, a, xp.ones_like(a))), xp.zeros_like(a)), axis=-1)
    allowed = pos if mask is None else _mask(mask, a)
    n = xp.sum(xp.astype(allowed, a.dtype) + xp.zeros_like(a), axis=-1)  # + zeros: broadcast a smaller mask
    many = n > 1
    log_n = xp.log(xp.where(many, n, xp.full_like(n, math.e)))
    return Entropy(nats + 0.0, xp.where(many, nats / log_n, xp.zeros_like(nats)))  # + 0.0: no -0.0


@dataclass(frozen=True)
class Report:
    """What ``check`` found. ``max_row_error`` is ``max |row sum − 1|`` over non-empty rows
    (rows summing to exactly 0 are empty: nothing could be attended); ``ok`` means every
    entry is finite and non-negative and every non-empty row sums to 1 within ``tolerance``."""

    rows: int
    empty_rows: int
    row_sum_min: float
    row_sum_max: float
    max_row_error: float
    nonfinite: int
    negative: int
    tolerance: float

    @property
    def finite(self) -> bool:
        return self.nonfinite == 0

    @property
    def ok(self) -> bool:
        return self.finite and self.negative == 0 and self.max_row_error <= self.tolerance

    def problems(self) -> list[str]:
        out = []
        if self.nonfinite:
            out.append(f"{self.nonfinite} non-finite entries")
        if self.negative:
            out.append(f"{self.negative} negative entries")
        if not self.max_row_error <= self.tolerance:
            out.append(f"a row sums to 1 ± {self.max_row_error:.3g} (tolerance {self.tolerance:.1g})")
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: every field, plus ``finite`` and ``ok``."""
        return {**asdict(self), "finite": self.finite, "ok": self.ok}

    def __str__(self) -> str:
        head = "ok" if self.ok else "NOT OK: " + "; ".join(self.problems())
        return (
            f"{head} — {self.rows} rows ({self.empty_rows} empty), row sums in "
            f"[{self.row_sum_min:.6g}, {self.row_sum_max:.6g}], max |sum − 1| {self.max_row_error:.3g}"
        )


def check(weights: Array, *, tolerance: float | None = None, raise_on_error: bool = False) -> Report:
    """Row sums, finiteness, negative entries and empty rows of ``weights (..., Nq, Nk)``.

    ``tolerance`` bounds ``|row sum − 1|`` (default by dtype: ``TOLERANCE``). With
    ``raise_on_error=True`` a failed check raises ``ArgumentError`` (a ``ValueError``) naming
    what is wrong, instead of only saying so in the report.

    >>> check(np.array([[0.5, 0.5], [0.0, 0.0]]))  # one row, one empty row
    """
    xp, a = _weights(weights, "weights")
    tol = TOLERANCE.get(dtype_name(as_array(weights, "weights")), 1e-5) if tolerance is None else float(tolerance)
    if not tol >= 0:
        raise ArgumentError(f"tolerance must be a number >= 0, got {tolerance!r}")
    finite = xp.isfinite(a)
    sums = xp.sum(xp.where(finite, a, xp.zeros_like(a)), axis=-1)
    empty = (sums == 0) & xp.all(finite, axis=-1)
    err = xp.where(empty, xp.zeros_like(sums), xp.abs(sums - 1.0))
    err = xp.where(xp.all(finite, axis=-1), err, xp.full_like(err, math.inf))
    rows = math.prod(a.shape[:-1])
    report = Report(
        rows=rows,
        empty_rows=int(xp.sum(xp.astype(empty, xp.int64))),
        row_sum_min=float(xp.min(sums)) if rows else 0.0,
        row_sum_max=float(xp.max(sums)) if rows else 0.0,
        max_row_error=float(xp.max(err)) if rows else 0.0,
        nonfinite=int(xp.sum(xp.astype(~finite, xp.int64))),
        negative=int(xp.sum(xp.astype(a < 0, xp.int64))),
        tolerance=tol,
    )
    if raise_on_error and not report.ok:
        raise ArgumentError(f"weights {tuple(a.shape)} fail the check: {'; '.join(report.problems())}")
    return report


class Comparison(NamedTuple):
    """``rows (..., Nq)``: ``‖a_i − e_i‖ / ‖e_i‖`` per output row; ``overall``: ``‖a − e‖ / ‖e‖``
    (Frobenius, over everything); ``max`` and ``mean`` of ``rows``."""

    rows: Array
    overall: float
    max: float
    mean: float

    def to_dict(self) -> dict[str, float]:
        return {"overall": self.overall, "max": self.max, "mean": self.mean}


def compare(approx_out: Array, exact_out: Array) -> Comparison:
    """Relative error of an approximate attention output against the exact one, per row and overall.

    Both ``(..., Nq, Dv)`` of the same shape. A row whose exact output is all zeros (an empty
    row) has relative error ``‖a_i‖`` (its absolute error): 0 when the approximation also gives
    zeros.

    >>> compare(qkv.approx.linear_attention(q, k, v), qkv.attention(q, k, v)).overall
    """
    xp, a = _weights(approx_out, "approx_out")
    _, e = _weights(exact_out, "exact_out")
    namespace(approx_out=a, exact_out=e)
    if tuple(a.shape) != tuple(e.shape):
        raise ShapeError(
            f"approx_out has shape {tuple(a.shape)} but exact_out has {tuple(e.shape)}; "
            "compare outputs of the same call"
        )
    diff = xp.sum((a - e) ** 2, axis=-1)
    norm = xp.sum(e * e, axis=-1)
    rows = xp.sqrt(xp.where(norm > 0, diff / xp.where(norm > 0, norm, xp.ones_like(norm)), diff))
    total = float(xp.sum(norm))
    overall = math.sqrt(float(xp.sum(diff)) / total) if total > 0 else math.sqrt(float(xp.sum(diff)))
    n = math.prod(rows.shape)
    return Comparison(rows, overall, float(xp.max(rows)) if n else 0.0, float(xp.mean(rows)) if n else 0.0)


def kl(p_weights: Array, q_weights: Array) -> Array:
    """``KL(p ‖ q) = Σⱼ p log(p / q)`` per row, in nats, ``(..., Nq)``.

    Direction: ``p`` is the reference (the exact weights), ``q`` the approximation: the
    information lost when ``q`` stands in for ``p``. Zeros: a key with ``p = 0`` adds nothing
    (``0 · log 0 = 0``, whatever ``q``); a key with ``p > 0`` and ``q = 0`` makes the row
    ``+inf`` (``q`` rules out a key ``p`` uses; for sparse patterns ``mass_outside`` measures
    that instead). Identical rows give exactly 0; rows that do not sum to 1 may give a slightly
    negative value, which is left as computed.
    """
    xp, p = _weights(p_weights, "p_weights")
    _, q = _weights(q_weights, "q_weights")
    namespace(p_weights=p, q_weights=q)
    if tuple(p.shape) != tuple(q.shape):
        raise ShapeError(f"p_weights has shape {tuple(p.shape)} but q_weights has {tuple(q.shape)}")
    one = xp.ones_like(p)
    used, ruled_out = p > 0, (p > 0) & (q <= 0)
    terms = xp.where(
        used & ~ruled_out, p * (xp.log(xp.where(used, p, one)) - xp.log(xp.where(q > 0, q, one))), xp.zeros_like(p)
    )
    inf = xp.full(terms.shape[:-1], math.inf, dtype=p.dtype, device=device(p))
    return xp.where(xp.any(ruled_out, axis=-1), inf, xp.sum(terms, axis=-1))


def mass_outside(weights: Array, mask: Any) -> Array:
    """``Σⱼ A_ij`` over the keys ``mask`` hides, per row ``(..., Nq)``.

    ``weights`` are usually exact attention weights, ``mask`` a sparse pattern (a boolean array,
    True = may attend, or a ``qkv.masks.Mask``): the share of attention the pattern would drop.
    A mask that keeps everything gives 0.

    >>> mass_outside(w, qkv.masks.sliding_window(256, causal=False))
    """
    xp, a = _weights(weights, "weights")
    m = _mask(mask, a)
    return xp.sum(xp.where(m, xp.zeros_like(a), a), axis=-1)


class CacheError(NamedTuple):
    """What storing ``k`` and ``v`` quantized changes in one attention call (``cache_error``): the
    ``format`` and ``per`` (``"token"`` or ``"head"``: one scale per token or per kv head).

    ``max_error``, ``mean_error``: ``max`` and mean ``|out_q − out|`` per query head ``(H,)``
    (over batch, query rows and features), ``relative``: ``rms(out_q − out) / rms(out)`` per head;
    ``k_error``, ``v_error``: per kv head ``(Hkv,)``, the largest over tokens of a token's
    ``max |x̂ − x| / max |x|`` (the stored values' own error, relative to each token's size);
    ``nbytes`` the quantized cache's bytes (values and scales), ``float_nbytes`` the cache's bytes
    as given. NumPy float64 arrays."""

    format: str
    per: str
    max_error: np.ndarray
    mean_error: np.ndarray
    relative: np.ndarray
    k_error: np.ndarray
    v_error: np.ndarray
    nbytes: int
    float_nbytes: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: the arrays as lists."""
        return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in self._asdict().items()}


def _per_head(x: np.ndarray, has_heads: bool) -> np.ndarray:
    """``(..., H, N, D)`` -> ``(H, everything else)`` (one head without a head axis)."""
    if not has_heads:
        return x.reshape(1, -1)
    return np.moveaxis(x.reshape(-1, *x.shape[-3:]), 1, 0).reshape(x.shape[-3], -1)


def cache_error(q: Array, k: Array, v: Array, dtype: Any, *, per: str = "token", **attention_kwargs: Any) -> CacheError:
    """Per-head error of ``qkv.attention`` over ``k``, ``v`` stored in ``dtype`` (``"int8"``,
    ``"float8_e4m3fn"``, ``"float8_e5m2"``; ``per`` is ``qkv.quantize``'s ``scale=``, ``"token"``
    or ``"head"``, named apart from attention's own ``scale``) against the same call over ``k``,
    ``v`` as given.

    q (*B, H, Nq, Dk), k (*B, Hkv, Nk, Dk), v (*B, Hkv, Nk, Dv); ``attention_kwargs`` go to both
    calls (``causal=True``, ``mask=``, ``scale=``, ...). Returns a ``CacheError``.

    >>> e = qkv.diagnostics.cache_error(q, k, v, "int8", causal=True)
    >>> e.max_error, e.relative          # (H,) each
    """
    from ._core import attention
    from ._quant import dequantize, quantize

    qk, qv = quantize(k, dtype, scale=per), quantize(v, dtype, scale=per)
    exact = to_numpy(attention(q, k, v, **attention_kwargs)).astype(np.float64)
    approx = to_numpy(attention(q, qk, qv, **attention_kwargs)).astype(np.float64)
    heads = max(len(q.shape), len(k.shape), len(v.shape)) >= 3
    diff, ref = _per_head(np.abs(approx - exact), heads), _per_head(exact, heads)
    rms = np.sqrt((ref**2).mean(1))
    rel = np.sqrt((diff**2).mean(1)) / np.where(rms > 0, rms, 1.0)

    def stored(x: Any, qx: Any) -> np.ndarray:  # each token's error relative to its own largest value
        x64 = to_numpy(x).astype(np.float64)
        err = np.abs(to_numpy(dequantize(qx, "float64")) - x64).max(-1, initial=0.0)
        size = np.abs(x64).max(-1, initial=0.0)
        rel = (err / np.where(size > 0, size, 1.0))[..., None]
        return _per_head(rel, heads).max(1, initial=0.0)

    item = {"float64": 8, "float32": 4}.get(dtype_name(k), 2)
    return CacheError(
        qk.format,
        per,
        diff.max(1, initial=0.0),
        diff.mean(1) if diff.shape[1] else np.zeros(diff.shape[0]),
        rel,
        stored(k, qk),
        stored(v, qv),
        qk.nbytes + qv.nbytes,
        item * (math.prod(k.shape) + math.prod(v.shape)),
    )
