"""The non-finite contract for the engines that compute with array code (reference, array
engine, SDPA); the compiled kernel keeps it inside its own pass (``_native/finite.hpp``).

A query row that attends a non-finite number — in its own q row, in an attended k or v row, or
in an attended bias entry (NaN or +inf; a bias of -inf hides its key, as a mask does) — gets
``out = NaN`` and ``lse = NaN``; every other row is exactly what it would be without the
non-finite numbers, which are never read where the mask hides them (``_finite.zeroed``).
"""

from typing import Any

import numpy as np

from .._backend import from_numpy, is_traced
from .._finite import bad_rows
from .._typing import Array, Result
from ._call import Call


def _bad_bias(xp: Any, bias: Array) -> Array:
    return xp.isnan(bias) | (bias == float("inf"))


def poisoned_rows(xp: Any, c: Call) -> Array | None:
    """``(*B, H, Nq)`` True for the rows that attend a non-finite input; None when every input is
    finite (the usual case: one look at q, k, v and the bias) or traced (IEEE arithmetic then)."""
    arrays = [c.q, c.k, c.v] + ([c.bias] if c.bias is not None else [])
    if any(is_traced(x) for x in arrays):
        return None
    bq, bk, bv = bad_rows(xp, c.q), bad_rows(xp, c.k), bad_rows(xp, c.v)
    bias_bad = c.bias is not None and bool(xp.any(_bad_bias(xp, c.bias)))
    if bq is None and bk is None and bv is None and not bias_bad:
        return None
    d = c.dims
    allowed = _allowed(xp, c)
    rows = xp.zeros(d.score_shape[:-1], dtype=xp.bool)
    keys = None
    for b in (bk, bv):
        if b is not None:
            keys = b if keys is None else keys | b
    if keys is not None:
        if d.grouped:  # kv head g serves query heads g·r ... g·r + r - 1
            keys = keys[..., np.arange(d.h) // (d.h // d.hkv), :]
        rows = rows | xp.any(allowed & keys[..., None, :], axis=-1)
    if bq is not None:
        rows = rows | (bq & xp.any(allowed, axis=-1))
    if bias_bad:
        rows = rows | xp.any(allowed & _bad_bias(xp, c.bias), axis=-1)
    return rows


def poisoned(xp: Any, res: Result, rows: Array | None) -> Result:
    """``res`` with ``out`` and ``lse`` NaN on ``rows`` (unchanged when None)."""
    if rows is None:
        return res
    nan = float("nan")
    out = xp.where(rows[..., None], xp.asarray(nan, dtype=res.out.dtype), res.out)
    lse = None if res.lse is None else xp.where(rows, xp.asarray(nan, dtype=res.lse.dtype), res.lse)
    return res._replace(out=out, lse=lse)


def _allowed(xp: Any, c: Call) -> Array:
    d = c.dims
    shape = d.score_shape
    allowed = xp.ones(shape, dtype=xp.bool) if c.mask is None else from_numpy(c.mask.dense(d.nq, d.nk), c.q)
    if c.bias is not None:
        allowed = allowed & ~(c.bias == -float("inf"))
    return xp.broadcast_to(allowed, shape)


def empty_rows_overflowed(xp: Any, c: Call, lse: Array) -> bool:
    """Whether a row came out empty (``lse = -inf``) although its mask and bias admit keys: every
    score it admits overflowed towards -inf. Looks at the mask only when some row is empty."""
    if is_traced(lse):
        return False
    empty = lse == -float("inf")
    if not bool(xp.any(empty)):
        return False
    return bool(xp.any(empty & xp.any(_allowed(xp, c), axis=-1)))
