"""Non-finite numbers: hidden positions never read, overflow never silent.

Two rules every implementation keeps (``docs/api`` of ``qkv.attention``):

- **A hidden key changes nothing.** A key the mask hides gets weight exactly 0, and its key
  and value rows are never read: an uninitialised KV-cache slot or a padded row may hold NaN or
  inf (``0 · NaN`` is NaN, so products are taken with those rows zeroed, and the rows that do
  attend a non-finite value get the plain product, NaN and all).
- **Finite inputs give a finite result or an error.** Scores that overflow the dtype
  (``|q · k · scale|`` beyond float32's 3.4e38) would make ``inf − inf = NaN`` of every row: qkv
  raises ``ArgumentError`` naming the overflow instead of returning NaN (and NumPy never warns).
  NaN or inf given as input propagates to the rows that attend it, and only to those.
"""

import math
from typing import Any

import numpy as np

from ._backend import dtype_name, is_jax, is_traced, to_numpy
from ._typing import Array
from .errors import ArgumentError


def bad_rows(xp: Any, x: Array) -> Array | None:
    """``(..., N)`` True where a row of ``x (..., N, D)`` holds NaN or inf; None when every row is
    finite (or when ``x`` is a JAX tracer, whose values cannot be looked at: then non-finite
    rows propagate as IEEE arithmetic has them)."""
    if is_traced(x):
        return None
    if isinstance(x, np.ndarray) and x.size and not any(x.strides):  # a broadcast scalar: one look
        return None if np.isfinite(x.flat[0]) else ~np.zeros(x.shape[:-1], dtype=bool)
    if is_jax(x):  # concrete, maybe a constant inside a traced program: look in NumPy (jnp would trace)
        found = ~np.all(np.isfinite(to_numpy(x)), axis=-1)
        return xp.asarray(found) if found.any() else None
    bad = ~xp.all(xp.isfinite(x), axis=-1)
    return bad if bool(xp.any(bad)) else None


def zeroed(xp: Any, x: Array, bad: Array | None) -> Array:
    """``x`` with the rows ``bad`` marks set to 0 (``x`` itself when there are none)."""
    return x if bad is None else xp.where(bad[..., None], xp.zeros_like(x), x)


def hidden_to_inf(xp: Any, s: Array, hidden: Array) -> Array:
    """``where(hidden, -inf, s)``: unlike adding ``-inf``, a NaN score of a hidden key is dropped too."""
    return xp.where(hidden, xp.asarray(-float("inf"), dtype=s.dtype), s)


def overflow_error(
    q: Array, k: Array, scale: float, rows: int | None = None, *, score_mod: Any = None
) -> ArgumentError:
    """The contract's error for finite inputs whose scores overflow the compute dtype (naming max
    |q|, max |k|, Dk and the scale: what to change). Looks at q and k: only on this error path.

    Where ``|q · k · scale|`` cannot reach the dtype's limit, the NaN did not come from the dot
    products: with a ``score_mod`` the error says the mod made the scores NaN or infinite."""
    big = [float(np.max(np.abs(to_numpy(x)))) if math.prod(x.shape) else 0.0 for x in (q, k)]
    bound = big[0] * big[1] * q.shape[-1] * abs(scale)
    f64 = dtype_name(q) == "float64"
    limit = float(np.finfo(np.float64 if f64 else np.float32).max)
    where = f" in {rows} row{'s' if rows != 1 else ''}" if rows else ""
    if score_mod is not None and bound < limit:
        return ArgumentError(
            f"the score mod {score_mod.name} made scores NaN or infinite{where} although q, k, v and the bias "
            f"are finite and |q·kᵀ·scale| <= {bound:.3g} cannot overflow "
            f"{'float64' if f64 else 'float32'}: look at what it computes (a log or a division of a score, "
            "an inf or NaN parameter such as alibi slopes)"
        )
    return ArgumentError(
        f"the scores q·kᵀ·scale overflow {'float64' if f64 else 'float32'}{where} "
        f"(max |q| = {big[0]:.3g}, max |k| = {big[1]:.3g}, Dk = {q.shape[-1]}, scale = {scale:.3g}: up to "
        f"{bound:.3g} > {limit:.3g}), which would make every weight NaN; scale q and k down"
        + ("" if f64 else ", or compute in float64")
    )


def _largest(x: Array) -> float:
    return float(np.max(np.abs(to_numpy(x).astype(np.float64)))) if math.prod(x.shape) else 0.0


def gradient_overflow_error(
    q: Array,
    k: Array,
    v: Array,
    dout: Array,
    scale: float,
    rows: int,
    *,
    dlse: Array | None = None,
    score_mod: Any = None,
) -> ArgumentError:
    """The backward's error for finite inputs whose gradients came out non-finite, with the bounds
    that show what overflowed (looked at only on this error path). From ``sum_j P_ij = 1``:
    ``|dP| <= Dv·max|dO|·max|v|`` and ``sum_j |dS_ij| <= 2·|dP| + max|dlse|`` (times a mod's
    derivative), so ``|dQ| <= |scale|·(2·|dP| + max|dlse|)·max|k|``, ``|dK|`` that times
    ``max|q|·Nq·H/Hkv`` instead of ``max|k|``, ``|dV| <= max|dO|·Nq·H/Hkv``; the scores as in
    ``overflow_error``."""
    f64 = dtype_name(q) == "float64"
    limit = float(np.finfo(np.float64 if f64 else np.float32).max)
    name = "float64" if f64 else "float32"
    mq, mk, mv, mo = (_largest(x) for x in (q, k, v, dout))
    sc = abs(scale)
    if mq * mk * q.shape[-1] * sc >= limit:
        return overflow_error(q, k, scale, rows, score_mod=score_mod)
    share = q.shape[-2] * max(1, (q.shape[-3] if q.ndim >= 3 else 1) // max(1, k.shape[-3] if k.ndim >= 3 else 1))
    dp = v.shape[-1] * mo * mv
    ds = 2 * dp + (0.0 if dlse is None else _largest(dlse))
    bounds = {"dQ": sc * ds * mk, "dK": sc * ds * mq * share, "dV": mo * share}
    where = f"{rows} row{'s' if rows != 1 else ''}"
    over = {n: b for n, b in bounds.items() if not b < limit}
    facts = (
        f"max |q| = {mq:.3g}, max |k| = {mk:.3g}, max |v| = {mv:.3g}, max |dout| = {mo:.3g}, scale = {scale:.3g}, "
        f"Dv = {v.shape[-1]}: |dP| = |dO·vᵀ| <= {dp:.3g}"
    )
    if over:
        shown = ", ".join(f"|{n}| up to {b:.3g}" for n, b in over.items())
        return ArgumentError(
            f"the gradients overflow {name} in {where} ({facts}, so {shown} > {limit:.3g}); scale dout, v or the "
            "scale down" + ("" if f64 else ", or compute in float64")
        )
    if score_mod is not None:
        return ArgumentError(
            f"the score mod {score_mod.name} made gradients NaN or infinite in {where} although every input is "
            f"finite and no gradient can overflow {name} ({facts}): look at what it computes and its derivative"
        )
    return ArgumentError(
        f"the gradients came out NaN or infinite in {where} although every input is finite and none can "
        f"overflow {name} ({facts}); this is a bug of qkv's compiled kernel: please report it with the call"
    )


def check_overflow(
    xp: Any, out: Array, *arrays: Any, scale: float, lse: Array | None = None, score_mod: Any = None
) -> None:
    """Raise ``ArgumentError`` if the result holds NaN although every input in ``arrays`` is finite
    (the scores overflowed, or ``score_mod`` made them NaN); NaN from non-finite inputs (sinks
    included, when given among ``arrays``) is left as it is. For the engines that do not report
    overflow themselves (the compiled kernel does): reads ``lse`` (a pass over ``(..., Nq)``, not
    over the output) where the engine gives it, else ``out``; the inputs only when something is
    amiss."""
    if is_traced(out) or (lse is not None and is_traced(lse)):
        return
    if lse is not None:
        if bool(xp.all(xp.isfinite(lse) | (lse == -float("inf")))):
            return  # every row finite or empty
    else:
        with np.errstate(over="ignore", invalid="ignore"):  # a float16 sum may overflow: then isnan decides
            total = xp.sum(out)
        if bool(xp.all(xp.isfinite(total))) or not bool(xp.any(xp.isnan(out))):
            return  # no NaN in out (a sum needs no output-sized temporary, unlike isnan)
    given = [x for x in arrays if x is not None]
    if not all(bool(xp.all(xp.isfinite(x))) for x in given):
        return  # a NaN or inf in the inputs, propagated to the rows that attend it
    raise overflow_error(given[0], given[1], scale, score_mod=score_mod)
