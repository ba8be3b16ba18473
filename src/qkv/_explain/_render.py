"""Text and HTML renderings of a ``Trace``: long axes abbreviated, values as ``0.0000``."""

import html as _html_escape
from collections.abc import Iterator
from typing import Any

import numpy as np

EDGE = 4  # rendered rows / columns kept at each end of a long axis
MATRICES = 4  # rendered 2-D slices of an array with leading (batch, head) axes


def _fmt(x: Any) -> str:
    text = f"{float(x):.4f}"
    return "0.0000" if text == "-0.0000" else text  # a tiny negative number is not news


def _cut(n: int) -> list[int | None]:
    """Indices shown along an axis of length ``n``; None marks the elided middle."""
    if n <= 2 * EDGE + 1:
        return list(range(n))
    return [*range(EDGE), None, *range(n - EDGE, n)]


def _matrices(value: np.ndarray) -> Iterator[tuple[str, list[list[str]]]]:
    """``(label, rows of cells)`` for each shown 2-D slice; "…" cells where axes are abbreviated."""
    m = value.reshape(1, 1) if value.ndim == 0 else value.reshape(1, -1) if value.ndim == 1 else value
    lead = list(np.ndindex(*m.shape[:-2]))
    for n, idx in enumerate(lead):
        if n == MATRICES:
            yield f"… {len(lead) - MATRICES} more {m.shape[-2]}×{m.shape[-1]} matrices", []
            return
        rows = [
            [("…" if j is None or i is None else _fmt(m[tuple(idx) + (i, j)])) for j in _cut(m.shape[-1])]
            for i in _cut(m.shape[-2])
        ]
        yield (f"[{', '.join(map(str, idx))}]" if idx else ""), rows


def text(t: Any) -> str:
    """Aligned text: a header line, then each step's name, formula, shape, note and values."""
    shapes = ", ".join(f"{n} {tuple(s)}" for n, s in t.inputs.items())
    what = f"{shapes} (the built-in example)" if t.options.get("example") else shapes
    lines = [f"qkv.explain: {what}; scale = {t.options['scale']:.4f}; dtype {t.options['dtype']}", ""]
    wn = max(len(s.name) for s in t)
    wf = max(len(s.formula) for s in t)
    ws = max(len(str(s.shape)) for s in t)
    for s in t:
        lines.append(f"{s.name:<{wn}}  {s.formula:<{wf}}  {str(s.shape):<{ws}}  {s.note}".rstrip())
        for label, rows in _matrices(s.value):
            if label:
                lines.append(f"    {label}")
            width = max((len(c) for r in rows for c in r), default=0)
            lines += ["    " + "  ".join(c.rjust(width) for c in r) for r in rows]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


_CSS = (
    ".qkv-trace{font-family:system-ui,sans-serif}.qkv-trace table{border-collapse:collapse;"
    "font-family:ui-monospace,monospace;margin:.25em 0 1em}.qkv-trace td{padding:0 .6em;text-align:right}"
    ".qkv-trace th{text-align:left;font-weight:normal;color:#666}.qkv-trace h3{margin:.5em 0 0}"
)


def html(t: Any) -> str:
    """A self-contained HTML fragment: a table per step, text escaped, no external assets."""
    e = _html_escape.escape
    shapes = ", ".join(f"{n} {tuple(s)}" for n, s in t.inputs.items())
    dtype = e(str(t.options["dtype"]))
    parts = [
        f'<div class="qkv-trace"><style>{_CSS}</style>',
        f"<p>qkv.explain: {e(shapes)}; scale = {t.options['scale']:.4f}; dtype {dtype}</p>",
    ]
    for s in t:
        parts.append(
            f'<section class="qkv-step" data-step="{e(s.name)}">'
            f"<h3><code>{e(s.name)}</code> — {e(s.formula)}</h3>"
            f"<p>shape {e(str(s.shape))}{' — ' + e(s.note) if s.note else ''}</p><table>"
        )
        for label, rows in _matrices(s.value):
            if label:
                parts.append(f'<tr><th colspan="{max(len(rows[0]) if rows else 1, 1)}">{e(label)}</th></tr>')
            parts += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows]
        parts.append("</table></section>")
    parts.append("</div>")
    return "\n".join(parts)
