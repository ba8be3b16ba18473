"""Time per generated token against the cache length: TinyGPT decoding with and without a KV cache.

With the cache each step attends one new query over the L cached keys, so a step reads each
cached key once: its time is roughly flat while L is short (per-step overhead dominates) and
grows linearly once reading K and V dominates. Without the cache each step recomputes the whole
prefix (quadratic attention, linear projections of every position). Steps are timed
interleaved (cached, uncached, cached, ...), medians of several.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/decode_cache.py [--lengths 64,256,1024,4096]
"""

import argparse
import time

import torch

from qkv._info import fresh_line
from qkv.nn import KVCache, TinyGPT


def step_times(model: TinyGPT, length: int, repeats: int) -> tuple[float, float]:
    """Median seconds of one decode step at cache length ``length``: (with cache, without)."""
    idx = torch.randint(0, model.vocab_size, (1, length + 1))
    cached, plain = [], []
    with torch.no_grad():
        for _ in range(repeats):
            cache = KVCache()
            model(idx[:, :length], cache=cache)  # prefill (not timed)
            t0 = time.perf_counter()
            model(idx[:, length:], cache=cache)  # one new token against `length` cached ones
            cached.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            model(idx)  # the whole prefix again
            plain.append(time.perf_counter() - t0)
    cached.sort()
    plain.sort()
    return cached[len(cached) // 2], plain[len(plain) // 2]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lengths", default="64,256,1024,4096")
    p.add_argument("--repeats", type=int, default=7)
    a = p.parse_args()
    print(fresh_line(), flush=True)  # qkv.info()'s line: CPU, ISA path, engines, threads, versions
    torch.set_num_threads(2)
    torch.manual_seed(0)
    lengths = [int(x) for x in a.lengths.split(",")]
    model = TinyGPT(64, d_model=256, n_heads=8, n_layers=4, max_len=max(lengths) + 1, n_kv_heads=2).eval()
    print("| cache length L | ms per token, cached | ms per token, recomputed | recomputed / cached |")
    print("|---:|---:|---:|---:|")
    for length in lengths:
        c, r = step_times(model, length, a.repeats)
        print(f"| {length} | {c * 1e3:.2f} | {r * 1e3:.2f} | {r / c:.1f}x |")


if __name__ == "__main__":
    main()
