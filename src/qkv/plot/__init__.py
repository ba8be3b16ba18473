"""Pictures of attention: heatmaps, masks, positional encodings, training and a real model's
heads, as matplotlib ``Figure`` objects (Agg, no pyplot state). matplotlib is imported only when a picture is drawn.

    >>> from qkv import plot
    >>> fig = plot.heatmap(weights, tokens_q=words, tokens_k=words, mask=masks.causal())
    >>> fig.savefig("heatmap.png")
"""

from ._common import FORMATS as FORMATS
from ._common import format_of as format_of
from ._common import pixel_size as pixel_size
from ._common import save as save
from .heatmap import heatmap as heatmap
from .heatmap import mask_picture as mask_picture
from .heatmap import row_stats as row_stats
from .model import approximation_figure as approximation_figure
from .model import head_grid as head_grid
from .model import rollout_figure as rollout_figure
from .pe import PE_KINDS as PE_KINDS
from .pe import alibi_figure as alibi_figure
from .pe import positional as positional
from .pe import rope_figure as rope_figure
from .pe import sinusoidal_figure as sinusoidal_figure
from .training import attention_grid as attention_grid
from .training import curves as curves
from .training import save_animation as save_animation

__all__ = [
    "FORMATS",
    "PE_KINDS",
    "alibi_figure",
    "approximation_figure",
    "attention_grid",
    "curves",
    "head_grid",
    "heatmap",
    "mask_picture",
    "positional",
    "rollout_figure",
    "rope_figure",
    "save",
    "save_animation",
    "sinusoidal_figure",
]
