"""``qkv explain``: attention replayed step by step, as text, JSON or HTML."""

import json
import math
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.console import Console

from .._checks import check_qkv
from .._explain import explain
from ..errors import ArgumentError
from ._common import Inputs, KFile, MaskSpec, QFile, VFile, mask_of, read_inputs

MAX_TRACE_BYTES = 2**31
"""Largest trace ``qkv explain`` builds from files: every step is kept whole, ~6 score matrices
(~10 with ``--grad``) of ``B·H·Nq·Nk`` float64 numbers."""


def _check_trace_size(arrays: tuple[Any, Any, Any], grad: bool) -> None:
    q, k, _ = arrays
    lead = math.prod(np.broadcast_shapes(q.shape[:-2], k.shape[:-2]))
    need = (10 if grad else 6) * lead * q.shape[-2] * k.shape[-2] * 8
    if need > MAX_TRACE_BYTES:
        raise ArgumentError(
            f"the trace of these inputs would hold ~{need / 2**30:.1f} GiB (every step of {lead} score matrices "
            f"{q.shape[-2]}x{k.shape[-2]}, kept whole); qkv explain builds at most {MAX_TRACE_BYTES / 2**30:.0f} GiB: "
            "explain a slice of the sequence, or use qkv.attention"
        )


def explain_command(
    q: QFile = None,
    k: KFile = None,
    v: VFile = None,
    inputs: Inputs = None,
    mask: MaskSpec = None,
    causal: Annotated[bool, typer.Option("--causal", help="mask future keys (bottom-right aligned)")] = False,
    scale: Annotated[float | None, typer.Option("--scale", help="score scale; default 1/sqrt(Dk)")] = None,
    grad: Annotated[bool, typer.Option("--grad", help="add the backward steps for dO = ones")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print the trace as JSON")] = False,
    html: Annotated[Path | None, typer.Option("--html", metavar="FILE", help="write the trace as HTML")] = None,
) -> None:
    """Replay attention step by step: S = QKᵀ, scaled, masked, A = softmax(S), row sums, entropy, O = AV.

    Without --q/--k/--v or --inputs it explains the built-in example (Q 2×2, K 3×2, V 3×2).
    The JSON's options say which impl qkv.attention would run for the same call, and why.
    """
    arrays = read_inputs(q, k, v, inputs)
    if arrays[0] is not None:
        check_qkv(*arrays)
        _check_trace_size(arrays, grad)
    m = None
    if mask is not None:
        nq, nk = (arrays[0].shape[-2], arrays[1].shape[-2]) if arrays[0] is not None else (2, 3)
        m = mask_of(mask, False, nq, nk)
    trace = explain(*arrays, mask=m, causal=causal, scale=scale, grad=grad)
    if html is not None:
        html.write_text(trace.to_html(), encoding="utf-8")
    if json_out:
        typer.echo(json.dumps(trace.to_dict(), indent=2))  # ASCII: safe on any terminal
    else:
        Console(soft_wrap=True, highlight=False, markup=False, emoji=False).print(str(trace), end="")
