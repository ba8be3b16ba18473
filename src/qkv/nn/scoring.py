"""The attention layers of the classic encoder–decoder: Bahdanau (additive) and Luong (general).

``AdditiveAttention`` scores ``vᵀ tanh(W_q q_i + W_k k_j)`` (Bahdanau et al., arXiv:1409.0473);
``GeneralAttention`` scores ``q_i W k_jᵀ`` (Luong et al., arXiv:1508.04025). Both then take
``softmax`` over the keys and average the values. Scores come from ``qkv.scores`` and the
softmax from ``qkv.softmax`` (a masked key gets exactly zero weight; a query with no key
allowed gets zeros, never NaN).

Shapes: ``query (..., Nq, Dq)``, ``keys (..., Nk, Dk)``, ``values (..., Nk, Dv)`` ->
``out (..., Nq, Dv)``, weights ``(..., Nq, Nk)``.
"""

import math
from typing import Any

import torch
from torch import Tensor, nn

from .._backend import compute_dtype, is_torch, namespace
from .._impls import check_mask_covers, split_mask
from .._impls.reference import biased, masked, normalised
from ..errors import MaskError, ShapeError
from ..masks import Mask
from ..scores import additive, general


def _attend(scores: Tensor, values: Tensor, mask: Any, need_weights: bool) -> Any:
    """``softmax(scores, masked) @ values``; ``mask``: bool (True = may attend), float bias or ``Mask``.

    The masking and the softmax are the reference implementation's own steps (``biased``,
    ``masked``, ``normalised``); only the scores differ from dot-product attention.
    """
    nq, nk = scores.shape[-2:]
    if values.ndim < 2 or values.shape[-2] != nk:
        raise ShapeError(
            f"values must be (..., Nk, Dv) with Nk={nk} (the number of keys) on axis -2, got {tuple(values.shape)}"
        )
    if mask is not None and not isinstance(mask, Mask) and not is_torch(mask):
        raise MaskError(f"mask must be a torch tensor or a qkv.masks.Mask, got {type(mask).__name__}")
    m, bias = split_mask(mask, False)
    check_mask_covers(m, bias, tuple(scores.shape))
    xp = namespace(scores=scores, values=values)
    weights, _ = normalised(xp, masked(xp, biased(xp, scores.to(compute_dtype(xp, scores)), bias), m))
    weights = weights.to(scores.dtype)
    out = weights @ values
    return (out, weights) if need_weights else out


def _uniform(shape: tuple[int, ...], fan_in: int) -> nn.Parameter:
    """``nn.Linear``'s default initialisation, U(-1/√fan_in, 1/√fan_in)."""
    bound = 1.0 / math.sqrt(fan_in)
    return nn.Parameter(torch.empty(shape).uniform_(-bound, bound))


class AdditiveAttention(nn.Module):
    """Bahdanau attention: ``softmax_j(vᵀ tanh(W_q q_i + W_k k_j)) · values``.

    Parameters ``w_q (d_attn, d_query)``, ``w_k (d_attn, d_key)``, ``v (d_attn,)``. The tanh
    tensor is ``(..., Nq, Nk, d_attn)``; ``qkv.scores.additive`` builds it in chunks and
    recomputes it in backward.
    """

    def __init__(self, d_query: int, d_key: int, d_attn: int) -> None:
        super().__init__()
        self.w_q = _uniform((d_attn, d_query), d_query)
        self.w_k = _uniform((d_attn, d_key), d_key)
        self.v = _uniform((d_attn,), d_attn)

    def forward(self, query: Tensor, keys: Tensor, values: Tensor, mask: Any = None, need_weights: bool = False) -> Any:
        """``out (..., Nq, Dv)``, or ``(out, weights (..., Nq, Nk))`` with ``need_weights=True``."""
        return _attend(additive(query, keys, self.w_q, self.w_k, self.v), values, mask, need_weights)


class GeneralAttention(nn.Module):
    """Luong's "general" attention: ``softmax_j(q_i W k_jᵀ) · values`` with ``W (d_query, d_key)``."""

    def __init__(self, d_query: int, d_key: int) -> None:
        super().__init__()
        self.w = _uniform((d_query, d_key), d_key)

    def forward(self, query: Tensor, keys: Tensor, values: Tensor, mask: Any = None, need_weights: bool = False) -> Any:
        """``out (..., Nq, Dv)``, or ``(out, weights (..., Nq, Nk))`` with ``need_weights=True``."""
        return _attend(general(query, keys, self.w), values, mask, need_weights)
