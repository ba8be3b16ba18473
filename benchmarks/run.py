"""Run a named qkv benchmark suite and print its tables (optionally save JSON / Markdown).

    python benchmarks/run.py --suite targets            # the targets of benchmarks/LOG.md (~8 minutes)
    python benchmarks/run.py --suite sliding --mode fwd --n 1024,4096,16384
    python benchmarks/run.py --suite quick --quick      # seconds

Candidates are timed interleaved (A B C A B C ...); speed-ups are medians of per-round
ratios with their quartiles. ``--quiet-wait S`` waits up to S seconds for other processes to
go quiet before each case and re-runs a contended case once.
"""

import argparse
import sys
import time

from _report import setup, write  # sets OMP_NUM_THREADS before torch loads
from rich.console import Console

from qkv.bench import SUITE_NAMES, run_suite
from qkv.cli.bench import render


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", default="quick", choices=SUITE_NAMES)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--n", help="comma-separated sequence lengths")
    p.add_argument("--mode", choices=("fwd", "fwdbwd"))
    p.add_argument("--workload")
    p.add_argument("--impl", help="comma-separated candidates")
    p.add_argument("--max-call", type=float, help="skip candidates predicted slower than this (s per call)")
    p.add_argument("--quiet-wait", type=float, default=30.0, help="seconds to wait for a quiet machine per case")
    p.add_argument("--json", dest="json_path", help="write rows to this JSON file")
    p.add_argument("--markdown", help="write Markdown tables to this file")
    a = p.parse_args()
    header = setup()
    err = Console(stderr=True)
    t0 = time.perf_counter()
    rows = run_suite(
        a.suite,
        quick=a.quick,
        ns=[int(x) for x in a.n.split(",")] if a.n else None,
        modes=[a.mode] if a.mode else None,
        workloads=[a.workload] if a.workload else None,
        impls=a.impl.split(",") if a.impl else None,
        max_call_s=a.max_call,
        quiet_s=a.quiet_wait,
        progress=lambda m: err.print(f"[dim]{time.perf_counter() - t0:6.0f}s {m}[/]", highlight=False),
    )
    header["seconds"] = round(time.perf_counter() - t0)
    out = Console(width=200) if not sys.stdout.isatty() else Console()
    out.print(
        f"{header['command']} — {header['date']} — {header['seconds']} s; torch {header['torch']}, "
        f"numpy {header['numpy']}, {header['threads']} threads"
    )
    render(rows, out)
    write(rows, header, a.json_path, a.markdown)


if __name__ == "__main__":
    main()
