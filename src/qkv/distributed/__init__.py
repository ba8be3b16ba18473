"""Attention over sequences sharded across processes, with ``torch.distributed`` (PyTorch only).

- ``ring_attention`` (Liu et al., arXiv:2310.01889): K/V blocks travel around a ring of ranks
  while each rank attends its queries to the block it holds; partial results merge by
  log-sum-exp (``qkv.merge_attention``). Any head count; ``"zigzag"`` layout for causal balance.
- ``ulysses_attention`` (Jacobs et al., arXiv:2309.14509): all-to-all from sequence shards to
  head shards, local attention over the whole sequence, all-to-all back. Heads must divide by
  the world size.
- ``shard_sequence`` / ``gather_sequence``: a rank's part of a sequence and back.
- ``simulate_ring``: the ring in one process over virtual ranks, every step recorded.

Results equal ``qkv.attention`` on the gathered tensors (exactly up to rounding), on CPUs with
gloo as on GPUs with NCCL. Launch one process per rank, e.g. ``torchrun --nproc-per-node=4
script.py`` (docs/distributed.md). ``import qkv`` does not import this package.
"""

from ._comm import DistributedError as DistributedError
from ._ring import ring_attention as ring_attention
from ._sequence import gather_sequence as gather_sequence
from ._sequence import shard_sequence as shard_sequence
from ._simulate import RingSimulation as RingSimulation
from ._simulate import RingStep as RingStep
from ._simulate import simulate_ring as simulate_ring
from ._ulysses import ulysses_attention as ulysses_attention

__all__ = [
    "DistributedError",
    "RingSimulation",
    "RingStep",
    "gather_sequence",
    "ring_attention",
    "shard_sequence",
    "simulate_ring",
    "ulysses_attention",
]
