"""The ``Mask`` type: a predicate over (query row, key column) index grids, its tiles and combinators.

Constructors live in ``qkv.masks``; this module holds what they share: evaluation on any tile,
tile classification (EMPTY / PARTIAL / FULL) analytically or by evaluation, ``&``, ``|``, ``~``
and the text picture.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._checks import check_int
from .._native import EMPTY, FULL, PARTIAL  # the compiled kernel's tile classes (params.hpp)
from ..errors import MaskError
from ._cache import cached

Allowed = Callable[[np.ndarray, np.ndarray, int, int], np.ndarray]
"""``(i, j, nq, nk) -> bool array`` broadcast over the index grids ``i`` and ``j``."""

Tiles = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, int], np.ndarray]
"""``(q0, q1, k0, k1, nq, nk) -> int array``: the class of each tile ``[q0, q1) x [k0, k1)``;
``q0, q1`` have shape ``(nbq, 1)``, ``k0, k1`` shape ``(1, nbk)``."""

Rows = Callable[[np.ndarray, int, int], tuple[np.ndarray, np.ndarray]]
"""``(i, nq, nk) -> (lo, hi)``: query row ``i`` may attend exactly the keys ``lo <= j < hi``.
``i (n,)``; ``lo``, ``hi`` int64 broadcasting to ``(..., n)`` (leading axes for batch-dependent
masks). Neither ever decreases as ``i`` grows (an empty row is ``lo = hi``), so a row of tiles
is bounded by its first and last query: what makes tile counts O(tile rows) and what the
compiled kernel masks with."""


Align = Callable[[np.ndarray, int, int], np.ndarray]
"""``(i, nq, nk) -> shift``: query row ``i`` sits at key position ``p = i + shift`` (int64
broadcasting to ``(..., n)``). Masks that align each sequence bottom-right on its own
(``padding``, ``packed``) give it, so position-based score mods (ALiBi, relative bias) measure
distances within each sequence as the mask does (flash-attn's varlen ALiBi); other masks have
None: ``shift = Nk - Nq`` for every row."""


@dataclass(frozen=True, eq=False)
class Mask:
    """'Query ``i`` may attend key ``j``', evaluated on index grids; see the module docstring.

    ``tiles`` classifies tiles analytically where the structure allows it; without it,
    ``blocks()`` evaluates the predicate one row of tiles at a time (exact, O(block_q · Nk) memory).
    ``rows`` gives each query row's allowed keys as one interval where the mask is that simple
    (causal, sliding window, prefix LM, padding, packed documents, and ``&`` of those).
    ``bind`` is set for masks that depend on the batch and head index (``from_fn(fn(b, h, i,
    j))``): ``qkv.attention`` binds them to its call's leading ``(*B, H)`` shape (``bound``).
    A mask is a pure, immutable function of its indices: its tile classes and bound forms are
    remembered per size outside it (``masks._cache.cached``).
    """

    allowed: Allowed
    name: str
    tiles: Tiles | None = None
    size: tuple[int, int] | None = None  # (Nq, Nk) for masks built for one size (from_dense, document)
    rows: Rows | None = None
    bind: Callable[[tuple[int, ...]], "Mask"] | None = None
    recipe: Any = field(default=None, repr=False)  # how it was made (_recipe): None for from_fn masks
    align: Align | None = None  # per-sequence alignment (padding, packed): see ``Align``

    def bound(self, lead: tuple[int, ...]) -> "Mask":
        """This mask for a call whose scores are ``(*lead, Nq, Nk)`` (itself unless it depends on batch and head)."""
        if self.bind is None:
            return self
        bind = self.bind
        return cached((self, "bound", tuple(lead)), lambda: bind(tuple(lead)))

    def intervals(self, nq: int, nk: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Each query row's allowed keys ``[lo, hi)``: int64 ``(..., nq)`` each, or None when the
        mask is not one interval per row (``|``, ``~``, global tokens, random blocks, arrays, functions)."""
        nq, nk = sizes(nq, nk, "Mask.intervals")
        if self.rows is None:
            return None
        lo, hi = self.rows(np.arange(nq), nq, nk)
        lo, hi = np.broadcast_arrays(np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64))
        return lo, np.maximum(lo, hi)

    def dense(self, nq: int, nk: int) -> np.ndarray:
        """The boolean matrix, NumPy ``(..., nq, nk)`` (leading axes only for batch-dependent masks)."""
        nq, nk = sizes(nq, nk, "Mask.dense")
        return self.tile(0, nq, 0, nk, nq, nk)

    def tile(self, q0: int, q1: int, k0: int, k1: int, nq: int, nk: int) -> np.ndarray:
        """Rows ``[q0, q1)`` and columns ``[k0, k1)`` of ``dense(nq, nk)``, computed alone."""
        i = np.arange(q0, q1)[:, None]
        j = np.arange(k0, k1)[None, :]
        a = np.asarray(self.allowed(i, j, nq, nk), dtype=bool)
        return np.broadcast_to(a, np.broadcast_shapes(a.shape, (q1 - q0, k1 - k0)))

    def blocks(
        self, nq: int, nk: int, block_q: int, block_k: int, *, rows: tuple[int, int] | None = None
    ) -> np.ndarray:
        """Classify each ``block_q x block_k`` tile as EMPTY (0), PARTIAL (1) or FULL (2).

        Returns int8 ``(..., ceil(nq / block_q), ceil(nk / block_k))``; the last tiles of a row
        or column may be smaller. EMPTY and FULL are exact; PARTIAL may be conservative for
        masks combined with ``&`` / ``|`` (a PARTIAL tile is still computed correctly).
        ``rows=(r0, r1)`` classifies only tile rows ``r0 … r1 - 1`` (to bound memory).
        """
        nq, nk = sizes(nq, nk, "Mask.blocks")
        for name, b in (("block_q", block_q), ("block_k", block_k)):
            check_int(b, f"Mask.blocks {name}", minimum=1, error=MaskError)
        nbq = -(-nq // block_q)
        r0, r1 = (0, nbq) if rows is None else (max(0, rows[0]), min(nbq, rows[1]))

        def build() -> np.ndarray:
            q0 = np.arange(r0 * block_q, min(r1 * block_q, nq), block_q)[:, None]
            k0 = np.arange(0, nk, block_k)[None, :]
            q1, k1 = np.minimum(q0 + block_q, nq), np.minimum(k0 + block_k, nk)
            c = self._classify(q0, q1, k0, k1, nq, nk).astype(np.int8)
            c = np.broadcast_to(c, np.broadcast_shapes(c.shape, (q0.size, k0.size))).copy()
            c.flags.writeable = False  # shared by every call of this size
            return c

        return cached((self, "blocks", nq, nk, block_q, block_k, r0, r1), build)

    def _classify(self, q0: np.ndarray, q1: np.ndarray, k0: np.ndarray, k1: np.ndarray, nq: int, nk: int):
        if self.tiles is not None:
            return np.asarray(self.tiles(q0, q1, k0, k1, nq, nk))
        return _classify_by_evaluation(self, q0[:, 0], q1[:, 0], k0[0], nq, nk)

    def __and__(self, other: "Mask") -> "Mask":
        a, b = self, _as_mask(other, "&")
        if a.bind is not None or b.bind is not None:
            return unbound(f"({a.name} & {b.name})", lambda lead: a.bound(lead) & b.bound(lead))
        return Mask(
            lambda i, j, nq, nk: a.allowed(i, j, nq, nk) & b.allowed(i, j, nq, nk),
            f"({a.name} & {b.name})",
            lambda *t: _and_classes(a._classify(*t), b._classify(*t)),
            a.size or b.size,
            _and_rows(a.rows, b.rows),
            recipe=_combined("&", a, b),
            align=_either_align(a, b),
        )

    def __or__(self, other: "Mask") -> "Mask":
        a, b = self, _as_mask(other, "|")
        if a.bind is not None or b.bind is not None:
            return unbound(f"({a.name} | {b.name})", lambda lead: a.bound(lead) | b.bound(lead))
        return Mask(
            lambda i, j, nq, nk: a.allowed(i, j, nq, nk) | b.allowed(i, j, nq, nk),
            f"({a.name} | {b.name})",
            lambda *t: _or_classes(a._classify(*t), b._classify(*t)),
            a.size or b.size,
            recipe=_combined("|", a, b),
            align=_either_align(a, b),
        )

    def __invert__(self) -> "Mask":
        a = self
        if a.bind is not None:
            return unbound(f"~{a.name}", lambda lead: ~a.bound(lead))
        return Mask(
            lambda i, j, nq, nk: ~np.asarray(a.allowed(i, j, nq, nk), dtype=bool),
            f"~{a.name}",
            lambda *t: FULL - a._classify(*t),  # FULL <-> EMPTY, PARTIAL stays
            a.size,
            recipe=_combined("~", a),
            align=a.align,
        )

    def __repr__(self) -> str:
        if self.bind is not None:
            return f"Mask {self.name} (depends on the batch and head index: draw mask.bound((B, H)))"
        return f"Mask {self.name}\n{picture(self)}"


def sizes(nq: Any, nk: Any, where: str) -> tuple[int, int]:
    """``(Nq, Nk)`` as ints ``>= 0`` (``MaskError`` naming the size otherwise)."""
    return tuple(check_int(n, f"{where} {name}", minimum=0, error=MaskError) for n, name in ((nq, "nq"), (nk, "nk")))  # type: ignore[return-value]


def picture(mask: Mask, nq: int | None = None, nk: int | None = None, crop: int = 16) -> str:
    """A text picture of ``mask`` (first batch element): ``█`` may attend, ``·`` not.

    Drawn at ``nq x nk`` (default: the mask's own size, else 8 x 8), cropped to the top-left
    ``crop x crop`` corner.
    """
    nq, nk = (nq, nk) if nq is not None and nk is not None else (mask.size or (8, 8))
    d = mask.dense(nq, nk)
    d = d[(0,) * (d.ndim - 2)][:crop, :crop]
    rows = "\n".join(" ".join("█" if x else "·" for x in row) for row in d)
    return rows if max(nq, nk) <= crop else f"{rows}\n(top-left {d.shape[0]}x{d.shape[1]} of {nq}x{nk})"


def unbound(name: str, bind: Callable[[tuple[int, ...]], Mask]) -> Mask:
    """A mask that depends on the batch and head index: evaluated only once bound to a call's shape."""

    def allowed(i: np.ndarray, j: np.ndarray, nq: int, nk: int) -> np.ndarray:
        raise MaskError(
            f"mask {name} depends on the batch and head index: qkv.attention binds it to its call; "
            "to draw or evaluate it alone, bind it first: mask.bound((B, H)).dense(Nq, Nk)"
        )

    return Mask(allowed, name, bind=bind)


def _combined(op: str, *parts: Mask) -> Any:
    """The recipe of a combination (``_recipe``): None when a part has none."""
    if any(p.recipe is None for p in parts):
        return None
    return (op, *(p.recipe for p in parts))


def _either_align(a: Mask, b: Mask) -> Align | None:
    """A combination keeps the per-sequence alignment of the part that has one; two parts that
    both have one must agree where a score mod asks (else ``MaskError``: which would it be?)."""
    if a.align is None or b.align is None or a.align is b.align:
        return a.align or b.align
    fa, fb = a.align, b.align

    def align(i: np.ndarray, nq: int, nk: int) -> np.ndarray:
        x, y = np.broadcast_arrays(fa(i, nq, nk), fb(i, nq, nk))
        if not np.array_equal(x, y):
            raise MaskError(
                f"masks {a.name} and {b.name} align their sequences differently, so a position-based "
                "score mod (alibi, relative_bias) has no one distance to measure; combine only one of them"
            )
        return x

    return align


def _as_mask(m: Any, op: str) -> Mask:
    if not isinstance(m, Mask):
        raise MaskError(f"cannot combine a Mask with {type(m).__name__} using {op}; wrap arrays in from_dense()")
    return m


def _and_rows(a: Rows | None, b: Rows | None) -> Rows | None:
    """The intersection of two interval masks (max and min of non-decreasing bounds never decrease)."""
    if a is None or b is None:
        return None

    def rows(i: np.ndarray, nq: int, nk: int) -> tuple[np.ndarray, np.ndarray]:
        (la, ha), (lb, hb) = a(i, nq, nk), b(i, nq, nk)
        lo = np.maximum(la, lb)
        return lo, np.maximum(lo, np.minimum(ha, hb))

    return rows


def _and_classes(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where((a == EMPTY) | (b == EMPTY), EMPTY, np.where((a == FULL) & (b == FULL), FULL, PARTIAL))


def _or_classes(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where((a == FULL) | (b == FULL), FULL, np.where((a == EMPTY) & (b == EMPTY), EMPTY, PARTIAL))


def from_counts(count: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Tile class from how many of a tile's ``size`` cells are allowed."""
    return np.where(count == 0, EMPTY, np.where(count == size, FULL, PARTIAL))


def _classify_by_evaluation(mask: Mask, q0: np.ndarray, q1: np.ndarray, k0: np.ndarray, nq: int, nk: int) -> np.ndarray:
    """Exact tile classes by evaluating the predicate a few rows of tiles at a time.

    ``q0``, ``q1`` are the first and one-past-last query rows of each tile row (consecutive
    tiles), ``k0`` the first key column of each tile column; memory stays ~4 M cells.
    """
    block_q = int(q1[0] - q0[0])
    lead = math.prod(mask.tile(int(q0[0]), int(q0[0]) + 1, 0, 1, nq, nk).shape[:-2])  # batch x heads evaluated
    rows_per_chunk = max(1, (1 << 22) // max(1, lead * block_q * nk))
    out = []
    for c in range(0, q0.size, rows_per_chunk):
        r0, r1 = int(q0[c]), int(q1[min(c + rows_per_chunk, q0.size) - 1])
        a = mask.tile(r0, r1, 0, nk, nq, nk)
        rows = q0[c : c + rows_per_chunk] - r0
        anyk = np.logical_or.reduceat(a, k0, axis=-1)
        allk = np.logical_and.reduceat(a, k0, axis=-1)
        anyt = np.logical_or.reduceat(anyk, rows, axis=-2)
        allt = np.logical_and.reduceat(allk, rows, axis=-2)
        out.append(np.where(allt, FULL, np.where(anyt, PARTIAL, EMPTY)))
    return np.concatenate(out, axis=-2)
