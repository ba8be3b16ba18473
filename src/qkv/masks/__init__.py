"""Masks: which keys each query may attend, as small composable predicates.

A ``Mask`` answers "may query row ``i`` attend key column ``j``?" on broadcast index grids
(``i (Nq, 1)``, ``j (1, Nk)`` or any tile of them), so the same object gives the dense boolean
matrix, one tile of it for the flash kernel, and (analytically, without materialising it) the
classification of every tile as EMPTY, PARTIAL or FULL. **True means "may attend"** (PyTorch
SDPA's convention). Masks compose with ``&``, ``|`` and ``~`` (flex attention's ``mask_mod``
idea, arXiv:2412.05496).

Alignment: masks that relate query and key positions use the query's *aligned* position
``p = i + (Nk - Nq)`` (bottom-right), so one new query against a KV cache sits after every
cached key. Masks whose data has a batch axis (``padding``, ``document`` with 2-D ids) give
arrays of shape ``(B, 1, Nq, Nk)``: they follow the ``(B, H, Nq, Nk)`` layout.

    >>> longformer = sliding_window(256, causal=False) | global_tokens([0])
    >>> bigbird = longformer | random_blocks(64, per_row=3, seed=0)

Where things live: ``_mask`` (the ``Mask`` type, tile classes, ``&`` ``|`` ``~``, pictures),
``_positions`` (masks of relative position), ``_sequences`` (padded and packed sequences, each
aligned to itself), ``_data`` (document ids, global positions, random blocks, arrays and
functions), ``_rows`` (tile counts from per-row key intervals), ``spec`` (the one
``"kind:key=value,..."`` grammar of the command line and the lab).
"""

from ._data import document as document
from ._data import from_dense as from_dense
from ._data import from_fn as from_fn
from ._data import global_tokens as global_tokens
from ._data import random_blocks as random_blocks
from ._mask import EMPTY as EMPTY
from ._mask import FULL as FULL
from ._mask import PARTIAL as PARTIAL
from ._mask import Mask as Mask
from ._mask import picture as picture
from ._plan import BlockPlan as BlockPlan
from ._plan import lead_shape as lead_shape
from ._plan import plan as plan
from ._plan import shared_classes as shared_classes
from ._positions import causal as causal
from ._positions import chunked as chunked
from ._positions import dilated as dilated
from ._positions import prefix_lm as prefix_lm
from ._positions import sliding_window as sliding_window
from ._recipe import compiling as compiling
from ._recipe import decode as decode
from ._recipe import decode_tree as decode_tree
from ._recipe import encode as encode
from ._rows import RowTiles as RowTiles
from ._rows import full_pairs as full_pairs
from ._rows import kept_pairs as kept_pairs
from ._rows import row_tiles as row_tiles
from ._rows import tile_counts as tile_counts
from ._sequences import packed as packed
from ._sequences import padding as padding

# Not in __all__: what the kernels and the cost models read of a mask (its plan for one call, its
# rows of tiles), for the packages above this one; nothing outside qkv.masks reaches its private
# modules (import-linter).

__all__ = [
    "EMPTY",
    "FULL",
    "PARTIAL",
    "Mask",
    "causal",
    "chunked",
    "dilated",
    "document",
    "from_dense",
    "from_fn",
    "global_tokens",
    "packed",
    "padding",
    "picture",
    "prefix_lm",
    "random_blocks",
    "sliding_window",
]
