"""Peak extra memory of causal forward + backward: qkv's default call against torch SDPA.

Issue 22, item 5: at N=32768, H=1 (B=1, D=64, float32 torch tensors requiring grad) qkv's
``qkv.attention(q, k, v, causal=True)`` followed by its backward must use at most the extra
memory of ``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` and its backward.

Each measurement runs in a fresh spawned process (``multiprocessing`` spawn): the child warms the
call up on a small case, allocates q, k, v and dout, records its RSS, resets the high-water mark
(``/proc/self/clear_refs`` <- "5") and makes one call (forward, then ``torch.autograd.grad``);
peak (``VmHWM``) minus that baseline is the call's extra memory, outputs (out, dq, dk, dv)
included. Large blocks are mmapped (``MALLOC_MMAP_THRESHOLD_``) so freed memory leaves the RSS
and the reading is the live peak, not allocation history (see ``qkv.bench._memory``).

    .venv/bin/python benchmarks/memory_peak.py                # N=32768, H=1, 3 rounds each
    .venv/bin/python benchmarks/memory_peak.py --n 8192 --heads 8
"""

import argparse
import multiprocessing as mp
import os
import re
import sys

THREADS = 2


def _status(field: str) -> int:
    return int(re.search(field + r":\s+(\d+)", open("/proc/self/status").read()).group(1)) * 1024


def _child(name: str, b: int, h: int, n: int, d: int, queue: "mp.Queue[tuple[float, float]]") -> None:
    import ctypes

    import torch
    import torch.nn.functional as F

    import qkv

    torch.set_num_threads(THREADS)

    def call(q, k, v, dout):
        if name == "qkv":
            out = qkv.attention(q, k, v, causal=True)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return [out, *torch.autograd.grad(out, (q, k, v), dout)]

    def inputs(n_):
        g = torch.Generator().manual_seed(0)
        xs = [torch.randn(b, h, n_, d, generator=g) for _ in range(4)]
        for x in xs[:3]:
            x.requires_grad_(True)
        return xs

    call(*inputs(256))  # libraries, thread pools, kernels loaded
    xs = inputs(n)
    ctypes.CDLL(None).malloc_trim(0)
    base = _status("VmRSS")
    open("/proc/self/clear_refs", "w").write("5")  # reset VmHWM to the current RSS
    outs = call(*xs)
    peak = _status("VmHWM")
    out_bytes = sum(o.numel() * o.element_size() for o in outs)
    queue.put(((peak - base) / 2**20, out_bytes / 2**20))


def measure(name: str, b: int, h: int, n: int, d: int) -> tuple[float, float]:
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()
    p = ctx.Process(target=_child, args=(name, b, h, n, d, q))
    p.start()
    r = q.get(timeout=1800)
    p.join()
    return r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=32768)
    ap.add_argument("--heads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")  # inherited by the spawned children
    os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))
    from qkv._info import fresh_line

    print(fresh_line(), flush=True)  # qkv.info()'s line: CPU, ISA path, engines, threads, versions
    print(f"command: {os.path.basename(sys.executable)} {' '.join(sys.argv)}")
    print(
        f"causal fwd+bwd, B={args.batch} H={args.heads} N={args.n} D={args.d} float32 torch, "
        f"{THREADS} threads, MALLOC_MMAP_THRESHOLD_={os.environ['MALLOC_MMAP_THRESHOLD_']}\n"
    )
    print("| call | peak extra MiB (rounds) | of which outputs MiB |")
    print("|---|---|---|")
    res = {}
    for name in ("qkv", "sdpa"):
        runs = [measure(name, args.batch, args.heads, args.n, args.d) for _ in range(args.rounds)]
        res[name] = min(r[0] for r in runs)
        label = "qkv.attention(causal=True)" if name == "qkv" else "F.scaled_dot_product_attention(is_causal=True)"
        each = ", ".join(f"{r[0]:.1f}" for r in runs)
        print(f"| {label} | {res[name]:.1f} ({each}) | {runs[0][1]:.1f} |", flush=True)
    print(f"\nqkv / sdpa = {res['qkv'] / res['sdpa']:.3f} (target <= 1)")


if __name__ == "__main__":
    main()
