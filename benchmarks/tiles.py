"""Sweep the flash kernel's tile sizes (BLOCK_Q x BLOCK_K), interleaved, against the defaults.

    python benchmarks/tiles.py      # dense fwd N=4096, dense fwdbwd N=2048, sliding fwd and fwdbwd N=8192
    python benchmarks/tiles.py --quick

SDPA's flash backend (with the dense mask for sliding windows) runs in the same rounds, for
the target ratios. Each configuration passes its tile sizes to the kernel as an argument
(``build_call(..., tiles=(bq, bk))``, the internal call record); the defaults are only read.
"""

import argparse
import sys
import time
from typing import Any

from _report import setup  # sets OMP_NUM_THREADS before torch loads
from rich.console import Console
from rich.table import Table

from qkv._core import run as run_call
from qkv._impls import build_call, flash
from qkv.bench import compare, flops, make_inputs, paired_ratios, workload
from qkv.bench._load import CpuMeter, wait_for_quiet

DEFAULT = (flash.BLOCK_Q, flash.BLOCK_K)


def _runner(w: Any, mode: str, bq: int, bk: int, x: Any) -> Any:
    import torch

    def run() -> None:
        out = run_call(build_call(x.q, x.k, x.v, mask=w.mask, tiles=(bq, bk)), "flash").out
        if mode == "fwdbwd":
            torch.autograd.grad(out, (x.q, x.k, x.v), x.dout)

    return run


def _sdpa(w: Any, mode: str, x: Any) -> Any:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    mask = None if w.causal or w.mask is None else torch.from_numpy(w.dense_mask())

    def run() -> None:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out = F.scaled_dot_product_attention(x.q, x.k, x.v, attn_mask=mask, is_causal=w.causal)
            if mode == "fwdbwd":
                torch.autograd.grad(out, (x.q, x.k, x.v), x.dout)

    return run


def sweep(name: str, n: int, mode: str, configs: list[tuple[int, int]], rounds: int) -> list[dict[str, Any]]:
    w = workload(name, n)
    x = make_inputs(w, grad=mode == "fwdbwd")
    fns = {f"{bq}x{bk}": _runner(w, mode, bq, bk, x) for bq, bk in configs}
    default = f"{DEFAULT[0]}x{DEFAULT[1]}"
    fns = {default: fns.pop(default), **fns} if default in fns else fns
    fns["sdpa-flash"] = _sdpa(w, mode, x)  # the targets' baseline (with the dense mask), for scale
    for fn in fns.values():
        fn()  # warm-up (and a first look at each config)
    wait_for_quiet(max_wait_s=30)
    meter = CpuMeter()
    t = compare(fns, warmup=0, repeats=rounds, rotate=True)
    others = meter.others()
    work = flops(w, mode)
    return [
        {
            "workload": name,
            "n": n,
            "mode": mode,
            "tiles": key,
            "median_s": v.median,
            "iqr_s": v.iqr,
            "gflops": work / v.median / 1e9,
            "vs_default": paired_ratios(t[default], v) if default in t else None,
            "vs_sdpa": paired_ratios(t["sdpa-flash"], v),
            "others_cpu": others,
        }
        for key, v in t.items()
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    header = setup()
    bqs, bks = ((128, 256), (256, 512)) if a.quick else ((64, 128, 256, 512), (128, 256, 512, 1024))
    configs = sorted({(bq, bk) for bq in bqs for bk in bks} | {DEFAULT})
    cases = (
        [("dense", 1024, "fwd")]
        if a.quick
        else [("dense", 4096, "fwd"), ("dense", 2048, "fwdbwd"), ("sliding", 8192, "fwd"), ("sliding", 8192, "fwdbwd")]
    )
    err = Console(stderr=True)
    t0 = time.perf_counter()
    rows = []
    for name, n, mode in cases:
        err.print(f"[dim]{time.perf_counter() - t0:5.0f}s {name} N={n} {mode}: {len(configs)} tile sizes[/]")
        rows += sweep(name, n, mode, configs, 3 if a.quick else a.rounds)
    out = Console(width=160) if not sys.stdout.isatty() else Console()
    out.print(
        f"{header['command']} — {header['date']} — {time.perf_counter() - t0:.0f} s; default tiles "
        f"{DEFAULT[0]}x{DEFAULT[1]}; torch {header['torch']}"
    )
    table = Table(
        "workload",
        "N",
        "mode",
        "BLOCK_Q x BLOCK_K",
        "median ms",
        "IQR ms",
        "GFLOP/s",
        "speed-up vs default (q1–q3)",
        "vs sdpa-flash (q1–q3)",
        "busy elsewhere",
    )
    for r in rows:
        s, d = r["vs_default"], r["vs_sdpa"]
        table.add_row(
            r["workload"],
            str(r["n"]),
            r["mode"],
            r["tiles"],
            f"{r['median_s'] * 1e3:.1f}",
            f"{r['iqr_s'] * 1e3:.1f}",
            f"{r['gflops']:.1f}",
            "" if s is None else f"{s.median:.2f}× ({s.q1:.2f}–{s.q3:.2f})",
            f"{d.median:.2f}× ({d.q1:.2f}–{d.q3:.2f})",
            f"{r['others_cpu']:.2f}",
        )
    out.print(table)


if __name__ == "__main__":
    main()
