"""``qkv.nn``: PyTorch modules that own parameters and call the functional core.

Each module keeps its attention math in ``qkv.attention`` / ``qkv.scores`` / ``qkv.softmax``:
``MultiHeadAttention`` (self, cross, grouped-query; RoPE or ALiBi), ``KVCache``,
``AdditiveAttention`` (Bahdanau) and ``GeneralAttention`` (Luong), positional encodings,
``TransformerBlock`` / ``TransformerEncoder`` / ``TransformerDecoder`` and ``TinyGPT``.
Inputs are ``(B, N, d_model)``; masks follow ``qkv.attention`` (True = may attend).

    >>> mha = MultiHeadAttention(d_model=64, n_heads=8, n_kv_heads=2, pos="rope")
    >>> out = mha(x, causal=True)                          # x (B, N, 64) -> (B, N, 64)
"""

try:
    import torch  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("qkv.nn needs PyTorch: pip install 'qkv[torch]'") from e

from ._torch_compat import mask_from_torch as mask_from_torch
from .attention import MultiHeadAttention as MultiHeadAttention
from .cache import KVCache as KVCache
from .gpt import TinyGPT as TinyGPT
from .positional import LearnedPositionalEncoding as LearnedPositionalEncoding
from .positional import SinusoidalPositionalEncoding as SinusoidalPositionalEncoding
from .scoring import AdditiveAttention as AdditiveAttention
from .scoring import GeneralAttention as GeneralAttention
from .transformer import TransformerBlock as TransformerBlock
from .transformer import TransformerDecoder as TransformerDecoder
from .transformer import TransformerEncoder as TransformerEncoder

__all__ = [
    "AdditiveAttention",
    "GeneralAttention",
    "KVCache",
    "LearnedPositionalEncoding",
    "MultiHeadAttention",
    "SinusoidalPositionalEncoding",
    "TinyGPT",
    "TransformerBlock",
    "TransformerDecoder",
    "TransformerEncoder",
    "mask_from_torch",
]
