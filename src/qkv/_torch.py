"""torch as a program has loaded it, never importing it (``import qkv`` never imports torch)."""

import sys
from typing import Any


def loaded() -> Any:
    """The ``torch`` module once its import has finished, else None.

    While another thread is still importing torch (the lab loads its model in the background),
    ``sys.modules`` already holds the half-built module, without ``torch.compiler`` or
    ``torch.Tensor`` yet: that is not a loaded torch, and no array of the call can be its tensor.
    Once loaded, torch is remembered: every call into the kernel asks (a decode step's budget is
    ~10 us, and the look-up costs ~0.1).
    """
    global _LOADED
    if _LOADED is not None:
        return _LOADED
    torch = sys.modules.get("torch")
    if torch is None or getattr(getattr(torch, "__spec__", None), "_initializing", False):
        return None
    _LOADED = torch
    return torch


_LOADED: Any = None


def compiling() -> bool:
    """Whether torch is tracing this code (``torch.compile`` / ``torch.export``)."""
    torch = loaded()
    return torch is not None and bool(torch.compiler.is_compiling())


_ANY_AUTOCAST: list[Any] = []
"""``torch._C._is_any_autocast_enabled``, looked up once."""


def autocast(q: Any, k: Any, v: Any) -> tuple[Any, Any, Any, Any]:
    """For torch tensors ``q, k, v``, ``(q, k, v, off)``: outside ``torch.autocast`` (for their
    device) the inputs as they are and ``off`` None; inside it, the inputs as autocast hands them
    to an op it computes in lower precision (SDPA among them: float32/float16/bfloat16 tensors in
    its dtype, float64 left alone) and ``off``, a context turning autocast off for the device,
    inside which qkv's own torch ops keep their precision (the reference's float32 accumulation
    stays float32)."""
    if not _ANY_AUTOCAST:  # called with torch tensors: torch is loaded
        _ANY_AUTOCAST.append(loaded()._C._is_any_autocast_enabled)
    if not _ANY_AUTOCAST[0]():  # the usual call: one cheap check (torch's tracer reads it too)
        return q, k, v, None
    torch = loaded()
    kind = q.device.type
    if not torch.is_autocast_enabled(kind):
        return q, k, v, None
    dtype = torch.get_autocast_dtype(kind)
    low = (torch.float32, torch.float16, torch.bfloat16)
    q, k, v = (  # a quantized cache (qkv.Quantized) as it is: its values are 8-bit, its scales float32
        x.to(dtype) if isinstance(x, torch.Tensor) and x.dtype in low and x.dtype != dtype else x for x in (q, k, v)
    )
    return q, k, v, torch.autocast(kind, enabled=False)
