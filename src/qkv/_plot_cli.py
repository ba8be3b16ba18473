"""``qkv heatmap`` and ``qkv pe``: pictures from the command line (registered by ``qkv.cli``).

Parse -> compute with the public API (``qkv.attention``, ``qkv.diagnostics``, ``qkv.positional``)
-> draw with ``qkv.plot`` -> write PNG (default), SVG or an HTML page, chosen by ``--format`` or
the output's extension; ``--json`` prints what was written and the numbers drawn. matplotlib is
imported only when a command runs.
"""

import json
import math
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

FILE = ".npy, .npz[:key], .json[:key] or .csv"
MAX_RANDOM_N = 512

# the output options both commands share
Format = Annotated[str | None, typer.Option("--format", help="png, svg or html (default: from --out)")]
Size = Annotated[str | None, typer.Option("--size", metavar="WxH", help="picture size in inches")]
Dpi = Annotated[float, typer.Option("--dpi", help="pixels per inch")]
JsonOut = Annotated[bool, typer.Option("--json", help="print what was written and the numbers, as JSON")]


def _size(text: str | None) -> tuple[float | None, float | None]:
    """``"8x4.5"`` -> inches; None keeps the picture's own size."""
    from .errors import ArgumentError

    if text is None:
        return None, None
    w, sep, h = text.lower().partition("x")
    try:
        width, height = float(w), float(h)
    except ValueError:
        width = height = math.nan
    if not sep or not (math.isfinite(width) and math.isfinite(height) and width > 0 and height > 0):
        raise ArgumentError(f"--size must be WIDTHxHEIGHT in inches, e.g. 8x4.5, got {text!r}")
    return width, height


def _written(fig: Any, path: Path, fmt: str) -> dict[str, Any]:
    from .plot._common import pixel_size

    w, h = fig.get_size_inches()
    w_px, h_px = pixel_size(float(w), float(h), float(fig.dpi))
    return {
        "path": str(path),
        "format": fmt,
        "width_px": w_px,
        "height_px": h_px,
        "dpi": float(fig.dpi),
        "width_in": round(float(w), 3),
        "height_in": round(float(h), 3),
    }


def _random_qkv(n: int | None, d: int | None, heads: int | None, seed: int) -> tuple[Any, Any, Any]:
    from .errors import ArgumentError

    n, d, heads = n or 8, d or 8, heads or 1
    if n > MAX_RANDOM_N:
        raise ArgumentError(f"--n must be at most {MAX_RANDOM_N} tokens to draw, got {n}")
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((heads, n, d)) for _ in range(3))  # type: ignore[return-value]


def _tokens(text: str | None, nq: int, nk: int) -> tuple[list[str] | None, list[str] | None]:
    """Key labels from ``--tokens``; queries take the last ``Nq`` (bottom-right alignment)."""
    from .errors import ArgumentError

    if text is None:
        return None, None
    tokens = [t.strip() for t in text.split(",")]
    if len(tokens) != nk:
        raise ArgumentError(f"--tokens has {len(tokens)} labels but the keys have Nk={nk}")
    if nq > nk:
        raise ArgumentError(f"--tokens labels the keys; the Nq={nq} queries cannot be the last of Nk={nk} keys")
    return tokens[nk - nq :], tokens


def _mask(spec: str | None, causal: bool, nq: int, nk: int) -> Any:
    """The combined ``Mask`` (``--mask`` and ``--causal``), or None."""
    from . import masks
    from ._mask_spec import build_mask, parse_mask_spec

    m = None
    if spec is not None:
        kind, params = parse_mask_spec(spec)
        m = build_mask(kind, nq, nk, **params)
    if causal:
        m = masks.causal() if m is None else m & masks.causal()
    return m


def _output(out: Path | None, fmt: str | None, stem: str) -> tuple[Path, str]:
    from .plot._common import format_of

    path = out if out is not None else Path(f"{stem}.{(fmt or 'png').lower()}")
    return path, format_of(path, fmt)


def _stats_table(title: str, labels: list[str], stats: dict[str, np.ndarray]) -> tuple[str, list[str], list[list[Any]]]:
    rows = [
        [lab, float(s), float(e), float(n)]
        for lab, s, e, n in zip(labels, stats["sum"], stats["entropy"], stats["entropy_normalised"], strict=True)
    ]
    return f"{title}: per query row", ["query", "row sum", "entropy (nats)", "entropy / log n"], rows


def heatmap_command(
    q: Annotated[str | None, typer.Option("--q", metavar="FILE", help=f"queries (..., Nq, Dk): {FILE}")] = None,
    k: Annotated[str | None, typer.Option("--k", metavar="FILE", help=f"keys (..., Nk, Dk): {FILE}")] = None,
    v: Annotated[str | None, typer.Option("--v", metavar="FILE", help=f"values (..., Nk, Dv): {FILE}")] = None,
    inputs: Annotated[
        str | None,
        typer.Option("--inputs", metavar="FILE", help="q, k and v from one .npz or .json file with keys q, k, v"),
    ] = None,
    n: Annotated[int | None, typer.Option("--n", min=1, help="random q, k, v with N tokens (default 8)")] = None,
    d: Annotated[int | None, typer.Option("--d", min=1, help="random q, k, v: head dimension (default 8)")] = None,
    heads: Annotated[int | None, typer.Option("--heads", min=1, help="random q, k, v: heads (default 1)")] = None,
    seed: Annotated[int, typer.Option("--seed", help="seed of the random q, k, v")] = 0,
    mask: Annotated[
        str | None,
        typer.Option(
            "--mask",
            metavar="SPEC",
            help="kind[:key=value,...], e.g. sliding_window:window=4,causal=false; kinds: "
            "none, causal, sliding_window, document, padding, prefix_lm, longformer, bigbird, dilated",
        ),
    ] = None,
    causal: Annotated[bool, typer.Option("--causal", help="mask future keys (bottom-right aligned)")] = False,
    scale: Annotated[float | None, typer.Option("--scale", help="score scale; default 1/sqrt(Dk)")] = None,
    temperature: Annotated[
        float | None, typer.Option("--temperature", help="divide the scaled scores by T (> 1 flattens, < 1 sharpens)")
    ] = None,
    mask_only: Annotated[
        bool, typer.Option("--mask-only", help="draw the mask alone (sizes from the inputs or --n, default 16)")
    ] = False,
    overlay: Annotated[bool, typer.Option("--overlay", help="grey and hatch the cells the mask hides")] = False,
    tokens: Annotated[str | None, typer.Option("--tokens", metavar="A,B,C", help="labels of the Nk keys")] = None,
    out: Annotated[Path | None, typer.Option("--out", metavar="FILE", help="output (default heatmap.png)")] = None,
    fmt: Format = None,
    size: Size = None,
    dpi: Dpi = 100.0,
    json_out: JsonOut = False,
) -> None:
    """Attention weights as a heatmap: a panel per head, token labels, row sums and entropy per row.

    Without --q/--k/--v, --inputs or --n it draws the built-in worked example (Q 2×2, K 3×2, V 3×2).
    """
    from .cli import _fail, _one_line_errors, _read_inputs

    with _one_line_errors():
        import qkv
        from qkv import plot

        width, height = _size(size)
        path, form = _output(out, fmt, "heatmap")
        arrays = _read_inputs(q, k, v, inputs)
        random = n is not None or d is not None or heads is not None
        if arrays[0] is not None and random:
            _fail("--n/--d/--heads draw random q, k, v: give them or input files, not both")
        if mask_only:
            if mask is None and not causal:
                _fail("--mask-only draws a mask: give --mask SPEC or --causal")
            nq, nk = (arrays[0].shape[-2], arrays[1].shape[-2]) if arrays[0] is not None else (n or 16, n or 16)
            plot._common.check_panel(nq, nk, "mask")
            m = _mask(mask, causal, nq, nk)
            tq, tk = _tokens(tokens, nq, nk)
            fig = plot.mask_picture(
                m, nq, nk, tokens_q=tq, tokens_k=tk, title=mask or "causal", width=width, height=height, dpi=dpi
            )
            allowed = m.dense(nq, nk)
            rows = [[i, int(c)] for i, c in enumerate(allowed.sum(-1))]
            plot.save(
                fig,
                path,
                form,
                title=f"qkv mask: {mask or 'causal'}",
                tables=[("keys each query may attend", ["query", "keys"], rows)],
            )
            meta = _written(fig, path, form) | {
                "mask": m.name,
                "shape": [nq, nk],
                "allowed_per_row": allowed.sum(-1).astype(int).tolist(),
            }
        else:
            example = arrays[0] is None and not random
            if example:
                from ._explain import EXAMPLE

                arrays = tuple(np.array(EXAMPLE[x]) for x in ("q", "k", "v"))  # type: ignore[assignment]
            elif arrays[0] is None:
                arrays = _random_qkv(n, d, heads, seed)
            qa, ka, va = arrays
            nq, nk = qa.shape[-2], ka.shape[-2]
            plot._common.check_panel(nq, nk)
            m = _mask(mask, causal, nq, nk)
            from .scores import temperature as temperature_mod

            score_mod = None if temperature is None else temperature_mod(temperature)
            _, w = qkv.attention(qa, ka, va, mask=m, scale=scale, score_mod=score_mod, return_weights=True)
            w = np.asarray(w)
            allowed = None if m is None else np.broadcast_to(m.dense(nq, nk), w.shape)
            stats = plot.row_stats(w, allowed)
            tq, tk = _tokens(tokens, nq, nk)
            what = ", ".join(
                x
                for x in (
                    "worked example" if example else None,
                    f"mask {m.name}" if m is not None else None,
                    f"scale {scale:g}" if scale is not None else None,
                    f"temperature {temperature:g}" if temperature is not None else None,
                )
                if x
            )
            fig = plot.heatmap(
                w,
                tokens_q=tq,
                tokens_k=tk,
                mask=allowed if overlay else None,
                overlay=overlay,
                suptitle=f"attention weights softmax(QKᵀ·scale){' — ' + what if what else ''}",
                width=width,
                height=height,
                dpi=dpi,
            )
            panels = w.reshape(-1, nq, nk)
            labels = tq or [f"q{i}" for i in range(nq)]
            flat = {key: val.reshape(-1, nq) for key, val in stats.items()}
            titles = [f"panel {p}" for p in range(len(panels))]
            tables = [
                _stats_table(titles[p], labels, {key: val[p] for key, val in flat.items()}) for p in range(len(panels))
            ]
            if nq * nk <= 256:
                tables += [
                    (
                        f"{titles[p]}: weights",
                        ["query", *(tk or [f"k{j}" for j in range(nk)])],
                        [[labels[i], *map(float, panels[p][i])] for i in range(nq)],
                    )
                    for p in range(len(panels))
                ]
            plot.save(fig, path, form, title="qkv heatmap", tables=tables)
            meta = _written(fig, path, form) | {
                "shapes": {"q": list(qa.shape), "k": list(ka.shape), "v": list(va.shape), "weights": list(w.shape)},
                "mask": None if m is None else m.name,
                "scale": scale,
                "temperature": temperature,
                "panels": [
                    {
                        "index": list(np.unravel_index(p, w.shape[:-2])) if w.ndim > 2 else [],
                        "row_sums": flat["sum"][p].tolist(),
                        "entropy": flat["entropy"][p].tolist(),
                        "entropy_normalised": flat["entropy_normalised"][p].tolist(),
                    }
                    for p in range(len(panels))
                ],
            }
        if json_out:
            typer.echo(json.dumps(meta, default=int))
        else:
            typer.echo(f"wrote {path} ({meta['format']}, {meta['width_px']}x{meta['height_px']} px)")


def pe_command(
    kind: Annotated[str, typer.Option("--kind", help="sinusoidal, rope, alibi or all")] = "all",
    n: Annotated[int, typer.Option("--n", min=1, help="positions")] = 64,
    d: Annotated[int, typer.Option("--d", min=1, help="model / head dimension (sinusoidal, rope)")] = 64,
    base: Annotated[float, typer.Option("--base", help="frequency base (sinusoidal, rope)")] = 10000.0,
    heads: Annotated[int, typer.Option("--heads", min=1, help="heads (alibi)")] = 8,
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
    from .cli import _fail, _one_line_errors

    with _one_line_errors():
        from .errors import ArgumentError
        from .plot import pe as plot_pe
        from .plot import save

        kinds = list(plot_pe.PE_KINDS) if kind == "all" else [kind]
        if kind != "all" and kind not in plot_pe.PE_KINDS:
            raise ArgumentError(f"--kind must be one of {', '.join(plot_pe.PE_KINDS)}, all; got {kind!r}")
        if out is not None and (out_dir is not None or len(kinds) > 1):
            _fail(
                "--out names one picture: use --out-dir DIR with --kind all"
                if out_dir is None
                else "give --out FILE or --out-dir DIR, not both"
            )
        width, height = _size(size)
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
        meta: dict[str, Any] = {"n": n, "d": d, "base": base, "heads": heads, "files": []}
        for name in kinds:
            path, form = _output(
                out if out is not None else (out_dir or Path()) / f"pe_{name}.{(fmt or 'png')}", fmt, f"pe_{name}"
            )
            fig = plot_pe.positional(name, n, d, base, heads, width=width, height=height, dpi=dpi)
            tables, numbers = _pe_numbers(name, n, d, base, heads)
            save(fig, path, form, title=f"qkv positional encoding: {name}", tables=tables)
            meta["files"].append(_written(fig, path, form) | {"kind": name})
            meta |= numbers
        if json_out:
            typer.echo(json.dumps(meta))
        else:
            for f in meta["files"]:
                typer.echo(f"wrote {f['path']} ({f['format']}, {f['width_px']}x{f['height_px']} px)")


def _pe_numbers(name: str, n: int, d: int, base: float, heads: int) -> tuple[list[Any], dict[str, Any]]:
    """HTML tables and ``--json`` numbers of one positional-encoding picture."""
    from .plot import pe as plot_pe
    from .positional import sinusoidal

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
