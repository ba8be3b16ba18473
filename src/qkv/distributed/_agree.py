"""Before the first transfer, every rank checks that all ranks of the group made the same call.

Ring attention (Liu et al., arXiv:2310.01889) and Ulysses (Jacobs et al., arXiv:2309.14509)
move blocks whose sizes each rank works out from its own arguments. When ranks disagree,
``torch.distributed`` does not say so: with shard lengths 32 and 16 gloo aborts one process
(``EnforceNotMet``, no Python exception) while the other returns a tensor built from a
half-filled receive buffer; shards ``(32, 16)`` and ``(16, 32)`` have the same byte count, so
both ranks return garbage silently. So every call first all-gathers a *signature* of each
rank's call and compares them on every rank, which then all raise the same
``DistributedError`` naming the ranks, the field and both values.

A signature is ``SLOTS`` int64 integers per rank, the same size whatever the call, so that
the all-gather itself cannot mismatch:

    slot 0      which function was called (``CALLS``)
    slot 1      0, or 1 if this rank's own argument checks failed (slots 2-3: the error's name)
    slots 2...  the fields: a shape is its number of axes, its last 8 sizes and a hash of the
                whole shape; a dtype or device type is 16 ASCII bytes; a float its 64 bits

One all-gather of ``SLOTS · W`` integers per call (``W`` = world size); nothing is cached
across calls. A rank whose own checks fail still joins the all-gather, so the others raise a
``DistributedError`` naming it instead of waiting for it, and it raises its own error.

Backward passes need no check of their own: each replays its forward's transfers with
gradients that autograd shapes like the forward's outputs. What no check can see is a rank
that never calls at all; the process group's ``timeout`` bounds that wait.
"""

import hashlib
import struct
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from ._comm import DistributedError, Group, talking

SLOTS = 64
CALLS = ("ring_attention", "ulysses_attention", "gather_sequence")
_SHOWN_AXES = 8  # sizes kept exactly per shape; a hash of the whole shape covers the rest
_TEXT = 16  # bytes of a dtype or device-type name (float8_e4m3fnuz is 15)

T = TypeVar("T")


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def _who(ranks: Sequence[int]) -> str:
    return f"{_ranks(ranks)} {'has' if len(ranks) == 1 else 'have'}"


class Field:
    """One named value of a signature, ``width`` integers wide; ``hint`` says why it matters."""

    width = 1

    def __init__(self, name: str, hint: str = "") -> None:
        self.name, self.hint = name, hint

    def encode(self, value: Any) -> list[int]:
        return [int(value)]

    def decode(self, ints: list[int]) -> Any:
        return ints[0]

    def show(self, value: Any) -> str:
        return f"{self.name}={value!r}"

    def clause(self, odd: Sequence[int], value: Any, ref: Sequence[int], ref_value: Any) -> str:
        """``rank 1 has causal=False but rank 0 has causal=True``, and the hint."""
        words = f"{_who(odd)} {self.show(value)} but {_who(ref)} {self.show(ref_value)}"
        return f"{words} ({self.hint})" if self.hint else words


class Flag(Field):
    def decode(self, ints: list[int]) -> bool:
        return bool(ints[0])


class Choice(Field):
    def __init__(self, name: str, choices: Sequence[str], hint: str = "") -> None:
        super().__init__(name, hint)
        self.choices = tuple(choices)

    def encode(self, value: Any) -> list[int]:
        return [self.choices.index(value)]

    def decode(self, ints: list[int]) -> str:
        return self.choices[ints[0]] if 0 <= ints[0] < len(self.choices) else f"<unknown {ints[0]}>"


class Real(Field):
    """A float compared bit for bit: ranks must use exactly the same scale."""

    def encode(self, value: Any) -> list[int]:
        return list(struct.unpack("<q", struct.pack("<d", float(value))))

    def decode(self, ints: list[int]) -> float:
        return float(struct.unpack("<d", struct.pack("<q", ints[0]))[0])


class Text(Field):
    """A short name (a dtype, a device type) as ``_TEXT`` ASCII bytes."""

    width = _TEXT // 8

    def encode(self, value: Any) -> list[int]:
        raw = str(value).encode("ascii", "replace")[:_TEXT].ljust(_TEXT, b"\0")
        return [int.from_bytes(raw[i : i + 8], "little", signed=True) for i in range(0, _TEXT, 8)]

    def decode(self, ints: list[int]) -> str:
        raw = b"".join(i.to_bytes(8, "little", signed=True) for i in ints)
        return raw.rstrip(b"\0").decode("ascii", "replace")

    def show(self, value: Any) -> str:
        return f"{self.name}={value}"


def _shape_hash(shape: tuple[int, ...]) -> int:
    digest = hashlib.blake2b(repr(shape).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


class Shape(Field):
    """A tensor's shape: every axis (exactly up to 8 axes; beyond that the last 8 and a hash).

    ``axes`` names the axes counted from the end in the package's dimension key, e.g.
    ``{-1: "Dk", -2: "Nk", -3: "Hkv"}`` for ``k``; other axes are batch axes ``B``.
    """

    width = 2 + _SHOWN_AXES

    def __init__(self, name: str, axes: dict[int, str]) -> None:
        super().__init__(name)
        self.axes = axes

    def encode(self, value: Any) -> list[int]:
        shape = tuple(int(s) for s in value)
        shown = shape[-_SHOWN_AXES:] if shape else ()
        whole = _shape_hash(shape) if len(shape) > _SHOWN_AXES else 0  # only needed when axes are hidden
        return [len(shape), *([-1] * (_SHOWN_AXES - len(shown))), *shown, whole]

    def decode(self, ints: list[int]) -> tuple[int, tuple[int, ...], int]:
        ndim = ints[0]
        return ndim, tuple(ints[1 + _SHOWN_AXES - min(ndim, _SHOWN_AXES) : 1 + _SHOWN_AXES]), ints[-1]

    def show(self, value: Any) -> str:
        ndim, shown, _ = value
        if ndim <= _SHOWN_AXES:
            return repr(shown)
        return f"({ndim - _SHOWN_AXES} more axes, {', '.join(map(str, shown))})"

    def clause(self, odd: Sequence[int], value: Any, ref: Sequence[int], ref_value: Any) -> str:
        """``rank 1 has Nk=16 on axis -2 but rank 0 has 32 (k: (1, 2, 16, 8) vs (1, 2, 32, 8))``."""
        shapes = f"({self.name}: {self.show(value)} vs {self.show(ref_value)})"
        (ndim, shown, _), (ref_ndim, ref_shown, _) = value, ref_value
        if ndim != ref_ndim:
            return f"{_who(odd)} {self.name} with {ndim} axes but {_who(ref)} {ref_ndim} {shapes}"
        for axis in range(-len(shown), 0):  # the first axis that differs, from the left
            if shown[axis] != ref_shown[axis]:
                label = self.axes.get(axis, "B")
                return f"{_who(odd)} {label}={shown[axis]} on axis {axis} but {_who(ref)} {ref_shown[axis]} {shapes}"
        return f"{_who(odd)} {self.name} differing in an axis before -{_SHOWN_AXES} {shapes}"


Q_AXES = {-1: "Dk", -2: "Nq", -3: "H"}
K_AXES = {-1: "Dk", -2: "Nk", -3: "Hkv"}
V_AXES = {-1: "Dv", -2: "Nk", -3: "Hkv"}


class Signature:
    """What this rank was called with: named fields, and their values for this rank."""

    def __init__(self, call: str) -> None:
        self.call = call
        self.fields: list[Field] = []
        self.values: list[Any] = []

    def add(self, field: Field, value: Any) -> "Signature":
        self.fields.append(field)
        self.values.append(value)
        return self

    def tensor(self, name: str, x: torch.Tensor, axes: dict[int, str]) -> "Signature":
        """Shape, dtype and device type of ``x`` (each rank may use its own device index)."""
        self.add(Shape(name, axes), tuple(x.shape))
        self.add(Text(f"{name}.dtype"), str(x.dtype).removeprefix("torch."))
        return self.add(Text(f"{name}.device.type"), x.device.type)

    def encode(self) -> list[int]:
        ints = [CALLS.index(self.call), 0, 0, 0]
        for f, v in zip(self.fields, self.values, strict=True):
            ints += f.encode(v)
        assert len(ints) <= SLOTS, f"a {self.call} signature needs {len(ints)} > {SLOTS} slots"
        return ints + [0] * (SLOTS - len(ints))


def _failed(call: str, error: Exception) -> list[int]:
    """The signature of a rank whose own checks raised ``error``: the call, 1, the error's name."""
    return [CALLS.index(call), 1, *Text("error").encode(type(error).__name__)] + [0] * (SLOTS - 4)


def _groups(values: list[Any]) -> list[list[int]]:
    """Ranks grouped by value, the reference group (the largest; ties: lowest rank) first."""
    by_value: dict[Any, list[int]] = {}
    for rank, value in enumerate(values):
        by_value.setdefault(value, []).append(rank)
    groups = sorted(by_value.values(), key=lambda ranks: ranks[0])
    ref = max(groups, key=len)
    return [ref] + [g for g in groups if g is not ref]


def disagreement(sig: Signature, rows: list[list[int]]) -> str | None:
    """Why the ranks' signatures ``rows`` (one per rank) do not match, or None when they all do."""
    if all(row == rows[0] for row in rows):
        return None
    calls = Choice("call", CALLS)
    called = [calls.decode(r[:1]) for r in rows]
    if len(set(called)) > 1:
        ref, *odd = _groups(called)
        return "; ".join(f"{_ranks(o)} called {called[o[0]]} but {_ranks(ref)} called {called[ref[0]]}" for o in odd)
    failed = [r for r, row in enumerate(rows) if row[1]]
    if failed:
        errors = [Text("error").decode(rows[r][2:4]) for r in failed]
        if len(failed) == 1:
            return f"rank {failed[0]} rejected its arguments with a {errors[0]} (its own error says why)"
        names = ", ".join(f"rank {r}: {e}" for r, e in zip(failed, errors, strict=True))
        return f"{_ranks(failed)} rejected their arguments ({names}; their own errors say why)"
    clauses, at = [], 4
    for f in sig.fields:
        values = [f.decode(row[at : at + f.width]) for row in rows]
        at += f.width
        if len(set(values)) > 1:
            ref, *odd = _groups(values)
            clauses += [f.clause(o, values[o[0]], ref, values[ref[0]]) for o in odd]
    return "; ".join(clauses) or None


def _device(g: Group, like: torch.device) -> torch.device:
    """Where the signature travels: the CPU on gloo (and MPI), the current GPU on NCCL."""
    backend = str(dist.get_backend(g.group))
    if "gloo" in backend or "mpi" in backend:
        return torch.device("cpu")
    if "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return like


def _all_gather(g: Group, ints: list[int], device: torch.device, call: str) -> list[list[int]]:
    mine = torch.tensor(ints, dtype=torch.int64, device=_device(g, device))
    every = torch.empty(g.size * SLOTS, dtype=torch.int64, device=mine.device)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
    with talking(call, "exchanging call signatures with the other ranks (the all-gather before any data moves)"):
        gather(every, mine, group=g.group)
    return every.view(g.size, SLOTS).tolist()


def agree(g: Group, call: str, check: Callable[[], tuple[Signature, T]], device: torch.device, advice: str) -> T:
    """Run this rank's argument ``check``, then compare every rank's signature; ``check``'s result.

    On every rank of the group: this rank's own error if its check failed, else a
    ``DistributedError`` if any rank's call differs (``advice`` says what must match), else
    ``check``'s result. One all-gather, skipped for a group of one.
    """
    error: Exception | None = None
    try:
        sig, result = check()
        ints = sig.encode()
    except Exception as e:  # this rank's mistake: tell the others before raising it
        error, ints = e, _failed(call, e)
    if g.size > 1:
        try:
            rows = _all_gather(g, ints, device, call)
        except DistributedError:
            if error is not None:  # this rank's own mistake says more than the failed exchange
                raise error from None
            raise
        if error is None:
            why = disagreement(sig, rows)
            if why:
                raise DistributedError(f"{call}: the ranks' calls differ, so nothing was sent: {why}. {advice}")
    if error is not None:
        raise error
    return result
