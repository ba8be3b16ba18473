"""The float32 forward's rate as one kv head's K+V outgrow the caches, against torch's SDPA.

The same FLOPs (4 Nq Nk D per head), GQA 8/2 heads, D=128, B=1, one thread by default: non-causal
calls whose K+V per kv head go from 1 to 64 MiB (Nq x Nk fixed), then causal squares at 4096 and
16384 tokens. Each of qkv's work items (64 rows: 16 positions x the 4 query heads of a kv head)
reads its kv head's K and V once; a rate that falls as they grow says those reads are not hidden
under the arithmetic. `qkv.attention` (the default call) and SDPA alternate, CPU time, medians:

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/kv_footprint.py [--rounds 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import qkv
from qkv._info import fresh_line

CALLS = (  # (Nq, Nk, causal)
    (16384, 1024, False),
    (16384, 4096, False),
    (4096, 16384, False),
    (1024, 65536, False),
    (4096, 4096, True),
    (16384, 16384, True),
)


def rates(nq: int, nk: int, causal: bool, rounds: int) -> dict[str, float]:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 8, nq, 128, generator=g)
    k, v = (torch.randn(1, 2, nk, 128, generator=g) for _ in range(2))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    calls = {
        "qkv": lambda: qkv.attention(q, k, v, causal=causal),
        "sdpa": lambda: sdpa(q, k, v, is_causal=causal, enable_gqa=True),
    }
    times: dict[str, list[float]] = {name: [] for name in calls}
    for r in range(rounds + 1):  # the first round warms up
        for name, call in calls.items():
            t = time.process_time()
            call()
            if r:
                times[name].append(time.process_time() - t)
    flop = 4 * 8 * nq * nk * 128 / (2 if causal else 1)
    return {name: flop / float(np.median(t)) / 1e9 for name, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(fresh_line(), flush=True)
    print("| call | K+V per kv head | qkv GFLOP/s | SDPA GFLOP/s |\n|---|---|---|---|")
    for nq, nk, causal in CALLS:
        r = rates(nq, nk, causal, a.rounds)
        kind = f"causal N={nq}" if causal else f"Nq={nq}, Nk={nk}"
        print(f"| {kind} | {nk * 128 * 4 * 2 / 2**20:.0f} MiB | {r['qkv']:.1f} | {r['sdpa']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
