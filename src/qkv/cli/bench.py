"""``qkv bench``: run a named suite and print a rich table of ratios (``--json`` for machines).

torch is imported inside the suite only, so ``import qkv.cli`` stays light. Progress lines go
to stderr; the table or the JSON to stdout.
"""

import json
import math
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from .._info import fresh_line
from ..bench import SUITE_NAMES


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return f"{seconds * 1e3:.3g}" if seconds < 1 else f"{seconds * 1e3:,.0f}"


def _x(value: float | None, q1: float | None = None, q3: float | None = None) -> str:
    if value is None or not math.isfinite(value):
        return ""
    spread = f" [{q1:.2f}–{q3:.2f}]" if q1 is not None and q3 is not None else ""
    return f"{value:.2f}×{spread}"


def timing_table(rows: list[dict[str, Any]], title: str = "Timings") -> Table:
    """Rows of ``kind`` timing/extra as a table, one section per (workload, N, mode)."""
    t = Table(title=title, title_justify="left")
    for col, just in (
        ("workload", "left"),
        ("N", "right"),
        ("mode", "left"),
        ("impl", "left"),
        ("median ms", "right"),
        ("IQR ms", "right"),
        ("n", "right"),
        ("speed-up vs baseline", "right"),
        ("GFLOP/s", "right"),
        ("max err", "right"),
        ("note", "left"),
    ):
        t.add_column(col, justify=just, overflow="fold")  # type: ignore[arg-type]
    case = None
    for r in rows:
        if r.get("kind") not in ("timing", "extra"):
            continue
        key = (r["workload"], r["n"], r["mode"])
        if case is not None and key != case:
            t.add_section()
        case = key
        note = r.get("note", "")
        if r.get("bandwidth_gbs"):
            note = f"{r['bandwidth_gbs']:.1f} GB/s read" + (f"; {note}" if note else "")
        elif r["status"] != "ok":
            note = f"{r['status']}: {note}"
        speed = _x(r.get("speedup"), r.get("speedup_q1"), r.get("speedup_q3"))
        if speed and r.get("baseline") == r["impl"]:
            speed = "baseline"
        err = r.get("max_abs_err")
        t.add_row(
            r["workload"],
            str(r["n"]),
            r["mode"],
            r["impl"],
            _ms(r.get("median_s")),
            _ms(r.get("iqr_s")),
            str(r.get("repeats") or ""),
            speed,
            f"{r['gflops']:.1f}" if r.get("gflops") else "",
            f"{err:.1e}" if err is not None else "",
            note,
        )
    return t


def target_table(rows: list[dict[str, Any]]) -> Table:
    """Rows of ``kind`` target (goal, measured ratio with its quartiles, met or not)."""
    t = Table(title="Targets", title_justify="left")
    for col in ("target", "impl", "measure", "value [q1–q3]", "goal", "met"):
        t.add_column(col)
    for r in rows:
        if r.get("kind") != "target":
            continue
        low = r.get("lower_is_better")
        value = "" if r["value"] is None else (f"{r['value']:.1f}" if low else _x(r["value"], r["q1"], r["q3"]))
        goal = f"< {r['goal']:.0f}" if low else f"≥ {r['goal']:g}×"
        verdict = str(r.get("verdict"))
        met = {"yes": "[green]yes[/]", "no": "[red]no[/]", "within noise": "[yellow]within noise[/]"}.get(verdict, "—")
        t.add_row(r["target"], r["impl"], r["measure"], value or r.get("note", ""), goal, met)
    return t


def memory_table(rows: list[dict[str, Any]]) -> Table:
    """Rows of ``kind`` memory (peak RSS in a subprocess)."""
    t = Table(title="Peak memory (subprocess)", title_justify="left")
    for col in ("impl", "workload", "N", "H", "mode", "extra MiB", "outputs MiB", "inputs MiB", "seconds", "note"):
        t.add_column(col)
    mib = 2**20
    for r in rows:
        if r.get("kind") != "memory":
            continue
        has = "extra" in r
        t.add_row(
            r["impl"],
            r["workload"],
            str(r["n"]),
            str(r["h"]),
            r["mode"],
            f"{r['extra'] / mib:.1f}" if has else "",
            f"{r['outputs'] / mib:.1f}" if has else "",
            f"{r['inputs'] / mib:.1f}" if has else "",
            f"{r['seconds']:.1f}" if has else "",
            r.get("note") or r.get("method", ""),
        )
    return t


def render(rows: list[dict[str, Any]], console: Console) -> None:
    """Print every table that has rows."""
    kinds = {r.get("kind") for r in rows}
    if kinds & {"timing", "extra"}:
        console.print(timing_table(rows))
    if "memory" in kinds:
        console.print(memory_table(rows))
    if "target" in kinds:
        console.print(target_table(rows))


def _ints(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        values = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise typer.BadParameter(f"--n takes comma-separated integers like 512,1024, got {text!r}") from None
    if not values or min(values) < 1:
        raise typer.BadParameter(f"--n takes positive integers, got {text!r}")
    return values


def bench_command(
    suite: Annotated[str, typer.Option("--suite", help=f"Suite to run: {', '.join(SUITE_NAMES)}.")] = "quick",
    quick: Annotated[bool, typer.Option("--quick", help="Small sizes, few rounds, no FlexAttention.")] = False,
    n: Annotated[str | None, typer.Option("--n", help="Sequence lengths, comma-separated, e.g. 512,1024.")] = None,
    mode: Annotated[str | None, typer.Option("--mode", help="fwd or fwdbwd (default: the suite's modes).")] = None,
    workload: Annotated[str | None, typer.Option("--workload", help="Only this workload (target group).")] = None,
    impl: Annotated[str | None, typer.Option("--impl", help="Candidates, comma-separated.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the rows as JSON instead of tables.")] = False,
) -> None:
    """Benchmark qkv against torch SDPA, FlexAttention and NumPy: interleaved ratios, medians and spread."""
    from ..bench import COMPETITORS, MODES, TARGET_GROUPS, WORKLOADS, run_suite

    if suite not in SUITE_NAMES:
        raise typer.BadParameter(f"--suite must be one of {', '.join(SUITE_NAMES)}, got {suite!r}")
    if mode is not None and mode not in MODES:
        raise typer.BadParameter(f"--mode must be fwd or fwdbwd, got {mode!r}")
    allowed = TARGET_GROUPS if suite == "targets" else WORKLOADS
    if workload is not None and workload not in allowed:
        raise typer.BadParameter(f"--workload must be one of {', '.join(allowed)}, got {workload!r}")
    impls = [x for x in (impl or "").split(",") if x] or None
    unknown = sorted(set(impls or ()) - set(COMPETITORS))
    if unknown:
        raise typer.BadParameter(f"unknown --impl {', '.join(unknown)}; known: {', '.join(COMPETITORS)}")
    err = Console(stderr=True)
    # the header: qkv.info()'s line (from a fresh interpreter: this one stays as the suite measures it);
    # stdout keeps only JSON under --json
    typer.echo(fresh_line(), err=json_out)
    rows = run_suite(
        suite,
        quick=quick,
        ns=_ints(n),
        modes=[mode] if mode else None,
        workloads=[workload] if workload else None,
        impls=impls,
        progress=lambda msg: err.print(f"[dim]{msg}[/]", highlight=False),
    )
    if json_out:
        typer.echo(json.dumps(rows, default=float))
    else:
        out = Console()
        render(rows, out if out.is_terminal else Console(width=200))  # a file or a pipe gets whole rows
