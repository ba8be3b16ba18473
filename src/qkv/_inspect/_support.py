"""Whether a transformers architecture routes its attention through the attention interface.

qkv runs inside a transformers model as an attention implementation (``qkv.integrations.
transformers``); a model whose attention layers compute attention themselves never calls it, so
qkv would neither run them nor see their weights. transformers marks the classes that do call
it with ``_supports_attention_backend`` and can tell from their source whether the
implementation can be switched (``_can_set_attn_implementation``).
"""

from typing import Any

ALTERNATIVES = "BERT, RoBERTa, DistilBERT, ELECTRA, GPT-2, Llama, Mistral, Qwen2 or Gemma"
"""Architectures whose attention goes through the interface, named when one does not."""


def interface_problem(model_or_class: Any) -> str | None:
    """None if the model (an instance or a class) calls transformers' attention interface, else
    one sentence naming the architecture and what to use instead."""
    cls = model_or_class if isinstance(model_or_class, type) else type(model_or_class)
    can_set = getattr(cls, "_can_set_attn_implementation", None)
    if getattr(cls, "_supports_attention_backend", False) and (can_set is None or can_set()):
        return None
    return (
        f"{cls.__name__} computes attention inside its own layers instead of calling transformers' "
        f"attention interface, so qkv can neither run its attention nor see the weights; inspect a "
        f"model of an architecture that does ({ALTERNATIVES}), e.g. the default all-MiniLM-L6-v2"
    )
