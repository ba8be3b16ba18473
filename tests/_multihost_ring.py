"""One rank of the two-host test (tests/test_distributed_multihost.py); torchrun runs it in each "host".

Every rank builds the same ``q, k, v`` from a seed, runs ``ring_attention`` on its zigzag shard
(causal, with gradients), gathers the output and the gradients and compares them with
``qkv.attention`` on the whole tensors in this one process, printing

    rank R of W on ADDRESS: ring attention vs one process: max |error| = E

With ``--keep-going`` it then runs the ring again and again, printing ``rank R: round I`` after
each, until a transfer fails (the test cuts the other host off): it prints

    rank R: FAILED after I rounds, S s after the last good one: DistributedError: ...

and exits with status 3. ``--timeout`` is the process group's timeout in seconds: how long a
rank waits for a peer that has gone silent before the transfer fails.
"""

import argparse
import os
import sys
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

import qkv
from qkv.distributed import gather_sequence, ring_attention, shard_sequence

B, H, HKV, N, D = 1, 4, 2, 32, 8


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--keep-going", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    rng = np.random.default_rng(0)  # the same tensors on every rank
    q, k, v = (
        torch.tensor(rng.standard_normal(s), requires_grad=True) for s in ((B, H, N, D), (B, HKV, N, D), (B, HKV, N, D))
    )
    expected = qkv.attention(q, k, v, causal=True)
    grads = torch.autograd.grad(expected.sum(), (q, k, v))
    expected = expected.detach()

    out = ring_attention(*(shard_sequence(x, layout="zigzag") for x in (q, k, v)), causal=True, layout="zigzag")
    mine = torch.autograd.grad(out.sum(), (q, k, v))
    for g in mine:
        dist.all_reduce(g)  # each rank holds its shards' share of the gradient
    whole = gather_sequence(out.detach(), layout="zigzag")
    err = max(float((a - b).abs().max()) for a, b in zip((whole, *mine), (expected, *grads), strict=True))
    print(
        f"rank {rank} of {world} on {os.environ.get('QKV_HOST', '?')}: ring attention vs one process: "
        f"max |error| = {err:.1e}",
        flush=True,
    )
    if err > 1e-10:
        return 2
    rounds, last = 0, time.monotonic()
    while args.keep_going:
        try:
            ring_attention(
                *(shard_sequence(x.detach(), layout="zigzag") for x in (q, k, v)), causal=True, layout="zigzag"
            )
        except Exception as e:
            print(
                f"rank {rank}: FAILED after {rounds} rounds, {time.monotonic() - last:.1f} s after the last good one: "
                f"{type(e).__name__}: {e}",
                flush=True,
            )
            return 3
        rounds, last = rounds + 1, time.monotonic()
        print(f"rank {rank}: round {rounds}", flush=True)
        time.sleep(0.2)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
