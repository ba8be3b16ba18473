"""One benchmark case: every candidate on one workload and mode, interleaved, as table rows.

Each candidate is built and called once first (the probe: a warm-up, a correctness check
against the baseline's numbers, and the time that decides how many rounds fit the budget);
candidates that cannot run become rows that say why. Then ``compare`` times the rest
round-robin, rotating the order each round (no candidate always follows the same one), and
every row gets its speed-up over the baseline from per-round paired ratios.
"""

import gc
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import _competitors
from ._competitors import CaseData, Unavailable, max_abs_diff
from ._load import CpuMeter, wait_for_quiet
from ._timing import Timing, compare, paired_ratios, timing
from ._workloads import Workload, flops

Progress = Callable[[str], None] | None
CONTENDED = 0.3
"""Cores used by other processes above which a case's timings are marked contended."""


def _row(w: Workload, mode: str, impl: str, **fields: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "kind": "timing",
        "workload": w.name,
        "n": w.nk,
        "nq": w.nq,
        "b": w.b,
        "h": w.h,
        "hkv": w.hkv,
        "d": w.d,
        "mode": mode,
        "impl": impl,
        "status": "ok",
        "median_s": None,
        "iqr_s": None,
        "min_s": None,
        "repeats": 0,
        "baseline": None,
        "speedup": None,
        "speedup_q1": None,
        "speedup_q3": None,
        "gflops": None,
        "max_abs_err": None,
        "err_vs": None,
        "compile_s": None,
        "note": "",
        "samples": [],
        "others_cpu": None,
    }
    row.update(fields)
    return row


def run_case(
    w: Workload,
    mode: str,
    impls: Sequence[str],
    *,
    baseline: str,
    budget_s: float = 30.0,
    repeats: tuple[int, int] = (3, 9),
    max_call_s: float = 30.0,
    predicted: Mapping[str, float] | None = None,
    extra: Mapping[str, Callable[[], Any]] | None = None,
    quiet_s: float = 0.0,
    progress: Progress = None,
) -> list[dict[str, Any]]:
    """Rows for ``impls`` on ``(w, mode)``: median seconds, IQR, speed-up over ``baseline``, GFLOP/s.

    ``repeats = (lo, hi)`` bounds the rounds; within them as many as fit ``budget_s`` seconds.
    A candidate whose ``predicted`` or probe time exceeds ``max_call_s`` is skipped or timed
    once. ``extra`` callables (e.g. a memory-bandwidth probe) join the rotation; their rows
    have ``kind = "extra"``. ``quiet_s > 0`` waits up to that long for other processes to
    go quiet before timing; every row records ``others_cpu``, the cores other processes used
    during the timed rounds (above ~0.3 on 2 cores, treat the case as suspect and re-run it).
    """
    data = CaseData(w)
    work = flops(w, mode)
    order = sorted(impls, key=lambda name: name != baseline)  # the baseline first: its numbers are the reference
    rows: dict[str, dict[str, Any]] = {}
    fns: dict[str, Callable[[], Any]] = {}
    probe: dict[str, float] = {}
    reference: tuple[str, list[Any]] | None = None
    for name in order:
        guess = (predicted or {}).get(name)
        if guess is not None and guess > max_call_s:
            rows[name] = _row(
                w, mode, name, status="skipped", note=f"predicted {guess:.0f} s per call > max {max_call_s:.0f} s"
            )
            continue
        if progress:
            progress(f"{w.label} {mode}: {name}")
        try:
            fn = _competitors.build(name, w, mode, data)
            t0 = time.perf_counter()
            out = fn()
            probe[name] = time.perf_counter() - t0
        except Unavailable as e:
            rows[name] = _row(w, mode, name, status="unavailable", note=str(e))
            continue
        except Exception as e:  # a candidate that fails is reported, the others still run
            rows[name] = _row(
                w,
                mode,
                name,
                status="unavailable",
                note=f"failed: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}",
            )
            continue
        fields: dict[str, Any] = {}
        compile_s, mask_s = getattr(fn, "compile_s", None), getattr(fn, "mask_s", None)
        if compile_s is not None:  # FlexAttention: its compilation is reported, never timed
            fields["compile_s"] = compile_s
            fields["note"] = f"compile {compile_s:.1f} s, block mask {mask_s or 0:.2f} s (excluded)"
        if reference is None:
            reference = (name, out)
        else:
            fields["max_abs_err"] = max_abs_diff(out, reference[1])
            fields["err_vs"] = reference[0]
        del out
        if probe[name] > max_call_s:  # too slow for rounds: its one call is all we report
            t = timing([probe[name]])
            rows[name] = _row(
                w,
                mode,
                name,
                median_s=t.median,
                iqr_s=0.0,
                min_s=t.min,
                repeats=1,
                samples=list(t.samples),
                gflops=work / t.median / 1e9,
                **fields,
            )
            rows[name]["note"] = (rows[name]["note"] + "; " if rows[name]["note"] else "") + "one call only (slow)"
            continue
        rows[name] = _row(w, mode, name, **fields)
        fns[name] = fn
    reference = None
    gc.collect()
    timings: dict[str, Timing] = {}
    others: float | None = None
    round_s = sum(probe[name] for name in fns) or 1e-3
    lo, hi = repeats
    rounds = max(lo, min(hi, int(budget_s / round_s)))
    k = len(fns) + len(extra or {})
    if k and rounds >= k:
        rounds -= rounds % k  # whole rotations: every candidate follows every other equally often
    if fns or extra:
        if progress:
            progress(f"{w.label} {mode}: {rounds} interleaved rounds of {', '.join([*fns, *(extra or {})])}")
        for fn in (extra or {}).values():
            fn()  # the candidates were warmed by their probe; the extras are warmed here
        for attempt in range(2 if quiet_s > 0 else 1):  # a contended run is re-run once if a quiet spell comes
            if quiet_s > 0:
                load = wait_for_quiet(threshold=CONTENDED, max_wait_s=quiet_s)
                if attempt > 0 and load is not None and load > CONTENDED:
                    break  # still busy: a re-run would be contended too
            meter = CpuMeter()
            again = compare({**fns, **(extra or {})}, warmup=0, repeats=rounds, rotate=True)
            load = meter.others()
            if attempt == 0 or (load is not None and others is not None and load < others):
                timings, others = again, load
            if others is None or others <= CONTENDED:
                break
        for r in (rows[name] for name in fns):  # the rows whose times these rounds are
            r["others_cpu"] = others
            if others is not None and others > CONTENDED:
                r["note"] = (r["note"] + "; " if r["note"] else "") + f"contended ({others:.1f} cores busy elsewhere)"
    base = timings.get(baseline)
    for name, t in timings.items():
        if name in (extra or {}):
            rows[name] = _row(
                w,
                mode,
                name,
                kind="extra",
                median_s=t.median,
                iqr_s=t.iqr,
                min_s=t.min,
                repeats=len(t.samples),
                samples=list(t.samples),
                others_cpu=others,
            )
            continue
        r = rows[name]
        r.update(
            median_s=t.median,
            iqr_s=t.iqr,
            min_s=t.min,
            repeats=len(t.samples),
            samples=list(t.samples),
            gflops=work / t.median / 1e9,
        )
    for name, r in rows.items():
        if r["median_s"] is None or r["kind"] != "timing":
            continue
        r["baseline"] = baseline
        if name in timings and base is not None:
            s = paired_ratios(base, timings[name])
            r.update(speedup=s.median, speedup_q1=s.q1, speedup_q3=s.q3)
        elif base is not None:  # a one-call row: unpaired
            r["speedup"] = base.median / r["median_s"]
        elif baseline in rows and rows[baseline]["median_s"] is not None:
            r["speedup"] = rows[baseline]["median_s"] / r["median_s"]
    ordered = [rows[name] for name in impls if name in rows]
    return ordered + [rows[name] for name in (extra or {}) if name in rows]
