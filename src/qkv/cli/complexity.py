"""``qkv complexity``: the cost model of ``qkv.complexity.estimate`` as a table, JSON or plot.

With ``--measure`` each configuration small enough to run is run in a fresh subprocess, timed,
and its peak memory read from the kernel (``qkv.bench._memory``, the harness the benchmarks
use), and printed beside the prediction.
"""

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from .._checks import check_impl
from ..errors import ArgumentError
from ._common import MaskSpec

MEASURE_BYTES = 2 * 10**9
"""``--measure`` runs a configuration only if its inputs, output and predicted peak fit in this..."""
MEASURE_FLOPS = 10**11
"""... and its predicted FLOPs stay under this (a few seconds on a laptop CPU)."""


def _ints(text: str, name: str) -> list[int]:
    try:
        values = [int(x.strip().lower().replace("k", "000")) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ArgumentError(f"{name} must be comma-separated integers such as 512,1024,2k, got {text!r}") from None
    if not values or min(values) < 1:  # any positive length: the estimate is its formulas beyond a call's
        raise ArgumentError(f"{name} must be positive integers, got {text!r}")
    return values


def _impls(values: list[str] | None) -> list[str]:
    names = [x.strip() for v in (values or ["reference,flash,torch"]) for x in v.split(",") if x.strip()]
    for name in names:
        check_impl(name, "--impl")
    return list(dict.fromkeys(names))


def _si(n: float, unit: str) -> str:
    """``4.29 G`` + unit: decimal prefixes, as in "8 · 32 · 2048² · 4 B ≈ 4.3 GB"."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {prefix}{unit}".rstrip()
    return f"{n:.3g} {unit}".rstrip()


# --------------------------------------------------------------------------- measurement


def _has_torch() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def _measured(row: dict[str, Any], mask_spec: str, rate: float) -> dict[str, Any]:
    """Measure one estimate row if it is small enough; adds ``measured`` (or ``skipped``)."""
    lib = "torch" if row["impl"] == "torch" or row["dtype"] == "bfloat16" or row["backward"] else "numpy"
    if lib == "torch" and not _has_torch():
        if row["impl"] == "torch" or row["dtype"] == "bfloat16":
            return {**row, "skipped": "needs torch"}
        lib = "numpy"
    need = row["input_bytes"] + row["output_bytes"] + row["peak_bytes"]
    if need > MEASURE_BYTES or row["flops"] > MEASURE_FLOPS:
        return {**row, "skipped": f"too large to run here (> {_si(MEASURE_BYTES, 'B')} or > {MEASURE_FLOPS:.0e} FLOPs)"}
    spec = {
        "batch": row["batch"],
        "heads": row["heads"],
        "kv_heads": row["kv_heads"],
        "n": row["n_q"],
        "d": row["d_k"],
        "dtype": row["dtype"],
        "impl": row["impl"],
        "mask": mask_spec,
        "backward": row["backward"],
        "lib": lib,
    }
    from ..bench import measure_attention

    m = measure_attention(spec)
    return {**row, "measured": {**m, "lib": lib, "predicted_seconds": row["flops"] / rate}}


# --------------------------------------------------------------------------- output


def _table(rows: list[dict[str, Any]], rate: float | None) -> Any:
    from rich.table import Table

    title = "qkv.complexity.estimate" + (" beside measurement" if rate else "") + " (bytes and FLOPs in SI units)"
    t = Table(title=title, title_justify="left")
    heads = ["impl", "N", "FLOPs", "kept", "scores B", "peak B", "KV cache B"]
    if rate:
        heads += ["pred. ms", "meas. ms", "FLOP/s", "meas. peak B", "meas/pred"]
    for col in heads:
        t.add_column(col, justify="left" if col == "impl" else "right")
    for r in rows:
        cells = [
            r["impl"],
            str(r["n_q"]),
            _si(r["flops"], ""),
            f"{100 * r['kept_fraction']:.0f}%",
            _si(r["score_bytes"], ""),
            _si(r["peak_bytes"], ""),
            _si(r["kv_cache_bytes"], ""),
        ]
        if rate:
            m = r.get("measured")
            if m is None:
                cells += [f"{r['flops'] / rate * 1e3:.3g}", r.get("skipped", ""), "", "", ""]
            else:
                ratio = f"{m['extra'] / r['peak_bytes']:.2f}" if r["peak_bytes"] else ""
                cells += [
                    f"{m['predicted_seconds'] * 1e3:.3g}",
                    f"{m['seconds'] * 1e3:.3g}",
                    _si(r["flops"] / m["seconds"], ""),
                    _si(m["extra"], ""),
                    ratio,
                ]
        t.add_row(*cells)
    return t


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """FLOPs and memory against N on log-log axes, one line per impl (measured points as markers)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ArgumentError("--plot needs matplotlib (pip install matplotlib)") from None
    if path.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise ArgumentError(f"--plot writes .png, .svg or .pdf, got {str(path)!r}")
    fig = Figure(figsize=(10, 4), constrained_layout=True)
    ax_f, ax_m = fig.subplots(1, 2)
    for i, impl in enumerate(dict.fromkeys(r["impl"] for r in rows)):
        rs = [r for r in rows if r["impl"] == impl]
        n, style = [r["n_q"] for r in rs], ("-", "--", ":", "-.")[i % 4]  # dashes: equal lines stay visible
        (line,) = ax_f.plot(n, [r["flops"] for r in rs], marker="o", linestyle=style, label=impl)
        ax_m.plot(
            n, [max(r["peak_bytes"], 1) for r in rs], marker="o", linestyle=style, color=line.get_color(), label=impl
        )
        got = [(r["n_q"], r["measured"]["extra"]) for r in rs if r.get("measured") and r["measured"]["extra"] > 0]
        if got:
            ax_m.plot(
                *zip(*got, strict=True),
                linestyle="none",
                marker="x",
                markersize=9,
                color=line.get_color(),
                label=f"{impl} measured",
            )
    for ax, title in ((ax_f, "FLOPs"), (ax_m, "peak memory beyond inputs and output (bytes)")):
        ax.set(xscale="log", yscale="log", xlabel="N (= Nq = Nk)", title=title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.savefig(path, dpi=120)


def complexity_command(
    n: Annotated[
        str, typer.Option("--n", help="sequence lengths, comma-separated (Nq = Nk); 2k = 2000")
    ] = "512,1024,2048,4096,8192",
    d: Annotated[int, typer.Option("--d", min=1, help="features per head (Dk = Dv)")] = 64,
    heads: Annotated[int, typer.Option("--heads", min=1, help="query heads H")] = 8,
    kv_heads: Annotated[int | None, typer.Option("--kv-heads", min=1, help="key/value heads (GQA; default H)")] = None,
    batch: Annotated[int, typer.Option("--batch", min=1, help="batch size B")] = 1,
    dtype: Annotated[str, typer.Option("--dtype", help="float32, float64, float16 or bfloat16")] = "float32",
    impl: Annotated[
        list[str] | None,
        typer.Option(
            "--impl", help="reference, flash, torch, auto: repeat or comma-separate (default: the first three)"
        ),
    ] = None,
    mask: MaskSpec = None,
    backward: Annotated[bool, typer.Option("--backward", help="add the backward pass")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print the rows as JSON")] = False,
    plot_path: Annotated[
        Path | None,
        typer.Option("--plot", metavar="FILE", help="write FLOPs and memory against N (log-log) to FILE (.png)"),
    ] = None,
    measure_: Annotated[
        bool,
        typer.Option(
            "--measure", help="also run each configuration small enough, and print measured time and peak memory"
        ),
    ] = False,
) -> None:
    """Predicted FLOPs, materialised scores, peak memory and KV cache of attention, per impl and N.

    With --measure, each configuration under 2 GB and 1e11 FLOPs is run in a fresh process:
    time beside the prediction at this machine's matmul rate, peak memory beyond inputs and
    output beside the model's.
    """
    from ..bench import matmul_rate
    from ..complexity import estimate
    from ._common import mask_of

    ns, impls = _ints(n, "--n"), _impls(impl)
    if plot_path is not None and plot_path.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise ArgumentError(f"--plot writes .png, .svg or .pdf, got {str(plot_path)!r}")
    rows = [
        estimate(
            x,
            d_k=d,
            heads=heads,
            kv_heads=kv_heads,
            batch=batch,
            dtype=dtype,
            impl=name,
            mask=mask_of(mask, False, x, x),
            backward=backward,
        ).to_dict()
        for name in impls
        for x in ns
    ]
    rate = None
    if measure_:
        rate = matmul_rate()
        rows = [_measured(r, mask or "none", rate) for r in rows]
    if plot_path is not None:
        plot(rows, plot_path)
    if json_out:
        typer.echo(json.dumps({"matmul_flops_per_second": rate, "rows": rows}))
        return
    from rich.console import Console

    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=160)  # pipes and files: no wrapping of the table
    console.print(_table(rows, rate))
    if rate:
        console.print(
            f"predicted ms = FLOPs / {_si(rate, 'FLOP/s')} (float32 batched matmul here); "
            f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"
        )
    if plot_path is not None:
        console.print(f"plot written to {plot_path}")
