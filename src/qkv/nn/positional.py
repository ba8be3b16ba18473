"""Absolute position encodings added to token embeddings ``x (B, N, d_model)``.

``SinusoidalPositionalEncoding``: the fixed table of the Transformer (Vaswani et al.,
arXiv:1706.03762, §3.5), from ``qkv.positional.sinusoidal``. ``LearnedPositionalEncoding``:
one trained vector per position (GPT, BERT). Both cover positions ``0 .. max_len - 1`` and take
an ``offset`` (the KV cache length during decoding).
"""

import torch
from torch import Tensor, nn

from ..errors import ArgumentError
from ..positional import sinusoidal
from .attention import check_features


def _check_span(offset: int, n: int, max_len: int, kind: str) -> None:
    if offset < 0 or offset + n > max_len:
        raise ArgumentError(
            f"{kind} covers positions 0 .. max_len - 1 = {max_len - 1}, but this call needs positions "
            f"{offset} .. {offset + n - 1}; use a larger max_len (or relative positions: rope, alibi)"
        )


class SinusoidalPositionalEncoding(nn.Module):
    """``x + PE[offset : offset + N]`` with the fixed sinusoidal table ``PE (max_len, d_model)``."""

    pe: Tensor

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        self.d_model, self.max_len = d_model, max_len
        table = torch.from_numpy(sinusoidal(max_len, d_model)).to(torch.get_default_dtype())
        self.register_buffer("pe", table, persistent=False)  # a function of the sizes: not saved

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        check_features(x, "x", self.d_model)
        _check_span(offset, x.shape[1], self.max_len, f"SinusoidalPositionalEncoding(max_len={self.max_len})")
        return x + self.pe[offset : offset + x.shape[1]].to(x.dtype)


class LearnedPositionalEncoding(nn.Module):
    """``x + P[offset : offset + N]`` with a trained table ``P (max_len, d_model)``, init N(0, 0.02²)."""

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        self.d_model, self.max_len = d_model, max_len
        self.weight = nn.Parameter(torch.randn(max_len, d_model) * 0.02)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        check_features(x, "x", self.d_model)
        _check_span(offset, x.shape[1], self.max_len, f"LearnedPositionalEncoding(max_len={self.max_len})")
        return x + self.weight[offset : offset + x.shape[1]].to(x.dtype)
