"""qkv: the attention mechanism, exact and easy to see into.

``softmax(Q Kᵀ / √d_k) V`` over NumPy and PyTorch arrays, with composable masks
(``qkv.masks``), score mods (``qkv.scores``), the analytic backward pass, keys and values
stored in 8 bits (``quantize``), a step-by-step ``explain`` trace, and ``inspect`` to look
inside a real transformers model. ``import qkv`` never imports torch (nor transformers:
``qkv.inspect`` imports them when it runs).
"""

import importlib
from typing import Any

from . import approx as approx
from . import complexity as complexity
from . import diagnostics as diagnostics
from . import errors as errors
from . import masks as masks
from . import positional as positional
from . import scores as scores
from ._core import attention as attention
from ._core import attention_backward as attention_backward
from ._core import dispatch as dispatch
from ._explain import Trace as Trace
from ._explain import explain as explain
from ._hopfield import hopfield as hopfield
from ._info import Info as Info
from ._info import info as info
from ._quant import Quantized as Quantized
from ._quant import dequantize as dequantize
from ._quant import quantize as quantize
from ._softmax import logsumexp as logsumexp
from ._softmax import merge_attention as merge_attention
from ._softmax import softmax as softmax
from ._version import __version__ as __version__

_LAZY = {"inspect": "qkv._inspect", "Inspection": "qkv._inspect"}
"""Public names that live above the layers ``import qkv`` loads (``qkv.inspect`` runs a
transformers model): imported on first use, by name, so the package root stays at the bottom
of the import layers that ``qkv.integrations`` and ``qkv.bench`` import it from."""


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'qkv' has no attribute {name!r}")


__all__ = [
    "Info",
    "Inspection",
    "Quantized",
    "Trace",
    "approx",
    "attention",
    "attention_backward",
    "complexity",
    "dequantize",
    "diagnostics",
    "dispatch",
    "errors",
    "explain",
    "hopfield",
    "info",
    "inspect",
    "logsumexp",
    "masks",
    "merge_attention",
    "positional",
    "quantize",
    "scores",
    "softmax",
]
