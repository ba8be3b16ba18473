"""The score mods of API.md: ``alibi``, ``relative_bias``, ``softcap``, ``temperature``."""

import math
from typing import Any

import numpy as np

from .._backend import from_numpy, is_torch, is_traced, to_numpy
from .._checks import check_int
from .._native import KernelMod, ModKind
from .._torch import compiling
from ..errors import ArgumentError, ShapeError
from ._mod import ScoreMod, additive_mod, heads, is_array, per_head, positions


def alibi(slopes: Any = None, n_heads: int | None = None) -> ScoreMod:
    """ALiBi (arXiv:2108.12409): add ``-slopes[h] · |p - j|`` to head ``h``'s scores.

    ``slopes (H,)``, or ``(B, H)`` for slopes per batch element; by default
    ``qkv.positional.alibi_slopes(H)`` with ``H = n_heads`` or, if that is None too, the size of
    the scores' head axis. With a causal mask this is the paper's ``-m · (i - j)``; without one
    it is symmetric.

    ``p`` is the query's key position, aligned as the call's mask aligns it: bottom-right
    (``p = i + Nk - Nq``), and beside ``masks.padding`` or ``masks.packed`` (alone or combined
    with other masks) within each sequence, bottom-right per sequence — flash-attn's varlen
    ALiBi: local query ``ii`` of a sequence of ``Lq`` queries and ``Lk`` keys is at local key
    ``ii + Lk - Lq``. Such calls run the flash kernel's array engine where the sequences'
    alignments differ from the call's (the compiled one measures from the call's corner).

    >>> cu_q, cu_k = [0, 2, 5], [0, 4, 6]  # two sequences: 2 queries / 4 keys, 3 queries / 2 keys
    >>> out = qkv.attention(q, k, v, mask=masks.packed(cu_q, cu_k), score_mod=scores.alibi())
    >>> # query 2 (the first of sequence 1) is at key 4 + 0 + 2 - 3 = 3: key 4 is 1 away, key 5 is 2
    """
    if n_heads is not None:
        n_heads = check_int(n_heads, "alibi n_heads", minimum=1)
    if slopes is not None:
        shape = tuple(slopes.shape) if hasattr(slopes, "shape") else np.shape(slopes)
        if len(shape) not in (1, 2) or 0 in shape:
            raise ShapeError(f"alibi slopes must be (H,) or (B, H), one slope per head, got shape {shape}")
        if n_heads is not None and shape[-1] != n_heads:
            raise ShapeError(f"alibi got {shape[-1]} slopes per row but n_heads={n_heads}")
        if not is_traced(slopes):  # inf · 0 at distance 0 would make the scores NaN
            values = np.asarray(to_numpy(slopes) if hasattr(slopes, "shape") else slopes, dtype=np.float64)
            if not np.isfinite(values).all():
                raise ArgumentError(f"alibi slopes must be finite numbers, got {np.round(values, 4).tolist()}")
    return _alibi(slopes, n_heads, None)


def _alibi(slopes: Any, n_heads: int | None, shift: np.ndarray | None) -> ScoreMod:
    from ..positional import alibi_slopes

    def bias(xp, s, i, j, nq, nk):
        h = heads(s)
        if n_heads is not None and n_heads != h:
            raise ShapeError(
                f"alibi(n_heads={n_heads}) but the scores have H={h} heads on axis -3 (scores: {tuple(s.shape)})"
            )
        m = (alibi_slopes(h) if h else np.zeros(0)) if slopes is None else slopes  # H = 0: an empty call
        m = m if is_array(m) else np.asarray(m, dtype=np.float64)
        m = per_head(xp, m, s, "alibi slopes", axis=m.ndim - 1)
        if m.ndim == 2 and (s.ndim < 4 or m.shape[0] not in (1, s.shape[-4])):
            raise ShapeError(
                f"alibi slopes have shape {tuple(m.shape)} (B, H) but the scores have shape {tuple(s.shape)}: "
                "per-batch slopes need scores (B, H, Nq, Nk) with the same B"
            )
        # (rows, cols), or (B, 1, rows, cols) for a per-batch alignment (padding)
        dist = from_numpy(np.abs(positions(i, nq, nk, shift) - j).astype(np.float64), s, s.dtype)
        b = -xp.reshape(m, (*m.shape, 1, 1)) * dist
        return b if s.ndim >= 3 else b[0]

    shown = (
        None
        if slopes is None
        else "traced"
        if is_traced(slopes)
        else np.round(np.asarray(to_numpy(slopes), dtype=float), 4).tolist()
    )
    name = "alibi" if slopes is None else f"alibi(slopes={shown})"
    tensors = (slopes,) if is_array(slopes) else ()
    if shift is not None:  # per sequence: the compiled kernel measures from the call's corner only
        return additive_mod(bias, f"{name} per sequence", tensors, heads=n_heads)
    table = None if slopes is None else slopes if is_array(slopes) else np.asarray(slopes, dtype=np.float64)
    native = (KernelMod(ModKind.ALIBI, table=table),)
    return additive_mod(bias, name, tensors, native, lambda sh: _alibi(slopes, n_heads, sh), heads=n_heads)


def kernel_ops(native: tuple[KernelMod, ...], lead: tuple[int, ...]) -> tuple[KernelMod, ...]:
    """A mod's compiled-kernel ops (``ScoreMod.native``) for a call whose scores are
    ``(*lead, Nq, Nk)`` (``lead = (*B, H)``, or ``()`` without heads): default ALiBi slopes
    resolved, every table checked against ``H`` (the ``ShapeError`` the reference raises, not
    the kernel's bare one), and per-batch slopes ``(B, H)`` spread over several batch axes the
    kernel sees flattened."""
    from ..positional import alibi_slopes

    *batch, h = lead if lead else (1,)
    out = []
    for op in native:
        if op.kind is ModKind.ALIBI:
            t = np.ascontiguousarray(alibi_slopes(h)) if op.table is None else op.table
            op = op._replace(table=_per_batch(_heads_checked(t, h, lead, "alibi slopes"), batch, lead))
        elif op.kind is ModKind.RELBIAS:
            op = op._replace(table=_heads_checked(op.table, h, lead, "relative_bias table", axis=0))
        out.append(op)
    return tuple(out)


def _heads_checked(t: Any, h: int, lead: tuple[int, ...], what: str, axis: int = -1) -> Any:
    shape = tuple(t.shape)
    if shape[axis] not in (1, h):
        raise ShapeError(
            f"{what} has {shape[axis]} heads on axis {axis % len(shape)} but the scores have H={h} on axis -3 "
            f"({what}: {shape}, scores' (*B, H): {tuple(lead)})"
        )
    return t


def _per_batch(slopes: Any, batch: list[int], lead: tuple[int, ...]) -> Any:
    """Slopes ``(H,)`` as they are; ``(Bm, H)`` checked against the last batch axis (as the
    reference broadcasts them) and spread to ``(prod(B), H)`` over the flattened batch."""
    shape = tuple(slopes.shape)
    if len(shape) == 1:
        return slopes
    if not batch or shape[0] not in (1, batch[-1]):
        need = f"B = 1 or B = {batch[-1]} (the last batch axis)" if batch else "scores (B, H, Nq, Nk)"
        raise ShapeError(
            f"alibi slopes have shape {shape} (B, H) but the scores' leading axes (*B, H) are {tuple(lead)}: "
            f"per-batch slopes need {need}"
        )
    if shape[0] == 1 or len(batch) == 1:
        return slopes
    full = (*batch, shape[-1])
    if is_torch(slopes):
        return slopes.expand(full).reshape(-1, shape[-1]).contiguous()
    return np.ascontiguousarray(np.broadcast_to(np.asarray(slopes), full).reshape(-1, shape[-1]))


def relative_bias(table: Any, max_distance: int) -> ScoreMod:
    """A learned bias per clipped relative distance (Shaw et al., arXiv:1803.02155; T5).

    ``table (2M + 1,)`` or ``(H, 2M + 1)`` with ``M = max_distance``; head ``h`` adds
    ``table[h, clip(j - p, -M, M) + M]``, with ``p`` the query's key position aligned as for
    ``alibi`` (within each sequence beside ``masks.padding`` / ``masks.packed``). A torch table
    that requires grad gets gradients through torch autograd.
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
    return _relative_bias(t, m, None)


def _relative_bias(t: Any, m: int, shift: np.ndarray | None) -> ScoreMod:
    def bias(xp, s, i, j, nq, nk):
        idx = np.clip(j - positions(i, nq, nk, shift), -m, m) + m  # (rows, cols) or (B, 1, rows, cols)
        tab = per_head(xp, t if t.ndim == 2 else t[None], s, "relative_bias table")
        b = tab[:, from_numpy(idx, s)] if is_torch(s) else tab[:, idx]  # NumPy and JAX index with NumPy ints
        if idx.ndim > 2:  # (H, B, 1, rows, cols) -> (B, H, rows, cols)
            b = xp.squeeze(xp.moveaxis(b, 0, -3), axis=-4)
        if idx.ndim == 2 and (t.ndim == 1 or s.ndim < 3):
            b = b[0]
        return b

    name = f"relative_bias(max_distance={m})"
    tensors = (t,) if is_array(t) else ()
    if shift is not None:
        return additive_mod(bias, f"{name} per sequence", tensors)
    native: tuple[KernelMod, ...] | None = (KernelMod(ModKind.RELBIAS, table=t if t.ndim == 2 else t[None], m=m),)
    if not is_traced(t) and not compiling() and not np.isfinite(np.asarray(to_numpy(t), dtype=np.float64)).all():
        # a -inf entry hides a distance: the array engine's (the compiled kernel takes finite
        # tables); while torch traces, the values cannot be read: the kernel's own check answers
        native = None
    return additive_mod(bias, name, tensors, native, lambda sh: _relative_bias(t, m, sh))


def softcap(c: float) -> ScoreMod:
    """``s -> c · tanh(s / c)``: scores squashed into ``(-c, c)`` (Gemma 2, arXiv:2408.00118)."""
    c = float(c)
    if not (c > 0 and math.isfinite(c)):
        raise ArgumentError(f"softcap needs a positive finite cap c, got {c}")

    def fn(xp, s, i, j, nq, nk):
        t = xp.tanh(s / c)
        return c * t, 1 - t * t

    return ScoreMod(fn, f"softcap({c:g})", native=(KernelMod(ModKind.SOFTCAP, c),))


def temperature(t: float) -> ScoreMod:
    """``s -> s / t``: ``t > 1`` flattens the weights, ``t < 1`` sharpens them."""
    t = float(t)
    if not (t > 0 and math.isfinite(t)):
        raise ArgumentError(f"temperature must be positive and finite, got {t}")

    def fn(xp, s, i, j, nq, nk):
        return s / t, 1.0 / t

    return ScoreMod(fn, f"temperature({t:g})", native=(KernelMod(ModKind.MUL, 1.0 / t),))
