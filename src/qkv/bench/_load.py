"""How busy the rest of the machine was while we measured (Linux ``/proc/stat``).

On 2 cores, another process using one core does not slow a 2-thread kernel by 2x but by up
to 50x: thread pools that spin at barriers (OpenMP, OpenBLAS) wait for a descheduled thread.
Such a spell hits candidates unevenly (many small parallel regions suffer most), so every case
records the cores other processes used while it ran, and can wait for a quiet spell first.
"""

import os
import time
from pathlib import Path


def _busy_seconds() -> float | None:
    """CPU seconds all processes have spent busy since boot (None off Linux)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system


class CpuMeter:
    """``others()``: average number of cores used by other processes since the meter started."""

    def __init__(self) -> None:
        self.t0, self.busy0, self.own0 = time.perf_counter(), _busy_seconds(), _own_seconds()

    def others(self) -> float | None:
        busy = _busy_seconds()
        if busy is None or self.busy0 is None:
            return None
        wall = time.perf_counter() - self.t0
        return max(0.0, (busy - self.busy0) - (_own_seconds() - self.own0)) / max(wall, 1e-9)


def wait_for_quiet(threshold: float = 0.3, max_wait_s: float = 60.0, interval: float = 1.0) -> float | None:
    """Sleep until other processes use under ``threshold`` cores (or ``max_wait_s`` passes).

    Returns the load seen last (cores), None where it cannot be read.
    """
    deadline = time.perf_counter() + max_wait_s
    while True:
        meter = CpuMeter()
        time.sleep(interval)
        load = meter.others()
        if load is None or load < threshold or time.perf_counter() >= deadline:
            return load
