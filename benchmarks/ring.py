"""Ring attention on one machine: W gloo processes of one thread each against one process.

What a ring of W ranks buys on a single machine is parallel work, paid for in copies through
gloo (K/V blocks sent every step, overlapped with the block computation) and in the causal
imbalance the zigzag layout removes. Each rank holds N/W of the sequence. Timed interleaved in
one run: the ring call on every rank (A), then rank 0 alone runs ``qkv.attention(impl="flash")``
on the whole sequence with one thread (B) while the others wait at a barrier; A B A B ...,
medians. ``speedup`` is B / A (W is the ideal). Bytes per rank come from
``qkv.complexity.communication`` (the tests check it against the bytes actually sent).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/ring.py [--world-size 2] [--n 4096,8192] [--repeats 5]
"""

import argparse
import os
import socket
import time
from datetime import timedelta
from typing import Any

CASES = [("contiguous", False), ("contiguous", True), ("zigzag", True)]


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def _worker(
    rank: int, w: int, port: int, ns: list[int], heads: int, d: int, repeats: int, backward: bool, out: Any
) -> None:
    import torch
    import torch.distributed as dist

    import qkv
    from qkv.distributed import ring_attention, shard_sequence

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=w, timeout=timedelta(seconds=600)
    )
    rows = []
    for n in ns:
        g = torch.Generator().manual_seed(n)
        q, k, v = (torch.randn(1, heads, n, d, generator=g) for _ in range(3))
        for layout, causal in CASES:
            shards = [shard_sequence(x, layout=layout).requires_grad_(backward) for x in (q, k, v)]
            full = [x.clone().requires_grad_(backward) for x in (q, k, v)]
            ring_t, single_t = [], []
            for _ in range(repeats + 1):  # the first round warms up
                dist.barrier()
                t0 = time.perf_counter()
                o = ring_attention(*shards, causal=causal, layout=layout)
                if backward:
                    o.sum().backward()
                dist.barrier()  # the ring is done when its slowest rank is
                ring_t.append(time.perf_counter() - t0)
                if rank == 0:
                    t0 = time.perf_counter()
                    o = qkv.attention(*full, causal=causal, impl="flash")
                    if backward:
                        o.sum().backward()
                    single_t.append(time.perf_counter() - t0)
                dist.barrier()
            if rank == 0:
                rows.append((n, layout, causal, _median(ring_t[1:]), _median(single_t[1:])))
    if rank == 0:
        out.put(rows)
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--n", default="4096,8192")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--backward", action="store_true", help="time forward + backward")
    a = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch.multiprocessing as mp

    from qkv._info import fresh_line

    print(fresh_line(), flush=True)  # qkv.info()'s line: CPU, ISA path, engines, threads, versions

    from qkv.complexity import communication

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ns = [int(x) for x in a.n.split(",")]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(r, a.world_size, port, ns, a.heads, a.d, a.repeats, a.backward, out))
        for r in range(a.world_size)
    ]
    for proc in procs:
        proc.start()
    rows = out.get(timeout=3600)
    for proc in procs:
        proc.join()
    mode = "fwd+bwd" if a.backward else "fwd"
    print(f"W = {a.world_size} processes x 1 thread vs 1 process x 1 thread; (1, {a.heads}, N, {a.d}) float32, {mode}")
    print("| N | layout | causal | ring ms | one process ms | speedup (ideal W) | MiB sent per rank |")
    print("|---:|---|---|---:|---:|---:|---:|")
    for n, layout, causal, ring, single in rows:
        sent = (
            communication(
                n, d_k=a.d, heads=a.heads, world_size=a.world_size, causal=causal, layout=layout, backward=a.backward
            ).bytes_per_rank
            / 2**20
        )
        print(
            f"| {n} | {layout} | {causal} | {ring * 1e3:.1f} | {single * 1e3:.1f} | {single / ring:.2f}x | {sent:.1f} |"
        )


if __name__ == "__main__":
    main()
