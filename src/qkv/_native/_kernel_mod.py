"""The score-mod protocol between ``qkv.scores`` and the compiled kernel, typed once.

A mod the kernel can run inside a tile (``mods.hpp``) is a ``KernelMod``: built by its
constructor in ``qkv.scores`` (``ScoreMod.native``, a tuple of them in call order), checked
against the call's heads by ``scores.kernel_ops``, carried through the torch operator's schema
(``masks.encode``: a KernelMod is a tuple, its kind an int) and parsed by ``binding.cpp`` as
``(kind, c, table, m)``. No string tags: the kinds are the kernel's own ``ModKind``
(``_facts.py``, generated from the extension).
"""

from typing import Any, NamedTuple

from ._facts import ModKind


class KernelMod(NamedTuple):
    """One score mod as the kernel runs it: ``s -> s · c`` (MUL), ``c · tanh(s / c)`` (SOFTCAP),
    ``s - slope[h] · |p - j|`` (ALIBI) or ``s + table[h, clip(j - p, -m, m) + m]`` (RELBIAS),
    with ``p`` the query's bottom-right aligned key position."""

    kind: ModKind
    c: float = 1.0
    """MUL's factor, SOFTCAP's cap."""
    table: Any = None
    """ALIBI: slopes ``(H,)`` or ``(B, H)`` (None: ``positional.alibi_slopes(H)``, resolved by
    ``scores.kernel_ops``); RELBIAS: ``(H, 2m + 1)``. Any float array (NumPy, torch, JAX)."""
    m: int = 0
    """RELBIAS's clip radius."""

    @property
    def positional(self) -> bool:
        """Whether it reads positions (ALIBI, RELBIAS): a mask that aligns each sequence on its
        own changes what it computes."""
        return self.kind in (ModKind.ALIBI, ModKind.RELBIAS)

    @classmethod
    def decoded(cls, t: tuple[Any, ...]) -> "KernelMod":
        """A KernelMod from the plain tuple ``masks.decode_tree`` gives back (the torch operator)."""
        kind, c, table, m = t
        return cls(ModKind(kind), float(c), table, int(m))
