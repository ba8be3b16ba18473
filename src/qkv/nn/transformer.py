"""Transformer blocks: attention and a feed-forward network, each inside a residual connection.

``norm="post"`` is the original arrangement (Vaswani et al., arXiv:1706.03762):
``x = LN(x + sublayer(x))``; ``norm="pre"`` (Xiong et al., arXiv:2002.04745; GPT-2) normalises
the sublayer's input, ``x = x + sublayer(LN(x))``, and trains without warm-up at depth.
A block with ``cross=True`` adds cross-attention to an encoder output between the two
(the decoder of the encoder–decoder Transformer). Shapes: ``x (B, N, d_model)``,
``context (B, Nk, d_model)``.
"""

from typing import Any

from torch import Tensor, nn

from ..errors import ArgumentError
from .attention import MultiHeadAttention
from .cache import KVCache

NORMS = ("pre", "post")


class TransformerBlock(nn.Module):
    """Self-attention, optional cross-attention, feed-forward (``d_model -> d_ff -> d_model``, GELU)."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        n_kv_heads: int | None = None,
        norm: str = "pre",
        dropout: float = 0.0,
        cross: bool = False,
        pos: str | None = None,
    ) -> None:
        super().__init__()
        if norm not in NORMS:
            raise ArgumentError(f"norm must be one of {list(NORMS)}, got {norm!r}")
        self.pre = norm == "pre"
        self.attn = MultiHeadAttention(d_model, n_heads, n_kv_heads, dropout=dropout, pos=pos)
        self.norm_attn = nn.LayerNorm(d_model)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, n_kv_heads, dropout=dropout) if cross else None
        self.norm_cross = nn.LayerNorm(d_model) if cross else None
        self.ff = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model))
        self.norm_ff = nn.LayerNorm(d_model)
        self.drop = nn.Dropout(dropout)

    def _residual(self, x: Tensor, norm: nn.Module, f: Any) -> tuple[Tensor, Any]:
        """``x + f(LN(x))`` (pre) or ``LN(x + f(x))`` (post); ``f`` returns ``(y, extra)``."""
        y, extra = f(norm(x) if self.pre else x)
        x = x + self.drop(y)
        return (x if self.pre else norm(x)), extra

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        mask: Any = None,
        causal: bool = False,
        context_mask: Any = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
    ) -> Any:
        """``x (B, N, d_model)``, or ``(x, self-attention weights (B, H, N, Nk))`` with ``need_weights``.

        ``mask`` / ``causal`` apply to self-attention, ``context_mask`` to cross-attention.
        """
        if context is None and self.cross_attn is not None:
            raise ArgumentError("this block has cross-attention (cross=True), so forward needs context")
        if context is not None and self.cross_attn is None:
            raise ArgumentError("context was given but this block has no cross-attention; build it with cross=True")

        def self_attn(h: Tensor) -> tuple[Tensor, Any]:
            r = self.attn(h, mask=mask, causal=causal, cache=cache, need_weights=need_weights)
            return r if need_weights else (r, None)

        x, weights = self._residual(x, self.norm_attn, self_attn)
        if self.cross_attn is not None and self.norm_cross is not None:
            cross = self.cross_attn
            x, _ = self._residual(
                x, self.norm_cross, lambda h: (cross(h, context, mask=context_mask, cache=cache), None)
            )
        x, _ = self._residual(x, self.norm_ff, lambda h: (self.ff(h), None))
        return (x, weights) if need_weights else x


class _Stack(nn.Module):
    cross: bool  # each stack says whether its blocks attend to a context too

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        n_layers: int,
        n_kv_heads: int | None = None,
        norm: str = "pre",
        dropout: float = 0.0,
        pos: str | None = None,
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            TransformerBlock(d_model, n_heads, d_ff, n_kv_heads, norm, dropout, self.cross, pos)
            for _ in range(n_layers)
        )
        self.norm = nn.LayerNorm(d_model) if norm == "pre" else nn.Identity()  # pre-norm leaves x unnormalised

    def _run(self, x: Tensor, need_weights: bool, **kw: Any) -> Any:
        weights = []
        for layer in self.layers:
            r = layer(x, need_weights=need_weights, **kw)
            x = r[0] if need_weights else r
            if need_weights:
                weights.append(r[1])
        x = self.norm(x)
        return (x, weights) if need_weights else x


class TransformerEncoder(_Stack):
    """``n_layers`` blocks of bidirectional self-attention (``causal=False`` unless asked)."""

    cross = False

    def forward(self, x: Tensor, mask: Any = None, causal: bool = False, need_weights: bool = False) -> Any:
        """``x (B, N, d_model)``, or ``(x, [weights (B, H, N, N) per layer])``."""
        return self._run(x, need_weights, mask=mask, causal=causal)


class TransformerDecoder(_Stack):
    """``n_layers`` blocks of causal self-attention plus cross-attention to an encoder output."""

    cross = True

    def forward(
        self,
        x: Tensor,
        context: Tensor,
        mask: Any = None,
        context_mask: Any = None,
        cache: KVCache | None = None,
        causal: bool = True,
        need_weights: bool = False,
    ) -> Any:
        """``x (B, N, d_model)`` attending causally to itself and fully to ``context (B, Nk, d_model)``.

        With ``cache`` (decoding), earlier positions' keys and values are reused and the
        projected ``context`` is computed once. Returns ``x`` or ``(x, [self-attention weights])``.
        """
        return self._run(
            x, need_weights, context=context, mask=mask, causal=causal, context_mask=context_mask, cache=cache
        )
