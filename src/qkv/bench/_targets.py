"""The targets of benchmarks/LOG.md (issue 14), measured as interleaved ratios and checked against their goals.

Each target gives timing rows (``run_case``) plus ``kind = "target"`` rows:
``target, impl, measure, value, q1, q3, goal, met, verdict`` where ``value`` is the median of
per-round ratios (above 1: qkv is faster), ``q1``/``q3`` their quartiles, ``met`` is
``value >= goal`` and ``verdict`` is "yes", "no" or "within noise" (the goal lies between the
quartiles). Memory targets
run in a subprocess (``peak_memory``); the decoding floor is the time to read K and V once at
the memory bandwidth measured by array sums interleaved with the decoding calls.
"""

from collections.abc import Sequence
from typing import Any

import numpy as np

from ._memory import peak_memory
from ._run import Progress, run_case
from ._timing import Ratio, paired_ratios, timing
from ._workloads import workload

QKV = ("qkv-flash", "qkv-auto")
BANDWIDTH_BYTES = 512 << 20


def _timing(row: dict[str, Any]) -> Any:
    return timing(row["samples"])


def _target(name: str, row: dict[str, Any], measure: str, ratio: Ratio | None, goal: float) -> dict[str, Any]:
    value = None if ratio is None else ratio.median
    verdict = None
    if ratio is not None:  # "within noise": the goal lies inside the quartiles of the per-round ratios
        verdict = "yes" if ratio.q1 >= goal else "no" if ratio.q3 < goal else "within noise"
    return {
        "kind": "target",
        "target": name,
        "impl": row["impl"],
        "measure": measure,
        "value": value,
        "q1": None if ratio is None else ratio.q1,
        "q3": None if ratio is None else ratio.q3,
        "goal": goal,
        "met": None if value is None else bool(value >= goal),
        "verdict": verdict,
        "note": row["note"] if value is None else "",
    }


def _vs(rows: list[dict[str, Any]], impl: str, other: str) -> Ratio | None:
    """Per-round ratio ``t(other) / t(impl)``: above 1 when ``impl`` is faster."""
    by = {r["impl"]: r for r in rows}
    a, b = by.get(impl), by.get(other)
    if a is None or b is None or len(a["samples"]) < 2 or len(b["samples"]) < 2:
        return None
    return paired_ratios(_timing(b), _timing(a))


def _case(
    out: list[dict[str, Any]],
    progress: Progress,
    wname: str,
    n: int,
    mode: str,
    impls: tuple[str, ...],
    baseline: str,
    quiet_s: float,
) -> list[dict[str, Any]]:
    """One target case's rows (interleaved rounds within a 40 s budget), also appended to ``out``."""
    rows = run_case(
        workload(wname, n),
        mode,
        impls,
        baseline=baseline,
        budget_s=40.0,
        repeats=(4, 9),
        max_call_s=60.0,
        quiet_s=quiet_s,
        progress=progress,
    )
    for r in rows:
        r["suite"] = "targets"
    out.extend(rows)
    return rows


def _speed_targets(
    out: list[dict[str, Any]],
    progress: Progress,
    wname: str,
    n: int,
    mode: str,
    goal: float | None,
    flex: bool,
    quiet_s: float,
) -> None:
    impls = (*QKV, "sdpa-flash", *(("flex",) if flex else ()))
    rows = _case(out, progress, wname, n, mode, impls, "sdpa-flash", quiet_s)
    label = f"{wname} {mode} N={n}"
    for impl in QKV:
        row = next(r for r in rows if r["impl"] == impl)
        if goal is not None:
            what = (
                "throughput / sdpa-flash"
                if wname.startswith("dense")
                else "speed-up over sdpa-flash (is_causal)"
                if wname == "causal"
                else "speed-up over sdpa-flash with the dense mask"
            )
            out.append(_target(label, row, what, _vs(rows, impl, "sdpa-flash"), goal))
        if flex:
            out.append(
                _target(label, row, "speed-up over compiled flex (compile excluded)", _vs(rows, impl, "flex"), 1.25)
            )


def _memory_targets(out: list[dict[str, Any]], progress: Progress, n: int) -> None:
    goal = 48 << 20
    for impl in ("qkv-flash", "sdpa-flash"):  # causal: the long-sequence case (and half the work of dense)
        if progress:
            progress(f"peak memory: {impl} causal fwdbwd N={n} H=1 (subprocess)")
        row: dict[str, Any] = {
            "kind": "memory",
            "suite": "targets",
            "workload": "causal",
            "n": n,
            "h": 1,
            "mode": "fwdbwd",
            "impl": impl,
            "note": "",
        }
        try:
            m = peak_memory(impl, "causal", n, "fwdbwd", h=1)
            row.update(m._asdict())
            row["materialised"] = 4 * n * n  # one float32 N x N score matrix
        except Exception as e:  # a child that dies (e.g. out of memory) is a result, not a crash
            row["note"] = f"failed: {e}"
        out.append(row)
        if impl.startswith("qkv"):
            extra = row.get("extra")
            out.append(
                {
                    "kind": "target",
                    "target": f"peak extra memory causal fwdbwd N={n} H=1 D=64",
                    "impl": impl,
                    "measure": "MiB (outputs and gradients included)",
                    "value": None if extra is None else extra / 2**20,
                    "q1": None,
                    "q3": None,
                    "goal": goal / 2**20,
                    "met": None if extra is None else bool(extra < goal),
                    "verdict": None if extra is None else ("yes" if extra < goal else "no"),
                    "note": row["note"],
                    "lower_is_better": True,
                }
            )


def _decode_targets(out: list[dict[str, Any]], progress: Progress, n: int, quiet_s: float) -> None:
    import torch

    buf = np.ones(BANDWIDTH_BYTES // 4, dtype=np.float32)
    tbuf = torch.from_numpy(buf)
    readers = {"read-numpy": lambda: float(buf.sum()), "read-torch": lambda: float(tbuf.sum())}
    for wname in ("decode", "decode-gqa"):
        w = workload(wname, n)
        rows = run_case(
            w,
            "fwd",
            (*QKV, "sdpa-flash", "sdpa-math"),
            baseline="sdpa-flash",
            budget_s=10.0,
            repeats=(9, 25),
            extra=readers,
            quiet_s=quiet_s,
            progress=progress,
        )
        by = {r["impl"]: r for r in rows}
        for r in rows:
            r["suite"] = "targets"
            if r["kind"] == "extra":
                r["bandwidth_gbs"] = BANDWIDTH_BYTES / r["median_s"] / 1e9
        out.extend(rows)
        reader = min(readers, key=lambda k: by[k]["median_s"])  # the faster reader: the stricter floor
        sdpa = min(("sdpa-flash", "sdpa-math"), key=lambda k: by[k]["median_s"] or float("inf"))
        for impl in QKV:
            out.append(_target(f"{wname} L={n}", by[impl], f"speed-up over {sdpa}", _vs(rows, impl, sdpa), 1.0))
            t_read, t_impl = _timing(by[reader]), _timing(by[impl])
            floor = paired_ratios(t_read, t_impl)  # t_read / t_impl, scaled below to the K, V bytes
            scale = w.kv_bytes() / BANDWIDTH_BYTES
            out.append(
                _target(
                    f"{wname} L={n}",
                    by[impl],
                    f"bandwidth floor / time (K+V {w.kv_bytes() / 2**20:.0f} MiB at "
                    f"{BANDWIDTH_BYTES / by[reader]['median_s'] / 1e9:.1f} GB/s, {reader})",
                    Ratio(floor.median * scale, floor.q1 * scale, floor.q3 * scale),
                    0.8,
                )
            )


def _engine_targets(out: list[dict[str, Any]], progress: Progress, n: int, quiet_s: float) -> None:
    """The compiled engine against the array engine, and 2 threads against 1 (dense forward)."""
    rows = _case(
        out,
        progress,
        "dense",
        n,
        "fwd",
        ("qkv-flash", "qkv-flash-array", "qkv-flash-1thread"),
        "qkv-flash-array",
        quiet_s,
    )
    row = next(r for r in rows if r["impl"] == "qkv-flash")
    out.append(
        _target(f"dense fwd N={n}", row, "2 threads / 1 thread", _vs(rows, "qkv-flash", "qkv-flash-1thread"), 1.8)
    )
    out.append(
        _target(f"dense fwd N={n}", row, "compiled / array engine", _vs(rows, "qkv-flash", "qkv-flash-array"), 1.0)
    )


TARGET_GROUPS = ("dense", "causal", "sliding", "document", "bf16", "memory", "decode", "engines")


def run_targets(
    quick: bool = False, quiet_s: float = 0.0, progress: Progress = None, only: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """Every target in benchmarks/LOG.md, or the groups in ``only`` (``TARGET_GROUPS``); ``quick``: the
    same checks at small sizes, FlexAttention left out."""
    unknown = set(only or ()) - set(TARGET_GROUPS)
    if unknown:
        raise ValueError(f"target groups are {TARGET_GROUPS}, got {sorted(unknown)}")
    groups = set(only or TARGET_GROUPS)
    n_dense, n_mask, n_mem, n_dec = (1024, 2048, 4096, 4096) if quick else (4096, 8192, 32768, 32768)
    out: list[dict[str, Any]] = []
    if "dense" in groups:
        for mode in ("fwd", "fwdbwd"):
            _speed_targets(out, progress, "dense", n_dense, mode, 1.2, False, quiet_s)
    if "causal" in groups:
        for mode in ("fwd", "fwdbwd"):
            _speed_targets(out, progress, "causal", n_dense, mode, 1.3, False, quiet_s)
    if "sliding" in groups:
        _speed_targets(out, progress, "sliding", n_mask, "fwd", None, not quick, quiet_s)
        _speed_targets(out, progress, "sliding", n_mask, "fwdbwd", 25.0, False, quiet_s)
    if "document" in groups:
        _speed_targets(out, progress, "document", n_mask, "fwd", None, not quick, quiet_s)
        _speed_targets(out, progress, "document", n_mask, "fwdbwd", 25.0, False, quiet_s)
    if "bf16" in groups:
        _speed_targets(out, progress, "dense-bf16", n_dense, "fwd", 1.0, False, quiet_s)
    if "memory" in groups:
        _memory_targets(out, progress, n_mem)
    if "decode" in groups:
        _decode_targets(out, progress, n_dec, quiet_s)
    if "engines" in groups:
        _engine_targets(out, progress, n_dense // 2, quiet_s)
    return out
