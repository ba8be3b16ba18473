"""Positional encodings as pictures: sinusoidal tables, RoPE angles and its relative-position
invariance, ALiBi biases per head. Each function returns a ``Figure`` (no pyplot state).

The numbers come from ``qkv.positional`` (``sinusoidal``, ``rope``, ``alibi_slopes``); the
``*_numbers`` helpers return them for ``--json`` and HTML tables.
"""

from typing import Any

import numpy as np

from ..errors import ArgumentError
from ..positional import alibi_slopes, rope, sinusoidal
from . import _common

PE_KINDS = ("sinusoidal", "rope", "alibi")


def _count(value: Any, name: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= hi:
        raise ArgumentError(f"{name} must be an integer in {lo}..{hi}, got {value!r}")
    return int(value)


def sinusoidal_figure(
    n: int = 64, d: int = 64, base: float = 10000.0, *, width: float = 9.0, height: float = 4.2, dpi: float = 100
) -> Any:
    """Left: the table ``PE (n, d)`` (Vaswani et al., arXiv:1706.03762); right: ``PE PEᵀ (n, n)``,
    whose value depends (almost) only on the distance ``|i - j|``."""
    n, d = _count(n, "n", 1, _common.MAX_TOKENS), _count(d, "d", 1, 4096)
    pe = sinusoidal(n, d, base)
    fig = _common.figure(width, height, dpi)
    left, right = fig.subplots(1, 2)
    im = left.imshow(pe, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    left.set(title=f"sinusoidal PE (n={n}, d={d}, base={base:g})", xlabel="dimension", ylabel="position")
    _colorbar(fig, im, left, "PE[pos, dim]")
    sim = pe @ pe.T
    im = right.imshow(sim, cmap="magma", aspect="auto", interpolation="nearest")
    right.set(title="similarity PE[i] · PE[j]", xlabel="position j", ylabel="position i")
    _colorbar(fig, im, right, "dot product")
    _small(left, right)
    return fig


def rope_numbers(
    n: int = 64, d: int = 64, base: float = 10000.0, positions: tuple[int, ...] = (0, 10, 100, 1000), seed: int = 0
) -> dict[str, Any]:
    """``q·k`` after RoPE for a fixed random ``q``, ``k`` (length ``d``) with the query at
    ``p + r`` and the key at ``p``, for offsets ``r`` in ``[-n/2, n/2)`` and each absolute ``p``.

    Returns ``offsets (R,)``, ``positions (P,)``, ``scores (P, R)`` and ``spread``, the largest
    difference between positions at one offset: ~1e-13, because
    ``rope(q, m) · rope(k, n)`` depends on ``m - n`` only (RoFormer, arXiv:2104.09864).
    """
    n, d = _count(n, "n", 2, _common.MAX_TOKENS), _count(d, "d", 2, 4096)
    if d % 2:
        raise ArgumentError(f"rope pairs features c and c + D/2, so d must be even, got d={d}")
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((2, 1, d))
    offsets = np.arange(-(n // 2), n - n // 2)
    scores = np.stack(
        [
            np.sum(
                rope(np.repeat(q, len(offsets), 0), p + offsets, base)
                * rope(np.repeat(k, len(offsets), 0), np.full(len(offsets), p), base),
                -1,
            )
            for p in positions
        ]
    )
    return {
        "offsets": offsets,
        "positions": np.asarray(positions),
        "scores": scores,
        "spread": float(np.ptp(scores, axis=0).max()),
    }


def rope_figure(
    n: int = 64, d: int = 64, base: float = 10000.0, *, width: float = 9.0, height: float = 4.2, dpi: float = 100
) -> Any:
    """Left: the rotation angle ``pos · base^(-2c/d)`` (mod 2π) per position and frequency pair
    ``c``; right: ``q·k`` against the offset ``m - n`` for several absolute positions (the curves coincide)."""
    nums = rope_numbers(n, d, base)
    fig = _common.figure(width, height, dpi)
    left, right = fig.subplots(1, 2)
    angle = np.arange(n)[:, None] * base ** (-np.arange(0, d, 2) / d)  # (n, d/2)
    im = left.imshow(
        np.mod(angle, 2 * np.pi), cmap="twilight", vmin=0, vmax=2 * np.pi, aspect="auto", interpolation="nearest"
    )
    left.set(title=f"RoPE angle mod 2π (d={d}, base={base:g})", xlabel="frequency pair c", ylabel="position")
    cbar = _colorbar(fig, im, left, "angle (rad)", ticks=[0, np.pi, 2 * np.pi])
    cbar.ax.set_yticklabels(["0", "π", "2π"])
    styles = ("-", "--", ":", "-.")
    for i, (p, row) in enumerate(zip(nums["positions"], nums["scores"], strict=True)):
        right.plot(nums["offsets"], row, styles[i % 4], lw=2.4 - 0.5 * i, label=f"key at {p}")
    right.set(title="q·k after RoPE vs offset m - n", xlabel="offset (query - key position)", ylabel="score")
    right.legend(fontsize=7, title=f"curves differ by ≤ {nums['spread']:.0e}", title_fontsize=7)
    right.grid(alpha=0.3)
    _small(left, right)
    return fig


def alibi_numbers(n: int = 16, heads: int = 8) -> dict[str, Any]:
    """ALiBi (Press et al., arXiv:2108.12409): ``slopes (H,)`` and causal ``bias (H, n, n)`` =
    ``-m_h · (i - j)`` for ``j <= i``, NaN above the diagonal (hidden)."""
    n, heads = _count(n, "n", 1, _common.MAX_TOKENS), _count(heads, "heads", 1, _common.MAX_PANELS)
    m = alibi_slopes(heads)
    dist = (np.arange(n)[:, None] - np.arange(n)[None, :]).astype(np.float64)
    bias = -m[:, None, None] * dist
    bias[:, dist < 0] = np.nan
    return {"slopes": m, "bias": bias}


def alibi_figure(
    n: int = 16, heads: int = 8, *, width: float | None = None, height: float | None = None, dpi: float = 100
) -> Any:
    """A panel per head: the causal ALiBi bias ``-m_h (i - j)`` added to the scores; one shared colour scale."""
    import matplotlib

    nums = alibi_numbers(n, heads)
    rows, cols = _common.grid(heads)
    fig = _common.figure(width or cols * 2.4 + 1.0, height or rows * 2.3 + 0.6, dpi)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#eeeeee")  # bad: NaN, hidden
    vmin = float(np.nanmin(nums["bias"]))
    im = None
    for h, ax in enumerate(axes):
        if h >= heads:
            ax.set_visible(False)
            continue
        im = ax.imshow(nums["bias"][h], cmap=cmap, vmin=vmin, vmax=0, interpolation="nearest")
        ax.set_title(f"head {h}: m = 2^{np.log2(nums['slopes'][h]):.3g}", fontsize=8)
        ax.tick_params(labelsize=6, length=2)
        ax.set_xlabel("key", fontsize=7, labelpad=1)
        ax.set_ylabel("query", fontsize=7, labelpad=1)
    _colorbar(fig, im, list(axes[:heads]), "bias -m·(i-j)")
    fig.suptitle(f"ALiBi biases per head (n={n}, H={heads}; grey: hidden by the causal mask)", fontsize=10)
    return fig


def _colorbar(fig: Any, image: Any, ax: Any, label: str, **kw: Any) -> Any:
    cbar = fig.colorbar(image, ax=ax, shrink=0.85, **kw)
    cbar.set_label(label, fontsize=8)
    cbar.ax.tick_params(labelsize=7)
    return cbar


def _small(*axes: Any) -> None:
    for ax in axes:
        ax.title.set_fontsize(9)
        ax.xaxis.label.set_fontsize(8)
        ax.yaxis.label.set_fontsize(8)
        ax.tick_params(labelsize=7)


def positional(
    kind: str,
    n: int = 64,
    d: int = 64,
    base: float = 10000.0,
    heads: int = 8,
    *,
    width: float | None = None,
    height: float | None = None,
    dpi: float = 100,
) -> Any:
    """The figure of one positional-encoding ``kind``: ``"sinusoidal"``, ``"rope"`` or ``"alibi"``."""
    size = {k: v for k, v in (("width", width), ("height", height)) if v is not None}
    if kind == "sinusoidal":
        return sinusoidal_figure(n, d, base, dpi=dpi, **size)
    if kind == "rope":
        return rope_figure(n, d, base, dpi=dpi, **size)
    if kind == "alibi":
        return alibi_figure(n, heads, dpi=dpi, **size)
    raise ArgumentError(f"positional kind must be one of {', '.join(PE_KINDS)}, got {kind!r}")
