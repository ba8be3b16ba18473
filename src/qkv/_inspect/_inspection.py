"""``Inspection``: what one forward pass of a real model showed, and ``HeadSummary``, one head's pattern.

Arrays are NumPy float32 (the model's precision); ``to_dict()`` turns them into nested lists of
the same float32 values, so JSON numbers equal the arrays exactly.
"""

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ArgumentError
from ._approx import approximate
from ._json import floats as _floats


@dataclass(frozen=True)
class HeadSummary:
    """One head's dominant pattern: ``pattern`` (``qkv.inspect.PATTERNS``), its ``score`` in [0, 1],
    ``param`` (offset or window size), a human ``label`` (``"previous token"``, ``"window 3"``,
    ``"separator ([SEP])"``), the head's mean normalised ``entropy`` and every pattern's ``scores``."""

    layer: int
    head: int
    pattern: str
    score: float
    param: int | None
    label: str
    entropy: float
    scores: dict[str, float] = field(repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "head": self.head,
            "pattern": self.pattern,
            "score": self.score,
            "param": self.param,
            "label": self.label,
            "entropy": self.entropy,
            "scores": dict(self.scores),
        }


@dataclass(frozen=True, eq=False, repr=False)
class Inspection:
    """What ``qkv.inspect(text, model)`` saw in one forward pass.

    - ``tokens`` (N strings, as the tokenizer wrote them), ``token_ids``, ``separators`` (positions
      of separator tokens such as [SEP] or EOS, the first position excluded);
    - ``layer_ids``, ``head_ids``: which of the model's ``n_layers`` x ``n_heads`` are kept (the
      ``layers=`` and ``heads=`` of ``qkv.inspect``); the arrays below index them in that order;
    - ``weights (layers, heads, N, N)``: the attention weights qkv computed (rows are queries and
      sum to 1 over the allowed keys); ``allowed (layers, N, N)``: the model's mask (True = may
      attend; lower-triangular for a ``causal`` decoder);
    - ``entropy (layers, heads, N)``: each row's entropy in nats; ``head_entropy (layers, heads)``:
      each head's mean normalised entropy (1 = uniform, 0 = one key per row);
    - ``heads``: a ``HeadSummary`` per kept head, layer by layer;
    - ``rollout (N, N)``: attention rollout over every layer and head of the model (``rollout``);
    - ``q (layers, heads, N, Dk)``, ``k``, ``v`` (grouped key/value heads repeated to one per
      query head) and ``scaling (layers,)``: what each head computed with, for ``approximations``.
    """

    text: str
    model: str
    architecture: str
    tokens: list[str]
    token_ids: list[int]
    separators: tuple[int, ...]
    n_layers: int
    n_heads: int
    layer_ids: tuple[int, ...]
    head_ids: tuple[int, ...]
    causal: bool
    weights: np.ndarray
    allowed: np.ndarray
    entropy: np.ndarray
    head_entropy: np.ndarray
    heads: list[HeadSummary]
    rollout: np.ndarray
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    scaling: np.ndarray
    softcap: tuple[float | None, ...]

    def index(self, layer: int, head: int) -> tuple[int, int]:
        """Where the model's ``layer`` and ``head`` sit in the arrays (``ArgumentError`` if not kept)."""
        for name, value, kept in (("layer", layer, self.layer_ids), ("head", head, self.head_ids)):
            if value not in kept:
                raise ArgumentError(f"{name} {value} was not inspected (kept: {', '.join(map(str, kept))})")
        return self.layer_ids.index(layer), self.head_ids.index(head)

    def head(self, layer: int, head: int) -> np.ndarray:
        """The ``(N, N)`` weights of the model's ``layer`` and ``head``."""
        li, hi = self.index(layer, head)
        return self.weights[li, hi]

    def summary(self, layer: int, head: int) -> HeadSummary:
        """The ``HeadSummary`` of the model's ``layer`` and ``head``."""
        li, hi = self.index(layer, head)
        return self.heads[li * len(self.head_ids) + hi]

    def approximations(
        self,
        window: int = 8,
        *,
        global_tokens: tuple[int, ...] = (0,),
        block: int = 4,
        per_row: int = 1,
        n_features: int = 64,
        rank: int = 8,
        seed: int = 0,
    ) -> Any:
        """What an approximation would lose on this input, per kept head: an ``Approximations``.

        Each head's exact attention (its own q, k, v, scale and mask, in float64) against
        ``window``: ``qkv.masks.sliding_window(window)`` (causal for a decoder); ``longformer``:
        that window ``| global_tokens(global_tokens)``; ``bigbird``: that ``| random_blocks(block,
        per_row, seed)``; ``performer``: FAVOR+ with ``n_features`` features from ``seed``;
        ``linformer``: keys projected onto their top ``rank`` principal directions and the value
        projection fitted by least squares to this head's weights (not for causal models).
        """
        return approximate(
            self,
            window=window,
            global_tokens=global_tokens,
            block=block,
            per_row=per_row,
            n_features=n_features,
            rank=rank,
            seed=seed,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: every field but ``q``, ``k``, ``v``; arrays as nested lists of float32 values."""
        return {
            "model": self.model,
            "architecture": self.architecture,
            "text": self.text,
            "tokens": list(self.tokens),
            "token_ids": list(self.token_ids),
            "separators": list(self.separators),
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "layer_ids": list(self.layer_ids),
            "head_ids": list(self.head_ids),
            "causal": self.causal,
            "weights": _floats(self.weights),
            "allowed": np.asarray(self.allowed, dtype=bool).tolist(),
            "entropy": _floats(self.entropy),
            "head_entropy": _floats(self.head_entropy),
            "heads": [h.to_dict() for h in self.heads],
            "rollout": _floats(self.rollout),
            "scaling": [float(s) for s in self.scaling],
        }

    def __repr__(self) -> str:
        n = len(self.tokens)
        return (
            f"Inspection({self.model!r}: {n} tokens, {len(self.layer_ids)} of {self.n_layers} layers x "
            f"{len(self.head_ids)} of {self.n_heads} heads{', causal' if self.causal else ''})"
        )
