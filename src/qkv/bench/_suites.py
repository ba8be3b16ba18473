"""Named benchmark suites: which workloads, lengths, modes and candidates, run case by case.

``run_suite(name)`` walks every (workload, mode) over increasing N; a candidate's time at one
N predicts its time at the next (``∝ N²``, ``∝ N`` for decoding), and candidates predicted to
exceed ``max_call_s`` are skipped, so each suite stays within minutes on a 2-core machine.
``"targets"`` is the list of goals in benchmarks/LOG.md (``_targets``); there the ``workloads`` filter takes
the target groups ``dense, sliding, document, memory, decode``.
"""

from collections.abc import Sequence
from typing import Any, NamedTuple

from ._run import Progress, run_case
from ._workloads import MODES, WORKLOADS, workload

STANDARD = ("qkv-flash", "qkv-auto", "qkv-reference", "sdpa-flash", "sdpa-math", "numpy", "flex")
FULL_NS = (512, 1024, 2048, 4096, 8192, 16384)


class Suite(NamedTuple):
    workloads: tuple[str, ...]
    ns: tuple[int, ...]
    quick_ns: tuple[int, ...]
    impls: tuple[str, ...] = STANDARD
    modes: tuple[str, ...] = MODES
    baseline: str = "sdpa-flash"
    budget_s: float = 12.0  # seconds of timed rounds per case (within the repeat bounds)
    max_call_s: float = 8.0


SUITES: dict[str, Suite] = {
    "quick": Suite(WORKLOADS, (512, 1024), (512,), STANDARD[:-1], budget_s=2.0, max_call_s=5.0),
    **{name: Suite((name,), FULL_NS, (512, 2048)) for name in ("dense", "causal", "sliding", "document", "gqa")},
    "decode": Suite(("decode", "decode-gqa"), (1024, 4096, 16384, 32768), (1024, 8192), modes=("fwd",)),
    "all": Suite(WORKLOADS, FULL_NS, (512, 2048)),
    "numpy": Suite(
        ("dense", "causal", "sliding"),
        (512, 1024, 2048, 4096),
        (512,),
        ("qkv-flash-np", "qkv-auto-np", "qkv-reference-np", "numpy", "qkv-flash"),
        baseline="qkv-reference-np",
    ),
}
SUITE_NAMES = (*SUITES, "targets")


def _scale(name: str, n_old: int, n_new: int) -> float:
    return n_new / n_old if name.startswith("decode") else (n_new / n_old) ** 2


def run_suite(
    name: str,
    quick: bool = False,
    *,
    ns: Sequence[int] | None = None,
    modes: Sequence[str] | None = None,
    workloads: Sequence[str] | None = None,
    impls: Sequence[str] | None = None,
    max_call_s: float | None = None,
    quiet_s: float = 0.0,
    progress: Progress = None,
) -> list[dict[str, Any]]:
    """Run suite ``name`` and return its rows (see ``run_case``); ``quick`` shrinks it to seconds.

    Rows: ``workload, n, mode, impl, status, median_s, iqr_s, speedup`` (baseline time over
    this time, median of per-round ratios, with ``speedup_q1/q3``), ``baseline``, ``gflops``
    (FLOPs of the pairs the mask allows, ``_workloads.flops``), ``max_abs_err`` against the
    baseline's output, ``others_cpu``, ``note``. ``quick`` drops FlexAttention (seconds of
    compilation); ``quiet_s`` waits up to that long for a quiet machine before each case and
    re-runs a contended case once.

    >>> rows = run_suite("quick", quick=True)
    """
    import torch

    torch.set_num_threads(2)  # the machine has 2 cores; say so rather than inherit
    if name == "targets":
        from ._targets import run_targets

        return run_targets(quick=quick, quiet_s=quiet_s, progress=progress, only=workloads)
    if name not in SUITES:
        raise ValueError(f"suite must be one of {SUITE_NAMES}, got {name!r}")
    s = SUITES[name]
    chosen = tuple(impls) if impls else tuple(c for c in s.impls if not (quick and c == "flex"))
    lengths = tuple(sorted(ns)) if ns else (s.quick_ns if quick else s.ns)
    cap = max_call_s if max_call_s is not None else (5.0 if quick else s.max_call_s)
    rows: list[dict[str, Any]] = []
    for wname in workloads or s.workloads:
        for mode in modes or s.modes:
            if mode not in MODES:
                raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
            if mode == "fwdbwd" and wname.startswith("decode"):
                continue  # decoding is inference
            last: dict[str, tuple[int, float]] = {}
            for n in lengths:
                w = workload(wname, n)
                guess = {c: t * _scale(wname, n0, n) for c, (n0, t) in last.items()}
                case = run_case(
                    w,
                    mode,
                    chosen,
                    baseline=s.baseline,
                    budget_s=1.0 if quick else s.budget_s,
                    repeats=(2, 3) if quick else (3, 9),
                    max_call_s=cap,
                    predicted=guess,
                    quiet_s=quiet_s,
                    progress=progress,
                )
                for r in case:
                    r["suite"] = name
                    if r["median_s"] is not None:
                        last[r["impl"]] = (n, r["median_s"])
                rows.extend(case)
    return rows
