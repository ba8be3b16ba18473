"""Attention weights and masks as heatmaps: one panel per head, row sums and entropy in the margin.

``heatmap(weights)`` draws ``(..., Nq, Nk)`` weights (every leading index a panel); a ``mask``
(boolean array or ``qkv.masks.Mask``) greys and hatches the cells it hides. ``mask_picture``
draws a mask alone. Both return a ``matplotlib.figure.Figure`` (no pyplot state).
"""

import textwrap
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._backend import to_numpy
from ..diagnostics import entropy
from ..errors import ArgumentError, MaskError, ShapeError
from ..masks import Mask
from . import _common

MAX_RUNS = 6000  # hatched rectangles per panel; beyond that hidden cells are only greyed


def _as_weights(weights: Any) -> np.ndarray:
    w = np.asarray(to_numpy(weights) if not isinstance(weights, (list, tuple)) else weights, dtype=np.float64)
    if w.ndim < 2:
        raise ShapeError(f"weights must have shape (..., Nq, Nk), got {w.ndim} axis (weights: {w.shape})")
    return w


def _allowed(mask: Any, shape: tuple[int, ...]) -> np.ndarray | None:
    """The mask as booleans broadcast to the weights' ``shape`` (True = may attend)."""
    if mask is None:
        return None
    nq, nk = shape[-2:]
    a = mask.dense(nq, nk) if isinstance(mask, Mask) else np.asarray(to_numpy(mask))
    if a.dtype != bool:
        raise MaskError(f"mask must be boolean (True = may attend) or a qkv.masks.Mask, got dtype {a.dtype}")
    try:
        return np.broadcast_to(a, shape)
    except ValueError:
        raise MaskError(
            f"mask has shape {a.shape}, which does not broadcast to the weights' {shape} (..., Nq, Nk)"
        ) from None


def row_stats(weights: Any, mask: Any = None) -> dict[str, np.ndarray]:
    """Per-row ``sum``, ``entropy`` (nats) and ``entropy_normalised`` of weights ``(..., Nq, Nk)``.

    The entropy is ``qkv.diagnostics.entropy`` (normalised by the log of the keys the mask
    allows). Each array has shape ``(..., Nq)``.
    """
    w = _as_weights(weights)
    allowed = _allowed(mask, w.shape)
    e = entropy(w, mask=allowed)
    return {"sum": w.sum(-1), "entropy": np.asarray(e.nats), "entropy_normalised": np.asarray(e.normalised)}


def _labels(tokens: Sequence[Any] | None, n: int, prefix: str, name: str) -> list[str]:
    if tokens is None:
        return [f"{prefix}{i}" for i in range(n)]
    labels = [str(t) for t in tokens]
    if len(labels) != n:
        raise ArgumentError(f"{name} has {len(labels)} labels but the axis has {n} positions")
    return labels


def _ticks(ax: Any, labels_q: list[str], labels_k: list[str]) -> None:
    nq, nk = len(labels_q), len(labels_k)
    step_q, step_k = max(1, nq // 32), max(1, nk // 32)
    ax.set_yticks(range(0, nq, step_q), labels_q[::step_q], fontsize=_common.fontsize(min(nq, 32)))
    rot = 90 if max(map(len, labels_k)) * min(nk, 32) > 40 else 0
    ax.set_xticks(range(0, nk, step_k), labels_k[::step_k], fontsize=_common.fontsize(min(nk, 32)), rotation=rot)
    ax.tick_params(length=2, pad=1)


def _hatch(ax: Any, hidden: np.ndarray) -> None:
    """Hatch the hidden cells, merged into horizontal runs (few patches even for a causal 512²)."""
    from matplotlib.collections import PatchCollection
    from matplotlib.patches import Rectangle

    rects: list[Any] = []
    for i, row in enumerate(hidden):
        edges = np.flatnonzero(np.diff(np.concatenate([[0], row.astype(np.int8), [0]])))
        rects.extend(Rectangle((a - 0.5, i - 0.5), b - a, 1) for a, b in zip(edges[::2], edges[1::2], strict=True))
        if len(rects) > MAX_RUNS:
            return
    if rects:
        ax.add_collection(PatchCollection(rects, facecolor="none", edgecolor="#888888", hatch="////", linewidth=0))


def _margin(ax: Any, lines: list[str], header: str) -> None:
    """Per-row text on a right-hand axis (row sums, entropy), thinned like the tick labels."""
    n = len(lines)
    step = max(1, n // 32)
    right = ax.secondary_yaxis("right")
    right.set_yticks(range(0, n, step), lines[::step], fontsize=_common.fontsize(min(n, 32)), family="monospace")
    right.tick_params(length=0, pad=2)
    ax.text(
        1.0,
        1.0,
        header,
        transform=ax.transAxes,
        fontsize=_common.fontsize(min(n, 32)),
        family="monospace",
        va="bottom",
        ha="left",
    )


def _panel_titles(lead: tuple[int, ...], titles: Sequence[str] | None) -> list[str]:
    n = int(np.prod(lead)) if lead else 1
    if titles is not None:
        if len(titles) != n:
            raise ArgumentError(f"titles has {len(titles)} entries but there are {n} panels (leading axes {lead})")
        return [str(t) for t in titles]
    if not lead:
        return [""]
    if len(lead) == 1:
        return [f"head {h}" for h in range(n)]
    return [
        " ".join(f"{a}{i}" for a, i in zip("bh" if len(lead) == 2 else "abcdefgh", idx, strict=False))
        for idx in np.ndindex(*lead)
    ]


def default_size(n_panels: int, n_q: int, n_k: int) -> tuple[float, float]:
    """A legible ``(width, height)`` in inches for ``n_panels`` panels of ``Nq x Nk`` cells."""
    rows, cols = _common.grid(n_panels)
    side = float(np.clip(max(n_q, n_k) * 0.22, 2.2, 4.2))
    return round(cols * (side * n_k / max(n_q, n_k) + 1.6) + 0.9, 2), round(
        rows * (side * n_q / max(n_q, n_k) + 0.9) + 0.5, 2
    )


def heatmap(
    weights: Any,
    *,
    tokens_q: Sequence[Any] | None = None,
    tokens_k: Sequence[Any] | None = None,
    mask: Any = None,
    titles: Sequence[str] | None = None,
    overlay: bool = True,
    annotate: bool | None = None,
    suptitle: str | None = None,
    width: float | None = None,
    height: float | None = None,
    dpi: float = 100,
) -> Any:
    """Attention weights ``(..., Nq, Nk)`` as a figure: a panel per leading index (per head).

    Rows are queries (``tokens_q``), columns keys (``tokens_k``); the right margin lists each
    row's sum ``Σ`` and entropy ``H`` in nats (``qkv.diagnostics.entropy``). With a ``mask``
    and ``overlay`` the hidden cells are grey and hatched. ``annotate`` writes the weights in
    the cells (default: when a panel has at most 64 cells). Returns a ``Figure``.
    """
    from matplotlib.colors import Normalize

    w = _as_weights(weights)
    lead, (nq, nk) = w.shape[:-2], w.shape[-2:]
    _common.check_panel(nq, nk)
    if nq * nk == 0:
        raise ShapeError(f"weights have no cells to draw (Nq={nq}, Nk={nk}; weights: {w.shape})")
    panels = w.reshape(-1, nq, nk)
    if len(panels) > _common.MAX_PANELS:
        raise ArgumentError(
            f"{len(panels)} panels (leading axes {lead}) are too many to draw: at most {_common.MAX_PANELS}"
        )
    allowed = _allowed(mask, w.shape)
    stats = row_stats(w, allowed)
    names = _panel_titles(lead, titles)
    lq, lk = _labels(tokens_q, nq, "q", "tokens_q"), _labels(tokens_k, nk, "k", "tokens_k")
    dw, dh = default_size(len(panels), nq, nk)
    fig = _common.figure(width or dw, height or dh, dpi)
    rows, cols = _common.grid(len(panels))
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    norm = Normalize(0.0, max(float(np.nanmax(panels)), 1e-12))
    annotate = nq * nk <= 64 if annotate is None else annotate
    sums, ents = stats["sum"].reshape(-1, nq), stats["entropy"].reshape(-1, nq)
    hidden_all = None if allowed is None else ~allowed.reshape(-1, nq, nk)
    image = None
    for p, ax in enumerate(axes):
        if p >= len(panels):
            ax.set_visible(False)
            continue
        data = panels[p]
        if hidden_all is not None and overlay:
            data = np.ma.masked_array(data, hidden_all[p])
        image = ax.imshow(data, cmap=_cmap(), norm=norm, interpolation="nearest", aspect="auto")
        if hidden_all is not None and overlay:
            _hatch(ax, hidden_all[p])
        if annotate:
            for (i, j), x in np.ndenumerate(panels[p]):
                if hidden_all is None or not hidden_all[p, i, j] or not overlay:
                    ax.text(
                        j,
                        i,
                        f"{x:.2f}",
                        ha="center",
                        va="center",
                        fontsize=7,
                        color="white" if norm(x) < 0.6 else "black",
                    )
        _ticks(ax, lq, lk)
        _margin(ax, [f"{s:4.2f} {h:4.2f}" for s, h in zip(sums[p], ents[p], strict=True)], "  Σ    H")
        ax.set_title(names[p], fontsize=9, pad=12)
        ax.set_xlabel("key", fontsize=7, labelpad=1)
        ax.set_ylabel("query", fontsize=7, labelpad=1)
    cbar = fig.colorbar(image, ax=list(axes[: len(panels)]), shrink=0.8, pad=0.02)
    cbar.set_label("weight", fontsize=8)
    cbar.ax.tick_params(labelsize=7)
    if suptitle:
        fig.suptitle(suptitle, fontsize=10)
    return fig


def _cmap() -> Any:
    import matplotlib

    return matplotlib.colormaps["viridis"].with_extremes(bad="#d9d9d9")  # bad: hidden cells (masked out)


def mask_picture(
    mask: Any,
    n_q: int,
    n_k: int,
    *,
    tokens_q: Sequence[Any] | None = None,
    tokens_k: Sequence[Any] | None = None,
    title: str | None = None,
    width: float | None = None,
    height: float | None = None,
    dpi: float = 100,
) -> Any:
    """A mask alone (``qkv.masks.Mask`` or boolean ``(Nq, Nk)``): allowed cells dark, keys per row in the margin."""
    from matplotlib.colors import ListedColormap

    _common.check_panel(n_q, n_k, "mask")
    a = _allowed(mask, (n_q, n_k))
    assert a is not None
    if title is None:
        title = mask.name if isinstance(mask, Mask) else "mask"
    dw, dh = default_size(1, n_q, n_k)
    fig = _common.figure(width or dw - 0.6, height or dh, dpi)
    ax = fig.subplots()
    ax.imshow(
        a.astype(np.int8),
        cmap=ListedColormap(["#f4f4f4", "#2c3e73"]),
        vmin=0,
        vmax=1,
        interpolation="nearest",
        aspect="auto",
    )
    _ticks(ax, _labels(tokens_q, n_q, "q", "tokens_q"), _labels(tokens_k, n_k, "k", "tokens_k"))
    _margin(ax, [str(int(c)) for c in a.sum(-1)], "keys")
    ax.set_title(f"{textwrap.fill(title, 60)}\n{int(a.sum())} of {n_q * n_k} cells may attend", fontsize=9, pad=12)
    ax.set_xlabel("key", fontsize=7, labelpad=1)
    ax.set_ylabel("query", fontsize=7, labelpad=1)
    return fig
