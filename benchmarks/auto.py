"""Check ``impl="auto"`` against the best of qkv's other impls, workload by workload.

    python benchmarks/auto.py            # ~8 minutes
    python benchmarks/auto.py --quick

For each case every qkv impl runs interleaved with ``auto``; the reported ratio is, per
round, ``t(auto) / min(t(flash), t(torch), t(reference))``, then the median and quartiles
(1.00 = auto chose the best; above 1 by more than the spread = a wrong choice). The impl
auto picked is read from ``qkv._impls.auto`` (a private helper, for this report only).
Candidates slower than 2 s per call (the reference at N = 4096) are timed once and left out
of the rounds: freeing their gigabytes of scores slows whichever candidate runs next.
"""

import argparse
import sys
import time
from typing import Any

import numpy as np
from _report import setup  # sets OMP_NUM_THREADS before torch loads
from rich.console import Console
from rich.table import Table

import qkv
from qkv.bench import run_case, workload
from qkv.bench._competitors import CaseData


def chosen(w: Any, lib: str) -> str:
    """The impl ``auto`` picks for ``w`` (``qkv.dispatch``)."""
    x = CaseData(w).inputs(lib)
    return qkv.dispatch(x.q, x.k, x.v, mask=w.mask).impl


def auto_vs_best(rows: list[dict[str, Any]], auto_name: str) -> tuple[float, float, float, str] | None:
    by = {r["impl"]: r for r in rows if r["status"] == "ok" and len(r["samples"]) > 1}
    if auto_name not in by or len(by) < 2:
        return None
    others = {k: np.asarray(v["samples"]) for k, v in by.items() if k != auto_name}
    n = min(len(v) for v in others.values())
    best = np.min(np.stack([v[:n] for v in others.values()]), axis=0)
    ratio = np.asarray(by[auto_name]["samples"][:n]) / best
    q1, med, q3 = np.percentile(ratio, [25, 50, 75])
    fastest = min(others, key=lambda k: float(np.median(others[k])))
    return float(med), float(q1), float(q3), fastest


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    header = setup()
    torch_impls = ("qkv-auto", "qkv-flash", "qkv-torch", "qkv-reference")
    numpy_impls = ("qkv-auto-np", "qkv-flash-np", "qkv-reference-np")
    ns = (256, 1024) if a.quick else (128, 256, 1024, 4096)
    cases = [
        (name, n, mode, "torch")
        for name in ("dense", "causal", "sliding", "document", "gqa")
        for n in ns
        for mode in ("fwd", "fwdbwd")
    ]
    cases += [
        (name, n, "fwd", "torch") for name in ("decode", "decode-gqa") for n in ((4096,) if a.quick else (4096, 32768))
    ]
    cases += [(name, n, "fwd", "numpy") for name in ("dense", "sliding") for n in ns]
    err = Console(stderr=True)
    t0 = time.perf_counter()
    results = []
    for name, n, mode, lib in cases:
        w = workload(name, n)
        impls = torch_impls if lib == "torch" else numpy_impls
        err.print(f"[dim]{time.perf_counter() - t0:5.0f}s {w.label} {mode} {lib}[/]")
        rows = run_case(
            w,
            mode,
            impls,
            baseline=impls[0],
            budget_s=3.0 if a.quick else 6.0,
            repeats=(3, 9),
            max_call_s=2.0,
            quiet_s=0 if a.quick else 20.0,
        )
        results.append((name, n, mode, lib, chosen(w, lib), auto_vs_best(rows, impls[0]), rows))
    out = Console(width=160) if not sys.stdout.isatty() else Console()
    out.print(f"{header['command']} — {header['date']} — {time.perf_counter() - t0:.0f} s; torch {header['torch']}")
    table = Table(
        "workload",
        "N",
        "mode",
        "arrays",
        "auto chose",
        "fastest other",
        "auto / best (q1–q3)",
        "times ms (auto; others)",
        "busy elsewhere",
    )
    for name, n, mode, lib, pick, ratio, rows in results:
        times = "; ".join(
            f"{r['impl'].removeprefix('qkv-')} {r['median_s'] * 1e3:.3g}" for r in rows if r["median_s"] is not None
        )
        skipped = [r["impl"].removeprefix("qkv-") for r in rows if r["median_s"] is None]
        if skipped:
            times += f" (not run: {', '.join(skipped)})"
        cell = "" if ratio is None else f"{ratio[0]:.2f} ({ratio[1]:.2f}–{ratio[2]:.2f})"
        flag = "[red]" if ratio is not None and ratio[1] > 1.1 else ""
        busy = rows[0].get("others_cpu")
        table.add_row(
            name,
            str(n),
            mode,
            lib,
            pick,
            "" if ratio is None else ratio[3].removeprefix("qkv-"),
            f"{flag}{cell}",
            times,
            "" if busy is None else f"{busy:.2f}",
        )
    out.print(table)


if __name__ == "__main__":
    main()
