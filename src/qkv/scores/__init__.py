"""Score mods and scoring functions: what turns queries and keys into scores.

Two kinds of object live here, in separate modules:

- **score mods** (``_mod``, ``_mods``, ``_fn``): a ``ScoreMod`` maps the scaled scores ``s (..., H, Nq, Nk)``
  (or any tile of them) to new scores, knowing each entry's query row ``i`` and key column
  ``j``, before masking (flex attention's ``score_mod``, arXiv:2412.05496); it also returns
  ``ds'/ds`` so the analytic backward pass can apply the chain rule. ``qkv.attention`` takes one
  as ``score_mod=``. Mods chain with ``+``: ``alibi() + softcap(50)`` adds the ALiBi bias, then
  caps. Positions are aligned bottom-right like the masks: query row ``i`` sits at
  ``p = i + (Nk - Nq)``. ``from_fn`` wraps a plain function ``fn(score, b, h, q_idx, kv_idx)``.
- **scoring functions** (``_functions``): replacements for the dot product itself,
  ``general`` (Luong) and ``additive`` (Bahdanau), each returning raw scores ``(..., Nq, Nk)``
  with its analytic backward (``general_backward``, ``additive_backward``).
"""

from ._fn import from_fn as from_fn
from ._functions import additive as additive
from ._functions import additive_backward as additive_backward
from ._functions import general as general
from ._functions import general_backward as general_backward
from ._mod import ScoreMod as ScoreMod
from ._mod import through as through
from ._mods import alibi as alibi
from ._mods import kernel_ops as kernel_ops
from ._mods import relative_bias as relative_bias
from ._mods import softcap as softcap
from ._mods import temperature as temperature

__all__ = [
    "ScoreMod",
    "additive",
    "additive_backward",
    "alibi",
    "from_fn",
    "general",
    "general_backward",
    "relative_bias",
    "softcap",
    "temperature",
]
