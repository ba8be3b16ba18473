"""A ragged batch: 8 causal sequences of 256 … 4096 tokens, packed versus padded.

- packed: the sequences one after another on the token axis (N = their total) with
  ``masks.packed(cu_seqlens, causal=True)``: one key interval per query row, every hidden tile
  skipped, no mask array;
- padded: a (8, H, 4096, D) batch with the equivalent dense ``(8, 1, 4096, 4096)`` boolean mask
  (right padding, causal per sequence), the route ``from_dense`` offers without per-sequence
  masks; through ``qkv.attention`` (auto) and through SDPA with the same mask.

Interleaved rounds (packed, padded-qkv, padded-sdpa, …), medians and quartiles of the per-round
ratios; outputs checked against each other on the real tokens.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/ragged.py [--mode fwd|fwdbwd] [--rounds 5]
"""

import argparse
import time

import numpy as np
from _report import setup  # sets OMP_NUM_THREADS before torch loads

import qkv
from qkv import masks
from qkv.bench import paired_ratios
from qkv.bench._load import CpuMeter, wait_for_quiet
from qkv.bench._timing import timing

LENGTHS = (256, 512, 768, 1024, 1536, 2048, 3072, 4096)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=("fwd", "fwdbwd"), default="fwd")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--heads", type=int, default=8)
    a = p.parse_args()
    header = setup()
    import torch

    h, d, n_max = a.heads, 64, max(LENGTHS)
    cu = np.concatenate([[0], np.cumsum(LENGTHS)])
    rng = np.random.default_rng(0)
    packed = [torch.from_numpy(rng.standard_normal((1, h, int(cu[-1]), d), dtype=np.float32)) for _ in range(3)]
    padded = [torch.zeros((len(LENGTHS), h, n_max, d)) for _ in range(3)]
    for s, n in enumerate(LENGTHS):
        for x, y in zip(padded, packed, strict=True):
            x[s, :, :n] = y[0, :, cu[s] : cu[s + 1]]
    dense = np.zeros((len(LENGTHS), 1, n_max, n_max), dtype=bool)
    for s, n in enumerate(LENGTHS):
        dense[s, 0, :n, :n] = np.tril(np.ones((n, n), dtype=bool))
    dense_t = torch.from_numpy(dense)
    mask = masks.packed(cu, causal=True)
    grad = a.mode == "fwdbwd"
    for x in packed + padded:
        x.requires_grad_(grad)

    def run(q, k, v, **kw):  # type: ignore[no-untyped-def]
        out = qkv.attention(q, k, v, **kw)
        if grad:
            torch.autograd.grad(out.sum(), (q, k, v))
        return out

    def sdpa():  # type: ignore[no-untyped-def]
        sdpa_mask = dense_t | ~dense_t.any(-1, keepdim=True)  # padded rows: any key (zeroed below)
        out = torch.nn.functional.scaled_dot_product_attention(*padded, attn_mask=sdpa_mask)
        if grad:
            torch.autograd.grad(out.sum(), tuple(padded))
        return out

    fns = {
        "packed (masks.packed)": lambda: run(*packed, mask=mask),
        "padded (dense mask, qkv)": lambda: run(*padded, mask=dense_t),
        "padded (dense mask, SDPA)": sdpa,
    }
    outs = {name: fn() for name, fn in fns.items()}  # warm-up, and the same numbers
    for s, n in enumerate(LENGTHS):
        want = outs["packed (masks.packed)"][0, :, cu[s] : cu[s + 1]].detach()
        for name in list(fns)[1:]:
            assert torch.allclose(outs[name][s, :, :n].detach(), want, atol=1e-4), name
    wait_for_quiet(max_wait_s=60)
    meter = CpuMeter()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(a.rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    busy = meter.others()
    base = "packed (masks.packed)"
    print(f"<!-- {header} -->")
    print(
        f"Ragged batch {list(LENGTHS)}, H={h}, D={d}, causal per sequence, float32, {a.mode}; "
        f"other processes used {'?' if busy is None else f'{busy:.1f}'} cores on average"
    )
    print("\n| route | median ms | packed is faster by (q1–q3) | extra mask memory |")
    print("|---|---:|---:|---:|")
    t_base = timing(samples[base])
    for name, ts in samples.items():
        t = timing(ts)
        r = paired_ratios(t, t_base)
        mem = (
            "none"
            if name == base
            else f"{dense.nbytes / 2**20:.0f} MiB bool" + (" + float copy" if "SDPA" in name else "")
        )
        cell = "—" if name == base else f"{r.median:.2f}× ({r.q1:.2f}–{r.q3:.2f})"
        print(f"| {name} | {t.median * 1e3:.1f} | {cell} | {mem} |")


if __name__ == "__main__":
    main()
