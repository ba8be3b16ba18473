"""The code here that talks to ``torch.distributed``: group checks, ring exchange, all-to-all.

Point-to-point transfers go through ``torch.distributed.batch_isend_irecv`` (NCCL needs the
sends and receives of one step posted together; gloo runs them as plain isend / irecv), so a
step's transfer runs while the caller computes on the block it already holds. A transfer that
fails (a rank died, the group's ``timeout`` ran out) raises ``DistributedError`` saying which
call, step and peer it was (``talking``). ``_agree`` holds the one other collective: the
all-gather that checks the ranks made the same call.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from .._backend import is_torch, kind
from ..errors import DTypeError, QKVError


class DistributedError(QKVError, RuntimeError):
    """A call across ranks cannot go ahead: no process group, not a member of it, ranks whose
    calls differ (raised on every rank), or a transfer that failed (a rank died or timed out)."""


class Group(NamedTuple):
    group: Any  # a ProcessGroup, or None for the default group
    rank: int  # this process's rank within the group
    size: int  # the group's world size

    def peer(self, rank: int) -> int:
        """Global rank of the group's rank ``rank`` (point-to-point calls address global ranks)."""
        r = rank % self.size
        return r if self.group is None else dist.get_global_rank(self.group, r)


def resolve(group: Any, what: str) -> Group:
    """The group to run ``what`` on, with this process's rank; clear errors when not set up."""
    if not dist.is_available():
        raise DistributedError(f"{what} needs torch.distributed, which this torch build does not include")
    if not dist.is_initialized():
        raise DistributedError(
            f"{what} needs an initialised process group: call torch.distributed.init_process_group("
            "backend='gloo' or 'nccl') in every process first (torchrun sets up the environment; see "
            "docs/distributed.md). In a single process, qkv.distributed.simulate_ring runs the same algorithm"
        )
    if group is dist.group.WORLD:
        group = None
    rank = dist.get_rank(group)
    if rank < 0:
        raise DistributedError(f"{what}: this process is not a member of the process group it was given")
    return Group(group, rank, dist.get_world_size(group))


def require_torch(what: str, **arrays: Any) -> None:
    for name, x in arrays.items():
        if not is_torch(x):
            raise DTypeError(
                f"{what} runs on torch tensors over torch.distributed, but {name} is {kind(x)} "
                "(qkv.distributed.simulate_ring runs the ring on NumPy arrays in one process)"
            )


@contextmanager
def talking(call: str, doing: str) -> Iterator[None]:
    """Turn a failed transfer (gloo / NCCL raise ``RuntimeError``) into a ``DistributedError``
    that says which ``call`` and what it was ``doing``."""
    try:
        yield
    except QKVError:
        raise
    except RuntimeError as e:
        raise DistributedError(
            f"{call}: {doing} failed: a rank of the group died, stopped calling or timed out "
            f"(init_process_group's timeout= bounds the wait; docs/distributed.md): {e}"
        ) from e


def ring_exchange(
    g: Group, sends: list[torch.Tensor], first_tag: int = 0, call: str = "ring_attention"
) -> tuple[list[torch.Tensor], list[Any]]:
    """Post ``sends`` to the next rank and receives of the same shapes from the previous one.

    Returns the receive buffers and the requests; ``wait`` on the requests before reading them.
    Transfers in flight at the same time use distinct tags (``first_tag`` onwards).
    """
    recvs = [torch.empty_like(t) for t in sends]
    nxt, prev = g.peer(g.rank + 1), g.peer(g.rank - 1)
    ops = [dist.P2POp(dist.isend, t, nxt, g.group, tag) for tag, t in enumerate(sends, first_tag)]
    ops += [dist.P2POp(dist.irecv, t, prev, g.group, tag) for tag, t in enumerate(recvs, first_tag)]
    with talking(call, f"posting the transfers to rank {(g.rank + 1) % g.size} and from rank {(g.rank - 1) % g.size}"):
        return recvs, dist.batch_isend_irecv(ops)


def wait(g: Group, requests: list[Any], doing: str, call: str = "ring_attention") -> None:
    """Wait for posted transfers; ``doing`` names them in the error if one fails."""
    with talking(
        call,
        f"{doing} (rank {g.rank} of {g.size}, sending to rank {(g.rank + 1) % g.size}, "
        f"receiving from rank {(g.rank - 1) % g.size})",
    ):
        for r in requests:
            r.wait()


def all_to_all(g: Group, x: torch.Tensor, call: str = "ulysses_attention") -> torch.Tensor:
    """``out[s] = x_s[r]``: piece ``s`` of axis 0 goes to rank ``s``, piece ``r`` comes back from each.

    ``x`` is ``(W, ...)``; rank ``r`` receives piece ``r`` of every rank's ``x``, stacked by sender.
    """
    x = x.contiguous()
    out = torch.empty_like(x)
    with talking(call, f"the all-to-all (rank {g.rank} of {g.size})"):
        dist.all_to_all_single(out, x, group=g.group)
    return out
