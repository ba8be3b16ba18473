"""bf16 compute (vdpbf16ps, the ``avx512bf16`` path) against the kernel's own float32, interleaved.

Forward: dense, B=1, H=8, N=4096, D=64 (issue 22's target: bf16 >= 1.6x qkv's float32
throughput where AVX512-BF16 exists), then the same causal (intervals, as the front end passes
them: exact key spans per pair of lane groups). Backward (``--part backward``, issue 35): the
backward alone on GQA 32/8 D=128 causal N=2048 and dense H=8 D=64 N=2048 (target: bf16 >= 1.6x
the float32 backward of the same call), its float32 rate beside torch's sgemm rate (2048^3, same
threads; target >= 0.9) on dense, causal and GQA, and fwd+bwd against SDPA (bf16 target >= 1.8x on
the GQA call). One process, rounds of A B C D ... in turn, medians of the per-round ratios:

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bf16_compute.py [--rounds 9] [--n 4096]
    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bf16_compute.py --part backward [--rounds 9]

Another build's kernel: ``QKV_NATIVE_LIB=/path/to/_ext*.so`` in front (qkv._native loads it).

Forward rows: qkv float32 (best ISA path), qkv bf16 on the ``avx512bf16`` path, qkv bf16 widened to
float32 (the ``avx512`` path, what bf16 ran at before), torch SDPA bf16. The ratios are time(float32)
/ time(x), so > 1 is faster than qkv float32. Each timing is the best of 3 calls of the low-level
``qkv._native.forward`` / ``.backward`` (no front end), threads = torch's. FLOP counts are
FlashAttention-2's: 4 D per allowed (query, key) pair forward, 10 D backward (five matmuls).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F

from qkv import _native as native
from qkv._info import fresh_line


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown CPU"


def timed(fn) -> float:
    t = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        t = min(t, time.perf_counter() - t0)
    return t


def rounds(cases: dict, n: int) -> dict[str, list[float]]:
    """Warm-up, then n rounds of every case in turn: {name: [best-of-3 seconds per round]}."""
    for fn in cases.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(n):
        for name, fn in cases.items():
            times[name].append(timed(fn))
    return times


def ratio(times: dict, num: str, den: str) -> tuple[float, float, float]:
    """Median, min and max over rounds of time(num) / time(den)."""
    r = np.array(times[num]) / np.array(times[den])
    return float(np.median(r)), float(r.min()), float(r.max())


def backward_part(a, threads: int) -> None:
    """The backward alone (bf16 on vdpbf16ps, bf16 widened, float32), torch's sgemm rate, and
    fwd+bwd against SDPA, on the issue's calls."""
    g = torch.Generator().manual_seed(0)
    bf16_isa = "avx512bf16" in native.isas()
    wide = "avx512" if "avx512" in native.isas() else None
    x = torch.randn(2048, 2048, generator=g)
    y = torch.randn(2048, 2048, generator=g)
    calls = [  # name, H, Hkv, D, causal
        ("GQA 32/8 D=128 causal", 32, 8, 128, True),
        ("dense H=8 D=64", 8, 8, 64, False),
        ("causal H=8 D=64", 8, 8, 64, True),
    ]
    n = a.n_bwd
    for name, h, hkv, d, causal in calls:
        q = torch.randn(1, h, n, d, generator=g)
        k, v = (torch.randn(1, hkv, n, d, generator=g) for _ in range(2))
        dout = torch.randn(1, h, n, d, generator=g)
        rows = np.stack([np.zeros(n), np.arange(n) + 1], -1).astype(np.int32)[None, None] if causal else None
        scale = d**-0.5

        def bwd(dtype, isa, q=q, k=k, v=v, dout=dout, rows=rows, scale=scale):
            qq, kk, vv, do = (t.to(dtype) for t in (q, k, v, dout))
            out = torch.empty(qq.shape[:3] + (vv.shape[3],), dtype=dtype)
            lse = torch.empty(qq.shape[:3])
            grads = [torch.empty(t.shape) for t in (qq, kk, vv)]
            with native.use_isa(isa):
                native.forward(qq, kk, vv, out, lse, scale=scale, rows=rows, threads=threads)

            def run():
                with native.use_isa(isa):
                    native.backward(qq, kk, vv, out, lse, do, *grads, scale=scale, rows=rows, threads=threads)

            return run

        def fwd_bwd_qkv(dtype, isa, q=q, k=k, v=v, dout=dout, rows=rows, scale=scale):
            qq, kk, vv, do = (t.to(dtype) for t in (q, k, v, dout))
            out = torch.empty(qq.shape[:3] + (vv.shape[3],), dtype=dtype)
            lse = torch.empty(qq.shape[:3])
            grads = [torch.empty(t.shape) for t in (qq, kk, vv)]

            def run():
                with native.use_isa(isa):
                    native.forward(qq, kk, vv, out, lse, scale=scale, rows=rows, threads=threads)
                    native.backward(qq, kk, vv, out, lse, do, *grads, scale=scale, rows=rows, threads=threads)

            return run

        def fwd_bwd_sdpa(dtype, q=q, k=k, v=v, dout=dout, causal=causal, scale=scale, gqa=h != hkv):
            qq, kk, vv = (t.to(dtype).requires_grad_() for t in (q, k, v))
            do = dout.to(dtype)

            def run():
                out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal, scale=scale, enable_gqa=gqa)
                out.backward(do)

            return run

        best = native.isas()[0]
        cases = {"qkv float32 bwd": bwd(torch.float32, best)}
        if bf16_isa:
            cases["qkv bf16 bwd (avx512bf16, vdpbf16ps)"] = bwd(torch.bfloat16, "avx512bf16")
        if wide:
            cases["qkv bf16 bwd (avx512, widened)"] = bwd(torch.bfloat16, wide)
        cases["torch sgemm 2048^3 float32"] = lambda: x @ y
        cases["qkv bf16 fwd+bwd"] = fwd_bwd_qkv(torch.bfloat16, best)
        cases["SDPA bf16 fwd+bwd"] = fwd_bwd_sdpa(torch.bfloat16)
        cases["qkv float32 fwd+bwd"] = fwd_bwd_qkv(torch.float32, best)
        cases["SDPA float32 fwd+bwd"] = fwd_bwd_sdpa(torch.float32)
        times = rounds(cases, a.rounds)
        pairs = n * (n + 1) / 2 if causal else n * n  # allowed (query, key) pairs
        flops = {"bwd": 10.0 * h * pairs * d, "fwd+bwd": 14.0 * h * pairs * d, "sgemm": 2.0 * 2048**3}
        print(f"\n{name}, B=1 N={n}: backward alone, sgemm, fwd+bwd ({threads} threads)")
        print(f"{'':40s} {'median ms':>10s} {'GFLOP/s':>8s}")
        for case, ts in times.items():
            kind = "sgemm" if "sgemm" in case else ("fwd+bwd" if "fwd+bwd" in case else "bwd")
            med = statistics.median(ts)
            print(f"{case:40s} {med * 1e3:10.2f} {flops[kind] / med / 1e9:8.1f}")

        def line(label, num, den, per=1.0, times=times):
            m, lo, hi = ratio(times, num, den)
            print(f"{label}: {m * per:.2f} ({lo * per:.2f}-{hi * per:.2f})")

        if bf16_isa:
            line(
                "bf16 bwd speed / float32 bwd speed (target >= 1.6)",
                "qkv float32 bwd",
                "qkv bf16 bwd (avx512bf16, vdpbf16ps)",
            )
        if wide:
            line("bf16 bwd widened speed / float32 bwd speed", "qkv float32 bwd", "qkv bf16 bwd (avx512, widened)")
        # rate(bwd) / rate(sgemm) = (flops_bwd / t_bwd) / (flops_sgemm / t_sgemm)
        line(
            "float32 bwd GFLOP/s / sgemm GFLOP/s (target >= 0.9)",
            "torch sgemm 2048^3 float32",
            "qkv float32 bwd",
            flops["bwd"] / flops["sgemm"],
        )
        line("qkv bf16 fwd+bwd speed / SDPA bf16's (target >= 1.8 on GQA)", "SDPA bf16 fwd+bwd", "qkv bf16 fwd+bwd")
        line("qkv float32 fwd+bwd speed / SDPA float32's", "SDPA float32 fwd+bwd", "qkv float32 fwd+bwd")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--n-bwd", type=int, default=2048, help="sequence length of the backward part")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--part", choices=("forward", "backward", "all"), default="forward")
    a = ap.parse_args()
    print(fresh_line(), flush=True)  # qkv.info()'s line: CPU, ISA path, engines, threads, versions
    threads = torch.get_num_threads()
    print(f"CPU: {cpu_model()}; ISA paths {native.isas()}; {threads} threads")
    if a.part in ("backward", "all"):
        backward_part(a, threads)
    if a.part == "backward":
        return
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
