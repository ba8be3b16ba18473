"""Peak memory of one call, measured in a fresh subprocess: the one harness of ``qkv bench`` and
``qkv complexity --measure``.

The child imports everything, builds its inputs and warms the call up on a small case
(libraries, thread pools and kernels loaded), then records its resident set size as the
baseline, resets the kernel's high-water mark (``/proc/self/clear_refs``, Linux >= 4.0) and
makes the one call; peak minus baseline is the call's extra memory, outputs included. Without
``clear_refs`` it falls back to ``ru_maxrss`` before and after the call. Before the baseline,
freed heap memory is returned to the OS (``malloc_trim``) and the pages mapped so far are
locked (``mlockall``), so neither allocation history nor a reclaimer paging out cold pages
during a long call moves the reading.

Two children use it: ``_competitor_child`` (a benchmark candidate on a workload, ``peak_memory``)
and ``_attention_child`` (one ``qkv.attention`` configuration, ``measure_attention``).
"""

import ctypes
import gc
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple


class Memory(NamedTuple):
    """Bytes: ``extra`` = ``peak`` - ``baseline`` during the call; ``inputs`` (q, k, v, dout)
    were allocated before the baseline; ``outputs`` (out, dq, dk, dv) are part of ``extra``."""

    extra: int
    inputs: int
    outputs: int
    baseline: int
    peak: int
    seconds: float
    method: str


# --------------------------------------------------------------------------- parent side


def in_subprocess(child: str, spec: dict[str, Any], *, env: dict[str, str] | None = None, timeout: float = 900.0):
    """Run ``qkv.bench._memory.<child>(spec_json)`` in a fresh Python; its last stdout line is JSON."""
    code = f"import sys; from qkv.bench._memory import {child}; {child}(sys.argv[1])"
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(spec)],
        env=env if env is not None else dict(os.environ),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = " ".join(proc.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"measuring {spec} failed (exit {proc.returncode}): {tail}")
    return json.loads(lines[-1])


def peak_memory(
    target: str, workload_name: str, n: int, mode: str = "fwdbwd", *, h: int = 8, d: int = 64, timeout: float = 900.0
) -> Memory:
    """Run competitor ``target`` on ``workload(workload_name, n, h=h, d=d)`` once in a fresh process.

    >>> m = peak_memory("qkv-flash", "dense", 32768, "fwdbwd", h=1)
    >>> m.extra / 2**20   # MiB beyond the inputs
    """
    spec = {"target": target, "workload": workload_name, "n": n, "mode": mode, "h": h, "d": d}
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    return Memory(**in_subprocess("_competitor_child", spec, env=env, timeout=timeout))


def measure_attention(spec: dict[str, Any], timeout: float = 300.0) -> dict[str, Any]:
    """Run one ``qkv.attention`` configuration in fresh subprocesses: ``{"extra", "outputs", "seconds", "method"}``.

    ``spec``: batch, heads, kv_heads, n, d, dtype, impl, mask (a ``qkv.masks.spec`` string),
    backward, lib (``"numpy"`` or ``"torch"``); optional repeats (timed calls after the first).
    ``extra`` is the peak memory beyond the inputs and the outputs (what
    ``complexity.estimate(...).peak_bytes`` predicts). Memory and time come from two processes:
    glibc raises its mmap threshold after each large free, so later tiles come from a heap that
    keeps freed pages resident and the high-water mark depends on allocation history (seen:
    14-29 MB for a 10 MB working set). With a fixed threshold every large block is mapped afresh
    and returned on free, so VmHWM reads the live peak, the same on every run; but mapping every
    tile costs page faults, so the time is taken in a second process with the default allocator.
    """
    fixed = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    memory = in_subprocess("_attention_child", {**spec, "repeats": 0}, env=fixed, timeout=timeout)
    if spec.get("repeats", 3) == 0:
        return memory
    timed = in_subprocess("_attention_child", spec, timeout=timeout)
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


# --------------------------------------------------------------------------- child side


def _status_bytes(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # 5: reset the peak RSS to the current RSS
    except OSError:
        return False
    return _status_bytes("VmHWM") is not None


def _maxrss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _trim_heap() -> None:
    """Give freed heap memory back to the OS before the baseline (glibc ``malloc_trim``), so memory
    freed while building the inputs is not reused by the measured call (which would read low)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _pin_resident() -> bool:
    """Lock the pages mapped so far (libraries, inputs), so a reclaimer paging out cold pages during
    a long call (DAMON on some VMs) cannot lower the RSS while the call allocates; later
    allocations are not locked. False where mlockall is not permitted."""
    try:
        return int(ctypes.CDLL(None, use_errno=True).mlockall(1)) == 0  # 1 = MCL_CURRENT
    except (OSError, AttributeError):
        return False


def _nbytes(x: Any) -> int:
    shape = tuple(x.shape)
    size = 1
    for s in shape:
        size *= int(s)
    itemsize = x.element_size() if hasattr(x, "element_size") else x.dtype.itemsize
    return size * int(itemsize)


def peak_of(call: Callable[[], list[Any]]) -> dict[str, Any]:
    """Measure one ``call()`` in this (child) process: its extra memory, the bytes of what it
    returned, its seconds and the reading's method. Everything ``call`` needs must already exist."""
    gc.collect()
    _trim_heap()
    pinned = _pin_resident()
    if _reset_peak():
        method, baseline = "VmHWM after clear_refs", _status_bytes("VmRSS") or 0
    else:
        method, baseline = "ru_maxrss", _maxrss()
    t0 = time.perf_counter()
    outs = call()
    seconds = time.perf_counter() - t0
    peak = (_status_bytes("VmHWM") or 0) if method.startswith("VmHWM") else _maxrss()
    outputs = sum(_nbytes(o) for o in outs)
    return {
        "baseline": baseline,
        "peak": peak,
        "outputs": outputs,
        "seconds": seconds,
        "method": method + (" after mlockall" if pinned else ""),
    }


def _competitor_child(spec_json: str) -> None:
    from ._competitors import CaseData, build
    from ._workloads import workload

    spec: dict[str, Any] = json.loads(spec_json)
    import torch

    torch.set_num_threads(2)
    mode = spec["mode"]
    small = workload(spec["workload"], 256, h=spec["h"], d=spec["d"])
    build(spec["target"], small, mode, CaseData(small))()  # load kernels, thread pools, caches
    w = workload(spec["workload"], spec["n"], h=spec["h"], d=spec["d"])
    fn = build(spec["target"], w, mode, CaseData(w))  # allocates the inputs (and any dense mask)
    r = peak_of(fn)
    inputs = w.input_bytes() + (4 * w.b * w.h * w.nq * w.d if mode == "fwdbwd" else 0)
    extra = r["peak"] - r["baseline"]
    m = Memory(extra, inputs, r["outputs"], r["baseline"], r["peak"], r["seconds"], r["method"])
    print(json.dumps(m._asdict()))


def _attention_child(spec_json: str) -> None:
    """One configuration of ``measure_attention``: prints ``{"extra", "outputs", "seconds", "method"}``."""
    import numpy as np

    import qkv
    from qkv.masks.spec import build_mask, parse_mask_spec

    s = json.loads(spec_json)
    lib, backward = s["lib"], s["backward"]
    kind, params = parse_mask_spec(s["mask"])
    rng = np.random.default_rng(0)

    def make(nq: int, nk: int) -> list[Any]:
        b, h, hkv, d = s["batch"], s["heads"], s["kv_heads"], s["d"]
        shapes = [(b, h, nq, d), (b, hkv, nk, d), (b, hkv, nk, d), (b, h, nq, d)]
        xs = [rng.standard_normal(shape, dtype=np.float32) for shape in shapes]  # no float64 temporaries
        if lib == "torch":
            import torch

            return [torch.from_numpy(x).to(getattr(torch, s["dtype"])) for x in xs]
        return [x if s["dtype"] == "float32" else x.astype(s["dtype"]) for x in xs]

    def call(q: Any, k: Any, v: Any, dout: Any) -> list[Any]:
        kw = {"mask": build_mask(kind, q.shape[-2], k.shape[-2], **params), "impl": s["impl"]}
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
    r = peak_of(lambda: call(*inputs))
    times: list[float] = []
    while len(times) < s.get("repeats", 3) and sum(times) + r["seconds"] < 2.0:  # a few more calls while cheap
        t0 = time.perf_counter()
        call(*inputs)
        times.append(time.perf_counter() - t0)
    seconds = float(np.median(times)) if times else r["seconds"]
    extra = r["peak"] - r["baseline"] - r["outputs"]
    print(json.dumps({"extra": extra, "outputs": r["outputs"], "seconds": seconds, "method": r["method"]}))
