"""Exact causal attention at N = 131,072 (one head, D = 64, float32) in O(N) extra memory.

A materialised score matrix would take 131072² · 4 B = 64 GiB; the flash kernel keeps one
tile of scores per step. Prints the time and the peak RSS growth beyond the inputs.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/long_sequence.py [--n 131072] [--backward] [--torch]
"""

import argparse
import resource
import time

import numpy as np

import qkv
from qkv._info import fresh_line


def rss_peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=131072)
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--backward", action="store_true")
    p.add_argument("--torch", action="store_true")
    a = p.parse_args()
    print(fresh_line(), flush=True)  # qkv.info()'s line: CPU, ISA path, engines, threads, versions
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, a.n, a.d), dtype=np.float32) for _ in range(3))
    if a.torch:
        import torch

        torch.set_num_threads(2)
        q, k, v = (torch.from_numpy(x).requires_grad_(a.backward) for x in (q, k, v))
    inputs = 3 * a.n * a.d * 4
    base = rss_peak()
    t0 = time.perf_counter()
    out, lse = qkv.attention(q, k, v, causal=True, impl="flash", return_lse=True)
    if a.backward:
        if a.torch:
            out.sum().backward()
        else:
            qkv.attention_backward(np.ones_like(out), q, k, v, out, lse, causal=True, impl="flash")
    dt = time.perf_counter() - t0
    extra = rss_peak() - base
    flops = 4 * a.n * a.n * a.d / 2 * (3.5 if a.backward else 1)
    print(
        f"N={a.n} D={a.d} causal {'fwd+bwd' if a.backward else 'fwd'} {'torch' if a.torch else 'numpy'}: "
        f"{dt:.1f} s, {flops / dt / 1e9:.0f} GFLOP/s, peak extra RSS {extra / 2**20:.1f} MiB "
        f"(inputs {inputs / 2**20:.0f} MiB; materialised scores would be {a.n * a.n * 4 / 2**30:.0f} GiB)"
    )


if __name__ == "__main__":
    main()
