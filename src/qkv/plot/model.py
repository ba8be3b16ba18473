"""Pictures of a real model's attention (``qkv.inspect``): every layer x head as small multiples,
attention rollout, and the layer x head table of what an approximation would lose.

The functions take arrays and token strings, not an ``Inspection``, so they draw saved numbers
too (``Inspection.to_dict()``). One head at full size is ``qkv.plot.heatmap`` with the tokens.
"""

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import ArgumentError, ShapeError
from . import _common

MAX_GRID_TOKENS = 24  # token ticks on the small multiples only up to this many tokens: beyond, they overlap


def _check_tokens(tokens: Sequence[str], n: int) -> list[str]:
    labels = [str(t) for t in tokens]
    if len(labels) != n:
        raise ShapeError(f"tokens has {len(labels)} labels but the weights have N={n} tokens")
    return labels


def head_grid(
    weights: Any,
    tokens: Sequence[str],
    *,
    layer_ids: Sequence[int] | None = None,
    head_ids: Sequence[int] | None = None,
    titles: Sequence[str] | None = None,
    width: float | None = None,
    height: float | None = None,
    dpi: float = 100,
) -> Any:
    """Small multiples of ``weights (L, H, N, N)``: a row per layer, a column per head, one colour
    scale (0..1), token ticks on the left column and the bottom row (up to ``MAX_GRID_TOKENS``).
    ``titles`` (``L·H`` strings, row-major) go under each panel's head number, e.g. its pattern."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 4 or w.shape[-1] != w.shape[-2]:
        raise ShapeError(f"weights must have shape (L, H, N, N), got {w.shape}")
    n_layers, n_heads, n = w.shape[:3]
    _common.check_panel(n, n)
    if n_heads > _common.MAX_PANELS or n_layers > _common.MAX_PANELS:
        raise ArgumentError(f"{n_layers} x {n_heads} panels are too many to draw: at most {_common.MAX_PANELS} a side")
    labels = _check_tokens(tokens, n)
    layers = list(layer_ids) if layer_ids is not None else list(range(n_layers))
    heads = list(head_ids) if head_ids is not None else list(range(n_heads))
    if titles is not None and len(titles) != n_layers * n_heads:
        raise ArgumentError(f"titles has {len(titles)} entries for {n_layers} x {n_heads} panels")
    ticks = n <= MAX_GRID_TOKENS
    fig = _common.figure(width or 1.25 * n_heads + 1.6, height or 1.3 * n_layers + 0.9, dpi)
    fig.set_layout_engine("none")  # fixed margins: constrained layout takes seconds over 72 panels
    axes = fig.subplots(
        n_layers,
        n_heads,
        squeeze=False,
        gridspec_kw={"left": 0.06, "right": 0.92, "bottom": 0.1, "top": 0.95, "wspace": 0.15, "hspace": 0.35},
    )
    image = None
    for li in range(n_layers):
        for hi in range(n_heads):
            ax = axes[li, hi]
            image = _common.weights_cell(ax, w[li, hi], f"head {heads[hi]}" if li == 0 else None, 7, pad=2)
            if titles is not None:
                ax.set_xlabel(titles[li * n_heads + hi], fontsize=5, labelpad=1)
            if hi == 0:
                ax.set_ylabel(f"layer {layers[li]}", fontsize=7)
                if ticks:
                    ax.set_yticks(range(n), labels, fontsize=3.5)
            if li == n_layers - 1 and ticks and titles is None:
                ax.set_xticks(range(n), labels, fontsize=3.5, rotation=90)
            ax.tick_params(length=0, pad=1)
    cbar = fig.colorbar(image, cax=fig.add_axes((0.94, 0.3, 0.012, 0.4)))
    cbar.set_label("weight", fontsize=7)
    cbar.ax.tick_params(labelsize=6)
    return fig


def rollout_figure(
    rollout: Any,
    tokens: Sequence[str],
    *,
    width: float | None = None,
    height: float | None = None,
    dpi: float = 100,
) -> Any:
    """Attention rollout ``(N, N)`` (row ``i``: how much of the last layer's token ``i`` comes
    from each input token) beside a bar chart of the first token's row (the [CLS] / BOS
    summary a classifier reads)."""
    r = np.asarray(rollout, dtype=np.float64)
    if r.ndim != 2 or r.shape[0] != r.shape[1]:
        raise ShapeError(f"rollout must have shape (N, N), got {r.shape}")
    n = r.shape[0]
    _common.check_panel(n, n, "rollout")
    labels = _check_tokens(tokens, n)
    side = float(np.clip(n * 0.25, 3.0, 6.0))
    fig = _common.figure(width or 2 * side + 1.8, height or side + 0.8, dpi)
    a, b = fig.subplots(1, 2)
    image = a.imshow(r, cmap="viridis", vmin=0, interpolation="nearest")
    fs = _common.fontsize(n)
    a.set_xticks(range(n), labels, rotation=90, fontsize=fs)
    a.set_yticks(range(n), labels, fontsize=fs)
    a.set_xlabel("input token", fontsize=8)
    a.set_ylabel("token after the last layer", fontsize=8)
    a.set_title("attention rollout", fontsize=9)
    fig.colorbar(image, ax=a, shrink=0.8, pad=0.02).ax.tick_params(labelsize=7)
    b.barh(range(n), r[0], color="tab:blue")
    b.set_yticks(range(n), labels, fontsize=fs)
    b.invert_yaxis()
    b.set_title(f"where {labels[0]} comes from", fontsize=9)
    b.set_xlabel("share", fontsize=8)
    b.tick_params(axis="x", labelsize=7)
    b.grid(alpha=0.3, axis="x")
    return fig


def approximation_figure(
    values: Any,
    labels: Sequence[str],
    *,
    layer_ids: Sequence[int] | None = None,
    head_ids: Sequence[int] | None = None,
    measure: str = "relative output error",
    width: float | None = None,
    height: float | None = None,
    dpi: float = 100,
) -> Any:
    """A layer x head heatmap per approximation method: ``values (methods, L, H)`` (NaN: not
    applicable, drawn blank), one shared colour scale from 0, the value written in each cell."""
    from matplotlib.colors import Normalize

    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 3:
        raise ShapeError(f"values must have shape (methods, L, H), got {v.shape}")
    m, n_layers, n_heads = v.shape
    if len(labels) != m:
        raise ArgumentError(f"labels has {len(labels)} entries for {m} methods")
    layers = list(layer_ids) if layer_ids is not None else list(range(n_layers))
    heads = list(head_ids) if head_ids is not None else list(range(n_heads))
    finite = v[np.isfinite(v)]
    norm = Normalize(0.0, max(float(finite.max()) if finite.size else 1.0, 1e-12))
    rows, cols = _common.grid(m, max_cols=3)
    fig = _common.figure(width or 0.4 * n_heads * cols + 1.4, height or rows * (0.32 * n_layers + 1.0) + 0.3, dpi)
    fig.set_layout_engine("none")  # fixed margins: constrained layout takes seconds over hundreds of labels
    axes = fig.subplots(
        rows,
        cols,
        squeeze=False,
        gridspec_kw={"left": 0.05, "right": 0.9, "bottom": 0.08, "top": 0.92, "wspace": 0.2, "hspace": 0.45},
    ).ravel()
    for ax in axes[m:]:
        ax.set_visible(False)
    axes = axes[:m]
    image = None
    for k, ax in enumerate(axes):
        image = ax.imshow(np.ma.masked_invalid(v[k]), cmap="magma_r", norm=norm, interpolation="nearest", aspect="auto")
        ax.set_title(labels[k], fontsize=7)
        ax.set_xticks(range(n_heads), [str(h) for h in heads], fontsize=5)
        ax.set_yticks(range(n_layers), [str(layer) for layer in layers], fontsize=5)
        ax.set_xlabel("head", fontsize=6)
        if k % cols == 0:
            ax.set_ylabel("layer", fontsize=6)
        ax.tick_params(length=0, pad=1)
        if n_heads * n_layers <= 150:
            for (i, j), x in np.ndenumerate(v[k]):
                if np.isfinite(x):
                    text = f"{x:.1f}" if x >= 10 else f"{x:.2f}"
                    ax.text(j, i, text, ha="center", va="center", fontsize=4, color="white" if norm(x) > 0.6 else "k")
    cbar = fig.colorbar(image, cax=fig.add_axes((0.92, 0.25, 0.012, 0.5)))
    cbar.set_label(measure, fontsize=7)
    cbar.ax.tick_params(labelsize=6)
    return fig
