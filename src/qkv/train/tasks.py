"""Toy sequence tasks whose solution needs attention: copy, reverse, sort, associative recall.

Each example is one token sequence ``prompt + SEP + answer`` for a decoder-only model; the loss
and the accuracy count only the answer tokens. A model must look back across the separator to
the right prompt positions (copy: the same offset; reverse: the mirrored one; sort: every
position, counting; recall: the key's neighbour, as in the "induction heads" of Olsson et al.,
arXiv:2209.11895, and the associative-recall task of Ba et al., arXiv:1610.06258).
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..errors import ArgumentError


@dataclass(frozen=True)
class Task:
    """A task: ``make(batch, length, generator) -> tokens (B, T)``; ``answer(length)`` lists the scored positions."""

    name: str
    vocab_size: int
    make: Callable[[int, int, torch.Generator], Tensor]
    answer: Callable[[int], Tensor]  # length -> positions (into tokens) of the answer tokens
    default_length: int
    default_steps: int
    description: str


SYMBOLS = 10  # prompt symbols 0..9; SEP = 10 for the sequence tasks
SEP = SYMBOLS


def _symbols(batch: int, length: int, g: torch.Generator) -> Tensor:
    return torch.randint(0, SYMBOLS, (batch, length), generator=g)


def _with_answer(x: Tensor, answer: Tensor) -> Tensor:
    sep = torch.full((x.shape[0], 1), SEP, dtype=x.dtype)
    return torch.cat([x, sep, answer], dim=1)


def _copy(batch: int, length: int, g: torch.Generator) -> Tensor:
    x = _symbols(batch, length, g)
    return _with_answer(x, x)


def _reverse(batch: int, length: int, g: torch.Generator) -> Tensor:
    x = _symbols(batch, length, g)
    return _with_answer(x, x.flip(1))


def _sort(batch: int, length: int, g: torch.Generator) -> Tensor:
    x = _symbols(batch, length, g)
    return _with_answer(x, x.sort(dim=1).values)


KEYS, VALUES = 16, 16  # recall: keys 0..15, values 16..31, SEP = 32


def _recall(batch: int, pairs: int, g: torch.Generator) -> Tensor:
    """``k1 v1 ... kn vn SEP kq1 vq1 ... kqn vqn``: distinct keys, then every key again in a new order.

    Each value after SEP is an answer: the model must find where its key was and read the token
    after it (multi-query associative recall, Arora et al., arXiv:2312.04927).
    """
    if pairs > KEYS:
        raise ArgumentError(
            f"recall has {KEYS} distinct keys, so length (the number of pairs) must be <= {KEYS}, got {pairs}"
        )
    keys = torch.rand(batch, KEYS, generator=g).argsort(dim=1)[:, :pairs]
    values = torch.randint(KEYS, KEYS + VALUES, (batch, pairs), generator=g)
    order = torch.rand(batch, pairs, generator=g).argsort(dim=1)
    prompt = torch.stack([keys, values], dim=2).reshape(batch, 2 * pairs)
    queries = torch.stack([keys.gather(1, order), values.gather(1, order)], dim=2).reshape(batch, 2 * pairs)
    sep = torch.full((batch, 1), KEYS + VALUES, dtype=keys.dtype)
    return torch.cat([prompt, sep, queries], dim=1)


def _tail(n: int) -> Tensor:
    """The last ``n`` positions of ``x SEP answer`` (T = 2n + 1)."""
    return torch.arange(n + 1, 2 * n + 1)


TASKS: dict[str, Task] = {
    "copy": Task("copy", SYMBOLS + 1, _copy, _tail, 8, 400, "x SEP x"),
    "reverse": Task("reverse", SYMBOLS + 1, _reverse, _tail, 8, 400, "x SEP reversed(x)"),
    "sort": Task("sort", SYMBOLS + 1, _sort, _tail, 8, 700, "x SEP sorted(x)"),
    "recall": Task(
        "recall",
        KEYS + VALUES + 1,
        _recall,
        lambda n: torch.arange(2 * n + 2, 4 * n + 1, 2),
        6,
        500,
        "k1 v1 ... kn vn SEP then each key again, followed by its value (length = number of pairs)",
    ),
}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise ArgumentError(f"task must be one of {list(TASKS)}, got {name!r}")
    return TASKS[name]


def make_batch(
    task: str, batch: int, length: int | None = None, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """``(tokens (B, T), answer)``: ``batch`` fresh examples of ``task``; ``answer`` holds the positions
    of the answer tokens (those the loss and the accuracy count).

    >>> tokens, n = make_batch("reverse", 2, length=3, generator=torch.Generator().manual_seed(0))
    """
    t = get_task(name=task)
    n = t.default_length if length is None else length
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ArgumentError(f"length must be a positive integer, got {length!r}")
    g = generator if generator is not None else torch.Generator().manual_seed(0)
    return t.make(batch, n, g), t.answer(n)
