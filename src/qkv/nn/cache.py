"""``KVCache``: the keys and values of earlier positions, kept per attention layer for decoding.

Autoregressive decoding recomputes nothing: a prefill step stores every layer's keys and values,
then each decode step appends one position and attends over everything stored, which the core's
bottom-right ``causal=True`` (query ``i`` sees key ``j <= i + Nk - Nq``) makes exact. Keys and
values are stored with their ``Hkv`` heads, so a grouped-query model (Ainslie et al.,
arXiv:2305.13245) or a multi-query one (Shazeer, arXiv:1911.02150) keeps ``H / Hkv`` times less.
RoPE positions continue from the cache length; cross-attention layers store the projected
encoder output once and reuse it while the same ``context`` tensor is passed.

``KVCache(dtype="int8")`` (or ``"float8_e4m3fn"``, ``"float8_e5m2"``) stores every key and value
in 8 bits with a float32 scale per token and kv head (``qkv.quantize``): each step quantizes the
new positions as they are appended, and attention reads the stored cache (``qkv.Quantized``),
whose dequantized values it attends exactly. A quantized cache changes the keys and values the
model sees (int8: by at most half a step, ``amax / 254`` per token), so generated tokens may
differ from a float cache's; ``qkv.diagnostics.cache_error`` measures how much.
"""

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from .._quant import FORMATS, Quantized, quantize
from ..errors import ArgumentError, ShapeError

KV = tuple[Any, Any]
"""A layer's keys and values: two ``(B, Hkv, L, D)`` tensors, or two ``qkv.Quantized``."""


class KVCache:
    """Per-layer keys and values ``(B, Hkv, L, Dk)``; pass the same cache to every forward call.

    ``max_len`` (optional) bounds the number of positions; appending past it raises
    ``ArgumentError``. ``length`` is the number of positions stored so far. ``dtype`` (None:
    the model's float dtype) ``"int8"``, ``"float8_e4m3fn"`` or ``"float8_e5m2"`` stores them
    quantized, one float32 scale per token and kv head: ``get`` then returns two
    ``qkv.Quantized``, which ``qkv.attention`` reads.

    >>> cache = KVCache()
    >>> logits = model(prompt, cache=cache)           # prefill: L = prompt length
    >>> logits = model(next_token, cache=cache)       # one step: attends over L + 1 keys
    >>> small = KVCache(dtype="int8")                 # about half a bfloat16 cache's bytes
    """

    def __init__(self, max_len: int | None = None, dtype: str | None = None) -> None:
        if max_len is not None and (isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1):
            raise ArgumentError(f"KVCache max_len must be a positive integer or None, got {max_len!r}")
        if dtype is not None and dtype not in FORMATS:
            raise ArgumentError(f"KVCache dtype must be None or one of {', '.join(FORMATS)}, got {dtype!r}")
        self.max_len = max_len
        self.dtype = dtype
        self._self: dict[nn.Module, KV] = {}
        self._cross: dict[nn.Module, tuple[Tensor, KV]] = {}

    @property
    def length(self) -> int:
        """Positions stored (the longest layer's; every layer has the same after a full step)."""
        return max((k.shape[-2] for k, _ in self._self.values()), default=0)

    def layer_length(self, layer: nn.Module) -> int:
        """Positions stored for ``layer`` (0 before its first step)."""
        kv = self._self.get(layer)
        return 0 if kv is None else kv[0].shape[-2]

    def get(self, layer: nn.Module) -> KV | None:
        """``(k, v)`` stored for ``layer``'s self-attention, each ``(B, Hkv, L, Dk)``, or None."""
        return self._self.get(layer)

    @property
    def nbytes(self) -> int:
        """Bytes held by every stored key and value tensor (self- and cross-attention)."""
        pairs = [*self._self.values(), *(kv for _, kv in self._cross.values())]
        return sum(_nbytes(t) for kv in pairs for t in kv)

    def reset(self) -> None:
        """Forget everything (start a new sequence)."""
        self._self.clear()
        self._cross.clear()

    def append(self, layer: nn.Module, k: Tensor, v: Tensor) -> KV:
        """Append ``k, v (B, Hkv, n, Dk)`` to ``layer``'s entry; return all ``(B, Hkv, L + n, Dk)``
        (quantized as they are appended when the cache has a ``dtype``)."""
        old = self._self.get(layer)
        n_old, n_new = (0 if old is None else old[0].shape[-2]), k.shape[-2]
        if self.max_len is not None and n_old + n_new > self.max_len:
            raise ArgumentError(
                f"KVCache(max_len={self.max_len}) holds {n_old} positions and this step appends {n_new}: "
                f"{n_old + n_new} > max_len={self.max_len}; create the cache with a larger max_len or reset() it"
            )
        if old is not None:
            ko, vo = old
            for name, new, stored in (("keys", k, ko), ("values", v, vo)):
                if new.shape[:-2] != stored.shape[:-2] or new.shape[-1] != stored.shape[-1]:
                    raise ShapeError(
                        f"new {name} have shape {tuple(new.shape)} but the cache stores (B, Hkv, L, D) = "
                        f"{tuple(stored.shape)}: B, Hkv and D must match (a cache serves one batch of sequences)"
                    )
            if self.dtype is not None:
                kv: KV = (ko.append(k), vo.append(v))
            else:
                kv = (torch.cat([ko, k], dim=-2), torch.cat([vo, v], dim=-2))
        elif self.dtype is not None:
            kv = (quantize(k, self.dtype), quantize(v, self.dtype))
        else:
            kv = (k, v)
        self._self[layer] = kv
        return kv

    def cross(self, layer: nn.Module, context: Tensor, project: Callable[[Tensor], KV]) -> KV:
        """``layer``'s projected ``context``: computed on the first call, reused while ``context`` is the same."""
        entry = self._cross.get(layer)
        if entry is None or entry[0] is not context:
            k, v = project(context)
            if self.dtype is not None:
                k, v = quantize(k, self.dtype), quantize(v, self.dtype)
            entry = (context, (k, v))
            self._cross[layer] = entry
        return entry[1]

    def __repr__(self) -> str:
        cap = "" if self.max_len is None else f", max_len={self.max_len}"
        kind = "" if self.dtype is None else f", dtype={self.dtype!r}"
        return f"KVCache(length={self.length}{cap}{kind}, layers={len(self._self)}, nbytes={self.nbytes})"


def _nbytes(t: Any) -> int:
    return t.nbytes if isinstance(t, Quantized) else t.numel() * t.element_size()
