"""What every picture shares: a pyplot-free ``Figure`` of an exact pixel size, saving as PNG/SVG/HTML.

Figures are ``matplotlib.figure.Figure`` objects with their own Agg canvas, never pyplot's
global state, so building pictures in a loop or a server thread leaks nothing between calls.
matplotlib is imported inside the functions: ``import qkv`` (and ``import qkv.plot``) stay light.
"""

import html
import io
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ArgumentError

FORMATS = ("png", "svg", "html")
MAX_TOKENS = 512  # per panel axis: beyond this the cells are sub-pixel and the labels unreadable
MAX_PANELS = 32
MAX_PIXELS = 8000  # per side of a picture


def figure(width: float, height: float, dpi: float = 100) -> Any:
    """An empty constrained-layout ``Figure`` of ``round(width·dpi) x round(height·dpi)`` pixels.

    The inches are nudged so that Agg's truncation of ``inches · dpi`` lands on the rounded
    pixel count exactly (``3.3 · 100`` is ``329.99…`` in floating point).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    w_px, h_px = pixel_size(width, height, dpi)
    fig = Figure(figsize=((w_px + 1e-3) / dpi, (h_px + 1e-3) / dpi), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def pixel_size(width: float, height: float, dpi: float) -> tuple[int, int]:
    """``(width_px, height_px)`` of a ``width x height`` inch picture at ``dpi``; checks the ranges."""
    for name, x in (("width", width), ("height", height), ("dpi", dpi)):
        if not (isinstance(x, (int, float)) and math.isfinite(x) and x > 0):
            raise ArgumentError(f"picture {name} must be a positive finite number, got {x!r}")
    w_px, h_px = round(width * dpi), round(height * dpi)
    if not (16 <= w_px <= MAX_PIXELS and 16 <= h_px <= MAX_PIXELS):
        raise ArgumentError(
            f"picture of {w_px}x{h_px} pixels ({width:g}x{height:g} in at {dpi:g} dpi): each side "
            f"must be 16..{MAX_PIXELS} pixels"
        )
    return w_px, h_px


def check_panel(n_q: int, n_k: int, what: str = "weights") -> None:
    """Refuse panels too large to draw legibly (``MAX_TOKENS`` per axis)."""
    if n_q > MAX_TOKENS or n_k > MAX_TOKENS:
        raise ArgumentError(
            f"{what} of Nq={n_q} x Nk={n_k} are too large to draw: at most {MAX_TOKENS} tokens per panel axis"
        )


def fontsize(n: int) -> float:
    """Tick-label size for an axis of ``n`` labels: small enough not to overlap."""
    return float(np.clip(220 / max(n, 1), 4.0, 9.0))


def grid(n: int, max_cols: int = 4) -> tuple[int, int]:
    """``(rows, cols)`` for ``n`` panels."""
    cols = min(n, max_cols)
    return math.ceil(n / cols), cols


def weights_cell(ax: Any, w: Any, title: str | None, fontsize: float, **title_kw: Any) -> Any:
    """One attention map ``w (Nq, Nk)`` in one cell of a grid: weights on [0, 1] in viridis, no
    ticks, ``title`` (the head) on top when given; returns the image for the colorbar."""
    image = ax.imshow(w, cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])
    if title is not None:
        ax.set_title(title, fontsize=fontsize, **title_kw)
    return image


def format_of(path: str | os.PathLike[str], fmt: str | None = None) -> str:
    """The picture format: ``fmt`` if given (it must agree with a known extension), else the extension."""
    ext = Path(path).suffix.lower().lstrip(".")
    if fmt is not None:
        fmt = fmt.lower()
        if fmt not in FORMATS:
            raise ArgumentError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
        if ext in FORMATS and ext != fmt:
            raise ArgumentError(f"--format {fmt} but the output file {os.fspath(path)!r} ends in .{ext}")
        return fmt
    if ext not in FORMATS:
        raise ArgumentError(
            f"cannot tell the picture format of {os.fspath(path)!r}: use a .png, .svg or .html "
            "file or --format png|svg|html"
        )
    return ext


def save(
    fig: Any,
    path: str | os.PathLike[str],
    fmt: str,
    *,
    title: str = "qkv",
    tables: list[tuple[str, list[str], list[list[Any]]]] | None = None,
) -> None:
    """Write ``fig`` as PNG, SVG or an HTML page (the SVG inline plus ``tables`` of numbers).

    ``tables``: ``(caption, header, rows)`` each. Metadata that changes from run to run (the
    date, matplotlib's version) is left out so the same picture gives the same bytes.
    """
    if fmt == "png":
        fig.savefig(path, format="png", metadata={"Software": None})
    elif fmt == "svg":
        fig.savefig(path, format="svg", metadata={"Date": None, "Creator": None})
    elif fmt == "html":
        Path(path).write_text(html_page(fig, title, tables or []), encoding="utf-8")
    else:
        raise ArgumentError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")


def svg_text(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    return text[text.index("<svg") :]  # drop the XML prolog and doctype: inline in HTML


def _cell(x: Any) -> str:
    if isinstance(x, (float, np.floating)):
        return f"{x:.4f}"
    return html.escape(str(x))


def html_page(fig: Any, title: str, tables: list[tuple[str, list[str], list[list[Any]]]]) -> str:
    """A self-contained page: the picture as inline SVG, then the tables (no network needed)."""
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:system-ui,sans-serif;margin:2em;color:#222}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:2px 8px;"
        "text-align:right;font-variant-numeric:tabular-nums}caption{text-align:left;font-weight:600}"
        "svg{max-width:100%;height:auto}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        svg_text(fig),
    ]
    for caption, header, rows in tables:
        parts.append(
            f"<table><caption>{html.escape(caption)}</caption><tr>"
            + "".join(f"<th>{html.escape(h)}</th>" for h in header)
            + "</tr>"
        )
        parts.extend("<tr>" + "".join(f"<td>{_cell(x)}</td>" for x in row) + "</tr>" for row in rows)
        parts.append("</table>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
