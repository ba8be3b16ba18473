"""The boundary with ``torch.nn.MultiheadAttention``: its weights, and its masks turned around.

torch's module stores ``in_proj_weight = [W_q; W_k; W_v]`` (or three separate weights when the
key/value sizes differ) and reads boolean masks the other way round from qkv and SDPA:
``True`` in ``attn_mask`` or ``key_padding_mask`` means "masked out". Float masks are additive
biases in both.
"""

from typing import Any

import torch
from torch import Tensor, nn

from ..errors import ArgumentError, MaskError


def copy_torch_mha(cls: Any, m: nn.MultiheadAttention) -> Any:
    """``cls`` (a ``MultiHeadAttention``) with copies of ``m``'s weights, dtype, device and mode."""
    if not isinstance(m, nn.MultiheadAttention):
        raise ArgumentError(f"from_torch needs a torch.nn.MultiheadAttention, got {type(m).__name__}")
    if m.bias_k is not None or m.add_zero_attn:
        raise ArgumentError(
            "from_torch cannot copy a MultiheadAttention built with add_bias_kv=True or "
            "add_zero_attn=True (they append extra key positions qkv does not model)"
        )
    if m.kdim != m.vdim:
        raise ArgumentError(
            f"from_torch needs kdim == vdim (one context for keys and values), got kdim={m.kdim}, vdim={m.vdim}"
        )
    w = m.out_proj.weight
    new = cls(m.embed_dim, m.num_heads, bias=m.in_proj_bias is not None, dropout=m.dropout)
    if m.kdim != m.embed_dim:
        has_bias = m.in_proj_bias is not None
        new.k_proj = nn.Linear(m.kdim, m.embed_dim, bias=has_bias)
        new.v_proj = nn.Linear(m.vdim, m.embed_dim, bias=has_bias)
    new.to(device=w.device, dtype=w.dtype)
    if m._qkv_same_embed_dim:
        weights = m.in_proj_weight.chunk(3)
    else:
        weights = (m.q_proj_weight, m.k_proj_weight, m.v_proj_weight)
    biases: tuple[Tensor | None, ...] = (None,) * 3 if m.in_proj_bias is None else m.in_proj_bias.chunk(3)
    with torch.no_grad():
        for lin, weight, bias in zip((new.q_proj, new.k_proj, new.v_proj), weights, biases, strict=True):
            lin.weight.copy_(weight)
            if bias is not None:
                lin.bias.copy_(bias)
        new.out_proj.weight.copy_(m.out_proj.weight)
        if m.out_proj.bias is not None:
            new.out_proj.bias.copy_(m.out_proj.bias)
    return new.train(m.training)


def mask_from_torch(
    attn_mask: Tensor | None = None, key_padding_mask: Tensor | None = None, n_heads: int | None = None
) -> Tensor | None:
    """torch ``MultiheadAttention`` masks -> one qkv mask (boolean True = may attend, or a float bias).

    - ``attn_mask (Nq, Nk)`` or ``(B · H, Nq, Nk)`` (then pass ``n_heads``): boolean ``True`` =
      masked out is inverted; float is kept as a bias.
    - ``key_padding_mask (B, Nk)``: boolean ``True`` = padding is inverted to ``(B, 1, 1, Nk)``;
      float is kept as a bias.
    Boolean with boolean gives a boolean mask; anything float gives a float bias with ``-inf``
    where a boolean hides a key. The result broadcasts to ``(B, H, Nq, Nk)``.
    """
    parts = []
    if attn_mask is not None:
        a = attn_mask
        if a.ndim == 3:
            if n_heads is None or a.shape[0] % n_heads:
                raise MaskError(
                    f"attn_mask has shape {tuple(a.shape)} (B · H, Nq, Nk); pass n_heads so that "
                    f"axis 0 splits into (B, H), got n_heads={n_heads}"
                )
            a = a.view(a.shape[0] // n_heads, n_heads, *a.shape[1:])
        elif a.ndim != 2:
            raise MaskError(f"attn_mask must be (Nq, Nk) or (B · H, Nq, Nk), got shape {tuple(a.shape)}")
        parts.append(a)
    if key_padding_mask is not None:
        if key_padding_mask.ndim != 2:
            raise MaskError(f"key_padding_mask must be (B, Nk), got shape {tuple(key_padding_mask.shape)}")
        parts.append(key_padding_mask[:, None, None, :])
    if not parts:
        return None
    if all(p.dtype == torch.bool for p in parts):
        out = ~parts[0]
        for p in parts[1:]:
            out = out & ~p
        return out
    dtype = next(p.dtype for p in parts if p.dtype != torch.bool)
    bias: Tensor | None = None
    for p in parts:
        if p.dtype == torch.bool:  # True = hidden -> -inf
            p = torch.zeros(p.shape, dtype=dtype, device=p.device).masked_fill(p, -float("inf"))
        bias = p if bias is None else bias + p
    return bias
