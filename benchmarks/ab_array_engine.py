"""Two versions of the array engine (``qkv/_impls/_flash_array.py``), interleaved in one process:
the median and range of the per-pair time ratios new / old (above 1: the new one is slower).

    git show <commit>:src/qkv/_impls/_flash_array.py > /tmp/old_flash_array.py
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ab_array_engine.py /tmp/old_flash_array.py

Float32 torch tensors, B = 1, H = 8, N = 4096, D = 64 and 128, forward and forward + backward.
"""

from __future__ import annotations

import importlib.util
import sys
import time

import numpy as np
import torch

import qkv
import qkv._impls.flash as flash
from qkv._impls import build_call
from qkv._info import fresh_line


def load(path: str):
    spec = importlib.util.spec_from_file_location("qkv._impls._flash_array_old", path)
    assert spec is not None and spec.loader is not None
    m = importlib.util.module_from_spec(spec)
    m.__package__ = "qkv._impls"
    sys.modules[spec.name] = m
    spec.loader.exec_module(m)
    return m


def run(engine, q, k, v, do, bwd: bool) -> float:
    """One call (and its backward) on ``engine``: seconds."""
    flash.array_engine = engine
    t = [x.clone().requires_grad_(bwd) for x in (q, k, v)]
    t0 = time.perf_counter()
    out = qkv._core.run(build_call(*t, engine="array"), "flash").out
    if bwd:
        out.backward(do)
    return time.perf_counter() - t0


def main() -> None:
    print(fresh_line(), flush=True)  # qkv.info()'s line: CPU, ISA path, engines, threads, versions
    old, new = load(sys.argv[1]), flash.array_engine
    pairs = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    g = torch.Generator().manual_seed(0)
    for d in (64, 128):
        x = [torch.randn(1, 8, 4096, d, generator=g) for _ in range(4)]
        for bwd in (False, True):
            run(old, *x, bwd), run(new, *x, bwd)  # warm-up
            ratios = []
            for i in range(pairs):
                if i % 2 == 0:
                    a = run(old, *x, bwd)
                    b = run(new, *x, bwd)
                else:
                    b = run(new, *x, bwd)
                    a = run(old, *x, bwd)
                ratios.append(b / a)
            r = np.array(ratios)
            what = "fwd+bwd" if bwd else "fwd"
            print(f"D={d} {what:8s} new/old median {np.median(r):.3f} (range {r.min():.3f}-{r.max():.3f})", flush=True)
    flash.array_engine = new


if __name__ == "__main__":
    main()
