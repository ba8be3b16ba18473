"""The road to the kernel: what a user's default call costs beyond the compiled kernel itself.

Every row is a ratio of two candidates timed interleaved in one run (``qkv.bench.compare``:
A B A B ..., median and interquartile range of the per-round ratios), on torch tensors, float32:

- the default ``qkv.attention(q, k, v, causal=True)`` and ``mask=sliding_window(256)`` against
  ``impl="flash"`` (B=1, H=8, D=64, N=4096 and 8192): the cost of deciding;
- a small causal call ``(1, 8, 128, 64)`` against SDPA called directly;
- a decode step through ``qkv.attention`` against the kernel called directly (1 query; 32 query
  heads over 8 kv heads, D=128, 4096 keys; 8 over 8, D=64, 1024 keys);
- with ``--busy``, the same with a separate process spinning on the other core;
- with ``--compile``, a causal attention forward+backward and a TinyGPT training step compiled
  (``torch.compile``, inductor) against the same with SDPA / FlexAttention: compile time and the
  compiled step's speed.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/road.py [--busy] [--compile] [--json out.json]
"""

import argparse
import json
import math
import multiprocessing as mp
import os
import platform
import time
from typing import Any

import torch
import torch.nn.functional as F

import qkv
from qkv import _native, masks
from qkv._info import fresh_line
from qkv.bench import compare, paired_ratios


def _spin(stop: Any) -> None:  # the other core kept busy: a separate process, as a data loader would be
    x = 0
    while not stop.is_set():
        for _ in range(10_000):
            x += 1


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _row(name: str, fns: dict[str, Any], repeats: int, base: str, other: str) -> dict[str, Any]:
    t = compare(fns, warmup=2, repeats=repeats, rotate=True)
    r = paired_ratios(t[base], t[other])  # base time / other time
    return {
        "case": name,
        "ratio": f"{base}/{other}",
        "median": r.median,
        "q1": r.q1,
        "q3": r.q3,
        base: t[base].median,
        other: t[other].median,
    }


def front_end_rows(repeats: int) -> list[dict[str, Any]]:
    g = torch.Generator().manual_seed(0)
    rows = []
    for n in (4096, 8192):
        q, k, v = (torch.randn(1, 8, n, 64, generator=g) for _ in range(3))
        for label, kw in (("causal", {"causal": True}), ("window256", {"mask": masks.sliding_window(256)})):
            rows.append(
                _row(
                    f"{label} N={n}",
                    {
                        "flash": lambda q=q, k=k, v=v, kw=kw: qkv.attention(q, k, v, impl="flash", **kw),
                        "default": lambda q=q, k=k, v=v, kw=kw: qkv.attention(q, k, v, **kw),
                    },
                    repeats,
                    "flash",
                    "default",
                )
            )
    q, k, v = (torch.randn(1, 8, 128, 64, generator=g) for _ in range(3))
    rows.append(
        _row(
            "small causal (1, 8, 128, 64)",
            {
                "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                "default": lambda: qkv.attention(q, k, v, causal=True),
            },
            repeats * 20,
            "default",
            "sdpa",
        )
    )
    for h, hkv, d, nk in ((32, 8, 128, 4096), (8, 8, 64, 1024)):
        q = torch.randn(1, h, 1, d, generator=g)
        k, v = (torch.randn(1, hkv, nk, d, generator=g) for _ in range(2))
        out, lse = torch.empty(1, h, 1, d), torch.empty(1, h, 1)
        threads = qkv.dispatch(q, k, v).threads
        rows.append(
            _row(
                f"decode {h}/{hkv} heads D={d} Nk={nk}",
                {
                    "kernel": lambda q=q, k=k, v=v, out=out, lse=lse, d=d, t=threads: _native.forward(
                        q, k, v, out, lse, scale=d**-0.5, threads=t
                    ),
                    "default": lambda q=q, k=k, v=v: qkv.attention(q, k, v, causal=True),
                },
                repeats * 20,
                "default",
                "kernel",
            )
        )
    return rows


def compile_rows(repeats: int) -> list[dict[str, Any]]:
    """Compile time and compiled speed, causal (1, 8, 2048, 64): forward+backward with qkv and SDPA,
    forward with qkv, SDPA and FlexAttention (Flex has no backward on the CPU)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    g = torch.Generator().manual_seed(0)
    n = 2048
    leaf = [torch.randn(1, 8, n, 64, generator=g) for _ in range(3)]
    block = create_block_mask(lambda b, h, i, j: j <= i, 1, 1, n, n, device="cpu")
    candidates = {
        "qkv": lambda q, k, v: qkv.attention(q, k, v, causal=True),
        "sdpa": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "flex": lambda q, k, v: flex_attention(q, k, v, block_mask=block),
    }
    rows = []
    for mode, names in (("fwd+bwd", ("qkv", "sdpa")), ("fwd", ("qkv", "sdpa", "flex"))):
        grad = mode == "fwd+bwd"
        args = [x.detach().requires_grad_(grad) for x in leaf]
        compiled, seconds = {}, {}
        for name in names:
            torch._dynamo.reset()
            c = torch.compile(candidates[name], fullgraph=True)
            t0 = time.perf_counter()
            out = c(*args)
            if grad:
                out.sum().backward()
            seconds[name] = time.perf_counter() - t0
            compiled[name] = c

        def step(name: str, grad: bool = grad, args: Any = args, compiled: Any = compiled) -> Any:
            def run() -> None:
                out = compiled[name](*args)
                if grad:
                    out.sum().backward()

            return run

        t = compare({name: step(name) for name in names}, warmup=1, repeats=repeats, rotate=True)
        for other in names[1:]:
            r = paired_ratios(t[other], t["qkv"])
            rows.append(
                {
                    "case": f"compiled causal {mode} N={n}",
                    "ratio": f"{other}/qkv",
                    "median": r.median,
                    "q1": r.q1,
                    "q3": r.q3,
                    "compile_s": {k: round(v, 2) for k, v in seconds.items()},
                }
            )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--busy", action="store_true", help="keep the other core busy with a separate process")
    ap.add_argument("--compile", action="store_true", help="also the torch.compile rows")
    ap.add_argument("--json", help="write the rows here too")
    args = ap.parse_args()
    print(fresh_line(), flush=True)  # qkv.info()'s line: CPU, ISA path, engines, threads, versions
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    stop, spinner = None, None
    if args.busy:
        ctx = mp.get_context("spawn")
        stop = ctx.Event()
        spinner = ctx.Process(target=_spin, args=(stop,), daemon=True)
        spinner.start()
    header = {
        "cpu": _cpu(),
        "isa": _native.isa() if _native.available() else None,
        "threads": torch.get_num_threads(),
        "busy": args.busy,
        "load": os.getloadavg()[0],
    }
    try:
        rows = front_end_rows(args.repeats)
        if args.compile:
            rows += compile_rows(max(3, args.repeats // 3))
    finally:
        if stop is not None and spinner is not None:
            stop.set()
            spinner.join(5)
    print(json.dumps(header))
    for row in rows:
        extra = f"  compile s {row['compile_s']}" if "compile_s" in row else ""
        print(f"{row['case']:<36} {row['ratio']:<14} {row['median']:.3f}  (IQR {row['q1']:.3f}-{row['q3']:.3f}){extra}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"header": header, "rows": rows}, f, indent=1)
    assert math.isfinite(rows[0]["median"])


if __name__ == "__main__":
    main()
