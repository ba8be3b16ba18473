"""Positional information: sinusoidal tables, rotary embeddings (RoPE) and ALiBi slopes.

- ``sinusoidal(n, d)``: the Transformer's fixed table (Vaswani et al., arXiv:1706.03762);
- ``rope(x, positions)``: rotary embeddings in the rotate-half layout (RoFormer,
  arXiv:2104.09864, as in GPT-NeoX and Llama), with explicit positions for cached decoding;
- ``alibi_slopes(n_heads)``: the per-head slopes of ALiBi (Press et al., arXiv:2108.12409),
  used by ``qkv.scores.alibi``.

NumPy in, NumPy out; ``rope`` also takes torch tensors (torch is never imported here).
"""

import math
from typing import Any

import numpy as np

from . import _torch
from ._backend import as_array, compute_dtype, from_numpy, is_torch, namespace, to_numpy
from ._typing import Array


def alibi_slopes(n_heads: int) -> np.ndarray:
    """The ALiBi head slopes (Press et al., arXiv:2108.12409), float64 ``(n_heads,)``.

    For ``n`` a power of two, head ``k = 1..n`` gets ``2^(-8k/n)``. Otherwise the paper's
    recipe: the slopes of the closest lower power of two ``m``, then every other slope of
    ``2m`` heads, until there are ``n_heads``.

    >>> alibi_slopes(4)
    array([0.25  , 0.0625  , 0.015625, 0.00390625])
    """
    from .errors import ArgumentError

    if isinstance(n_heads, bool) or int(n_heads) != n_heads or n_heads < 1:
        raise ArgumentError(f"n_heads must be a positive integer, got {n_heads!r}")
    n = int(n_heads)

    def power_of_two(m: int) -> np.ndarray:
        return 2.0 ** (-8.0 * np.arange(1, m + 1) / m)

    m = 2 ** int(math.floor(math.log2(n)))
    if m == n:
        return power_of_two(n)
    return np.concatenate([power_of_two(m), power_of_two(2 * m)[0::2][: n - m]])


def _positive(value: Any, name: str) -> float:
    from .errors import ArgumentError

    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ArgumentError(f"{name} must be a positive finite number, got {value!r}") from None
    if not (v > 0 and math.isfinite(v)):
        raise ArgumentError(f"{name} must be a positive finite number, got {value!r}")
    return v


def _count(value: Any, name: str, minimum: int) -> int:
    from .errors import ArgumentError

    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ArgumentError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def sinusoidal(n: int, d: int, base: float = 10000.0) -> np.ndarray:
    """The sinusoidal position table of the Transformer (Vaswani et al., arXiv:1706.03762, §3.5).

    Float64 ``(n, d)`` with ``PE[pos, 2i] = sin(pos / base^(2i/d))`` and
    ``PE[pos, 2i+1] = cos(pos / base^(2i/d))``; an odd ``d`` ends with a sine column.

    >>> sinusoidal(2, 4)[1].round(4)
    array([0.8415, 0.5403, 0.01  , 1.    ])
    """
    n, d = _count(n, "n", 0), _count(d, "d", 1)
    base = _positive(base, "base")
    pos = np.arange(n, dtype=np.float64)[:, None]
    two_i = np.arange(0, d, 2, dtype=np.float64)  # 2i for every sine column
    angle = pos / base ** (two_i / d)  # (n, ceil(d / 2))
    pe = np.empty((n, d), dtype=np.float64)
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle[:, : d // 2])
    return pe


def _positions(positions: Any, lead: tuple[int, ...], x_shape: tuple[int, ...]) -> np.ndarray:
    """Positions as float64 NumPy, checked to broadcast onto ``x.shape[:-1] = lead``."""
    from .errors import ArgumentError, ShapeError

    if positions is None:
        return np.arange(lead[-1], dtype=np.float64)
    p = to_numpy(positions) if is_torch(positions) else np.asarray(positions)
    if not (np.issubdtype(p.dtype, np.integer) or np.issubdtype(p.dtype, np.floating)):
        raise ArgumentError(f"rope positions must be numbers (integers), got dtype {p.dtype}")
    p = p.astype(np.float64)
    if not np.isfinite(p).all():
        raise ArgumentError("rope positions must be finite")
    try:
        fits = np.broadcast_shapes(p.shape, lead) == lead
    except ValueError:
        fits = False
    if not fits:
        raise ShapeError(
            f"rope positions have shape {p.shape}, which does not broadcast to x's leading axes (..., N) = {lead}; "
            f"pass (N,) = ({lead[-1]},) or a shape like (B, 1, N) (x: {x_shape})"
        )
    return p


_compiling = _torch.compiling


def _traced_angles(x: Any, positions: Any, base: float, r: int, interleaved: bool, ct: Any) -> tuple[Any, Any]:
    """``(cos, sin)`` of ``rope``'s angles in torch ops (float64), for a program torch traces:
    NumPy there would break the graph. The positions are a tensor or None (``arange(N)``)."""
    import torch

    if positions is None:
        p = torch.arange(x.shape[-2], dtype=torch.float64, device=x.device)
    else:
        p = torch.as_tensor(positions, device=x.device).to(torch.float64)
    inv_freq = base ** (-torch.arange(0, r, 2, dtype=torch.float64, device=x.device) / r)
    angle = p[..., None] * inv_freq
    angle = torch.repeat_interleave(angle, 2, dim=-1) if interleaved else torch.cat([angle, angle], dim=-1)
    return torch.cos(angle).to(ct), torch.sin(angle).to(ct)


def rope(
    x: Array,
    positions: Any = None,
    base: float = 10000.0,
    *,
    interleaved: bool = False,
    rotary_dim: int | None = None,
) -> Array:
    """Rotary position embedding (RoFormer, Su et al., arXiv:2104.09864).

    ``x (..., N, D)``; the first ``R = rotary_dim`` features (default all of ``D``; ``R`` even)
    are rotated in pairs, the rest pass unchanged (partial rotary, GPT-NeoX / Phi). Pair ``c <
    R/2`` is rotated by the angle ``pos · base^(-2c/R)``. Which features pair up:

    - ``interleaved=False`` (rotate-half, GPT-NeoX / Llama): feature ``c`` with ``c + R/2``,
      ``out = x · cos(θ) + rotate_half(x) · sin(θ)``, ``rotate_half(x) = (-x[R/2:], x[:R/2])``;
    - ``interleaved=True`` (GPT-J, the paper's layout): feature ``2c`` with ``2c + 1``.

    ``positions``: ``(N,)`` or anything broadcasting to ``x.shape[:-1]`` (e.g. ``(B, 1, N)``),
    default ``arange(N)``; a decoder with a KV cache passes ``cache_length + arange(N)``.
    Because the rotations compose, ``rope(q, m) · rope(k, n)`` depends only on ``m - n``.
    Angles are computed in float64; the result has ``x``'s kind and dtype (half precision is
    rotated in float32) and is differentiable under torch autograd.
    """
    from ._checks import check_flag, check_int
    from .errors import ShapeError

    x = as_array(x, "x")
    if x.ndim < 2:
        raise ShapeError(f"rope needs x of shape (..., N, D), got {x.ndim} axis (x: {tuple(x.shape)})")
    d = x.shape[-1]
    interleaved = check_flag(interleaved, "rope interleaved")
    r = d if rotary_dim is None else check_int(rotary_dim, "rope rotary_dim", minimum=2, maximum=d, error=ShapeError)
    if r % 2:
        what = f"rotary_dim={r}" if rotary_dim is not None else f"an even D on its last axis, got D={d}"
        raise ShapeError(f"rope rotates features in pairs, so it needs {what} to be even (x: {tuple(x.shape)})")
    base = _positive(base, "base")
    xp = namespace(x=x)
    ct = compute_dtype(xp, x)
    if is_torch(x) and _compiling():
        cos, sin = _traced_angles(x, positions, base, r, interleaved, ct)
    else:
        p = _positions(positions, tuple(x.shape[:-1]), tuple(x.shape))
        inv_freq = base ** (-np.arange(0, r, 2, dtype=np.float64) / r)  # (R/2,)
        angle = p[..., None] * inv_freq  # (..., N, R/2)
        angle = np.repeat(angle, 2, axis=-1) if interleaved else np.concatenate([angle, angle], axis=-1)
        cos, sin = from_numpy(np.cos(angle), x, ct), from_numpy(np.sin(angle), x, ct)
    xc = x if x.dtype == ct else xp.astype(x, ct)
    xr = xc[..., :r]
    if interleaved:  # (x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...)
        rotated = xp.reshape(xp.stack([-xr[..., 1::2], xr[..., 0::2]], axis=-1), tuple(xr.shape))
    else:
        rotated = xp.concat([-xr[..., r // 2 :], xr[..., : r // 2]], axis=-1)
    out = xr * cos + rotated * sin
    if r < d:
        out = xp.concat([out, xc[..., r:]], axis=-1)
    return out if out.dtype == x.dtype else xp.astype(out, x.dtype)
