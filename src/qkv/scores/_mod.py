"""The ``ScoreMod`` type: a function of the scaled scores and their positions, with its derivative.

``fn(xp, s, i, j, nq, nk) -> (s', ds'/ds)``; ``+`` chains two mods (apply the left, then the
right; derivatives multiply). A pure bias (``s' = s + bias(i, j)``) also carries ``bias``, so
kernels that only add a float mask (torch SDPA) can apply it.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._backend import from_numpy, is_jax, is_torch, kind, namespace, to_numpy
from .._native import KernelMod
from .._typing import Array
from ..errors import ShapeError

Grad = Array | float | Callable[[], Array] | None
"""``ds'/ds``: an array, a constant, None for 1 (a pure bias), or a function computing it when a
backward pass asks (``from_fn`` mods: autograd's derivative is only taken when needed, and a
NumPy mod without ``grad=`` refuses the backward only then)."""

ModFn = Callable[[Any, Array, np.ndarray, np.ndarray, int, int], tuple[Array, Grad]]
"""``(xp, s, i, j, nq, nk) -> (s', ds'/ds)`` with ``i (rows, 1)``, ``j (1, cols)`` NumPy ints."""


@dataclass(frozen=True, eq=False)
class ScoreMod:
    """A function of the scaled scores and their positions; ``bias`` is set for pure biases
    (``s' = s + bias(i, j)``), which lets impls hand them to kernels as an additive mask."""

    fn: ModFn
    name: str
    bias: Callable[[Any, Array, np.ndarray, np.ndarray, int, int], Array] | None = None
    tensors: tuple[Array, ...] = ()  # learnable arrays it closes over (kernels without autograd decline them)
    opaque: bool = False  # a plain function: it may close over tensors only autograd can follow
    native: tuple[KernelMod, ...] | None = None  # the compiled kernel's ops for it (None: not expressible)
    # position-based mods (alibi, relative_bias): this mod with query row i at key position
    # p = i + shift[..., i] (shift int64 (..., Nq), from a per-sequence mask's ``Mask.align``)
    realign: Callable[[np.ndarray], "ScoreMod"] | None = None
    # the query heads H it was built for (alibi's n_heads or slopes, a relative_bias table's rows;
    # None: any H); a chain keeps the first, and two that differ can never fit one call
    heads: int | None = None

    def __call__(self, s: Array, i: np.ndarray, j: np.ndarray, nq: int, nk: int) -> Array:
        """``s'`` for scores ``s`` at rows ``i (rows, 1)`` and columns ``j (1, cols)``."""
        return self.with_grad(s, i, j, nq, nk)[0]

    def with_grad(self, s: Array, i: np.ndarray, j: np.ndarray, nq: int, nk: int) -> tuple[Array, Grad]:
        """``(s', ds'/ds)``; the derivative is None when it is 1 everywhere."""
        return self.fn(namespace(s=s), s, i, j, nq, nk)

    def __add__(self, other: "ScoreMod") -> "ScoreMod":
        """Chain: apply ``self``, then ``other``."""
        if not isinstance(other, ScoreMod):
            return NotImplemented
        a, b = self, other

        def fn(xp, s, i, j, nq, nk):
            s1, g1 = a.fn(xp, s, i, j, nq, nk)
            s2, g2 = b.fn(xp, s1, i, j, nq, nk)
            return s2, _mul(g1, g2)

        both = None
        if a.bias is not None and b.bias is not None:
            ab, bb = a.bias, b.bias

            def both(xp, like, i, j, nq, nk):
                return ab(xp, like, i, j, nq, nk) + bb(xp, like, i, j, nq, nk)

        native = None if a.native is None or b.native is None else a.native + b.native
        realign = None
        if a.realign is not None or b.realign is not None:

            def realign(shift: np.ndarray) -> "ScoreMod":
                return (a if a.realign is None else a.realign(shift)) + (b if b.realign is None else b.realign(shift))

        if a.heads is not None and b.heads is not None and a.heads != b.heads:
            raise ShapeError(f"{a.name} is built for H={a.heads} heads and {b.name} for H={b.heads}: no call fits both")
        heads = a.heads if a.heads is not None else b.heads
        name = f"{a.name} + {b.name}"
        return ScoreMod(fn, name, both, a.tensors + b.tensors, a.opaque or b.opaque, native, realign, heads)

    def check_heads(self, h: int, shapes: Callable[[], str] | None = None) -> None:
        """``ShapeError`` naming both head counts when the mod was built for other than the call's
        ``H`` query heads: every impl and engine asks here before running (the compiled kernel
        would otherwise resolve default slopes for ``H`` and never see ``n_heads``)."""
        if self.heads is not None and self.heads != h:
            raise ShapeError(
                f"score_mod {self.name} is built for {self.heads} head{'s' if self.heads != 1 else ''} but the "
                f"call has H={h} query heads on axis -3" + (f" ({shapes()})" if shapes is not None else "")
            )

    def __repr__(self) -> str:
        return f"ScoreMod({self.name})"


def _mul(a: Grad, b: Grad) -> Grad:
    if a is None:
        return b
    if b is None:
        return a
    if callable(a) or callable(b):
        return lambda: resolved(a) * resolved(b)
    return a * b


def resolved(grad: Grad) -> Any:
    """The derivative's value (computing it if it was deferred)."""
    return grad() if callable(grad) else grad


def through(ds: Array, grad: Grad) -> Array:
    """``dS ∘ ds'/ds``: the chain rule through a score mod."""
    return ds if grad is None else ds * resolved(grad)


def additive_mod(
    bias: Callable[[Any, Array, np.ndarray, np.ndarray, int, int], Array],
    name: str,
    tensors: tuple[Array, ...] = (),
    native: tuple[KernelMod, ...] | None = None,
    realign: Callable[[np.ndarray], ScoreMod] | None = None,
    heads: int | None = None,
) -> ScoreMod:
    def fn(xp, s, i, j, nq, nk):
        return s + bias(xp, s, i, j, nq, nk), None

    return ScoreMod(fn, name, bias, tensors, native=native, realign=realign, heads=heads)


def positions(i: np.ndarray, nq: int, nk: int, shift: np.ndarray | None) -> np.ndarray:
    """Key positions ``p`` of query rows ``i (rows, 1)``: ``i + Nk - Nq`` (bottom-right), or
    ``i + shift[..., i]`` per sequence (``(..., rows, 1)``, ``ScoreMod.realign``)."""
    if shift is None:
        return i + (nk - nq)
    return i + shift[..., i[:, 0]][..., None]


def is_array(x: Any) -> bool:
    """A torch tensor or JAX array (kept as is, so autograd and ``jax.grad`` reach it)."""
    return is_torch(x) or is_jax(x)


def heads(s: Array) -> int:
    return s.shape[-3] if s.ndim >= 3 else 1


def per_head(xp: Any, values: Array, like: Array, what: str, axis: int = 0) -> Array:
    """``values`` with heads on ``axis`` in the library and dtype of ``like``, checked against its head axis."""
    h = heads(like)
    if values.shape[axis] not in (1, h):
        raise ShapeError(
            f"{what} has {values.shape[axis]} heads on axis {axis} but the scores have H={h} on axis -3 "
            f"({what}: {tuple(values.shape)}, scores: {tuple(like.shape)})"
        )
    if kind(like) != kind(values):  # a NumPy table on torch / JAX scores, or the reverse
        values = from_numpy(to_numpy(values), like)
    return xp.astype(values, like.dtype)
