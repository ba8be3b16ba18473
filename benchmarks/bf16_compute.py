"""bf16 compute (vdpbf16ps, the ``avx512bf16`` path) against the kernel's own float32, interleaved.

Dense forward, B=1, H=8, N=4096, D=64 (issue 22's target: bf16 >= 1.6x qkv's float32
throughput where AVX512-BF16 exists), then the same causal (intervals, as the front end passes
them: exact key spans per pair of lane groups). One process, rounds of A B C D ... in turn, medians
of the per-round ratios:

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bf16_compute.py [--rounds 9] [--n 4096]

Another build's kernel: ``QKV_NATIVE_LIB=/path/to/_ext*.so`` in front (qkv._native loads it).

Rows: qkv float32 (best ISA path), qkv bf16 on the ``avx512bf16`` path, qkv bf16 widened to
float32 (the ``avx512`` path, what bf16 ran at before), torch SDPA bf16. The ratios are time(float32)
/ time(x), so > 1 is faster than qkv float32. Each timing is the best of 3 calls of the low-level
``qkv._native.forward`` (no front end), threads = torch's.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from qkv import _native as native


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--d", type=int, default=64)
    a = ap.parse_args()
    threads = torch.get_num_threads()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, a.heads, a.n, a.d, generator=g) for _ in range(3))
    qb, kb, vb = (x.to(torch.bfloat16) for x in (q, k, v))
    scale = a.d**-0.5

    def qkv_call(x, y, z, isa, rows):
        out = torch.empty_like(x)
        lse = torch.empty(x.shape[:3], dtype=torch.float32)

        def run():
            with native.use_isa(isa):
                native.forward(x, y, z, out, lse, scale=scale, rows=rows, threads=threads)

        return run

    def timed(fn):
        t = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            t = min(t, time.perf_counter() - t0)
        return t

    best = native.isas()[0]
    if "avx512bf16" not in native.isas():
        print("this CPU has no AVX512-BF16: only the widening bf16 path is timed")
    print(f"B=1 H={a.heads} N={a.n} D={a.d}, {threads} threads, ISA paths {native.isas()}")
    i = np.arange(a.n)
    causal = np.stack([np.zeros(a.n), i + 1], -1).astype(np.int32)[None, None]
    for mask, rows, pairs in (("dense", None, a.n * a.n), ("causal", causal, a.n * (a.n + 1) / 2)):
        cases = {"qkv float32": qkv_call(q, k, v, best, rows)}
        if "avx512bf16" in native.isas():
            cases["qkv bf16 (avx512bf16, vdpbf16ps)"] = qkv_call(qb, kb, vb, "avx512bf16", rows)
        if "avx512" in native.isas():
            cases["qkv bf16 (avx512, widened)"] = qkv_call(qb, kb, vb, "avx512", rows)
        is_causal = rows is not None
        cases["torch SDPA bf16"] = lambda c=is_causal: torch.nn.functional.scaled_dot_product_attention(
            qb, kb, vb, scale=scale, is_causal=c
        )
        for fn in cases.values():  # warm up (threads, scratch, caches)
            fn()
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(a.rounds):
            for name, fn in cases.items():
                times[name].append(timed(fn))
        flops = 4.0 * a.heads * pairs * a.d  # useful work: 4 D per allowed (query, key) pair
        ref = times["qkv float32"]
        print(f"\n{mask} forward")
        print(f"{'':36s} {'median ms':>10s} {'GFLOP/s':>8s} {'f32 time / time (median of rounds)':>36s}")
        for name, ts in times.items():
            med = statistics.median(ts)
            ratio = statistics.median(np.array(ref) / np.array(ts))
            print(f"{name:36s} {med * 1e3:10.2f} {flops / med / 1e9:8.1f} {ratio:36.2f}")
        if "qkv bf16 (avx512bf16, vdpbf16ps)" in times:
            r = statistics.median(
                np.array(times["torch SDPA bf16"]) / np.array(times["qkv bf16 (avx512bf16, vdpbf16ps)"])
            )
            print(f"qkv bf16 (avx512bf16) vs SDPA bf16: {r:.2f}x")


if __name__ == "__main__":
    main()
