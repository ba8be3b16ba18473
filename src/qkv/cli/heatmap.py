"""``qkv heatmap``: attention weights (or a mask alone) as a picture, a panel per head.

Parse -> compute with the public API (``qkv.attention``, ``qkv.diagnostics``) -> draw with
``qkv.plot`` -> write PNG (default), SVG or an HTML page, chosen by ``--format`` or the output's
extension; ``--json`` prints what was written and the numbers drawn. matplotlib is imported
only when the command runs.
"""

import json
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from .._checks import check_qkv
from ..errors import ArgumentError
from ._common import (
    Dpi,
    Format,
    Inputs,
    JsonOut,
    KFile,
    MaskSpec,
    QFile,
    Size,
    VFile,
    all_or_nothing,
    mask_of,
    output_path,
    picture_size,
    read_inputs,
    written,
)

MAX_RANDOM_N = 512
"""Largest ``--n`` for random inputs: more tokens than a picture can show one cell each."""
MAX_RANDOM_D = 4096
"""Largest ``--d``: random inputs of at most 3 · heads · N · D floats."""
MAX_RANDOM_HEADS = 64


def _random_qkv(n: int | None, d: int | None, heads: int | None, seed: int) -> tuple[Any, Any, Any]:
    n, d, heads = n or 8, d or 8, heads or 1
    for name, value, most in (("--n", n, MAX_RANDOM_N), ("--d", d, MAX_RANDOM_D), ("--heads", heads, MAX_RANDOM_HEADS)):
        if value > most:
            raise ArgumentError(f"{name} must be at most {most} to draw random inputs, got {value}")
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((heads, n, d)) for _ in range(3))  # type: ignore[return-value]


def _tokens(text: str | None, nq: int, nk: int) -> tuple[list[str] | None, list[str] | None]:
    """Key labels from ``--tokens``; queries take the last ``Nq`` (bottom-right alignment)."""
    if text is None:
        return None, None
    tokens = [t.strip() for t in text.split(",")]
    if len(tokens) != nk:
        raise ArgumentError(f"--tokens has {len(tokens)} labels but the keys have Nk={nk}")
    if nq > nk:
        raise ArgumentError(f"--tokens labels the keys; the Nq={nq} queries cannot be the last of Nk={nk} keys")
    return tokens[nk - nq :], tokens


def _stats_table(title: str, labels: list[str], stats: dict[str, np.ndarray]) -> tuple[str, list[str], list[list[Any]]]:
    rows = [
        [lab, float(s), float(e), float(n)]
        for lab, s, e, n in zip(labels, stats["sum"], stats["entropy"], stats["entropy_normalised"], strict=True)
    ]
    return f"{title}: per query row", ["query", "row sum", "entropy (nats)", "entropy / log n"], rows


def heatmap_command(
    q: QFile = None,
    k: KFile = None,
    v: VFile = None,
    inputs: Inputs = None,
    n: Annotated[int | None, typer.Option("--n", min=1, help="random q, k, v with N tokens (default 8)")] = None,
    d: Annotated[int | None, typer.Option("--d", min=1, help="random q, k, v: head dimension (default 8)")] = None,
    heads: Annotated[int | None, typer.Option("--heads", min=1, help="random q, k, v: heads (default 1)")] = None,
    seed: Annotated[int, typer.Option("--seed", min=0, help="seed of the random q, k, v")] = 0,
    mask: MaskSpec = None,
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
    import qkv
    from qkv import plot

    width, height = picture_size(size)
    path, form = output_path(out, fmt, "heatmap")
    arrays = read_inputs(q, k, v, inputs)
    if arrays[0] is not None:
        check_qkv(*arrays)  # shapes first: the sizes below are read from them
    random = n is not None or d is not None or heads is not None
    if arrays[0] is not None and random:
        raise ArgumentError("--n/--d/--heads draw random q, k, v: give them or input files, not both")
    if mask_only:
        if mask is None and not causal:
            raise ArgumentError("--mask-only draws a mask: give --mask SPEC or --causal")
        nq, nk = (arrays[0].shape[-2], arrays[1].shape[-2]) if arrays[0] is not None else (n or 16, n or 16)
        plot._common.check_panel(nq, nk, "mask")
        m = mask_of(mask, causal, nq, nk)
        tq, tk = _tokens(tokens, nq, nk)
        fig = plot.mask_picture(
            m, nq, nk, tokens_q=tq, tokens_k=tk, title=mask or "causal", width=width, height=height, dpi=dpi
        )
        allowed = m.dense(nq, nk)
        rows = [[i, int(c)] for i, c in enumerate(allowed.sum(-1))]
        with all_or_nothing([path]) as (temp,):
            plot.save(
                fig,
                temp,
                form,
                title=f"qkv mask: {mask or 'causal'}",
                tables=[("keys each query may attend", ["query", "keys"], rows)],
            )
        meta = written(fig, path, form) | {
            "mask": m.name,
            "shape": [nq, nk],
            "allowed_per_row": allowed.sum(-1).astype(int).tolist(),
        }
    else:
        example = arrays[0] is None and not random
        if example:
            from .._explain import EXAMPLE

            arrays = tuple(np.array(EXAMPLE[x]) for x in ("q", "k", "v"))  # type: ignore[assignment]
        elif arrays[0] is None:
            arrays = _random_qkv(n, d, heads, seed)
        qa, ka, va = arrays
        nq, nk = qa.shape[-2], ka.shape[-2]
        plot._common.check_panel(nq, nk)
        m = mask_of(mask, causal, nq, nk)
        from ..scores import temperature as temperature_mod

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
        with all_or_nothing([path]) as (temp,):
            plot.save(fig, temp, form, title="qkv heatmap", tables=tables)
        meta = written(fig, path, form) | {
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
