"""Shared by the scripts in benchmarks/: thread settings, the run header and Markdown tables."""

import datetime
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "2")  # before torch is imported: the machine has 2 cores


def setup() -> dict[str, Any]:
    """Pin torch to 2 threads, print ``qkv.info()``'s line (CPU, ISA path, engines, threads,
    versions) and describe the run (date, versions, command)."""
    import numpy as np
    import torch

    from qkv._info import fresh_line

    torch.set_num_threads(2)
    line = fresh_line()
    print(line, flush=True)
    return {
        "qkv_info": line,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": "python " + " ".join(sys.argv),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
        "cpus": os.cpu_count(),
    }


def fmt_x(value: float | None, q1: float | None = None, q3: float | None = None) -> str:
    if value is None:
        return "—"
    return f"{value:.2f}× ({q1:.2f}–{q3:.2f})" if q1 is not None and q3 is not None else f"{value:.2f}×"


def timing_markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| workload | N | mode | impl | median ms | IQR ms | rounds | speed-up vs baseline (q1–q3) | GFLOP/s |"
        " max err | note |",
        "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if r.get("kind") not in ("timing", "extra"):
            continue
        med = "" if r.get("median_s") is None else f"{r['median_s'] * 1e3:.3g}"
        iqr = "" if r.get("iqr_s") is None else f"{r['iqr_s'] * 1e3:.2g}"
        speed = (
            "baseline"
            if r.get("baseline") == r["impl"]
            else fmt_x(r.get("speedup"), r.get("speedup_q1"), r.get("speedup_q3"))
        )
        if r.get("kind") == "extra":
            speed = ""
        note = r.get("note", "")
        if r.get("bandwidth_gbs"):
            note = f"{r['bandwidth_gbs']:.1f} GB/s" + (f"; {note}" if note else "")
        elif r.get("status") not in (None, "ok"):
            note = f"{r['status']}: {note}"
        err = "" if r.get("max_abs_err") is None else f"{r['max_abs_err']:.1e}"
        gflops = "" if not r.get("gflops") else f"{r['gflops']:.1f}"
        lines.append(
            f"| {r['workload']} | {r['n']} | {r['mode']} | {r['impl']} | {med} | {iqr} | "
            f"{r.get('repeats') or ''} | {speed} | {gflops} | {err} | {note} |"
        )
    return "\n".join(lines)


def target_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| target | impl | measure | value (q1–q3) | goal | met |", "|---|---|---|---:|---:|---|"]
    for r in rows:
        if r.get("kind") != "target":
            continue
        low = r.get("lower_is_better")
        value = "—" if r["value"] is None else (f"{r['value']:.1f}" if low else fmt_x(r["value"], r["q1"], r["q3"]))
        goal = f"< {r['goal']:.0f}" if low else f"≥ {r['goal']:g}×"
        met = {"yes": "**yes**", "no": "**no**", "within noise": "within noise"}.get(r.get("verdict"), "—")
        lines.append(f"| {r['target']} | {r['impl']} | {r['measure']} | {value} | {goal} | {met} |")
    return "\n".join(lines)


def memory_markdown(rows: list[dict[str, Any]]) -> str:
    mib = 2**20
    lines = [
        "| impl | workload | N | H | mode | extra MiB | of which outputs+grads MiB | inputs MiB | one N×N fp32 "
        "matrix MiB | seconds |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r.get("kind") != "memory":
            continue
        if "extra" not in r:
            lines.append(f"| {r['impl']} | {r['workload']} | {r['n']} | {r['h']} | {r['mode']} | {r['note']} |||||")
            continue
        lines.append(
            f"| {r['impl']} | {r['workload']} | {r['n']} | {r['h']} | {r['mode']} | {r['extra'] / mib:.1f} | "
            f"{r['outputs'] / mib:.1f} | {r['inputs'] / mib:.1f} | {r['materialised'] / mib:,.0f} | "
            f"{r['seconds']:.1f} |"
        )
    return "\n".join(lines)


def write(rows: list[dict[str, Any]], header: dict[str, Any], json_path: str | None, md_path: str | None) -> None:
    """Save the rows as JSON and/or Markdown (header first)."""
    if json_path:
        Path(json_path).write_text(json.dumps({"header": header, "rows": rows}, indent=1, default=float))
    if md_path:
        parts = [
            f"`{header['command']}` — {header['date']}; torch {header['torch']}, numpy {header['numpy']}, "
            f"{header['threads']} threads",
            "",
            f"`{header['qkv_info']}`",
            "",
        ]
        for fn in (target_markdown, timing_markdown, memory_markdown):
            table = fn(rows)
            if table.count("\n") > 1:
                parts += [table, ""]
        Path(md_path).write_text("\n".join(parts))
