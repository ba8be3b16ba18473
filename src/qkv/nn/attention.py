"""``MultiHeadAttention``: projections around one call to ``qkv.attention`` (no attention math here).

Multi-head attention (Vaswani et al., arXiv:1706.03762, §3.2.2) with grouped-query heads
(``n_kv_heads``; Ainslie et al., arXiv:2305.13245; ``n_kv_heads=1`` is multi-query attention,
Shazeer, arXiv:1911.02150): ``H`` query heads, ``Hkv`` key/value heads, each kv head serving
``H // Hkv`` consecutive query heads. The core handles the grouping natively, so K and V are
never repeated, and a ``KVCache`` stores ``Hkv`` heads. Positions: ``pos="rope"`` rotates
queries and keys (arXiv:2104.09864), ``pos="alibi"`` adds ``qkv.scores.alibi``
(arXiv:2108.12409).

Shapes: ``x (B, Nq, d_model)``, ``context (B, Nk, d_context)``; inside, ``q (B, H, Nq, Dk)``,
``k, v (B, Hkv, Nk, Dk)``; out ``(B, Nq, d_model)``, weights ``(B, H, Nq, Nk)``.
"""

from typing import Any

import numpy as np
from torch import Tensor, nn

from .._backend import is_torch
from .._checks import check_heads, check_impl
from .._core import attention
from ..errors import ArgumentError, DTypeError, ShapeError
from ..positional import rope
from ..scores import alibi
from .cache import KVCache

POS = (None, "rope", "alibi")


def split_heads(x: Tensor, heads: int) -> Tensor:
    """``(B, N, heads · D) -> (B, heads, N, D)``."""
    b, n, _ = x.shape
    return x.view(b, n, heads, -1).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """``(B, H, N, D) -> (B, N, H · D)``."""
    b, h, n, d = x.shape
    return x.transpose(1, 2).reshape(b, n, h * d)


def check_features(x: Any, name: str, d: int, dtype: Any = None) -> None:
    """``x`` must be a ``(B, N, d)`` tensor (of the module's parameter ``dtype``, when given)."""
    if not is_torch(x):
        raise ArgumentError(f"{name} must be a torch.Tensor of shape (B, N, {d}), got {type(x).__name__}")
    if x.ndim != 3 or x.shape[-1] != d:
        raise ShapeError(f"{name} must have shape (B, N, {d}) with {d} features on its last axis, got {tuple(x.shape)}")
    if dtype is not None and x.dtype != dtype:
        raise DTypeError(
            f"{name} has dtype {x.dtype} but the module's parameters are {dtype}; "
            f"cast one to the other (x.to({dtype}) or module.to({x.dtype}))"
        )


class MultiHeadAttention(nn.Module):
    """Self- or cross-attention with ``n_heads`` query heads and ``n_kv_heads`` key/value heads.

    ``d_k`` (per head) defaults to ``d_model // n_heads``; values use ``d_k`` too. Dropout on
    the weights applies only in training mode. ``impl`` is passed to ``qkv.attention``.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        d_k: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        pos: str | None = None,
        impl: str = "auto",
    ) -> None:
        super().__init__()
        for name, value in (("d_model", d_model), ("n_heads", n_heads)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ArgumentError(f"{name} must be a positive integer, got {value!r}")
        self.d_model, self.h = d_model, n_heads
        self.hkv = n_heads if n_kv_heads is None else n_kv_heads
        check_heads(self.h, self.hkv)
        if d_k is None and d_model % n_heads:
            raise ShapeError(f"d_model={d_model} is not a multiple of n_heads={n_heads}; pass d_k explicitly")
        self.d_k = d_model // n_heads if d_k is None else d_k
        if pos not in POS:
            raise ArgumentError(f"pos must be one of {list(POS)}, got {pos!r}")
        if pos == "rope" and self.d_k % 2:
            raise ArgumentError(f"pos='rope' rotates feature pairs, so it needs an even d_k, got d_k={self.d_k}")
        if not 0.0 <= dropout < 1.0:
            raise ArgumentError(f"dropout must be a probability in [0, 1), got {dropout!r}")
        self.pos, self.dropout, self.impl = pos, float(dropout), check_impl(impl)
        self.q_proj = nn.Linear(d_model, self.h * self.d_k, bias=bias)
        self.k_proj = nn.Linear(d_model, self.hkv * self.d_k, bias=bias)
        self.v_proj = nn.Linear(d_model, self.hkv * self.d_k, bias=bias)
        self.out_proj = nn.Linear(self.h * self.d_k, d_model, bias=bias)
        self._alibi = alibi(n_heads=self.h) if pos == "alibi" else None

    def kv(self, source: Tensor) -> tuple[Tensor, Tensor]:
        """Project ``source (B, Nk, d)`` to ``k, v (B, Hkv, Nk, Dk)``."""
        check_features(source, "context", self.k_proj.in_features, self.k_proj.weight.dtype)
        return split_heads(self.k_proj(source), self.hkv), split_heads(self.v_proj(source), self.hkv)

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        mask: Any = None,
        causal: bool = False,
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> Any:
        """``out (B, Nq, d_model)``, or ``(out, weights (B, H, Nq, Nk))`` with ``need_weights=True``.

        Self-attention when ``context`` is None, cross-attention to ``context`` otherwise.
        ``mask`` follows ``qkv.attention`` (True = may attend; float = additive bias; a
        ``qkv.masks.Mask``) and broadcasts to ``(B, H, Nq, Nk)``: a per-batch boolean mask is
        ``(B, 1, Nq, Nk)`` or ``(B, 1, 1, Nk)``. With ``cache``, keys and values of earlier
        calls are prepended (``Nk = L + Nq``) and ``causal=True`` is bottom-right.
        """
        check_features(x, "x", self.d_model, self.q_proj.weight.dtype)
        q = split_heads(self.q_proj(x), self.h)
        if context is None:
            k, v = self.kv(x)
            if self.pos == "rope":  # positions continue after what the cache holds
                start = 0 if cache is None else cache.layer_length(self)
                positions = np.arange(start, start + x.shape[1])
                q, k = rope(q, positions), rope(k, positions)
            if cache is not None:
                k, v = cache.append(self, k, v)
        else:
            if self.pos is not None:
                raise ArgumentError(
                    f"pos={self.pos!r} describes positions within one sequence, but context was "
                    "given (cross-attention); build the cross-attention module with pos=None"
                )
            k, v = self.kv(context) if cache is None else cache.cross(self, context, self.kv)
        res = attention(
            q,
            k,
            v,
            mask=mask,
            causal=causal,
            score_mod=self._alibi,
            dropout=self.dropout if self.training else 0.0,
            impl=self.impl,
            return_weights=need_weights,
        )
        out, weights = res if need_weights else (res, None)
        out = self.out_proj(merge_heads(out))
        return (out, weights) if need_weights else out

    @classmethod
    def from_torch(cls, m: nn.MultiheadAttention) -> "MultiHeadAttention":
        """A copy of ``torch.nn.MultiheadAttention`` ``m``'s weights that gives the same outputs.

        The result always takes batch-first ``(B, N, E)`` inputs (transpose ``(N, B, E)`` inputs
        of a ``batch_first=False`` source) and one ``context`` for keys and values. torch's
        boolean masks mean "masked out" (the opposite of qkv's); convert them with
        ``qkv.nn.mask_from_torch(attn_mask, key_padding_mask)``. Where a query row has nothing
        to attend, torch gives NaN and qkv gives zeros.
        """
        from ._torch_compat import copy_torch_mha

        return copy_torch_mha(cls, m)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, n_heads={self.h}, n_kv_heads={self.hkv}, d_k={self.d_k}, "
            f"pos={self.pos!r}, dropout={self.dropout}, impl={self.impl!r}"
        )
