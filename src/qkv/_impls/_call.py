"""One normalised attention call, as every impl receives it.

``qkv.attention`` turns its keyword shortcuts into this record in its first lines: one
``Mask`` (``causal=`` and boolean arrays folded in), one float bias, one ``ScoreMod``, a
numeric scale. Impls never see ``causal=`` or an array mask.
"""

from typing import Any, NamedTuple

from .._typing import Array, Dims
from ..masks import Mask
from ..scores import ScoreMod


class Call(NamedTuple):
    q: Array
    k: Array
    v: Array
    dims: Dims
    mask: Mask | None
    bias: Array | None
    score_mod: ScoreMod | None
    scale: float
    dropout: float = 0.0
    rng: Any = None
    want_weights: bool = False
    want_lse: bool = False
