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
gloo as on GPUs with NCCL. Before any data moves, the ranks compare their calls (one small
all-gather, ``_agree``): ranks that disagree on shapes, dtypes, ``causal``, ``layout`` or
``scale`` all raise ``DistributedError`` naming the ranks, the field and both values. Launch
one process per rank, e.g. ``torchrun --nproc-per-node=4 script.py`` (docs/distributed.md).
``import qkv`` does not import this package's torch modules, and importing it imports torch
only when one of its names is first used.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names below, for type checkers and documentation; at run time they load lazily
    from ._comm import DistributedError as DistributedError
    from ._ring import ring_attention as ring_attention
    from ._sequence import gather_sequence as gather_sequence
    from ._sequence import shard_sequence as shard_sequence
    from ._simulate import RingSimulation as RingSimulation
    from ._simulate import RingStep as RingStep
    from ._simulate import simulate_ring as simulate_ring
    from ._ulysses import ulysses_attention as ulysses_attention

# torch-free: the sequence layouts, for qkv.complexity (not in __all__)
from ._layout import LAYOUTS as LAYOUTS  # noqa: E402
from ._layout import allowed_pairs as allowed_pairs  # noqa: E402
from ._layout import segments as segments  # noqa: E402

_WHERE = {
    "DistributedError": "._comm",
    "ring_attention": "._ring",
    "gather_sequence": "._sequence",
    "shard_sequence": "._sequence",
    "RingSimulation": "._simulate",
    "RingStep": "._simulate",
    "simulate_ring": "._simulate",
    "ulysses_attention": "._ulysses",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    """Load a public name on first use: torch is imported then, so the torch-free layout helpers
    (``qkv.distributed._layout``, used by ``qkv.complexity``) import without it (PEP 562)."""
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(_WHERE[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
