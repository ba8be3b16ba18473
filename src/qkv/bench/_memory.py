"""Peak memory of one benchmark call, measured in a fresh subprocess.

The child imports everything, builds the inputs and warms the candidate up on a small case
(libraries, thread pools and kernels loaded), then records its resident set size as the
baseline, resets the kernel's high-water mark (``/proc/self/clear_refs``, Linux >= 4.0) and
makes the one call; peak minus baseline is the call's extra memory, outputs and gradients
included. Without ``clear_refs`` it falls back to ``ru_maxrss`` before and after the call.
"""

import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

from ._competitors import CaseData, build, to_numpy
from ._workloads import workload


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


def peak_memory(
    target: str, workload_name: str, n: int, mode: str = "fwdbwd", *, h: int = 8, d: int = 64, timeout: float = 900.0
) -> Memory:
    """Run competitor ``target`` on ``workload(workload_name, n, h=h, d=d)`` once in a fresh process.

    >>> m = peak_memory("qkv-flash", "dense", 32768, "fwdbwd", h=1)
    >>> m.extra / 2**20   # MiB beyond the inputs
    """
    spec = {"target": target, "workload": workload_name, "n": n, "mode": mode, "h": h, "d": d}
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "memory.json"
        code = "import sys; from qkv.bench._memory import _child; _child(sys.argv[1], sys.argv[2])"
        proc = subprocess.run(
            [sys.executable, "-c", code, json.dumps(spec), str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if proc.returncode != 0 or not out.exists():
            tail = " ".join(proc.stderr.strip().splitlines()[-3:])
            raise RuntimeError(f"memory child for {spec} exited with {proc.returncode}: {tail}")
        return Memory(**json.loads(out.read_text()))


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


def _child(spec_json: str, out_path: str) -> None:
    spec: dict[str, Any] = json.loads(spec_json)
    import torch

    torch.set_num_threads(2)
    mode = spec["mode"]
    small = workload(spec["workload"], 256, h=spec["h"], d=spec["d"])
    build(spec["target"], small, mode, CaseData(small))()  # load kernels, thread pools, caches
    w = workload(spec["workload"], spec["n"], h=spec["h"], d=spec["d"])
    fn = build(spec["target"], w, mode, CaseData(w))  # allocates the inputs (and any dense mask)
    gc.collect()
    if _reset_peak():
        method, baseline = "VmHWM after clear_refs", _status_bytes("VmRSS") or 0
    else:
        method, baseline = "ru_maxrss", _maxrss()
    t0 = time.perf_counter()
    outs = fn()
    seconds = time.perf_counter() - t0
    peak = (_status_bytes("VmHWM") or 0) if method.startswith("VmHWM") else _maxrss()
    outputs = sum(to_numpy(x).nbytes for x in outs)
    inputs = w.input_bytes() + (4 * w.b * w.h * w.nq * w.d if mode == "fwdbwd" else 0)
    result = Memory(peak - baseline, inputs, outputs, baseline, peak, seconds, method)
    Path(out_path).write_text(json.dumps(result._asdict()))
