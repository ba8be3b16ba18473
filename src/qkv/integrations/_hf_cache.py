"""``QuantizedCache``: a transformers cache that stores keys and values in 8 bits for qkv to read.

Each layer keeps its keys and values as one ``uint8`` tensor ``(B, Hkv, L, D + 4)`` per side:
a token's ``D`` codes (int8, or float8 bit patterns) followed by the four bytes of its float32
scale (``qkv.quantize``, one scale per token and kv head). Packing the scale beside the codes
keeps the layer a plain tensor, so everything transformers does to a cache layer (``torch.cat``
or ``index_copy_`` as tokens arrive, ``index_select`` for beam search, slicing for ``crop``,
``torch.compile`` of a static cache) works on it unchanged and moves each token's scale with it.

``update`` returns those tensors viewed in the format's own dtype (``torch.int8``,
``torch.float8_e4m3fn``, ``torch.float8_e5m2``); qkv's attention function recognises the 8-bit
dtype and reads them as ``qkv.Quantized`` views (``unpacked``), never dequantizing in Python. An
attention implementation other than qkv's cannot read them, so the cache refuses a model
configured with one.

    layer buffer (B, Hkv, L, D + 4) uint8:  [ c_0 … c_{D-1} | scale (float32, 4 bytes) ]
    keys = buffer[..., :D] · buffer[..., D:].view(float32)
"""

from typing import Any

import torch
from transformers.cache_utils import Cache, DummyLayer, DynamicLayer, StaticLayer, get_layer_types_and_kwargs

from .._quant import Format, Quantized, check_format, quantize
from ..errors import ArgumentError, ShapeError
from ._hf_models import QKV_NAMES

SCALE_BYTES = 4
"""A float32 scale stored after each token's codes."""


def _storage(f: Format) -> torch.dtype:
    """The dtype the codes of ``f`` have in torch (and the dtype ``update`` returns)."""
    return torch.int8 if f.name == "int8" else getattr(torch, f.name)


_FORMATS = {torch.int8: "int8", torch.float8_e4m3fn: "float8_e4m3fn", torch.float8_e5m2: "float8_e5m2"}
"""The dtype of a packed layer -> its format."""


def packed(x: torch.Tensor, f: Format) -> torch.Tensor:
    """``x (B, Hkv, n, D)`` quantized per token and packed: ``(B, Hkv, n, D + 4)`` uint8."""
    q = quantize(x, f.name)
    scales = q.scales.unsqueeze(-1).contiguous().view(torch.uint8)  # (B, Hkv, n, 4)
    return torch.cat([q.values.view(torch.uint8), scales], dim=-1)


def unpacked(key: Any, value: Any) -> tuple[Any, Any]:
    """The ``(key, value)`` a ``QuantizedCache`` layer returned, as two ``qkv.Quantized`` views of its
    buffers (no copy, nothing dequantized); anything else as it is."""
    fmt = _FORMATS.get(key.dtype) if isinstance(key, torch.Tensor) else None
    if fmt is None:
        return key, value
    if getattr(value, "dtype", None) != key.dtype:
        raise ArgumentError(
            f"the attention layer got keys of dtype {key.dtype} (a qkv QuantizedCache) but values of dtype "
            f"{getattr(value, 'dtype', None)}: both come from one cache"
        )
    return _view(key, fmt), _view(value, fmt)


def _view(t: torch.Tensor, fmt: str) -> Quantized:
    d = t.shape[-1] - SCALE_BYTES
    scales = t[..., d:].view(torch.float32)[..., 0]  # (B, Hkv, L): a strided view, the row stride D + 4 bytes
    return Quantized(t[..., :d], scales, fmt)


def _check_dims(key_states: torch.Tensor, value_states: torch.Tensor) -> None:
    for name, x in (("keys", key_states), ("values", value_states)):
        if x.shape[-1] % SCALE_BYTES:
            raise ShapeError(
                f"QuantizedCache stores each token's float32 scale after its codes, which needs a head dim that is "
                f"a multiple of 4; the {name} have D={x.shape[-1]} ({tuple(x.shape)})"
            )


class QuantizedLayer(DynamicLayer):
    """One attention layer's growing cache: ``keys``, ``values`` ``(B, Hkv, L, D + 4)`` uint8 (codes and
    scale per token); ``update`` quantizes the new tokens, appends them and returns the whole cache
    in the format's dtype (``unpacked`` reads it)."""

    is_sliding = False

    def __init__(self, dtype: str = "int8") -> None:
        super().__init__()
        self.format = check_format(dtype)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        _check_dims(key_states, value_states)
        self.device, self.dtype = key_states.device, key_states.dtype
        b, h = key_states.shape[:2]
        self.keys = torch.empty((b, h, 0, key_states.shape[-1] + SCALE_BYTES), dtype=torch.uint8, device=self.device)
        self.values = torch.empty(
            (b, h, 0, value_states.shape[-1] + SCALE_BYTES), dtype=torch.uint8, device=self.device
        )
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        keys: Any = self.keys
        values: Any = self.values
        self.keys = keys = torch.cat([keys, packed(key_states, self.format)], dim=-2)
        self.values = values = torch.cat([values, packed(value_states, self.format)], dim=-2)
        dtype = _storage(self.format)
        return keys.view(dtype), values.view(dtype)

    def __repr__(self) -> str:
        return f"QuantizedLayer({self.format.name}, length={self.get_seq_length()})"


class QuantizedStaticLayer(StaticLayer):
    """One attention layer's cache of ``max_cache_len`` slots allocated once (``torch.compile``'s
    static addresses): ``keys``, ``values`` ``(B, Hkv, max_cache_len, D + 4)`` uint8, written in
    place with ``index_copy_``; unused slots hold zeros (scale 0), hidden by the mask."""

    def __init__(self, max_cache_len: int, dtype: str = "int8") -> None:
        super().__init__(max_cache_len=max_cache_len)
        self.format = check_format(dtype)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        _check_dims(key_states, value_states)
        self.device, self.dtype = key_states.device, key_states.dtype
        self.batch_size, self.num_heads = key_states.shape[:2]
        self.k_head_dim, self.v_head_dim = key_states.shape[-1], value_states.shape[-1]
        shape = (self.batch_size, self.num_heads, self.max_cache_len)
        self.keys = torch.zeros((*shape, self.k_head_dim + SCALE_BYTES), dtype=torch.uint8, device=self.device)
        self.values = torch.zeros((*shape, self.v_head_dim + SCALE_BYTES), dtype=torch.uint8, device=self.device)
        self.cumulative_length = self.cumulative_length.to(self.device)
        if not torch.compiler.is_compiling():
            torch._dynamo.mark_static_address(self.keys)
            torch._dynamo.mark_static_address(self.values)
            torch._dynamo.mark_static_address(self.cumulative_length)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        positions = torch.arange(n, device=self.device) + self.cumulative_length
        self.cumulative_length.add_(n)
        keys: Any = self.keys
        values: Any = self.values
        keys.index_copy_(2, positions, packed(key_states, self.format))
        values.index_copy_(2, positions, packed(value_states, self.format))
        dtype = _storage(self.format)
        return keys.view(dtype), values.view(dtype)

    def __repr__(self) -> str:
        return f"QuantizedStaticLayer({self.format.name}, max_cache_len={self.max_cache_len})"


class QuantizedCache(Cache):
    """A transformers cache whose layers store keys and values in 8 bits, read by qkv's attention.

    ``dtype``: ``"int8"`` (default), ``"float8_e4m3fn"`` or ``"float8_e5m2"``, one float32 scale
    per token and kv head (``qkv.quantize``). ``max_cache_len=None`` grows with the sequence (as
    ``DynamicCache``); an int allocates that many slots per layer once (as ``StaticCache``:
    ``torch.compile`` of the decode step, fixed shapes). Sliding-window and chunked layers keep
    every token (the mask hides the ones outside the window). The model must run qkv's attention
    (``attn_implementation="qkv"``, ``qkv.integrations.transformers.register``): no other
    implementation reads the packed layers. Head dims must be multiples of 4.

    >>> cache = QuantizedCache(model.config, dtype="int8")
    >>> out = model.generate(ids, past_key_values=cache, max_new_tokens=64)
    >>> cache.nbytes                      # ~0.52x a bfloat16 cache at head_dim 128
    """

    def __init__(self, config: Any, dtype: str = "int8", max_cache_len: int | None = None) -> None:
        fmt = check_format(dtype)
        if max_cache_len is not None and (
            isinstance(max_cache_len, bool) or not isinstance(max_cache_len, int) or max_cache_len < 1
        ):
            raise ArgumentError(f"max_cache_len must be a positive integer or None, got {max_cache_len!r}")
        text = config.get_text_config(decoder=True)
        implementation = getattr(text, "_attn_implementation", None) or getattr(config, "_attn_implementation", None)
        if implementation not in QKV_NAMES:
            raise ArgumentError(
                f"QuantizedCache stores keys and values packed in 8 bits, which only qkv's attention reads; this "
                f"model runs attn_implementation={implementation!r}: call qkv.integrations.transformers.register() "
                "and load the model with attn_implementation='qkv'"
            )
        layer_types, _ = get_layer_types_and_kwargs(text)
        layers: list[Any] = []
        for kind in layer_types:
            if kind == "dummy":
                layers.append(DummyLayer())
            elif kind in ("full_attention", "sliding_attention", "chunked_attention"):
                layers.append(
                    QuantizedLayer(fmt.name) if max_cache_len is None else QuantizedStaticLayer(max_cache_len, fmt.name)
                )
            else:
                raise ArgumentError(f"QuantizedCache stores attention layers; this model has a {kind!r} layer")
        super().__init__(layers=layers)
        self.format, self.max_cache_len = fmt.name, max_cache_len

    @property
    def nbytes(self) -> int:
        """Bytes held by every layer's packed keys and values (codes and scales)."""
        return sum(
            int(t.numel()) * t.element_size()
            for layer in self.layers
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
            if isinstance(t, torch.Tensor)
        )

    def quantized(self, layer_idx: int) -> tuple[Quantized, Quantized]:
        """Layer ``layer_idx``'s keys and values as ``qkv.Quantized`` views ``(B, Hkv, L, D)`` (a static
        cache's every slot, the unused ones zeros)."""
        layer: Any = self.layers[layer_idx]
        dtype = _storage(layer.format)
        return unpacked(layer.keys.view(dtype), layer.values.view(dtype))

    def __repr__(self) -> str:
        kind = "dynamic" if self.max_cache_len is None else f"max_cache_len={self.max_cache_len}"
        return f"QuantizedCache({self.format}, {kind}, layers={len(self.layers)})"
