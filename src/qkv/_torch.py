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
