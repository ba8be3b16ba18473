"""Ring and Ulysses attention across processes, checked against single-process attention.

Launch one process per rank with torchrun (gloo on CPUs, NCCL on GPUs):

    torchrun --nproc-per-node=4 examples/ring_torchrun.py

Every rank builds the same tensors from a seed, keeps its shard of the sequence, runs
``ring_attention`` (zigzag layout, causal) and ``ulysses_attention``, gathers the outputs and
the gradients, and rank 0 prints how far they are from ``qkv.attention`` on the whole tensors.
Run without torchrun, it shows the same ring simulated in this one process.
"""

import os
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

import qkv
from qkv.distributed import gather_sequence, ring_attention, shard_sequence, simulate_ring, ulysses_attention

B, H, HKV, N, D = 2, 4, 2, 64, 16  # N divides by 2 · world size (zigzag), H and HKV by the world size


def whole_tensors() -> tuple[torch.Tensor, ...]:
    rng = np.random.default_rng(0)  # the same q, k, v on every rank
    shapes = [(B, H, N, D), (B, HKV, N, D), (B, HKV, N, D)]
    return tuple(torch.tensor(rng.standard_normal(s), dtype=torch.float64, requires_grad=True) for s in shapes)


def run_distributed() -> None:
    if not dist.is_initialized():  # torchrun set the environment; a lost rank ends the others within the timeout
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend, timeout=timedelta(seconds=120))
    rank = dist.get_rank()
    q, k, v = whole_tensors()
    expected = qkv.attention(q, k, v, causal=True)
    dq, dk, dv = torch.autograd.grad(expected.sum(), (q, k, v))
    expected = expected.detach()

    for name, layout in (("ring", "zigzag"), ("ulysses", "contiguous")):
        shards = [shard_sequence(x, layout=layout) for x in (q, k, v)]
        if name == "ring":
            out = ring_attention(*shards, causal=True, layout=layout)
        else:
            out = ulysses_attention(*shards, causal=True)
        grads = torch.autograd.grad(out.sum(), (q, k, v))  # this rank's shards' share of each gradient
        for g in grads:
            dist.all_reduce(g)  # sum of the shares: the whole gradient
        whole = gather_sequence(out.detach(), layout=layout)
        err = max(float((a - b).abs().max()) for a, b in zip((whole, *grads), (expected, dq, dk, dv), strict=True))
        if rank == 0:
            print(f"{name:8s} on {dist.get_world_size()} ranks: max |error| vs one process = {err:.1e}")
        assert err < 1e-10, f"{name} differs from single-process attention by {err}"
    dist.destroy_process_group()


def run_simulated() -> None:
    q, k, v = (x.detach() for x in whole_tensors())
    sim = simulate_ring(q, k, v, world_size=4, causal=True, layout="zigzag")
    err = float((sim.out - qkv.attention(q, k, v, causal=True)).abs().max())
    print(f"simulated ring, 4 virtual ranks, {len(sim.steps)} steps: max |error| = {err:.1e}")
    print("for real processes: torchrun --nproc-per-node=4 examples/ring_torchrun.py")


if __name__ == "__main__":
    if "RANK" in os.environ:  # launched by torchrun (or another launcher that sets RANK, WORLD_SIZE, MASTER_*)
        run_distributed()
    else:
        run_simulated()
