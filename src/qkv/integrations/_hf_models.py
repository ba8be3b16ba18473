"""Which transformers models route attention through ``AttentionInterface``, and the refusal of the others.

A model class whose attention layers never call ``ALL_ATTENTION_FUNCTIONS.get_interface(...)``
computes attention in its own code, whatever ``attn_implementation`` says. Under ``"qkv"``
such a model would not run qkv at all, and worse, some (Bloom, CodeGen, XGLM, MPNet, MPT)
still build their mask through qkv's mask function and misread it (they expect an additive
float mask): non-causal attention or inverted padding, with no error. transformers' own test
for this is the class method ``_can_set_attn_implementation`` (it reads the modeling source);
``check_model`` uses it, and ``install_guard`` makes transformers' validation of an
``attn_implementation`` (at ``__init__`` / ``from_config`` / ``from_pretrained`` time and in
``set_attn_implementation``) refuse such a class for every name qkv registered.
"""

import inspect
import re
import sys
from functools import cache
from typing import Any

from ..errors import ArgumentError

QKV_NAMES: set[str] = set()
"""The ``attn_implementation`` names ``register`` gave qkv."""

SYMPTOMS = {
    "bloom": "it reads qkv's boolean mask as an additive one (non-causal attention, inverted padding)",
    "codegen": "it reads qkv's boolean mask as an additive one (non-causal attention, inverted padding)",
    "xglm": "it reads qkv's boolean mask as an additive one (non-causal attention, inverted padding)",
    "mpnet": "it reads qkv's boolean mask as an additive one (inverted padding)",
    "mpt": "it reads qkv's boolean mask as an additive one and then fails",
    "deberta-v2": "it would silently run its own eager attention (disentangled relative positions)",
    "deberta": "it would silently run its own eager attention (disentangled relative positions)",
    "gptj": "it looks its attention class up by name in its own table (KeyError: 'qkv')",
    "gpt_neo": "it looks its attention class up by name in its own table (KeyError: 'qkv')",
    "falcon": "it looks its attention class up by name in its own table (KeyError: 'qkv')",
}
"""What each known non-dispatching architecture did under ``"qkv"`` before it was refused."""


EAGER_MASKS = {
    "nllb-moe": "its expert router reads padding from the mask's values (`~padding_mask.bool()`, eager's form)",
}
"""Model types whose own code, outside the attention call, reads the 4-D mask's *values* in eager's
form (0 = attend, a very negative number = hidden): qkv's mask function gives them eager's float
mask, which its attention reads as well (hidden where ``<= finfo.min / 2``). Found by the
architecture sweep (``tests/hf_sweep.py`` records every read of qkv's mask by a module that is not
an attention layer) with every layer kind built, and by reading the modeling sources."""

EAGER_ONLY_PROVEN = frozenset(
    {
        "bigbird_pegasus",
        "longt5",
        "markuplm",
        "maskformer",
        "nllb-moe",
        "speech_to_text",
        "splinter",
        "switch_transformers",
        "time_series_transformer",
    }
)
"""Model types whose classes transformers marks eager-only (no sdpa, flash or flex attention) and
which the architecture sweep proves match eager under qkv, with every layer kind built: the only
eager-only ones qkv runs (a class its authors never ran on another backend may read the mask in
eager's form anywhere). ``tests/test_transformers_sweep.py`` checks each matches."""


def eager_reader(config: Any) -> str | None:
    """Why the model of ``config`` reads the 4-D mask's values in eager's form (None: it does not)."""
    model_type = getattr(config, "model_type", None)
    return EAGER_MASKS.get(model_type) if isinstance(model_type, str) else None


def supported_backends(cls: type) -> list[str]:
    """The attention implementations a transformers model class declares it supports."""
    names = ["eager"]
    if getattr(cls, "_supports_sdpa", False):
        names.append("sdpa")
    if getattr(cls, "_supports_flash_attn", False) or getattr(cls, "_supports_flash_attn_2", False):
        names.append("flash_attention_2")
    if getattr(cls, "_supports_flex_attn", False):
        names.append("flex_attention")
    return names


_CACHED = "_can_set_attn_implementation_cached_value"
"""Where transformers' ``_can_set_attn_implementation`` caches its answer, on the class it was
asked about, read back with ``getattr``: an answer cached on a base class (``PreTrainedModel``)
is every subclass's answer."""


def _can_set(cls: type) -> bool:
    """transformers' own answer for ``cls`` alone, leaving no trace: any cached answer ``cls``
    inherits is shadowed while asking, and the class attribute is restored afterwards."""
    own = cls.__dict__.get(_CACHED)
    if isinstance(own, bool):
        return own
    missing = _CACHED not in cls.__dict__
    setattr(cls, _CACHED, None)  # shadow an inherited answer: this class's own source decides
    try:
        return bool(cls._can_set_attn_implementation())  # type: ignore[attr-defined]
    finally:
        if missing:
            delattr(cls, _CACHED)
        else:
            setattr(cls, _CACHED, own)


_OWN_TABLE = re.compile(r"\b[A-Z0-9_]+_CLASSES\[\s*(?:self\.)?config\._attn_implementation\s*\]")
"""A modeling file that picks its attention class from its own table by the implementation's
name (``GIT_SELF_ATTENTION_CLASSES[config._attn_implementation]``): under ``"qkv"``, a
``KeyError`` at load (Git, SAM, SAM-HQ, SuperGlue, Data2Vec-Vision, DeepSeek-OCR 2 ...)."""


def _own_table(cls: type) -> bool:
    """Whether a modeling file ``cls`` is built from looks attention classes up in its own table."""
    for base in cls.__mro__:
        module = sys.modules.get(base.__module__)
        if module is None or not base.__module__.startswith("transformers.models."):
            continue
        try:
            source = inspect.getsource(module)
        except (OSError, TypeError):
            continue
        if _OWN_TABLE.search(source):
            return True
    return False


def _dispatches(cls: type) -> bool:
    """Whether a modeling file ``cls`` is built from calls transformers' attention interface (a
    class without one, a convolutional network say, never reaches qkv: nothing to refuse)."""
    for base in cls.__mro__:
        module = sys.modules.get(base.__module__)
        if module is None or not base.__module__.startswith("transformers.models."):
            continue
        try:
            if "ALL_ATTENTION_FUNCTIONS.get_interface(" in inspect.getsource(module):
                return True
        except (OSError, TypeError):
            continue
    return False


@cache
def _reason(cls: type) -> str | None:
    if getattr(cls, "_can_set_attn_implementation", None) is None:
        return f"{cls.__name__} is not a transformers PreTrainedModel class"
    from transformers.modeling_utils import PreTrainedModel

    if cls is PreTrainedModel:
        return f"{cls.__name__} is the base of transformers' models, not a model: pass a model or model class"
    table = _own_table(cls)
    model_type = getattr(getattr(cls, "config_class", None), "model_type", "") or ""
    if _can_set(cls) and not table:
        if supported_backends(cls) != ["eager"] or model_type in EAGER_ONLY_PROVEN or not _dispatches(cls):
            return None
        return (
            f"{cls.__name__} (model_type {model_type!r}) is marked eager-only by transformers (no sdpa, flash or "
            "flex attention), so attn_implementation='qkv' cannot run there: its code may read the attention "
            "mask in eager's form, and no check here proves it does not. It supports attn_implementation in ['eager']"
        )
    symptom = (
        "it looks its attention class up by name in its own table (KeyError: 'qkv')"
        if table
        else SYMPTOMS.get(model_type, "it would run its own attention code, never qkv's")
    )
    how = (
        "builds its attention layers from its own table of classes"
        if table
        else "computes attention in its own code instead of through transformers' AttentionInterface"
    )
    return (
        f"{cls.__name__} (model_type {model_type!r}) {how}, so attn_implementation='qkv' cannot run there: "
        f"{symptom}. It supports attn_implementation in {supported_backends(cls)}"
    )


def check_model(model_or_class: Any) -> str | None:
    """None if a transformers model (or model class) routes its attention through qkv under
    ``attn_implementation="qkv"``; otherwise the reason it cannot, one sentence naming the
    architecture and the backends it does support.

    >>> check_model(LlamaForCausalLM) is None
    True
    >>> check_model(BloomForCausalLM)
    "BloomForCausalLM (model_type 'bloom') computes attention in its own code ..."
    """
    cls = model_or_class if isinstance(model_or_class, type) else type(model_or_class)
    return _reason(cls)


def refuse(model_or_class: Any) -> None:
    """Raise ``ArgumentError`` with ``check_model``'s reason if the model cannot run qkv."""
    why = check_model(model_or_class)
    if why is not None:
        raise ArgumentError(why)


_BY_MODEL_TYPE: dict[str, str | None] = {}
"""``_model_type_reason``'s answers. A plain dict, not ``functools.cache``: torch's tracer runs a
cached function's body again (reading modeling sources), but reads a dict entry as a constant."""


def _model_type_reason(model_type: str) -> str | None:
    """``check_model`` for the base model class of a config's ``model_type`` (None if unknown)."""
    if model_type in _BY_MODEL_TYPE:
        return _BY_MODEL_TYPE[model_type]
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    name = MODEL_MAPPING_NAMES.get(model_type)
    if isinstance(name, (list, tuple)):
        name = name[0]
    cls = getattr(transformers, name, None) if isinstance(name, str) else None
    why = None if cls is None or not hasattr(cls, "_can_set_attn_implementation") else _reason(cls)
    _BY_MODEL_TYPE[model_type] = why
    return why


def refuse_config(config: Any) -> None:
    """The guard inside the mask function: a config of a non-dispatching architecture that reached
    qkv (e.g. ``config._attn_implementation`` set by hand, bypassing the validation) raises."""
    model_type = getattr(config, "model_type", None)
    why = _model_type_reason(model_type) if isinstance(model_type, str) and model_type else None
    if why is not None:
        raise ArgumentError(why)


GUARDED = ("get_correct_attn_implementation", "set_attn_implementation")
"""The ``PreTrainedModel`` methods ``install_guard`` wraps."""


def install_guard() -> None:
    """Make transformers' own validation of ``attn_implementation`` refuse non-dispatching classes
    for qkv's names: ``PreTrainedModel.get_correct_attn_implementation`` (run by ``__init__``,
    hence ``from_config`` / ``from_pretrained``, and by ``set_attn_implementation`` for sub-models)
    and ``set_attn_implementation`` itself (which, for such a class, would only log a warning and
    keep the old implementation). Installing twice is harmless."""
    from transformers.modeling_utils import PreTrainedModel

    get_correct = PreTrainedModel.get_correct_attn_implementation
    if not getattr(get_correct, "_qkv_guard", False):

        def get_correct_attn_implementation(self: Any, requested_attention: Any, is_init_check: bool = False) -> Any:
            if requested_attention in QKV_NAMES:
                refuse(self)
                refuse_config(getattr(self, "config", None))  # answered now, read while a compiled forward runs
            return get_correct(self, requested_attention, is_init_check)

        get_correct_attn_implementation._qkv_guard = True  # type: ignore[attr-defined]
        PreTrainedModel.get_correct_attn_implementation = get_correct_attn_implementation  # type: ignore[method-assign]

    set_attn = PreTrainedModel.set_attn_implementation
    if not getattr(set_attn, "_qkv_guard", False):

        def set_attn_implementation(self: Any, attn_implementation: Any, *args: Any, **kwargs: Any) -> Any:
            requested = attn_implementation.get("") if isinstance(attn_implementation, dict) else attn_implementation
            if requested in QKV_NAMES:
                refuse(self)
            return set_attn(self, attn_implementation, *args, **kwargs)

        set_attn_implementation._qkv_guard = True  # type: ignore[attr-defined]
        PreTrainedModel.set_attn_implementation = set_attn_implementation  # type: ignore[method-assign]
