"""Where the flash kernel's time goes: one score tile's operations timed one by one.

    python benchmarks/breakdown.py                 # dense N=4096 tiles, H=8, D=64, float32

Times the torch operations a forward tile performs (``Q Kᵀ``, row max, ``exp``, row sum,
``P V``, the rescales) on one ``BLOCK_Q x BLOCK_K`` tile batched over the heads, interleaved,
and compares their sum times the number of tiles with the whole kernel and SDPA's flash
backend. The gap between the matmuls alone and the kernel is the price of the extra passes
over each score tile and of the Python loop; the gap between the matmuls and SDPA is BLAS
efficiency on tile-sized products.
"""

import argparse
import sys

from _report import setup  # sets OMP_NUM_THREADS before torch loads
from rich.console import Console
from rich.table import Table

import qkv
from qkv._impls import flash
from qkv.bench import compare, flops, make_inputs, workload


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=15)
    a = p.parse_args()
    header = setup()
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    bq, bk, h, d = flash.BLOCK_Q, flash.BLOCK_K, 8, 64
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, h, bq, d, generator=g) * d**-0.5
    k, v = torch.randn(1, h, bk, d, generator=g), torch.randn(1, h, bk, d, generator=g)
    s = q @ k.mT
    m = s.amax(-1, keepdim=True)
    p_ = torch.exp(s - m)
    acc = torch.zeros(1, h, bq, d)
    alpha = torch.ones(1, h, bq, 1)
    ops = {
        "Q Kᵀ (matmul)": lambda: q @ k.mT,
        "row max": lambda: s.amax(-1, keepdim=True),
        "exp(S - m) (in place on a copy)": lambda: s.clone().sub_(m).exp_(),
        "copy of the tile (for the line above)": lambda: s.clone(),
        "row sum": lambda: p_.sum(-1, keepdim=True),
        "P V (matmul)": lambda: p_ @ v,
        "rescale acc·alpha + PV": lambda: acc * alpha + acc,
        "tiny op (Python + dispatch)": lambda: alpha * 1.0,
    }
    t = compare(ops, warmup=3, repeats=a.rounds)
    w = workload("dense", a.n)
    x = make_inputs(w)
    tiles = -(-a.n // bq) * -(-a.n // bk)

    def kernel() -> None:
        qkv.attention(x.q, x.k, x.v, impl="flash")

    def sdpa() -> None:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(x.q, x.k, x.v)

    whole = compare({"flash kernel": kernel, "sdpa-flash": sdpa}, warmup=1, repeats=5)
    out = Console(width=140) if not sys.stdout.isatty() else Console()
    out.print(f"{header['command']} — {header['date']}; tile {bq}x{bk}, H={h}, D={d}; N={a.n}: {tiles} tiles")
    table = Table("operation", "µs per tile", f"ms for {tiles} tiles", "share of the kernel")
    total = whole["flash kernel"].median
    per = {}
    for name, tm in t.items():
        per[name] = tm.median
        table.add_row(
            name, f"{tm.median * 1e6:.0f}", f"{tm.median * tiles * 1e3:.1f}", f"{tm.median * tiles / total:.0%}"
        )
    table.add_section()
    matmuls = per["Q Kᵀ (matmul)"] + per["P V (matmul)"]
    passes = (
        per["row max"]
        + per["exp(S - m) (in place on a copy)"]
        - per["copy of the tile (for the line above)"]
        + per["row sum"]
        + per["rescale acc·alpha + PV"]
    )
    table.add_row("matmuls only", "", f"{matmuls * tiles * 1e3:.1f}", f"{matmuls * tiles / total:.0%}")
    table.add_row("softmax passes only", "", f"{passes * tiles * 1e3:.1f}", f"{passes * tiles / total:.0%}")
    for name, tm in whole.items():
        table.add_row(f"whole: {name}", "", f"{tm.median * 1e3:.1f}", f"{tm.median / total:.0%}")
    gf = flops(w, "fwd") / 1e9
    table.add_row("matmul rate on tiles (GFLOP/s)", "", f"{gf / (matmuls * tiles):.0f}", "")
    out.print(table)


if __name__ == "__main__":
    main()
