"""transformers' masks as qkv ``Mask`` objects, instead of a dense ``(B, 1, Lq, Lk)`` boolean tensor.

transformers describes a model's mask by a mask function (causal, or causal and a sliding
window) plus the 2-D padding mask; its ``sdpa_mask`` evaluates that into ``B · Lq · Lk``
booleans, which the flash kernel must then read back and classify tile by tile (~0.35 s per
layer at N = 8192). Where the description is one qkv has a constructor for, the mask function
returns a ``StructuredMask`` instead: ``masks.causal()``, ``masks.sliding_window(w)`` or
``masks.padding(lengths, causal=True, window=w, left=True)``, whose tiles (or per-row key
intervals) are known analytically. One object serves every layer of a forward pass, so
whatever the kernel derives from it per shape is computed once (``masks.plan``'s cache).
"""

from typing import Any

from .. import masks
from ..masks import Mask


class StructuredMask:
    """The attention mask qkv's mask function hands a model: ``mask`` (a qkv ``Mask``, bottom-right
    aligned, batch axis from the padding lengths), what it is made of (``window``: the sliding
    window or None; ``padded``: whether some sequence is left-padded) and the ``shape (B, 1, Lq,
    Lk)`` of the dense mask it stands for. Only qkv's attention function reads it."""

    __slots__ = ("mask", "padded", "shape", "window")
    ndim = 4

    def __init__(self, mask: Mask, shape: tuple[int, int, int, int], window: int | None, padded: bool) -> None:
        self.mask, self.shape, self.window, self.padded = mask, shape, window, padded

    def __repr__(self) -> str:
        return f"StructuredMask({self.mask.name}, shape={self.shape})"


def _window(mask_function: Any) -> tuple[bool, int | None]:
    """``(known, window)``: whether ``mask_function`` is transformers' causal mask (window None) or
    its sliding-window causal mask (the window), read off the closures ``and_masks`` and
    ``sliding_window_overlay`` build. Anything else (packed sequences, image-token overlays,
    chunked attention, another transformers version's layout) is not known."""
    from transformers.masking_utils import causal_mask_function

    if mask_function is causal_mask_function:
        return True, None
    if masks.compiling():  # closures cannot be read while torch traces: the dense mask, as a tensor
        return False, None
    if getattr(mask_function, "__qualname__", "") != "and_masks.<locals>.and_mask":
        return False, None
    cells = dict(zip(mask_function.__code__.co_freevars, mask_function.__closure__ or (), strict=False))
    parts: tuple[Any, ...] = tuple(cells["mask_functions"].cell_contents) if "mask_functions" in cells else ()
    if len(parts) != 2 or parts[1] is not causal_mask_function:
        return False, None
    overlay = parts[0]
    if getattr(overlay, "__qualname__", "") != "sliding_window_overlay.<locals>.inner_mask":
        return False, None
    inner = dict(zip(overlay.__code__.co_freevars, overlay.__closure__ or (), strict=False))
    window = inner["sliding_window"].cell_contents if "sliding_window" in inner else None
    return (True, window) if isinstance(window, int) and window > 0 else (False, None)


def _left_padding_lengths(attention_mask: Any, kv_offset: int, kv_length: int) -> tuple[bool, list[int] | None]:
    """``(known, lengths)``: the real keys per sequence when ``attention_mask (B, >= kv_offset +
    Lk)`` is pure left padding over this layer's keys (lengths None: no padding at all)."""
    if attention_mask is None:
        return True, None
    if attention_mask.ndim != 2 or attention_mask.shape[-1] < kv_offset + kv_length:
        return False, None
    real = attention_mask[:, kv_offset : kv_offset + kv_length].bool()
    if bool(real.all()):
        return True, None
    if not bool((real[:, 1:] >= real[:, :-1]).all()):  # a 0 after a 1: not left padding
        return False, None
    return True, [int(n) for n in real.sum(-1).tolist()]


def structured(
    mask_function: Any,
    q_length: int,
    kv_length: int,
    q_offset: Any,
    kv_offset: Any,
    attention_mask: Any,
    skip: bool,
) -> Any:
    """A ``StructuredMask`` for the call to qkv's mask function, None where the dense mask (or "no
    mask") must be built instead.

    Only for queries that are the last ``Lq`` of the ``Lk`` keys (``q_offset + Lq == kv_offset +
    Lk``: a prefill, a decode step against a dynamic or sliding cache), where qkv's bottom-right
    alignment is the model's; a static cache with unused slots takes the dense path.
    """
    if not (isinstance(q_offset, int) and isinstance(kv_offset, int)) or q_offset + q_length != kv_offset + kv_length:
        return None
    if attention_mask is not None and masks.compiling():
        return None  # its values (the padding) cannot be read while torch traces: the dense mask, as a tensor
    known, window = _window(mask_function)
    if not known:
        return None
    known, lengths = _left_padding_lengths(attention_mask, kv_offset, kv_length)
    if not known or (lengths is None and window is None and skip):
        return None  # not expressible, or plain causal: "no mask", which qkv reads as causal
    if lengths is not None:
        mask = masks.padding(lengths, causal=True, window=window, left=True)
        batch = len(lengths)
    else:
        mask = masks.causal() if window is None else masks.sliding_window(window)
        batch = 1 if attention_mask is None else int(attention_mask.shape[0])
    return StructuredMask(mask, (batch, 1, q_length, kv_length), window, lengths is not None)
