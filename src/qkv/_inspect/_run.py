"""``inspect(text, model)``: tokenize, one forward pass with the weights captured, then the numbers."""

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..diagnostics import entropy
from ..errors import ArgumentError
from . import _capture
from ._errors import ModelError
from ._inspection import HeadSummary, Inspection
from ._model import LoadedModel, load_model
from ._patterns import describe, head_patterns
from ._rollout import rollout
from ._support import interface_problem


def _select(value: Any, total: int, name: str) -> tuple[int, ...]:
    """``layers=`` / ``heads=``: None (all), an index or a sequence of indices (negative from the end)."""
    if value is None:
        return tuple(range(total))
    items = [value] if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else value
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence) or not items:
        raise ArgumentError(f"{name} must be None, an index or a non-empty list of indices, got {value!r}")
    kept: list[int] = []
    for x in items:
        if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or not -total <= x < total:
            raise ArgumentError(f"{name} must be indices in 0..{total - 1} (the model has {total}), got {value!r}")
        if int(x) % total not in kept:
            kept.append(int(x) % total)
    return tuple(kept)


def check_text(text: Any) -> None:
    """``ArgumentError`` unless ``text`` is a non-empty string of valid Unicode: checked before a
    model loads. A lone surrogate comes from invalid UTF-8 (Python keeps the bad bytes as
    surrogates, e.g. on the command line) or half a UTF-16 pair; tokenizers raise a ``TypeError``."""
    if not isinstance(text, str):
        raise ArgumentError(f"text must be a string, got {type(text).__name__}")
    if not text.strip():
        raise ArgumentError("text is empty: give a sentence to inspect")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        code = ord(text[e.start])
        raise ArgumentError(
            f"text is not valid Unicode: character {e.start} is a lone surrogate (U+{code:04X}), "
            + ("from a byte that is not UTF-8" if 0xDC80 <= code <= 0xDCFF else "half of a UTF-16 pair")
            + ": give the text as UTF-8"
        ) from None


def tokenize(loaded: LoadedModel, text: str) -> tuple[list[int], list[str]]:
    """``(ids, tokens)`` of ``text`` as the model's tokenizer writes them, special tokens included;
    ``ArgumentError`` for a text ``check_text`` refuses, ``ModelError`` if there are more than the
    model takes or an id beyond its embeddings (a tokenizer that does not belong to the weights)."""
    check_text(text)
    ids = [int(i) for i in loaded.tokenizer(text, verbose=False)["input_ids"]]
    if not ids:
        raise ArgumentError(f"the tokenizer of {loaded.name!r} made no tokens of {text[:40]!r}")
    beyond = [j for j, i in enumerate(ids) if loaded.vocab_size and not 0 <= i < loaded.vocab_size]
    if beyond:
        # the embedding lookup would fail with an IndexError deep in torch
        j = beyond[0]
        token = loaded.tokenizer.convert_ids_to_tokens([ids[j]])[0]
        raise ModelError(
            f"the tokenizer of {loaded.name!r} gives token {j} ({str(token)[:40]!r}) the id {ids[j]}, beyond the "
            f"model's {loaded.vocab_size} embeddings: its tokenizer does not belong to its weights"
        )
    if len(ids) > loaded.max_tokens:
        raise ModelError(
            f"the text is {len(ids)} tokens long; {loaded.name} takes at most {loaded.max_tokens} "
            f"({loaded.limit_reason}): shorten the text"
        )
    return ids, [str(t) for t in loaded.tokenizer.convert_ids_to_tokens(ids)]


def _separators(loaded: LoadedModel, ids: list[int]) -> tuple[int, ...]:
    tok = loaded.tokenizer
    marks = {getattr(tok, "sep_token_id", None), getattr(tok, "eos_token_id", None)} - {None}
    marks.discard(getattr(tok, "pad_token_id", None))
    return tuple(j for j, i in enumerate(ids) if j > 0 and i in marks)


def forward(loaded: LoadedModel, ids: list[int]) -> list[_capture.CapturedCall]:
    """Run the model once on ``ids`` and return each attention layer's call, in order."""
    import torch

    model = loaded.model
    # ids and an all-ones mask only: every model defaults the rest (BERT's token types to zeros);
    # GPT-2 would add token-type embeddings if given any
    inputs = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
    with loaded.lock, _capture.record() as calls, torch.no_grad():
        model(**inputs, output_attentions=True)
    if not calls:
        raise ModelError(
            interface_problem(model)
            or f"{loaded.architecture}'s attention layers never called qkv: "
            "they bypass transformers' attention interface"
        )
    if loaded.n_layers and len(calls) != loaded.n_layers:
        raise ModelError(
            f"{loaded.architecture} made {len(calls)} attention calls for its {loaded.n_layers} layers; "
            "qkv.inspect reads models with one self-attention call per layer"
        )
    heads = {c.query.shape[0] for c in calls}
    if len(heads) != 1:
        raise ModelError(f"{loaded.architecture}'s layers have different numbers of heads ({sorted(heads)})")
    return calls


def inspect(text: str, model: Any = None, *, layers: Any = None, heads: Any = None) -> Inspection:
    """Look inside a real transformers model: run it once on ``text`` with qkv as its attention and
    return the ``Inspection`` (tokens, weights per layer and head, entropy, head patterns, rollout).

    ``model``: None for the all-MiniLM-L6-v2 of the ``qkv[model]`` extra, a model folder, a
    Hugging Face hub name, or a ``qkv.inspect.load_model(...)`` result; a model is loaded once per
    process. ``layers`` / ``heads``: an index or a list of indices to keep (default all); the
    rollout always uses every layer and head. Encoders and decoders whose attention goes through
    transformers' attention interface are supported (``ModelError`` names an architecture that
    is not, and a text longer than the model takes); without the extra, ``MissingExtra`` says what
    to install.

    >>> insp = qkv.inspect("The cat sat on the mat.")
    >>> insp.weights.shape          # (layers, heads, N, N)
    (6, 12, 9, 9)
    >>> insp.heads[0].label
    """
    check_text(text)  # before a model loads for tens of seconds
    loaded = load_model(model)
    ids, tokens = tokenize(loaded, text)
    calls = forward(loaded, ids)
    n_heads = calls[0].query.shape[0]
    layer_ids, head_ids = _select(layers, len(calls), "layers"), _select(heads, n_heads, "heads")
    every = np.stack([c.weights for c in calls])  # (L, H, N, N)
    kept = [calls[i] for i in layer_ids]
    h = list(head_ids)

    def per_query_head(x: np.ndarray) -> np.ndarray:  # grouped kv heads: each serves n_heads / Hkv query heads
        return np.repeat(x, n_heads // x.shape[0], axis=0)[h]

    weights = every[list(layer_ids)][:, h].astype(np.float32)
    allowed = np.stack([c.allowed for c in kept])
    separators = _separators(loaded, ids)
    ent = entropy(weights, mask=allowed[:, None])
    patterns = head_patterns(weights, allowed[:, None], separators)
    summaries = [
        HeadSummary(
            layer=layer,
            head=head,
            pattern=p.pattern,
            score=p.score,
            param=p.param,
            label=describe(p.pattern, p.param, tokens, separators),
            entropy=p.scores["broad"],
            scores=p.scores,
        )
        for layer, row in zip(layer_ids, patterns, strict=True)
        for head, p in zip(head_ids, row, strict=True)
    ]
    causal = bool(all(not np.triu(c.allowed, 1).any() for c in calls)) and len(ids) > 1
    return Inspection(
        text=text,
        model=loaded.name,
        architecture=loaded.architecture,
        tokens=tokens,
        token_ids=ids,
        separators=separators,
        n_layers=len(calls),
        n_heads=n_heads,
        layer_ids=layer_ids,
        head_ids=head_ids,
        causal=causal,
        weights=weights,
        allowed=allowed,
        entropy=np.asarray(ent.nats, dtype=np.float32),
        head_entropy=np.array([s.entropy for s in summaries], dtype=np.float32).reshape(len(layer_ids), len(h)),
        heads=summaries,
        rollout=rollout(every).astype(np.float32),
        q=np.stack([c.query[h] for c in kept]),
        k=np.stack([per_query_head(c.key) for c in kept]),
        v=np.stack([per_query_head(c.value) for c in kept]),
        scaling=np.array([c.scaling for c in kept]),
        softcap=tuple(c.softcap for c in kept),
    )
