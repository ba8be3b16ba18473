"""Issue 22's forward prefill workloads (W1 dense, W2 causal, W3 sliding window, W5 GQA prefill):
qkv's compiled kernel against SDPA (and compiled FlexAttention on W3), or against another build.

Default: ``qkv.attention(..., impl="flash")`` interleaved with SDPA (``qkv.bench.compare``, rotated
rounds; ratio = SDPA time / qkv time, median and quartiles of the per-round ratios). SDPA gets
``is_causal`` for causal work and the dense boolean mask for the window; ``--flex`` adds compiled
FlexAttention on W3. W3 also prints qkv's GFLOP/s of useful work (4 Dk per allowed pair).

``--a LIB [--b LIB]``: the kernel alone (``qkv._native.forward`` with the same intervals the front
end passes) of two builds, each in its own worker process, asked in turn (A B A B ...; ratio
B / A, > 1: B slower). Build a baseline with, e.g.:

    git archive <commit> CMakeLists.txt src/qkv/_native | tar -x -C /tmp/old
    cmake -S /tmp/old -B /tmp/old/build -DPython_EXECUTABLE=$PWD/.venv/bin/python -DCMAKE_BUILD_TYPE=Release
    cmake --build /tmp/old/build -j2

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/fwd_ranges.py [--flex] [--rounds 9]
    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/fwd_ranges.py --a $(find /tmp/old/build -name '_ext*.so')
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

# name -> (H, Hkv, N, D, mask); float32, B = 1
WORKLOADS = {
    "W1 dense H=8 N=4096 D=64": (8, 8, 4096, 64, "dense"),
    "W2 causal H=8 N=4096 D=64": (8, 8, 4096, 64, "causal"),
    "W3 window 256 causal H=8 N=8192 D=64": (8, 8, 8192, 64, "window"),
    "W5 GQA causal 32/8 N=2048 D=128": (32, 8, 2048, 128, "causal"),
}
WINDOW = 256


def rows(n: int, mask: str) -> np.ndarray | None:
    """The (1, 1, N, 2) intervals [lo, hi) of each query (None: dense)."""
    if mask == "dense":
        return None
    i = np.arange(n)
    lo = np.zeros(n) if mask == "causal" else i - (WINDOW - 1)
    return np.stack([lo, i + 1], -1).astype(np.int32)[None, None]


def useful_flops(h: int, n: int, d: int, mask: str) -> float:
    r = rows(n, mask)
    pairs = n * n if r is None else float((np.minimum(r[..., 1], n) - np.maximum(r[..., 0], 0)).sum())
    return 4.0 * d * pairs * h


def inputs(h: int, hkv: int, n: int, d: int):
    import torch

    g = torch.Generator().manual_seed(0)
    return torch.randn(1, h, n, d, generator=g), *(torch.randn(1, hkv, n, d, generator=g) for _ in range(2))


def worker() -> None:
    """Reads workload names on stdin, answers each with the best of 3 kernel timings (seconds)."""
    import torch

    from qkv import _native

    threads = int(os.environ.get("OMP_NUM_THREADS", "2"))
    made = {}
    for line in sys.stdin:
        name = line.strip()
        h, hkv, n, d, mask = WORKLOADS[name]
        if name not in made:
            q, k, v = inputs(h, hkv, n, d)
            made[name] = (q, k, v, torch.empty(1, h, n, d), torch.empty(1, h, n), rows(n, mask))
        q, k, v, out, lse, r = made[name]
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            _native.forward(q, k, v, out, lse, scale=d**-0.5, rows=r, threads=threads)
            best = min(best, time.perf_counter() - t0)
        print(json.dumps(best), flush=True)


def ab(lib_a: str, lib_b: str | None, rounds: int) -> None:
    def start(lib: str | None) -> subprocess.Popen:
        env = dict(os.environ)
        if lib:
            env["QKV_NATIVE_LIB"] = lib
        cmd = [sys.executable, __file__, "--worker"]
        return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def ask(p: subprocess.Popen, name: str) -> float:
        assert p.stdin is not None and p.stdout is not None
        p.stdin.write(name + "\n")
        p.stdin.flush()
        return float(json.loads(p.stdout.readline()))

    a, b = start(lib_a), start(lib_b)
    print(f"A = {lib_a}\nB = {lib_b or 'installed'}\nOMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
    for name, (h, _, n, d, mask) in WORKLOADS.items():
        ask(a, name), ask(b, name)
        ta, tb = [], []
        for r in range(rounds):
            first, second = (a, b) if r % 2 == 0 else (b, a)
            x, y = ask(first, name), ask(second, name)
            ta.append(x if first is a else y)
            tb.append(y if first is a else x)
        ratio = np.array(tb) / np.array(ta)
        gf = useful_flops(h, n, d, mask) / 1e9
        print(
            f"{name:40s} A {np.median(ta) * 1e3:8.2f} ms ({gf / np.median(ta):5.0f} GFLOP/s useful)  "
            f"B {np.median(tb) * 1e3:8.2f} ms ({gf / np.median(tb):5.0f})  B/A median {np.median(ratio):.3f} "
            f"(range {ratio.min():.3f}-{ratio.max():.3f})",
            flush=True,
        )
    for p in (a, b):
        assert p.stdin is not None
        p.stdin.close()
        p.wait()


def against_peers(rounds: int, flex: bool) -> None:
    import torch
    import torch.nn.functional as F

    import qkv
    from qkv import masks
    from qkv.bench import compare, paired_ratios

    print(f"torch {torch.__version__}, qkv ISA path {qkv._native._need().isa()}, threads {torch.get_num_threads()}")
    for name, (h, hkv, n, d, mask) in WORKLOADS.items():
        q, k, v = inputs(h, hkv, n, d)
        gqa = h != hkv
        kw = {"dense": {}, "causal": {"causal": True}, "window": {"mask": masks.sliding_window(WINDOW)}}[mask]
        fns = {"qkv": lambda q=q, k=k, v=v, kw=kw: qkv.attention(q, k, v, impl="flash", **kw)}
        if mask == "window":
            i = torch.arange(n)
            dense = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - WINDOW)
            fns["sdpa"] = lambda q=q, k=k, v=v, m=dense: F.scaled_dot_product_attention(q, k, v, attn_mask=m)
            if flex:
                from torch.nn.attention.flex_attention import create_block_mask, flex_attention

                bm = create_block_mask(lambda b, h, i, j: (j <= i) & (j > i - WINDOW), 1, 1, n, n, device="cpu")
                compiled = torch.compile(flex_attention)
                fns["flex"] = lambda q=q, k=k, v=v, bm=bm, f=compiled: f(q, k, v, block_mask=bm)
        else:
            fns["sdpa"] = lambda q=q, k=k, v=v, c=mask == "causal", g=gqa: F.scaled_dot_product_attention(
                q, k, v, is_causal=c, enable_gqa=g
            )
        with torch.no_grad():
            t = compare(fns, warmup=2, repeats=rounds, rotate=True)
        line = f"{name:40s} qkv {t['qkv'].median * 1e3:8.2f} ms"
        for other in fns:
            if other != "qkv":
                r = paired_ratios(t[other], t["qkv"])
                line += f"  {other}/qkv {r.median:6.2f}x ({r.q1:.2f}-{r.q3:.2f})"
        line += f"  {useful_flops(h, n, d, mask) / t['qkv'].median / 1e9:5.0f} GFLOP/s useful"
        print(line, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", help="baseline _ext*.so: compare two kernel builds instead of peers")
    ap.add_argument("--b", default=None, help="candidate _ext*.so (default: the installed module)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--flex", action="store_true", help="also compiled FlexAttention on W3")
    ap.add_argument("--only", default=None, help="substring: run the workloads whose name contains it")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.only:
        for name in list(WORKLOADS):
            if args.only not in name:
                del WORKLOADS[name]
    if args.worker:
        worker()
        return
    from qkv._info import fresh_line

    print(fresh_line(), flush=True)  # qkv.info()'s line: CPU, ISA path, engines, threads, versions
    if args.a:
        ab(args.a, args.b, args.rounds)
    else:
        against_peers(args.rounds, args.flex)


if __name__ == "__main__":
    main()
