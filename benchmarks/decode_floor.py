"""Decode at the memory floor: one query against a long K/V cache, against the plain streaming read
of the same K+V bytes and torch's SDPA, interleaved round-robin in one process (medians).

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/decode_floor.py            # Nk=32768, f32 + bf16
    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/decode_floor.py --nk 8192 --rounds 15
    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/decode_floor.py --only quant --nk 8192,32768,131072

For each case (MHA 8/8 heads D=64 and GQA 32/8 heads D=128, B=1, Nq=1; float32 and bfloat16
caches) it times, in turn: the kernel call (qkv._native.forward), the default public call
(qkv.attention), SDPA (the math of torch's CPU backends for Nq=1 with GQA heads enabled), and the
floor: the best of two plain reads of the K+V bytes (torch sums over the bytes viewed as float32,
on the same threads; a kernel whose read is as fast as that is at the floor). Reports GB/s (K+V
bytes / median time) and the fraction of the floor (floor time / kernel time; target >= 0.85).
Then the fixed cost: the kernel call and the qkv.attention call at Nk=16, where the read is free.
`--only quant`: a quantized cache (int8, float8 E4M3 / E5M2 codes with a float32 scale per token
and kv head) against the bfloat16 cache, bfloat16 queries, interleaved with each format's own
floor (its code and scale bytes read plainly): the fraction of the floor (target >= 0.85) and the
speed-up over the bf16 cache (target >= 1.8x at Nk >= 8k), for the kernel call and for
qkv.attention over qkv.Quantized (the public call, its Python included).
`--only sweep`: one thread, one head of MHA D=64 float32 from L2-sized to DRAM-sized caches, the kernel's
cost a key against a plain read of the same bytes (does the loop's arithmetic hide under its reads?).
`--only prefetch`: qkv.attention with the decode loop's prefetch target forced to L1 and to L2
(`qkv._native.use_decode_prefetch`; dispatch.cpp picks one per CPU), interleaved with the floor,
for float32 / bfloat16 caches and the three 8-bit ones: the fraction of the floor of each.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F

import qkv
from qkv import _native as native
from qkv._info import fresh_line

THREADS = 2


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def round_robin(fns: dict, rounds: int, inner: int = 1, stat=np.median) -> dict:
    """Seconds per call of each function (median, or `stat`, over rounds), called in turn (A B C ..
    B C .. A C .. A B ..): each round starts one later, so every call follows every other equally
    often: in a fixed order one column always runs right after torch's floor reads (whose OpenMP
    workers spin on after a parallel region) and another never does."""
    for f in fns.values():
        f()
    times = {k: [] for k in fns}
    names = list(fns)
    for r in range(rounds):
        s = r % len(names)
        for name in names[s:] + names[:s]:
            f = fns[name]
            t = time.perf_counter()
            for _ in range(inner):
                f()
            times[name].append((time.perf_counter() - t) / inner)
    return {k: float(stat(v)) for k, v in times.items()}


def tensors(h: int, hkv: int, d: int, nk: int, dtype):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, h, 1, d, generator=g).to(dtype)
    k = torch.randn(1, hkv, nk, d, generator=g).to(dtype)
    v = torch.randn(1, hkv, nk, d, generator=g).to(dtype)
    return q, k, v


def kernel_call(q, k, v):
    out = torch.empty(q.shape[:3] + (v.shape[3],), dtype=q.dtype)
    lse = torch.empty(q.shape[:3], dtype=torch.float32)
    scale = q.shape[3] ** -0.5

    def run():
        native.forward(q, k, v, out, lse, scale=scale, threads=THREADS)

    return run


def floor_reads(k, v):
    kb, vb = k.view(torch.float32), v.view(torch.float32)  # the same bytes, read as float32

    def sums():
        return float(kb.sum()) + float(vb.sum())

    def amax():
        return float(torch.amax(kb)) + float(torch.amax(vb))

    return sums, amax


def case(name, h, hkv, d, nk, dtype, rounds, stat):
    q, k, v = tensors(h, hkv, d, nk, dtype)
    nbytes = (k.numel() + v.numel()) * k.element_size()
    sums, amax = floor_reads(k, v)
    gqa = h != hkv
    fns = {
        "kernel": kernel_call(q, k, v),
        "qkv.attention": lambda: qkv.attention(q, k, v),
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa),
        "floor sum": sums,
        "floor amax": amax,
    }
    t = round_robin(fns, rounds, stat=stat)
    floor = min(t["floor sum"], t["floor amax"])
    gbs = {n: nbytes / t[n] / 1e9 for n in t}
    print(
        f"| {name} | {nbytes / 2**20:.0f} MiB | {t['kernel'] * 1e3:.3f} ({gbs['kernel']:.1f} GB/s) | "
        f"**{floor / t['kernel']:.2f}** | {t['qkv.attention'] * 1e3:.3f} ({floor / t['qkv.attention']:.2f}) | "
        f"{t['sdpa'] * 1e3:.3f} ({floor / t['sdpa']:.2f}; ours {t['sdpa'] / t['kernel']:.2f}x) | "
        f"{floor * 1e3:.3f} ({nbytes / floor / 1e9:.1f} GB/s) |",
        flush=True,
    )


def quant_tensors(k, fmt):
    """k (B, Hkv, Nk, D) float -> (codes, float32 scale (B, Hkv, Nk)) of a format, per token."""
    top = {"i8": 127.0, "e4m3": 448.0, "e5m2": 57344.0}[fmt]
    scale = (k.float().abs().amax(-1) / top).clamp_min(1e-30)
    y = k.float() / scale[..., None]
    if fmt == "i8":
        return torch.round(y).clamp(-127, 127).to(torch.int8), scale
    return y.to({"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[fmt]).view(torch.uint8), scale


def quant_case(name, h, hkv, d, nk, rounds, stat):
    q, k, v = tensors(h, hkv, d, nk, torch.bfloat16)
    fns, nbytes, reads = {"bf16": kernel_call(q, k, v)}, {"bf16": (k.numel() + v.numel()) * 2}, {}
    public = {"bf16": lambda: qkv.attention(q, k, v)}
    reads["bf16"] = floor_reads(k, v)[0]
    for fmt in ("i8", "e4m3", "e5m2"):
        kc, ks = quant_tensors(k, fmt)
        vc, vs = quant_tensors(v, fmt)
        out = torch.empty(q.shape[:3] + (d,), dtype=q.dtype)
        lse = torch.empty(q.shape[:3], dtype=torch.float32)

        kv_format = native.KvFormat[fmt.upper()]

        def run(kc=kc, vc=vc, ks=ks, vs=vs, out=out, lse=lse, f=kv_format):
            native.forward(q, kc, vc, out, lse, scale=d**-0.5, threads=THREADS, kv_format=f, k_scale=ks, v_scale=vs)

        fns[fmt] = run
        name8 = {"i8": "int8", "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}[fmt]
        store = torch.int8 if fmt == "i8" else getattr(torch, name8)
        qk, qv = (qkv.Quantized(c.view(store), s, name8) for c, s in ((kc, ks), (vc, vs)))
        public[fmt] = lambda qk=qk, qv=qv: qkv.attention(q, qk, qv)
        nbytes[fmt] = kc.numel() + vc.numel() + 4 * (ks.numel() + vs.numel())
        codes = floor_reads(kc, vc)[0]
        scales = floor_reads(ks, vs)[0]
        reads[fmt] = lambda c=codes, s=scales: c() + s()
    calls = {**fns, **{f"qkv.attention {f}": p for f, p in public.items()}}
    t = round_robin({**calls, **{f"floor {f}": r for f, r in reads.items()}}, rounds, stat=stat)
    for fmt in fns:
        fl, pub = t[f"floor {fmt}"], t[f"qkv.attention {fmt}"]
        print(
            f"| {name} Nk={nk} | {fmt} | {nbytes[fmt] / 2**20:.1f} MiB | {t[fmt] * 1e3:.3f} "
            f"({nbytes[fmt] / t[fmt] / 1e9:.1f} GB/s) | **{fl / t[fmt]:.2f}** | {t['bf16'] / t[fmt]:.2f}x | "
            f"{pub * 1e3:.3f} ({fl / pub:.2f}; {t['qkv.attention bf16'] / pub:.2f}x) |",
            flush=True,
        )


def prefetch_case(name, h, hkv, d, nk, rounds, stat):
    """qkv.attention under each prefetch target, for each cache format, against its floor."""
    for fmt in ("float32", "bfloat16", "i8", "e4m3", "e5m2"):
        q, k, v = tensors(h, hkv, d, nk, torch.float32 if fmt == "float32" else torch.bfloat16)
        if fmt in ("float32", "bfloat16"):
            kk, vv, floor = k, v, floor_reads(k, v)[0]
            nbytes = (k.numel() + v.numel()) * k.element_size()
        else:
            (kc, ks), (vc, vs) = quant_tensors(k, fmt), quant_tensors(v, fmt)
            name8 = {"i8": "int8", "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}[fmt]
            store = torch.int8 if fmt == "i8" else getattr(torch, name8)
            kk, vv = (qkv.Quantized(c.view(store), s, name8) for c, s in ((kc, ks), (vc, vs)))
            codes, scales = floor_reads(kc, vc)[0], floor_reads(ks, vs)[0]

            def floor(c=codes, s=scales):
                return c() + s()

            nbytes = kc.numel() + vc.numel() + 4 * (ks.numel() + vs.numel())

        def under(target, q=q, kk=kk, vv=vv):
            def run():
                with native.use_decode_prefetch(target):
                    qkv.attention(q, kk, vv)

            return run

        t = round_robin({"l1": under("l1"), "l2": under("l2"), "floor": floor}, rounds, stat=stat)
        fl = t["floor"]
        print(
            f"| {name} Nk={nk} | {fmt} | {nbytes / 2**20:.1f} MiB | {t['l1'] * 1e3:.3f} (**{fl / t['l1']:.2f}**) | "
            f"{t['l2'] * 1e3:.3f} (**{fl / t['l2']:.2f}**) | {t['l1'] / t['l2']:.2f}x | "
            f"{fl * 1e3:.3f} ({nbytes / fl / 1e9:.1f} GB/s) |",
            flush=True,
        )


def fixed_cost(rounds):
    for name, h, hkv, d in (("MHA 8/8 D=64", 8, 8, 64), ("GQA 32/8 D=128", 32, 8, 128)):
        for dtype in (torch.float32, torch.bfloat16):
            q, k, v = tensors(h, hkv, d, 16, dtype)
            t = round_robin(
                {
                    "kernel": kernel_call(q, k, v),
                    "qkv.attention": lambda q=q, k=k, v=v: qkv.attention(q, k, v),
                    "sdpa": lambda q=q, k=k, v=v, g=h != hkv: F.scaled_dot_product_attention(q, k, v, enable_gqa=g),
                },
                rounds,
                inner=200,
            )
            print(
                f"| {name} {str(dtype)[6:]} Nk=16 | {t['kernel'] * 1e6:.1f} | {t['qkv.attention'] * 1e6:.1f} | "
                f"{t['sdpa'] * 1e6:.1f} |",
                flush=True,
            )
        # an int8 cache (bf16 q): the kernel call against qkv.attention over qkv.Quantized
        q, k, v = tensors(h, hkv, d, 16, torch.bfloat16)
        (kc, ks), (vc, vs) = quant_tensors(k, "i8"), quant_tensors(v, "i8")
        out, lse = torch.empty(1, h, 1, d, dtype=q.dtype), torch.empty(1, h, 1)
        qk, qv = qkv.Quantized(kc, ks, "int8"), qkv.Quantized(vc, vs, "int8")
        i8 = native.KvFormat.I8

        def kernel(q=q, kc=kc, vc=vc, ks=ks, vs=vs, out=out, lse=lse, d=d, f=i8):
            native.forward(q, kc, vc, out, lse, scale=d**-0.5, threads=THREADS, kv_format=f, k_scale=ks, v_scale=vs)

        public = lambda q=q, qk=qk, qv=qv: qkv.attention(q, qk, qv)  # noqa: E731
        t = round_robin({"kernel": kernel, "qkv.attention": public}, rounds, inner=200)
        print(f"| {name} int8 cache Nk=16 | {t['kernel'] * 1e6:.1f} | {t['qkv.attention'] * 1e6:.1f} | |", flush=True)


def sweep(rounds, stat):
    """One thread, one head of MHA D=64 float32, the cache from L2 to DRAM: the kernel's cost a key
    against a plain read of the same bytes. Where the loop's arithmetic overlaps its reads, the
    kernel's cost from DRAM is the larger of its L2 cost and the read's; where it does not, the sum."""
    torch.set_num_threads(1)
    for nk in (4096, 16384, 65536, 262144):
        q, k, v = tensors(1, 1, 64, nk, torch.float32)
        out, lse = torch.empty(1, 1, 1, 64), torch.empty(1, 1, 1)

        def kernel(q=q, k=k, v=v, out=out, lse=lse):
            native.forward(q, k, v, out, lse, scale=64**-0.5, threads=1)

        inner = max(1, 65536 // nk)
        t = round_robin({"kernel": kernel, "read": floor_reads(k, v)[0]}, rounds, inner=inner, stat=stat)
        nbytes = 2 * k.numel() * 4
        print(
            f"| {nbytes / 2**20:.0f} MiB | {t['kernel'] / nk * 1e9:.1f} ({nbytes / t['kernel'] / 1e9:.1f}) | "
            f"{t['read'] / nk * 1e9:.1f} ({nbytes / t['read'] / 1e9:.1f}) | {t['read'] / t['kernel']:.2f} |",
            flush=True,
        )
    torch.set_num_threads(THREADS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nk", default="32768", help="key counts, comma-separated")
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--only", default="floor,fixed")
    ap.add_argument("--best", action="store_true", help="minimum over rounds instead of the median (a loaded machine)")
    a = ap.parse_args()
    print(fresh_line(), flush=True)  # qkv.info()'s line: CPU, ISA path, engines, threads, versions
    nks = [int(x) for x in str(a.nk).split(",")]
    torch.set_num_threads(THREADS)
    stat = np.min if a.best else np.median
    print(f"qkv._native path: {native.isa()}; torch {torch.__version__}; threads {THREADS}")
    if "floor" in a.only:
        print(
            "| case | K+V | kernel ms (GB/s) | fraction of floor | qkv.attention ms (fraction) | SDPA ms (fraction) "
            "| floor ms (GB/s) |\n|---|---|---|---|---|---|---|"
        )
        for nk in nks:
            for dtype in (torch.float32, torch.bfloat16):
                for name, h, hkv, d in (("MHA 8/8 D=64", 8, 8, 64), ("GQA 32/8 D=128", 32, 8, 128)):
                    case(f"{name} {str(dtype)[6:]} Nk={nk}", h, hkv, d, nk, dtype, a.rounds, stat)
    if "quant" in a.only:
        print(
            "\n| case (bf16 q) | cache | K+V (+ scales) | kernel ms (GB/s) | fraction of floor | speed vs bf16 cache "
            "| qkv.attention ms (fraction; vs bf16) |\n|---|---|---|---|---|---|---|"
        )
        for nk in nks:
            for name, h, hkv, d in (("MHA 8/8 D=64", 8, 8, 64), ("GQA 32/8 D=128", 32, 8, 128)):
                quant_case(name, h, hkv, d, nk, a.rounds, stat)
    if "sweep" in a.only:
        print("\n| K+V, one thread | kernel ns a key (GB/s) | read ns a key (GB/s) | fraction |\n|---|---|---|---|")
        sweep(a.rounds, stat)
    if "prefetch" in a.only:
        print(
            f"\n(the CPU's own target: {native.decode_prefetch()})\n| case | cache | K+V (+ scales) "
            "| qkv.attention, L1 prefetch, ms (fraction of floor) | L2 prefetch | L2 speed-up | floor ms (GB/s) |"
            "\n|---|---|---|---|---|---|---|"
        )
        for nk in nks:
            for name, h, hkv, d in (("MHA 8/8 D=64", 8, 8, 64), ("GQA 32/8 D=128", 32, 8, 128)):
                prefetch_case(name, h, hkv, d, nk, a.rounds, stat)
    if "fixed" in a.only:
        print("\n| fixed cost | kernel us | qkv.attention us | SDPA us |\n|---|---|---|---|")
        fixed_cost(max(5, a.rounds // 3))


if __name__ == "__main__":
    main()
