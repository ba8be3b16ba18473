"""``qkv complexity``: the cost model of ``qkv.complexity.estimate`` as a table, JSON or plot,
and with ``--measure`` checked against the program: each configuration small enough to run is
run in a fresh subprocess, timed, and its peak memory read from the kernel (``VmHWM`` after
``/proc/self/clear_refs``, else ``ru_maxrss``; pages already mapped are locked first so that
nothing paged out during the call hides what it allocates). Registered by ``qkv.cli``.
"""

import gc
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from .bench._memory import _reset_peak, _status_bytes  # the benchmark suite's /proc readers
from .errors import ArgumentError, QKVError

MEASURE_BYTES = 2 * 10**9
"""``--measure`` runs a configuration only if its inputs, output and predicted peak fit in this..."""
MEASURE_FLOPS = 10**11
"""... and its predicted FLOPs stay under this (a few seconds on a laptop CPU)."""
IMPL_NAMES = ("reference", "flash", "torch", "auto")


def _ints(text: str, name: str) -> list[int]:
    try:
        values = [int(x.strip().lower().replace("k", "000")) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ArgumentError(f"{name} must be comma-separated integers such as 512,1024,2k, got {text!r}") from None
    if not values or min(values) < 1:
        raise ArgumentError(f"{name} must be positive integers, got {text!r}")
    return values


def _impls(values: list[str] | None) -> list[str]:
    names = [x.strip() for v in (values or ["reference,flash,torch"]) for x in v.split(",") if x.strip()]
    for name in names:
        if name not in IMPL_NAMES:
            raise ArgumentError(f"--impl must be among {list(IMPL_NAMES)}, got {name!r}")
    return list(dict.fromkeys(names))


def parse_mask(spec: str) -> Any:
    """``none``, ``causal`` or ``sliding:W`` (causal window of W keys) as a ``qkv.masks.Mask`` or None."""
    from . import masks

    if spec == "none":
        return None
    if spec == "causal":
        return masks.causal()
    if spec.startswith("sliding:"):
        return masks.sliding_window(_ints(spec.split(":", 1)[1], "--mask sliding:W")[0])
    raise ArgumentError(f"--mask must be none, causal or sliding:W, got {spec!r}")


def _si(n: float, unit: str) -> str:
    """``4.29 G`` + unit: decimal prefixes, as in "8 · 32 · 2048² · 4 B ≈ 4.3 GB"."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {prefix}{unit}".rstrip()
    return f"{n:.3g} {unit}".rstrip()


# --------------------------------------------------------------------------- measurement


def _trim_heap() -> None:
    """Give freed heap memory back to the OS before the baseline (glibc ``malloc_trim``).

    Otherwise memory freed while building the inputs stays resident, counts in the baseline,
    and is reused by the measured call, which then reads low by up to a score tile.
    """
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _pin_resident() -> bool:
    """Lock the pages mapped so far (libraries, inputs) in memory, so that a reclaimer paging out
    cold file-backed pages during a long call (DAMON on some VMs) cannot lower the RSS while the
    call allocates; later allocations are not locked. False where mlockall is not permitted."""
    try:
        import ctypes

        return int(ctypes.CDLL(None, use_errno=True).mlockall(1)) == 0  # 1 = MCL_CURRENT
    except (OSError, AttributeError):
        return False


def _child(spec_json: str) -> None:
    """Run one configuration (in a fresh process): print ``{"extra", "outputs", "seconds", ...}``."""
    import numpy as np

    import qkv

    s = json.loads(spec_json)
    mask, lib, backward = parse_mask(s["mask"]), s["lib"], s["backward"]
    rng = np.random.default_rng(0)

    def make(nq: int, nk: int) -> list[Any]:
        shapes = [
            (s["batch"], s["heads"], nq, s["d"]),
            (s["batch"], s["kv_heads"], nk, s["d"]),
            (s["batch"], s["kv_heads"], nk, s["d"]),
            (s["batch"], s["heads"], nq, s["d"]),
        ]
        xs = [rng.standard_normal(shape, dtype=np.float32) for shape in shapes]  # no float64 temporaries
        if lib == "torch":
            import torch

            return [torch.from_numpy(x).to(getattr(torch, s["dtype"])) for x in xs]
        return [x if s["dtype"] == "float32" else x.astype(s["dtype"]) for x in xs]

    def call(q: Any, k: Any, v: Any, dout: Any) -> list[Any]:
        kw = {"mask": mask, "impl": s["impl"]}
        if not backward:
            return [qkv.attention(q, k, v, **kw)]
        if lib == "torch":
            for x in (q, k, v):
                x.requires_grad_(True)
            out = qkv.attention(q, k, v, **kw)
            out.backward(dout)
            grads = [x.grad for x in (q, k, v)]
            for x in (q, k, v):
                x.grad = None
            return [out.detach(), *grads]
        out, lse = qkv.attention(q, k, v, return_lse=True, **kw)
        return [out, lse, *qkv.attention_backward(dout, q, k, v, out, lse, **kw)]

    call(*make(min(s["n"], 64), min(s["n"], 64)))  # libraries, thread pools and kernels loaded
    inputs = make(s["n"], s["n"])
    gc.collect()
    _trim_heap()
    pinned = _pin_resident()
    if _reset_peak():
        method, base = "VmHWM", _status_bytes("VmRSS") or 0
    else:
        method, base = "ru_maxrss", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.perf_counter()
    outs = call(*inputs)
    first = time.perf_counter() - t0
    peak = _status_bytes("VmHWM") if method == "VmHWM" else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out_bytes = sum(int(np.prod(o.shape)) * o.dtype.itemsize for o in outs)
    del outs
    times: list[float] = []
    while len(times) < s.get("repeats", 3) and sum(times) + first < 2.0:  # a few more calls while cheap
        t0 = time.perf_counter()
        call(*inputs)
        times.append(time.perf_counter() - t0)
    seconds = float(np.median(times)) if times else first
    print(
        json.dumps(
            {
                "extra": (peak or 0) - base - out_bytes,
                "outputs": out_bytes,
                "seconds": seconds,
                "method": method + (" after mlockall" if pinned else ""),
            }
        )
    )


def _run_child(spec: dict[str, Any], env: dict[str, str], timeout: float) -> dict[str, Any]:
    code = "import sys; from qkv._complexity_cli import _child; _child(sys.argv[1])"
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )
    if proc.returncode != 0:
        tail = " ".join(proc.stderr.strip().splitlines()[-2:])
        raise RuntimeError(f"measuring {spec} failed: {tail}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def measure(spec: dict[str, Any], timeout: float = 300.0) -> dict[str, Any]:
    """Run ``spec`` (batch, heads, kv_heads, n, d, dtype, impl, mask, backward, lib; optional
    repeats, timed calls after the first) in fresh subprocesses.

    ``extra`` is the peak memory beyond the inputs and the outputs (what ``peak_bytes`` predicts).
    Memory and time come from two processes: glibc raises its mmap threshold after each large
    free, so later tiles come from a heap that keeps freed pages resident and the high-water mark
    depends on allocation history (seen: 14-29 MB for a 10 MB working set). With a fixed threshold
    every large block is mapped afresh and returned on free, so VmHWM reads the live peak, the
    same on every run; but mapping every tile costs page faults, so the time is taken in a second
    process with the default allocator (when ``repeats`` asks for timed calls).
    """
    memory = _run_child({**spec, "repeats": 0}, {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}, timeout)
    if spec.get("repeats", 3) == 0:
        return memory
    timed = _run_child(spec, dict(os.environ), timeout)
    return {**memory, "seconds": timed["seconds"]}


def matmul_rate(seconds: float = 0.15, windows: int = 3) -> float:
    """FLOP/s of float32 batched matmuls shaped like attention tiles on this machine (NumPy): the
    best of a few short windows, so a slow spell or sleeping BLAS threads do not set the scale."""
    import numpy as np

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((8, 256, 64), dtype=np.float32), rng.standard_normal((8, 64, 512), dtype=np.float32)
    best = 0.0
    for _ in range(windows):
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            a @ b
            n += 1
        best = max(best, 2 * 8 * 256 * 64 * 512 * n / (time.perf_counter() - t0))
    return best


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
    m = measure(spec)
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
        import matplotlib
    except ImportError:
        raise ArgumentError("--plot needs matplotlib (pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_f, ax_m) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
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
    plt.close(fig)


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
    mask: Annotated[str, typer.Option("--mask", help="none, causal or sliding:W")] = "none",
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
    from .complexity import estimate

    try:
        ns, impls, m = _ints(n, "--n"), _impls(impl), parse_mask(mask)
        rows = [
            estimate(
                x, d_k=d, heads=heads, kv_heads=kv_heads, batch=batch, dtype=dtype, impl=name, mask=m, backward=backward
            ).to_dict()
            for name in impls
            for x in ns
        ]
        rate = None
        if measure_:
            rate = matmul_rate()
            rows = [_measured(r, mask, rate) for r in rows]
        if plot_path is not None:
            plot(rows, plot_path)
    except QKVError as e:
        typer.echo(f"error: {type(e).__name__}: {' '.join(str(e).split())}", err=True)
        raise typer.Exit(1) from None
    except (OSError, RuntimeError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
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
