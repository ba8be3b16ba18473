"""qkv as an attention implementation of Hugging Face transformers.

``register(name="qkv", impl="auto")`` adds two functions to transformers' registries:

- an attention function (``AttentionInterface``): the model hands it ``query (B, H, Lq, D)``,
  un-expanded grouped keys and values ``(B, Hkv, Lk, D)``, the mask the mask function built
  (or None), ``scaling``, ``dropout`` and model-specific keyword arguments; it returns
  ``(out (B, Lq, H, D) contiguous, weights (B, H, Lq, Lk) or None)``, like transformers' own
  ``sdpa_attention_forward``;
- a mask function (``AttentionMaskInterface``): without one, transformers builds no mask at
  all for an unknown implementation name. It gives transformers' own boolean ``sdpa_mask``
  (True = may attend, like qkv) and never None (``sdpa_mask`` skips it where SDPA's
  ``is_causal`` or "no mask" would do; qkv would then have to guess what the model meant).
  Where qkv has a constructor for the mask, the tensor is lazy: a real tensor to every reader,
  computed only if one reads it, and carrying the qkv ``Mask`` the attention function uses;
  otherwise its values are computed at once. Either way it refuses to be added to float scores
  (a module computing attention in its own code): an ``ArgumentError`` naming the module.

Then ``AutoModelForCausalLM.from_config(cfg, attn_implementation="qkv")`` and
``model.set_attn_implementation("qkv")`` run every attention layer through ``qkv.attention``.
transformers (and torch) are imported when ``register`` is called, never by ``import qkv``.
"""

from collections.abc import Callable
from functools import cache
from typing import Any

from .._checks import check_impl
from .._impls import lean_attention
from .._torch import autocast
from ..errors import ArgumentError, MaskError
from ._hf_masks import lazy, offset_of, plain, structure_of, structured
from ._hf_models import GUARDED, QKV_NAMES, eager_reader, install_guard, refuse_config
from ._hf_models import check_model as check_model
from ._hf_models import supported_backends as supported_backends


def __getattr__(name: str) -> Any:
    if name == "QuantizedCache":  # a transformers Cache subclass: defined once transformers is imported
        from ._hf_cache import QuantizedCache

        return QuantizedCache
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


IGNORED = frozenset(
    {
        # bookkeeping the attention itself does not use
        "position_ids",
        "output_attentions",
        "output_hidden_states",
        "output_router_logits",
        "num_items_in_batch",
        "use_cache",
        "cache_position",
        "past_key_values",
        "past_key_value",
        "position_embeddings",
        "layer_idx",
        "return_dict",
        "token_type_ids",
        # flash-attention's varlen description of packed sequences; for every other implementation
        # transformers folds the packing into the mask (from position_ids), which qkv applies
        "cu_seq_lens_q",
        "cu_seq_lens_k",
        "max_length_q",
        "max_length_k",
        "seq_idx",
        # Mistral-style models pass their window here; the mask function has already built it
        "sliding_window",
        # flash-attn's switch for a deterministic backward (ModernBERT); qkv's is always deterministic
        "deterministic",
    }
)
"""Keyword arguments models pass that change nothing here; any other non-None one is refused."""

HONOURED = frozenset({"softcap", "position_bias", "s_aux"})
"""Keyword arguments qkv turns into its own: ``softcap`` (Gemma 2) -> ``scores.softcap``,
``position_bias`` (T5's learnt relative bias, ``(B|1, H, Lq, Lk)``) -> ``bias=``, ``s_aux``
(gpt-oss attention sinks, ``(H,)``) -> ``sinks=``; gradients reach the last two."""


def register(name: str = "qkv", impl: str = "auto") -> str:
    """Register qkv with transformers as ``attn_implementation=name``; returns ``name``.

    ``impl`` is passed to ``qkv.attention`` (``"auto"``, ``"reference"``, ``"flash"`` or
    ``"torch"``). Registering again (same or another ``impl``) replaces the entry, so calling
    it twice is harmless.

    Everything qkv needs is registered here and nowhere else (importing this module registers
    nothing): the attention function, the mask function, the name, and the guard that refuses
    models qkv cannot run (``check_model``). All of it or none: if a step fails, transformers'
    registries and ``PreTrainedModel`` are left as they were and the error propagates.

    >>> register()
    'qkv'
    >>> model = AutoModelForCausalLM.from_config(config, attn_implementation="qkv")
    """
    if not isinstance(name, str) or not name:
        raise ArgumentError(f"name must be a non-empty string, got {name!r}")
    check_impl(impl)
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface, PreTrainedModel

    registries = (AttentionInterface._global_mapping, AttentionMaskInterface._global_mapping)
    saved = [dict(r) for r in registries], set(QKV_NAMES), dict(vars(PreTrainedModel))
    try:
        install_guard()
        AttentionInterface.register(name, attention_function(impl))
        AttentionMaskInterface.register(name, mask_function)
        QKV_NAMES.add(name)
    except BaseException:
        for registry, before in zip(registries, saved[0], strict=True):
            registry.clear()
            registry.update(before)
        QKV_NAMES.clear()
        QKV_NAMES.update(saved[1])
        for method in GUARDED:
            setattr(PreTrainedModel, method, saved[2][method])
        raise
    return name


@cache
def attention_function(impl: str = "auto") -> Callable[..., tuple[Any, Any]]:
    """The function registered with ``AttentionInterface`` for ``impl`` (one object per impl)."""

    def qkv_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any) -> Any:
        # transformers passes dropout, scaling and is_causal by keyword: forward names them
        return forward(module, query, key, value, attention_mask, impl=impl, **kwargs)

    qkv_attention.__name__ = qkv_attention.__qualname__ = f"qkv_attention_{impl}"
    return qkv_attention


def forward(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    *,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    impl: str = "auto",
    **kwargs: Any,
) -> tuple[Any, Any]:
    """One attention layer of a transformers model, computed by ``qkv.attention``.

    query (B, H, Lq, D), key (B, Hkv, Lk, D), value (B, Hkv, Lk, Dv) with ``H % Hkv == 0``
    (grouped heads are not expanded: qkv serves each kv head's ``H // Hkv`` query heads) ->
    ``(out (B, Lq, H, Dv) contiguous, weights (B, H, Lq, Lk) or None)``.

    - ``attention_mask``: what transformers built, read exactly as eager attention reads it. qkv's
      mask function hands over a lazy mask tensor carrying its structure (``masks.causal()``, a
      window, left padding), which is used without reading its values; any other boolean mask
      (True = may attend) is used as is; a float mask's very negative entries (``<= finfo.min /
      2``, transformers' "minus infinity") are hidden keys, other values an additive bias. None
      means every key, as in eager attention, unless the model passes ``is_causal=True`` (then
      causal, bottom-right: ``Lq < Lk`` means the queries are the last ``Lq`` positions); qkv never
      guesses causality from the module.
    - ``scaling``: the score scale (None: ``1/sqrt(D)``). ``dropout``: applied to the weights
      only while ``module.training``, drawn from torch's global generator (seed it with
      ``torch.manual_seed``; the flash kernel draws its counter-based seed from it).
    - ``softcap`` (Gemma 2): ``qkv.scores.softcap``. ``output_attentions=True`` returns the
      weights (the reference impl materialises them; flash rebuilds them from its lse).
    - A row that may attend no key (left padding) gives zeros, never NaN.
    - ``position_bias`` (T5) is qkv's ``bias=``, ``s_aux`` (gpt-oss) its ``sinks=``; gradients
      reach both. ``deterministic`` (ModernBERT) is ignored: qkv is deterministic.
    - Keyword arguments qkv cannot honour raise ``ArgumentError`` naming them rather than being
      ignored.
    - key and value from a ``QuantizedCache`` layer (8-bit dtypes) are read as ``qkv.Quantized``.
    """
    from .. import attention, scores

    refused = sorted(k for k, v in kwargs.items() if v is not None and k not in IGNORED and k not in HONOURED)
    if refused:
        raise ArgumentError(
            f"qkv's transformers backend cannot honour the keyword argument(s) {refused} passed by "
            f"{type(module).__name__}; use attn_implementation='eager' for this model"
        )
    want_weights = _weights_requested(module, kwargs)
    query, key, value, _ = autocast(query, key, value)  # as SDPA: RoPE's float32 q, k beside a bfloat16 v
    structure = structure_of(attention_mask)
    nk = key.shape[-2]
    if structure is not None and structure.keys is not None and structure.keys < nk:
        # a static cache: the slots after the queries' positions are hidden from every query, never read
        key, value = key[..., : structure.keys, :], value[..., : structure.keys, :]
    quantized = key.dtype.itemsize == 1  # a QuantizedCache layer's packed 8-bit keys and values
    if quantized:
        from ._hf_cache import unpacked
    if (
        query.shape[-2] == 1
        and all(kwargs.get(name) is None for name in HONOURED)
        and impl in ("auto", "flash")
        and not (dropout and getattr(module, "training", False))
        and not want_weights
        and (attention_mask is None or (structure is not None and not structure.padded and structure.chunk is None))
    ):  # a decode step against the cache: the lean path, as little Python as possible
        window = None if structure is None else structure.window
        k, v = key, value  # (the full path below reads the whole cache with its mask)
        if window is not None and window < key.shape[-2]:  # one query, the last key's: the last `window` keys
            k, v = key[..., -window:, :], value[..., -window:, :]
        if quantized:  # a packed layer's tokens, sliced above with their scales
            k, v = unpacked(k, v)
        res = lean_attention(query, k, v, False, scaling)  # one query: causal hides nothing
        if res is not None:  # (B, H, 1, Dv) seen as (B, 1, H, Dv) is already contiguous: no copy
            return res.out.transpose(1, 2).contiguous(), None
    if quantized:
        key, value = unpacked(key, value)
    mask, causal = layer_mask(attention_mask, key.shape[-2], is_causal)
    softcap = kwargs.get("softcap")
    bias = kwargs.get("position_bias")
    if bias is not None:  # T5: (B|1, H, Lq, Lk'), for a longer (static) cache its first Lk keys are these
        bias = bias[..., -query.shape[-2] :, : key.shape[-2]]
    res = attention(
        query,
        key,
        value,
        mask=mask,
        causal=causal,
        scale=scaling,
        score_mod=None if softcap is None else scores.softcap(softcap),
        dropout=float(dropout) if getattr(module, "training", False) else 0.0,
        impl=impl,
        return_weights=want_weights,
        bias=bias,
        sinks=kwargs.get("s_aux"),
    )
    out, weights = res if want_weights else (res, None)
    if weights is not None and weights.shape[-1] < nk:  # the unread slots' weights: zero
        import torch

        weights = torch.nn.functional.pad(weights, (0, nk - weights.shape[-1]))
    return out.transpose(1, 2).contiguous(), weights


def _weights_requested(module: Any, kwargs: dict[str, Any]) -> bool:
    """Whether the caller asked for the attention weights (``output_attentions=True``).

    Models in transformers 5 record the weights with a forward hook while ``output_attentions``
    is on, and many (GPT-2) drop the flag before it reaches the attention function; the hook's
    active collector is the reliable signal. The weights are only built when asked for: the
    reference impl materialises them, the flash kernel rebuilds them in a second pass.
    """
    if kwargs.get("output_attentions"):
        return True
    from .. import masks

    collector = None if masks.compiling() else _collector()  # torch's tracer cannot read a ContextVar
    collected = None if collector is None else collector.get()
    if isinstance(collected, dict):  # the model's capture decided from its flag and config: what it records
        return any(key.endswith("attentions") for key in collected)
    # no capture running (or not readable): the config's flag (its read costs ~9 us, so only here)
    return bool(getattr(getattr(module, "config", None), "output_attentions", False))


@cache
def _collector() -> Any:
    """transformers' active output collector (a ``ContextVar``), None in a version without one."""
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:
        return None
    return _active_collector


def layer_mask(attention_mask: Any, nk: int, is_causal: bool | None = None) -> tuple[Any, bool]:
    """``(mask, causal)`` for ``qkv.attention``: the one rule by which the backend (``forward``) and
    ``qkv.inspect`` read the mask a transformers layer is handed for ``nk`` keys.

    A lazy mask tensor from qkv's mask function gives its qkv ``Mask`` (None: every key) when that
    covers the ``nk`` keys (a structure over the first ``keys`` of a static cache: when ``nk`` is
    that count, ``forward`` having left the rest unread); another 4-D tensor (or a lazy mask read
    over other keys) gives a boolean mask or float bias (``_qkv_mask``); None gives no mask, causal
    only when the model passed ``is_causal=True`` -- eager attention applies no mask it was not
    given, and qkv's mask function always gives one, so qkv never infers causality from the module.
    """
    structure = structure_of(attention_mask)
    if structure is not None and (structure.keys is None or structure.keys == nk):
        return structure.mask, False
    if attention_mask is None:
        return None, is_causal is True
    return _qkv_mask(plain(attention_mask), nk), False


def _qkv_mask(mask: Any, nk: int) -> Any:
    """transformers' 4-D mask ``(B, 1 or H, Lq, Lk')`` as a qkv boolean mask or float bias."""
    import torch

    if mask.ndim != 4:
        raise MaskError(
            f"attention_mask has shape {tuple(mask.shape)}; the transformers backend expects the "
            "4-D (B, 1 or H, Lq, Lk) mask its mask function builds"
        )
    if mask.shape[-1] > nk:  # a mask built for a longer (e.g. static) cache: its first Nk keys are these
        mask = mask[..., :nk]
    if mask.dtype == torch.bool:
        return mask
    if not mask.dtype.is_floating_point:
        raise MaskError(
            f"attention_mask has dtype {mask.dtype}; pass a boolean (True = may attend) or float (additive) mask"
        )
    hidden = mask <= torch.finfo(mask.dtype).min / 2  # eager masks write finfo.min for "never attend"
    if not mask.requires_grad and not bool(mask.masked_fill(hidden, 0.0).any()):
        # a pure 0 / -inf mask: boolean, so the flash kernel can skip hidden tiles. A mask that
        # needs its gradient (Swin's learned bias, zero at its start) stays a float bias.
        return ~hidden
    return mask.masked_fill(hidden, -float("inf"))


def mask_function(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: Any = 0,
    kv_offset: int = 0,
    mask_function: Callable[..., Any] | None = None,
    attention_mask: Any = None,
    allow_is_causal_skip: bool = True,
    **kwargs: Any,
) -> Any:
    """The mask registered with ``AttentionMaskInterface``: always a boolean ``(B, 1, Lq, Lk)`` tensor
    with transformers' ``sdpa_mask`` values (True = may attend; padding, sliding windows, packed
    sequences and chunked attention included), never None: "no mask" would leave qkv to guess
    what the model meant.

    The tensor is lazy (``_hf_masks``): its values are computed only if code other than qkv reads
    them, and where qkv has a constructor for the mask (causal, a sliding window, left padding,
    every key) it carries the qkv ``Mask`` qkv uses instead. Code that adds it to float scores
    (a module computing attention in its own code, expecting eager's additive mask) raises
    ``ArgumentError`` naming the module. While torch traces, it is a plain tensor.
    ``allow_is_causal_skip`` is accepted and ignored.

    A model whose own code reads the mask's values in eager's form (``_hf_models.EAGER_MASKS``:
    NLLB-MoE's expert router) gets transformers' ``eager_mask`` instead: the float mask eager
    attention gets (0 = attend, ``finfo.min`` = hidden), which qkv's attention reads the same way.
    """
    from functools import partial

    from transformers.masking_utils import causal_mask_function, sdpa_mask

    from .. import masks

    refuse_config(kwargs.get("config"))  # a model that would misread this mask never gets one
    mask_function = mask_function or causal_mask_function
    kwargs.pop("allow_is_bidirectional_skip", None)  # sdpa_mask's default: off

    def made_by(maker: Any, **how: Any) -> Any:  # transformers' own mask maker, over this call's sizes
        return maker(
            batch_size=batch_size,
            q_length=q_length,
            kv_length=kv_length,
            q_offset=q_offset,
            kv_offset=kv_offset,
            mask_function=mask_function,
            **how,
            **kwargs,
        )

    if eager_reader(kwargs.get("config")) is not None:  # its own code reads the values as eager's: give it those
        from transformers.masking_utils import eager_mask

        return made_by(eager_mask, attention_mask=attention_mask, allow_is_bidirectional_skip=False)
    if not masks.compiling():  # a static cache's position: read now, the cache moves it in place later
        q_offset = offset_of(q_offset)
    structure = (
        None
        if masks.compiling()
        else structured(mask_function, q_length, kv_length, q_offset, kv_offset, attention_mask)
    )

    def dense(padding: Any = attention_mask) -> Any:
        return made_by(sdpa_mask, attention_mask=padding, allow_is_causal_skip=False)

    if structure is None or structure.keys is not None:
        # built now: its inputs (a tensor q_offset, the padding) may change in place later, and a
        # static cache's step may be compiled (generate builds its mask outside the traced forward,
        # which then reads these values)
        values = dense()
        if masks.compiling():  # the traced program takes a plain tensor
            return values
        return lazy(structure, tuple(values.shape), lambda: values, values.device)
    # only ints and a copy of the padding reach the lazy build: nothing a caller changes in place later
    padding = None if attention_mask is None else attention_mask.clone()
    device = kwargs.get("device", "cpu" if attention_mask is None else attention_mask.device)
    return lazy(structure, (batch_size, 1, q_length, kv_length), partial(dense, padding), device)
