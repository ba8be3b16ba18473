"""Dimension key. Prose, docstrings and error messages use API.md's names; einsum strings
use the single letters.

    B    *batch  ...  leading axes, broadcast        Nq   nq  i   query positions
    H    h       h    query heads (axis -3)          Nk   nk  j   key/value positions
    Hkv  hkv     g    key/value heads, H % Hkv == 0  Dk   dk  d   query/key features
    H//Hkv       r    query heads per kv head        Dv   dv  e   value features
"""

from typing import Any, Literal, NamedTuple, get_args

Array = Any  # a NumPy ndarray or a torch.Tensor; the array API namespace tells which


class Dims(NamedTuple):
    """Sizes of one attention call, validated once by ``_checks.check_qkv``.

    ``batch`` is the broadcast of the leading axes before the head axis; ``has_heads`` is
    False when every input is 2-D (then ``h = hkv = 1`` and impls add no head axis).
    """

    batch: tuple[int, ...]
    h: int
    hkv: int
    nq: int
    nk: int
    dk: int
    dv: int
    has_heads: bool

    @property
    def score_shape(self) -> tuple[int, ...]:
        """Shape of the score matrix ``(*batch, H, Nq, Nk)`` (no H axis for 2-D inputs)."""
        heads = (self.h,) if self.has_heads else ()
        return (*self.batch, *heads, self.nq, self.nk)

    @property
    def grouped(self) -> bool:
        """True when 1 < Hkv < H: K/V heads serve several query heads (GQA)."""
        return self.has_heads and 1 < self.hkv < self.h


class Result(NamedTuple):
    """What every impl returns; the public function picks the contract's tuple from it."""

    out: Array
    weights: Array | None
    lse: Array | None


Impl = Literal["auto", "reference", "flash", "torch"]
"""``impl=`` of ``qkv.attention``: ``"auto"`` picks one of the other three for each call."""

IMPLS: tuple[str, ...] = get_args(Impl)
"""``("auto", "reference", "flash", "torch")``: the one list every consumer (the registry,
``complexity``, the command line, the lab, the integrations) checks names against."""

Engine = Literal["native", "array"]
"""How ``"flash"`` runs: the compiled tile loop (``"native"``) or array-API code (``"array"``)."""
