"""Attention while a model trains, from a ``qkv.train.History``: small multiples (a row per
recorded step, a column per head), loss / accuracy / entropy curves, and an animated GIF.

Only ``history.attention`` (``Snapshot(step, weights=[(H, T, T) per layer])``), ``loss``,
``accuracy`` and ``probe`` are read, so a History rebuilt from saved arrays works too.
"""

import os
from typing import Any

import numpy as np

from ..diagnostics import entropy
from ..errors import ArgumentError
from . import _common

MAX_ROWS = 12  # recorded steps drawn in the grid; more are subsampled evenly (first and last kept)


def _layer_maps(history: Any, layer: int) -> tuple[list[int], np.ndarray]:
    """``(steps, maps (S, H, T, T))`` of one layer; checks that something was recorded."""
    snaps = list(getattr(history, "attention", []) or [])
    if not snaps:
        raise ArgumentError("the history has no recorded attention maps: train with record_every")
    n_layers = len(snaps[0].weights)
    if not -n_layers <= layer < n_layers:
        raise ArgumentError(
            f"layer must be in {-n_layers}..{n_layers - 1} (the model has {n_layers} layers), got {layer}"
        )
    maps = np.stack([np.asarray(s.weights[layer], dtype=np.float64) for s in snaps])
    _common.check_panel(maps.shape[-2], maps.shape[-1], "attention maps")
    return [int(s.step) for s in snaps], maps


def _pick(n: int, most: int) -> list[int]:
    return list(range(n)) if n <= most else sorted(set(np.linspace(0, n - 1, most).round().astype(int).tolist()))


def _tokens(history: Any, t: int) -> list[str] | None:
    probe = getattr(history, "probe", None)
    return None if probe is None else [str(int(x)) for x in np.asarray(probe)[:t]]


def attention_grid(
    history: Any, layer: int = -1, *, width: float | None = None, height: float | None = None, dpi: float = 100
) -> Any:
    """Small multiples of one layer's attention on the probe: a row per recorded step (at most
    ``MAX_ROWS``, evenly subsampled), a column per head, one colour scale (0..1)."""
    steps, maps = _layer_maps(history, layer)
    rows = _pick(len(steps), MAX_ROWS)
    n_heads, t = maps.shape[1], maps.shape[-1]
    if n_heads > _common.MAX_PANELS:
        raise ArgumentError(f"{n_heads} heads are too many to draw: at most {_common.MAX_PANELS}")
    fig = _common.figure(width or 1.5 * n_heads + 1.2, height or 1.35 * len(rows) + 0.7, dpi)
    axes = fig.subplots(len(rows), n_heads, squeeze=False)
    labels = _tokens(history, t)
    im = None
    for r, s in enumerate(rows):
        for h in range(n_heads):
            ax = axes[r, h]
            im = _common.weights_cell(ax, maps[s, h], f"head {h}" if r == 0 else None, 8)
            if h == 0:
                ax.set_ylabel(f"step {steps[s]}", fontsize=8)
    if labels is not None and t <= 8:  # the probe's tokens under the last row
        for h in range(n_heads):
            axes[-1, h].set_xticks(range(t), labels, fontsize=5)
            axes[-1, h].tick_params(length=1, pad=1)
    cbar = fig.colorbar(im, ax=axes.ravel().tolist(), shrink=min(0.6, 3.0 / fig.get_size_inches()[1]), pad=0.02)
    cbar.set_label("weight", fontsize=8)
    cbar.ax.tick_params(labelsize=7)
    n_layers = len(history.attention[0].weights)
    fig.suptitle(f"{getattr(history, 'task', '')}: attention of layer {layer % n_layers} on the probe", fontsize=9)
    return fig


def entropy_per_head(history: Any, layer: int = -1) -> tuple[list[int], np.ndarray]:
    """``(steps, mean normalised entropy (S, H))`` of one layer's maps (``qkv.diagnostics.entropy``)."""
    steps, maps = _layer_maps(history, layer)
    return steps, np.asarray(entropy(maps).normalised).mean(-1)


def curves(history: Any, layer: int = -1, *, width: float = 10.0, height: float = 3.2, dpi: float = 100) -> Any:
    """Loss (log scale) and accuracy per step, and the mean normalised attention entropy of
    each head of ``layer`` at the recorded steps (1 = uniform, 0 = one key)."""
    loss = np.asarray(getattr(history, "loss", []), dtype=np.float64)
    if loss.size == 0:
        raise ArgumentError("the history has no training steps to plot")
    fig = _common.figure(width, height, dpi)
    a, b, c = fig.subplots(1, 3)
    x = np.arange(1, loss.size + 1)
    a.plot(x, loss, lw=1.2)
    a.set(title="training loss", xlabel="step")
    if loss.min() > 0 and loss.max() / loss.min() > 20:  # a loss that falls by decades reads on a log axis
        a.set_yscale("log")
    b.plot(x, np.asarray(history.accuracy), lw=1.2, color="tab:green")
    b.set(ylim=(-0.02, 1.02), title="answer-token accuracy (batch)", xlabel="step")
    if getattr(history, "attention", None):
        steps, ent = entropy_per_head(history, layer)
        for h in range(ent.shape[1]):
            c.plot(steps, ent[:, h], marker="o", ms=3, lw=1.2, label=f"head {h}")
        c.legend(fontsize=6, ncols=2)
        n_layers = len(history.attention[0].weights)
        c.set(ylim=(-0.02, 1.02), title=f"mean entropy / log n, layer {layer % n_layers}", xlabel="step")
    else:
        c.set_axis_off()
        c.text(0.5, 0.5, "no attention recorded", ha="center", va="center", transform=c.transAxes)
    for ax in (a, b, c):
        ax.grid(alpha=0.3)
        ax.title.set_fontsize(9)
        ax.xaxis.label.set_fontsize(8)
        ax.tick_params(labelsize=7)
    return fig


def save_animation(
    history: Any,
    path: str | os.PathLike[str],
    layer: int = -1,
    *,
    fps: int = 4,
    width: float | None = None,
    height: float | None = None,
    dpi: float = 80,
) -> int:
    """Write an animated GIF of one layer's maps, a frame per recorded step (every head side by
    side), with matplotlib's ``PillowWriter``. Returns the number of frames."""
    from matplotlib.animation import FuncAnimation, PillowWriter

    steps, maps = _layer_maps(history, layer)
    n_heads = maps.shape[1]
    rows, cols = _common.grid(n_heads)
    fig = _common.figure(width or 2.1 * cols + 0.9, height or 2.1 * rows + 0.5, dpi)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    images = []
    for h, ax in enumerate(axes):
        if h >= n_heads:
            ax.set_visible(False)
            continue
        images.append(ax.imshow(maps[0, h], cmap="viridis", vmin=0, vmax=1, interpolation="nearest"))
        ax.set_title(f"head {h}", fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.colorbar(images[-1], ax=list(axes[:n_heads]), shrink=0.8).set_label("weight", fontsize=8)
    title = fig.suptitle("", fontsize=9)
    n_layers = len(history.attention[0].weights)

    def frame(s: int) -> list[Any]:
        for h, im in enumerate(images):
            im.set_data(maps[s, h])
        title.set_text(f"{getattr(history, 'task', '')} · layer {layer % n_layers} · step {steps[s]}")
        return [*images, title]

    anim = FuncAnimation(fig, frame, frames=len(steps), blit=False, repeat=False)
    anim.save(os.fspath(path), writer=PillowWriter(fps=fps))
    return len(steps)
