"""``qkv pe``: positional encodings as pictures (sinusoidal, RoPE, ALiBi), PNG, SVG or HTML.

Every picture is checked and drawn before any file is written; the files of one run are
written together (``all_or_nothing``), so a failure leaves none behind.
"""

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from ..errors import ArgumentError
from ._common import Dpi, Format, JsonOut, Size, all_or_nothing, output_path, picture_size, written

MAX_N, MAX_D, MAX_HEADS = 4096, 4096, 256
"""Upper bounds of ``--n``, ``--d`` and ``--heads``: tables of at most 16 M numbers."""


def pe_command(
    kind: Annotated[str, typer.Option("--kind", help="sinusoidal, rope, alibi or all")] = "all",
    n: Annotated[int, typer.Option("--n", min=1, max=MAX_N, help="positions")] = 64,
    d: Annotated[int, typer.Option("--d", min=1, max=MAX_D, help="model / head dimension (sinusoidal, rope)")] = 64,
    base: Annotated[float, typer.Option("--base", help="frequency base (sinusoidal, rope)")] = 10000.0,
    heads: Annotated[int, typer.Option("--heads", min=1, max=MAX_HEADS, help="heads (alibi)")] = 8,
    out: Annotated[
        Path | None, typer.Option("--out", metavar="FILE", help="output of one kind (default pe_KIND.png)")
    ] = None,
    out_dir: Annotated[Path | None, typer.Option("--out-dir", metavar="DIR", help="write pe_KIND.FORMAT here")] = None,
    fmt: Format = None,
    size: Size = None,
    dpi: Dpi = 100.0,
    json_out: JsonOut = False,
) -> None:
    """Positional encodings as pictures: sinusoidal table and similarity, RoPE angles and the
    relative-position invariance of q·k, ALiBi biases per head."""
    from ..plot import pe as plot_pe
    from ..plot import save

    kinds = list(plot_pe.PE_KINDS) if kind == "all" else [kind]
    if kind != "all" and kind not in plot_pe.PE_KINDS:
        raise ArgumentError(f"--kind must be one of {', '.join(plot_pe.PE_KINDS)}, all; got {kind!r}")
    if out is not None and (out_dir is not None or len(kinds) > 1):
        raise ArgumentError(
            "--out names one picture: use --out-dir DIR with --kind all"
            if out_dir is None
            else "give --out FILE or --out-dir DIR, not both"
        )
    width, height = picture_size(size)
    meta: dict[str, Any] = {"n": n, "d": d, "base": base, "heads": heads, "files": []}
    targets = [
        output_path(out if out is not None else (out_dir or Path()) / f"pe_{name}.{(fmt or 'png')}", fmt, f"pe_{name}")
        for name in kinds
    ]
    drawn = []
    for name in kinds:  # every picture drawn (and every argument checked) before a file is written
        fig = plot_pe.positional(name, n, d, base, heads, width=width, height=height, dpi=dpi)
        tables, numbers = _pe_numbers(name, n, d, base, heads)
        drawn.append((name, fig, tables))
        meta |= numbers
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    with all_or_nothing([path for path, _ in targets]) as temps:
        for (name, fig, tables), (path, form), temp in zip(drawn, targets, temps, strict=True):
            save(fig, temp, form, title=f"qkv positional encoding: {name}", tables=tables)
            meta["files"].append(written(fig, path, form) | {"kind": name})
    if json_out:
        typer.echo(json.dumps(meta))
    else:
        for f in meta["files"]:
            typer.echo(f"wrote {f['path']} ({f['format']}, {f['width_px']}x{f['height_px']} px)")


def _pe_numbers(name: str, n: int, d: int, base: float, heads: int) -> tuple[list[Any], dict[str, Any]]:
    """HTML tables and ``--json`` numbers of one positional-encoding picture."""
    from ..plot import pe as plot_pe
    from ..positional import sinusoidal

    if name == "sinusoidal":
        pe = sinusoidal(min(n, 8), d)
        cols = min(d, 8)
        return (
            [
                (
                    "PE[pos, dim], first positions and dimensions",
                    ["pos", *map(str, range(cols))],
                    [[i, *map(float, row[:cols])] for i, row in enumerate(pe)],
                )
            ],
            {},
        )
    if name == "rope":
        r = plot_pe.rope_numbers(n, d, base)
        rows = [[int(o), *map(float, r["scores"][:, i])] for i, o in enumerate(r["offsets"])]
        return (
            [
                (
                    "q·k after RoPE by offset, for keys at several absolute positions",
                    ["offset", *(f"key at {p}" for p in r["positions"])],
                    rows,
                )
            ],
            {"rope_spread": r["spread"]},
        )
    a = plot_pe.alibi_numbers(n, heads)
    return (
        [("ALiBi slope per head", ["head", "slope"], [[h, float(s)] for h, s in enumerate(a["slopes"])])],
        {"alibi_slopes": a["slopes"].tolist()},
    )
