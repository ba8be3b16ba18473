"""One forward pass through qkv's transformers backend, keeping what every attention layer saw.

``install()`` registers qkv with transformers under the name ``BACKEND`` (``qkv.integrations.
transformers.register``, the reference implementation, which materialises the weights) and
wraps the registered attention function: while a recording is active in the current thread
(``record``), each call appends its query, key, value, mask, scale and the weights qkv returned.
The model is asked for its attentions (``output_attentions=True``) so the backend returns the
weights of the very computation that produced the output: no second, eager forward.
"""

import contextvars
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import numpy as np

BACKEND = "qkv-inspect"
"""The attention implementation name the inspected models are loaded with."""

_recorder: contextvars.ContextVar[list["CapturedCall"] | None] = contextvars.ContextVar(
    "qkv_inspect_recorder", default=None
)
_installed = threading.Lock()


class CapturedCall(NamedTuple):
    """One attention layer's call, batch axis dropped, as float32 NumPy: ``query (H, N, D)``,
    ``key``/``value (Hkv, N, D)``, ``weights (H, N, N)``, ``allowed (N, N)`` (True = may attend),
    the score ``scaling`` and the ``softcap`` (None without one)."""

    query: np.ndarray
    key: np.ndarray
    value: np.ndarray
    weights: np.ndarray
    allowed: np.ndarray
    scaling: float
    softcap: float | None


def _numpy(x: Any) -> np.ndarray:
    return np.asarray(x.detach().float().cpu().numpy()[0])


def _allowed(mask: Any, is_causal: Any, nq: int, nk: int) -> np.ndarray:
    """The keys each query of the first sequence may attend ``(nq, nk)``, True = may attend, by the
    rule qkv's backend applies (``layer_mask``, the one rule both read)."""
    import torch

    from ..integrations.transformers import layer_mask
    from ..masks import Mask

    m, causal = layer_mask(mask, nk, is_causal)
    if m is None:
        full = np.ones((nq, nk), dtype=bool)
        return np.tril(full, nk - nq) if causal else full
    if isinstance(m, Mask):
        return np.asarray(m.dense(nq, nk), dtype=bool).reshape(-1, nq, nk)[0]
    first = m.reshape(-1, *m.shape[-2:])[0].detach().cpu()  # (B, 1|H, Lq, Lk): the first sequence, head
    allowed = first if first.dtype == torch.bool else first > -float("inf")  # a float bias hides keys with -inf
    return np.asarray(allowed.numpy(), dtype=bool)


def _capturing(base: Any) -> Any:
    def qkv_inspect_attention(
        module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any
    ) -> tuple[Any, Any]:
        calls = _recorder.get()
        if calls is None:
            return base(module, query, key, value, attention_mask, **kwargs)
        kwargs["output_attentions"] = True  # the backend returns the weights it computed
        out, weights = base(module, query, key, value, attention_mask, **kwargs)
        nq, nk, d = query.shape[-2], key.shape[-2], query.shape[-1]
        scaling = kwargs.get("scaling")
        calls.append(
            CapturedCall(
                query=_numpy(query),
                key=_numpy(key),
                value=_numpy(value),
                weights=_numpy(weights),
                allowed=_allowed(attention_mask, kwargs.get("is_causal"), nq, nk),
                scaling=float(d**-0.5 if scaling is None else scaling),
                softcap=None if kwargs.get("softcap") is None else float(kwargs["softcap"]),
            )
        )
        return out, weights

    qkv_inspect_attention._qkv_inspect = True  # type: ignore[attr-defined]
    return qkv_inspect_attention


def install() -> None:
    """Register the capturing backend with transformers as ``BACKEND`` (once per process)."""
    from transformers import AttentionInterface

    from ..integrations.transformers import register

    with _installed:
        if getattr(AttentionInterface._global_mapping.get(BACKEND), "_qkv_inspect", False):
            return
        register(BACKEND, impl="reference")
        AttentionInterface.register(BACKEND, _capturing(AttentionInterface()[BACKEND]))


@contextmanager
def record() -> Iterator[list[CapturedCall]]:
    """Collect the attention calls of the forward passes run in this block (this thread only)."""
    calls: list[CapturedCall] = []
    token = _recorder.set(calls)
    try:
        yield calls
    finally:
        _recorder.reset(token)
