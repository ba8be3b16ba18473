"""The score mods of API.md: ``alibi``, ``relative_bias``, ``softcap``, ``temperature``."""

import math
from typing import Any

import numpy as np

from .._backend import from_numpy, is_torch, is_traced, to_numpy
from .._checks import check_int
from ..errors import ArgumentError, ShapeError
from ._mod import ScoreMod, additive_mod, heads, is_array, per_head


def alibi(slopes: Any = None, n_heads: int | None = None) -> ScoreMod:
    """ALiBi (arXiv:2108.12409): add ``-slopes[h] · |p - j|`` to head ``h``'s scores.

    ``slopes (H,)``, or ``(B, H)`` for slopes per batch element; by default
    ``qkv.positional.alibi_slopes(H)`` with ``H = n_heads`` or, if that is None too, the size of
    the scores' head axis. With a causal mask this is the paper's ``-m · (i - j)``; without one
    it is symmetric.
    """
    from ..positional import alibi_slopes

    if n_heads is not None:
        n_heads = check_int(n_heads, "alibi n_heads", minimum=1)
    if slopes is not None:
        shape = tuple(slopes.shape) if hasattr(slopes, "shape") else np.shape(slopes)
        if len(shape) not in (1, 2) or 0 in shape:
            raise ShapeError(f"alibi slopes must be (H,) or (B, H), one slope per head, got shape {shape}")
        if n_heads is not None and shape[-1] != n_heads:
            raise ShapeError(f"alibi got {shape[-1]} slopes per row but n_heads={n_heads}")

    def bias(xp, s, i, j, nq, nk):
        h = heads(s)
        if n_heads is not None and n_heads != h:
            raise ShapeError(
                f"alibi(n_heads={n_heads}) but the scores have H={h} heads on axis -3 (scores: {tuple(s.shape)})"
            )
        m = alibi_slopes(h) if slopes is None else slopes
        m = m if is_array(m) else np.asarray(m, dtype=np.float64)
        m = per_head(xp, m, s, "alibi slopes", axis=m.ndim - 1)
        if m.ndim == 2 and (s.ndim < 4 or m.shape[0] not in (1, s.shape[-4])):
            raise ShapeError(
                f"alibi slopes have shape {tuple(m.shape)} (B, H) but the scores have shape {tuple(s.shape)}: "
                "per-batch slopes need scores (B, H, Nq, Nk) with the same B"
            )
        dist = from_numpy(np.abs(i + (nk - nq) - j).astype(np.float64), s, s.dtype)
        b = -xp.reshape(m, (*m.shape, 1, 1)) * dist
        return b if s.ndim >= 3 else b[0]

    if slopes is None:  # the kernel's op gets alibi_slopes(H) once H is known
        return additive_mod(bias, "alibi", native=(("alibi", None),))
    shown = "traced" if is_traced(slopes) else np.round(np.asarray(to_numpy(slopes), dtype=float), 4).tolist()
    table = slopes if is_array(slopes) else np.asarray(slopes, dtype=np.float64)
    return additive_mod(bias, f"alibi(slopes={shown})", (slopes,) if is_array(slopes) else (), (("alibi", table),))


def relative_bias(table: Any, max_distance: int) -> ScoreMod:
    """A learned bias per clipped relative distance (Shaw et al., arXiv:1803.02155; T5).

    ``table (2M + 1,)`` or ``(H, 2M + 1)`` with ``M = max_distance``; head ``h`` adds
    ``table[h, clip(j - p, -M, M) + M]``. A torch table that requires grad gets gradients
    through torch autograd.
    """
    m = int(max_distance)
    if m < 0:
        raise ArgumentError(f"relative_bias max_distance must be >= 0, got {max_distance}")
    t = table if is_array(table) else np.asarray(table, dtype=np.float64)
    if t.ndim not in (1, 2) or t.shape[-1] != 2 * m + 1:
        raise ShapeError(
            f"relative_bias table has shape {tuple(t.shape)} but needs (2M + 1,) or (H, 2M + 1) "
            f"with 2M + 1 = {2 * m + 1} on its last axis"
        )

    def bias(xp, s, i, j, nq, nk):
        idx = np.clip(j - (i + (nk - nq)), -m, m) + m
        tab = per_head(xp, t if t.ndim == 2 else t[None], s, "relative_bias table")
        b = tab[:, from_numpy(idx, s)] if is_torch(s) else tab[:, idx]  # NumPy and JAX index with NumPy ints
        if t.ndim == 1 or s.ndim < 3:
            b = b[0]
        return b

    native = (("relbias", t if t.ndim == 2 else t[None], m),)
    return additive_mod(bias, f"relative_bias(max_distance={m})", (t,) if is_array(t) else (), native)


def softcap(c: float) -> ScoreMod:
    """``s -> c · tanh(s / c)``: scores squashed into ``(-c, c)`` (Gemma 2, arXiv:2408.00118)."""
    c = float(c)
    if not (c > 0 and math.isfinite(c)):
        raise ArgumentError(f"softcap needs a positive finite cap c, got {c}")

    def fn(xp, s, i, j, nq, nk):
        t = xp.tanh(s / c)
        return c * t, 1 - t * t

    return ScoreMod(fn, f"softcap({c:g})", native=(("softcap", c),))


def temperature(t: float) -> ScoreMod:
    """``s -> s / t``: ``t > 1`` flattens the weights, ``t < 1`` sharpens them."""
    t = float(t)
    if not (t > 0 and math.isfinite(t)):
        raise ArgumentError(f"temperature must be positive and finite, got {t}")

    def fn(xp, s, i, j, nq, nk):
        return s / t, 1.0 / t

    return ScoreMod(fn, f"temperature({t:g})", native=(("mul", 1.0 / t),))
