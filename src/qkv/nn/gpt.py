"""``TinyGPT``: a decoder-only language model small enough to read and to train on a laptop CPU.

Token embedding, optional absolute positions, ``n_layers`` pre-norm causal ``TransformerBlock``s,
a final LayerNorm and a linear head (GPT-2, Radford et al. 2019; nanoGPT's layout). Positions:
``"rope"`` (arXiv:2104.09864) or ``"alibi"`` (arXiv:2108.12409) inside attention, or
``"sinusoidal"`` / ``"learned"`` tables added to the embeddings (these two stop at ``max_len``).
``generate`` decodes with a ``KVCache``: one prefill pass, then one position per step.
"""

from typing import Any

import torch
from torch import Tensor, nn

from .._backend import is_torch
from ..errors import ArgumentError, DTypeError, ShapeError
from .cache import KVCache
from .positional import LearnedPositionalEncoding, SinusoidalPositionalEncoding
from .transformer import TransformerBlock

POS = ("rope", "alibi", "sinusoidal", "learned")


class TinyGPT(nn.Module):
    """``forward(idx (B, N)) -> logits (B, N, vocab_size)``; ``generate`` appends tokens."""

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 64,
        n_heads: int = 4,
        n_layers: int = 2,
        max_len: int = 256,
        n_kv_heads: int | None = None,
        pos: str = "rope",
    ) -> None:
        super().__init__()
        if pos not in POS:
            raise ArgumentError(f"pos must be one of {list(POS)}, got {pos!r}")
        self.vocab_size, self.max_len, self.pos = vocab_size, max_len, pos
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pe: nn.Module | None = None  # rope and alibi act inside attention
        if pos == "sinusoidal":
            self.pe = SinusoidalPositionalEncoding(d_model, max_len)
        elif pos == "learned":
            self.pe = LearnedPositionalEncoding(d_model, max_len)
        inner = pos if pos in ("rope", "alibi") else None
        self.blocks = nn.ModuleList(
            TransformerBlock(d_model, n_heads, 4 * d_model, n_kv_heads, norm="pre", pos=inner) for _ in range(n_layers)
        )
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)

    def _check(self, idx: Any, offset: int, new: int = 0) -> None:
        if not is_torch(idx) or idx.ndim != 2:
            raise ShapeError(f"idx must be a (B, N) tensor of token ids, got {getattr(idx, 'shape', type(idx))}")
        if idx.dtype.is_floating_point or idx.dtype.is_complex or idx.dtype == torch.bool:
            raise DTypeError(f"idx must hold integer token ids, got dtype {idx.dtype}")
        # the ids' values are checked where they can be read: a traced program (torch.compile,
        # torch.export) has none, and the embedding itself refuses an id out of range at run time
        if (
            idx.numel()
            and not torch.compiler.is_compiling()
            and (int(idx.min()) < 0 or int(idx.max()) >= self.vocab_size)
        ):
            raise ArgumentError(
                f"token ids must lie in [0, vocab_size={self.vocab_size}), got ids from "
                f"{int(idx.min())} to {int(idx.max())}"
            )
        first, last = offset, offset + idx.shape[1] + new - 1
        if self.pe is not None and last >= self.max_len:
            what = f"generating {new} tokens after {idx.shape[1]} needs" if new else "this call needs"
            raise ArgumentError(
                f"TinyGPT(pos={self.pos!r}, max_len={self.max_len}) has positions 0 .. "
                f"{self.max_len - 1}, but {what} positions {first} .. {last}; "
                "use a larger max_len, or pos='rope' / 'alibi', which have no limit"
            )

    def forward(self, idx: Tensor, need_weights: bool = False, cache: KVCache | None = None) -> Any:
        """``logits (B, N, vocab_size)``, or ``(logits, [weights (B, H, N, Nk) per layer])``.

        With ``cache``, ``idx`` holds the next positions after those cached (``Nk = L + N``).
        """
        offset = 0 if cache is None else cache.length
        self._check(idx, offset)
        x = self.tok(idx)
        if self.pe is not None:
            x = self.pe(x, offset)
        weights = []
        for block in self.blocks:
            r = block(x, causal=True, cache=cache, need_weights=need_weights)
            x = r[0] if need_weights else r
            if need_weights:
                weights.append(r[1])
        logits = self.head(self.norm(x))
        return (logits, weights) if need_weights else logits

    @torch.no_grad()
    def generate(
        self,
        idx: Tensor,
        max_new_tokens: int,
        temperature: float = 0.0,
        use_cache: bool = True,
        generator: torch.Generator | None = None,
        cache_dtype: str | None = None,
    ) -> Tensor:
        """``idx (B, N)`` with ``max_new_tokens`` tokens appended, ``(B, N + max_new_tokens)``.

        ``temperature=0`` picks the most likely token (greedy); ``> 0`` samples from
        ``softmax(logits / temperature)`` with ``generator``. The cache changes the speed, never
        the tokens. ``cache_dtype`` (``"int8"``, ``"float8_e4m3fn"``, ``"float8_e5m2"``) stores
        the cache quantized (``KVCache(dtype=...)``): the keys and values then change by their
        rounding, and so may the tokens (``qkv.diagnostics.cache_error`` measures it).
        """
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ArgumentError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        if not temperature >= 0.0:
            raise ArgumentError(f"temperature must be >= 0 (0 is greedy), got {temperature!r}")
        self._check(idx, 0, max_new_tokens)  # the whole run must fit in max_len: fail before any work
        if cache_dtype is not None and not use_cache:
            raise ArgumentError(
                f"cache_dtype={cache_dtype!r} stores the cache quantized, but use_cache=False keeps none"
            )
        cache = KVCache(dtype=cache_dtype) if use_cache else None
        step = idx
        for _ in range(max_new_tokens):
            logits = self(step if use_cache else idx, cache=cache)[:, -1, :]
            if temperature == 0.0:
                nxt = logits.argmax(dim=-1, keepdim=True)
            else:
                probs = torch.softmax(logits.float() / temperature, dim=-1)
                nxt = torch.multinomial(probs, 1, generator=generator)
            idx = torch.cat([idx, nxt], dim=1)
            step = nxt
        return idx
