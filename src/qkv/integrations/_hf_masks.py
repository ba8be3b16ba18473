"""transformers' masks as qkv ``Mask`` objects carried by the mask tensor itself.

transformers describes a model's mask by a mask function (causal, causal with a sliding window,
bidirectional) plus the 2-D padding mask; its ``sdpa_mask`` evaluates that into ``B · Lq · Lk``
booleans, which the flash kernel must then read back and classify tile by tile (~0.35 s per
layer at N = 8192). Where the description is one qkv has a constructor for, the mask function
returns a *lazy mask tensor* instead: a real ``torch.Tensor`` (boolean, ``(B, 1, Lq, Lk)``, what
``sdpa_mask`` gives) whose values are only computed when code other than qkv reads them (an
indexing, ``generate`` feeding it back, a model adding it to its scores), and which carries the
``Structure`` qkv reads instead: ``masks.causal()``, ``masks.sliding_window(w)``,
``masks.chunked(c)`` (Llama 4's chunked layers), ``masks.padding(lengths, causal=True, window=w,
left=True)`` or "every key" (a bidirectional mask without padding), whose tiles are known
analytically. Any other mask is computed at once and wrapped the same way (no structure). One
tensor serves every layer of a forward pass, so whatever the kernel derives from it per shape is
computed once (``masks.plan``'s cache). Summed with float scores (``scores + mask``: a module
that expects eager's additive mask), either kind raises ``ArgumentError`` naming the module.
"""

from collections.abc import Callable
from functools import cache
from typing import Any, NamedTuple

from .. import masks
from ..errors import ArgumentError
from ..masks import Mask

_SUMS = frozenset({"add", "add_", "sub", "sub_", "rsub"})
"""Operations that read a boolean mask as an additive float one (``scores + mask``): only a
module computing attention in its own code, expecting eager's float mask, does that."""


def _reader() -> str:
    """The innermost ``nn.Module`` on the Python stack (the code reading the mask), by class name."""
    import sys

    import torch

    frame: Any = sys._getframe(2)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, torch.nn.Module):
            return f"{type(owner).__name__} (in {frame.f_code.co_filename.rsplit('/', 1)[-1]})"
        frame = frame.f_back
    return "code outside qkv"


def _refuse_sum(func: Any, args: Any) -> None:
    """Raise ``ArgumentError`` when qkv's boolean mask is summed with float scores."""
    import torch
    from torch.utils._pytree import tree_leaves

    if func.overloadpacket.__name__ not in _SUMS:
        return
    if any(isinstance(a, torch.Tensor) and a.is_floating_point() for a in tree_leaves(args)):
        raise ArgumentError(
            f"{_reader()} adds qkv's boolean attention mask to float scores, as eager's additive mask: "
            "that module computes attention in its own code, not through transformers' AttentionInterface, so "
            "attn_implementation='qkv' cannot run this model; use attn_implementation='eager' (or 'sdpa')"
        )


class Structure(NamedTuple):
    """What a lazy mask tensor stands for: ``mask`` (a qkv ``Mask``, bottom-right aligned, batch
    axis from the padding lengths; None: every key), ``window`` (the sliding window or None),
    ``padded`` (whether some sequence is left-padded), ``chunk`` (chunked attention's size or
    None) and ``keys``: None when ``mask`` covers all ``Lk`` keys, else the count of the first
    keys it covers, every later key being hidden from every query (a static cache's slots after
    the queries' positions, not yet written); qkv then reads only those ``keys`` keys."""

    mask: Mask | None
    window: int | None
    padded: bool
    chunk: int | None = None
    keys: int | None = None


_DEFINED: list[type] = []
"""The lazy mask type, once ``_lazy_type`` has defined it."""


@cache
def _lazy_type() -> type:
    """The ``torch.Tensor`` wrapper subclass of lazy masks (defined on first use: torch is imported
    only by the transformers backend, never by ``import qkv``)."""
    import torch
    from torch.utils._pytree import tree_map_only

    class LazyMask(torch.Tensor):
        """A boolean ``(B, 1, Lq, Lk)`` mask tensor whose values are ``dense()`` (built on first
        use, once); ``structure`` says what it is to qkv. Every torch operation on it sees the
        dense values, so any code reads exactly what ``sdpa_mask`` would have given."""

        structure: Structure | None
        written: Structure | None
        _build: Callable[[], Any] | None
        _dense: Any

        @staticmethod
        def __new__(
            cls, structure: Structure | None, shape: tuple[int, ...], build: Callable[[], Any], device: Any
        ) -> Any:
            t = torch.Tensor._make_wrapper_subclass(cls, shape, dtype=torch.bool, device=device)
            t._build, t._dense = build, None
            # a structure over a static cache's written keys changes with every step: kept where
            # traced code never looks (a compiled forward would guard on it and recompile per step)
            written = structure is not None and structure.keys is not None
            t.structure, t.written = (None, structure) if written else (structure, None)
            return t

        __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

        def dense(self) -> Any:
            if self._dense is None:
                assert self._build is not None
                self._dense, self._build = self._build(), None
            return self._dense

        @classmethod
        def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:  # type: ignore[override]
            _refuse_sum(func, (args, kwargs))
            args, kwargs = tree_map_only(cls, lambda t: t.dense(), (args, kwargs or {}))
            return func(*args, **kwargs)

        def __repr__(self) -> str:  # type: ignore[override]
            s = self.structure or self.written
            name = "dense" if s is None else "every key" if s.mask is None else s.mask.name
            return f"LazyMask({name}, shape={tuple(self.shape)})"

    _DEFINED.append(LazyMask)
    return LazyMask


def lazy(structure: Structure | None, shape: tuple[int, int, int, int], build: Callable[[], Any], device: Any) -> Any:
    """A lazy mask tensor of ``shape (B, 1, Lq, Lk)`` standing for ``structure`` (None: only its
    values), with the values ``build()`` returns (computed only when something reads them)."""
    return _lazy_type()(structure, shape, build, device)


def structure_of(mask: Any) -> Structure | None:
    """The ``Structure`` a lazy mask tensor carries; None for anything else (a plain tensor, a
    slice of a lazy mask, None) and, while torch traces, for a structure over a static cache's
    written keys (``Structure.keys``; the traced program reads the mask's values instead)."""
    s = getattr(mask, "structure", None)
    if s is None and not masks.compiling():
        s = getattr(mask, "written", None)
    return s if isinstance(s, Structure) else None


def plain(mask: Any) -> Any:
    """``mask`` as a plain tensor: a lazy mask's values, anything else as it is. (Reads the type
    only once it exists: torch's tracer cannot run the class definition, and a traced program
    only ever sees plain tensors.)"""
    return mask.dense() if _DEFINED and isinstance(mask, _DEFINED[0]) else mask  # type: ignore[attr-defined]


def _pattern(mask_function: Any) -> tuple[bool, int | None, int | None]:
    """``(known, window, chunk)``: whether ``mask_function`` is transformers' causal mask, its
    sliding-window causal mask (the window) or its chunked causal mask with no left padding (the
    chunk size), read off the closures ``and_masks``, ``sliding_window_overlay`` and
    ``chunked_overlay`` build. Anything else (packed sequences, image-token overlays, chunks
    shifted by padding, another transformers version's layout) is not known."""
    from transformers.masking_utils import causal_mask_function

    if mask_function is causal_mask_function:
        return True, None, None
    if getattr(mask_function, "__qualname__", "") != "and_masks.<locals>.and_mask":
        return False, None, None
    cells = dict(zip(mask_function.__code__.co_freevars, mask_function.__closure__ or (), strict=False))
    parts: tuple[Any, ...] = tuple(cells["mask_functions"].cell_contents) if "mask_functions" in cells else ()
    if len(parts) != 2 or parts[1] is not causal_mask_function:
        return False, None, None
    overlay = parts[0]
    kind = getattr(overlay, "__qualname__", "")
    code = getattr(overlay, "__code__", None)
    inner = {} if code is None else dict(zip(code.co_freevars, overlay.__closure__ or (), strict=False))
    if kind == "sliding_window_overlay.<locals>.inner_mask":
        window = inner["sliding_window"].cell_contents if "sliding_window" in inner else None
        return (True, window, None) if isinstance(window, int) and window > 0 else (False, None, None)
    if kind == "chunked_overlay.<locals>.inner_mask" and {"chunk_size", "left_padding"} <= inner.keys():
        chunk, shifts = inner["chunk_size"].cell_contents, inner["left_padding"].cell_contents
        unshifted = shifts is None or not bool((shifts != 0).any())  # chunks counted from each sequence's start
        return (True, None, chunk) if isinstance(chunk, int) and chunk > 0 and unshifted else (False, None, None)
    return False, None, None


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


def offset_of(q_offset: Any) -> Any:
    """``q_offset`` as an int where it is a one-element integer tensor (a static cache's position,
    which the cache later changes in place), else as it is."""
    if getattr(q_offset, "ndim", None) is not None and q_offset.numel() == 1 and not q_offset.is_floating_point():
        return int(q_offset)
    return q_offset


def structured(
    mask_function: Any, q_length: int, kv_length: int, q_offset: Any, kv_offset: Any, attention_mask: Any
) -> Structure | None:
    """The ``Structure`` of the mask transformers asks qkv's mask function for, None where the
    dense mask must be built instead.

    Only for queries that are the last ``Lq`` of the first ``keys = q_offset + Lq - kv_offset``
    keys, where qkv's bottom-right alignment over those keys is the model's: ``keys == Lk`` for a
    prefill or a decode step against a dynamic or sliding cache; ``keys < Lk`` for a static cache
    (``q_offset`` an int or a one-element tensor), whose slots after the queries' positions every
    causal mask hides from every query (``Structure.keys``).
    """
    from transformers.masking_utils import bidirectional_mask_function

    if not (isinstance(q_offset, int) and isinstance(kv_offset, int)):
        return None
    keys = q_offset + q_length - kv_offset
    if not 0 < keys <= kv_length:
        return None
    if mask_function is bidirectional_mask_function:  # every key visible: no hidden tail
        known, lengths = _left_padding_lengths(attention_mask, kv_offset, kv_length)
        return Structure(None, None, False) if keys == kv_length and known and lengths is None else None
    known, window, chunk = _pattern(mask_function)
    if not known:
        return None
    known, lengths = _left_padding_lengths(attention_mask, kv_offset, keys)
    if not known:
        return None
    tail = None if keys == kv_length else keys  # keys from `keys` on: after every query, hidden by causality
    if chunk is not None:  # chunks counted from key 0: the keys must start at position 0, unpadded
        unpadded = lengths is None and kv_offset == 0
        return Structure(_unpadded(None, chunk), None, False, chunk, tail) if unpadded else None
    if lengths is not None:
        return Structure(masks.padding(lengths, causal=True, window=window, left=True), window, True, None, tail)
    return Structure(_unpadded(window, None), window, False, None, tail)


@cache
def _unpadded(window: int | None, chunk: int | None) -> Mask:
    """``masks.causal()``, ``masks.sliding_window(window)`` or ``masks.chunked(chunk)``: one object
    per size, so a decode step does not build it again (~20 us) and its tile plans stay cached."""
    if chunk is not None:
        return masks.chunked(chunk)
    return masks.causal() if window is None else masks.sliding_window(window)
