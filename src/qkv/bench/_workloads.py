"""Benchmark workloads: shapes, masks, inputs and the FLOPs they are worth.

Defaults follow the targets in benchmarks/LOG.md: B = 1, H = 8, D = 64, float32. Every workload has ``Nq = Nk = n``
except decoding (one query against an ``n``-long KV cache). FLOPs count only the (query, key)
pairs the mask allows ("entries"), so every implementation is credited with the same useful
work and GFLOP/s ratios equal speed ratios; ``count="tiles"`` counts instead the entries of
every tile the flash kernel keeps (its actual work, skipped tiles excluded).
"""

from typing import Any, NamedTuple

import numpy as np

from .. import masks
from ..complexity import flops as attention_flops
from ..complexity import mask_pairs, tile_pairs
from ..masks import Mask


class Unavailable(Exception):
    """A candidate cannot run a case; the message says why (it becomes the row's note)."""


WINDOW = 256
DOCUMENTS = 8
WORKLOADS = ("dense", "causal", "sliding", "document", "gqa", "decode", "decode-gqa", "dense-bf16")
MODES = ("fwd", "fwdbwd")


class Workload(NamedTuple):
    """One attention problem: ``q (b, h, nq, d)``, ``k, v (b, hkv, nk, d)`` and a mask."""

    name: str
    b: int
    h: int
    hkv: int
    nq: int
    nk: int
    d: int
    mask: Mask | None  # qkv's mask (masks.causal() itself for plain causal)
    window: int | None = None  # sliding window size (causal)
    doc_ids: np.ndarray | None = None  # document ids per position (with causal)

    @property
    def label(self) -> str:
        gqa = f" Hkv={self.hkv}" if self.hkv != self.h else ""
        return f"{self.name} B={self.b} H={self.h}{gqa} Nq={self.nq} Nk={self.nk} D={self.d}"

    @property
    def causal(self) -> bool:
        """True when the mask is exactly ``masks.causal()`` with Nq == Nk (SDPA's ``is_causal``)."""
        return self.mask is masks.causal() and self.nq == self.nk

    def dense_mask(self) -> np.ndarray | None:
        """The ``(nq, nk)`` boolean matrix (True = may attend), None when nothing is hidden."""
        return None if self.mask is None else np.array(self.mask.dense(self.nq, self.nk), dtype=bool)  # writable copy

    def input_bytes(self, itemsize: int = 4) -> int:
        """Bytes of q, k and v."""
        return itemsize * self.b * self.d * (self.h * self.nq + 2 * self.hkv * self.nk)

    def kv_bytes(self, itemsize: int = 4) -> int:
        """Bytes of k and v: what a decoding step must read at least once."""
        return itemsize * self.b * self.d * 2 * self.hkv * self.nk

    def score_bytes(self, itemsize: int = 4) -> int:
        """Bytes of one materialised ``(b, h, nq, nk)`` score matrix."""
        return itemsize * self.b * self.h * self.nq * self.nk


def workload(name: str, n: int, *, b: int = 1, h: int = 8, d: int = 64, hkv: int | None = None) -> Workload:
    """The named workload at sequence length ``n`` (the cache length for ``decode``).

    >>> workload("sliding", 8192).label
    'sliding B=1 H=8 Nq=8192 Nk=8192 D=64'
    """
    if name not in WORKLOADS:
        raise ValueError(f"workload must be one of {WORKLOADS}, got {name!r}")
    if n < 1:
        raise ValueError(f"n must be positive, got {n}")
    grouped = name in ("gqa", "decode-gqa")
    kv = hkv if hkv is not None else (max(1, h // 4) if grouped else h)
    nq = 1 if name.startswith("decode") else n
    if name in ("dense", "decode", "decode-gqa", "dense-bf16"):
        return Workload(name, b, h, kv, nq, n, d, None)
    if name in ("causal", "gqa"):
        return Workload(name, b, h, kv, nq, n, d, masks.causal())
    if name == "sliding":
        return Workload(name, b, h, kv, nq, n, d, masks.sliding_window(WINDOW), window=WINDOW)
    ids = np.arange(n) * DOCUMENTS // n  # DOCUMENTS equal (or nearly equal) packed documents
    return Workload(name, b, h, kv, nq, n, d, masks.document(ids) & masks.causal(), doc_ids=ids)


class Inputs(NamedTuple):
    q: Any
    k: Any
    v: Any
    dout: Any


def make_inputs(w: Workload, lib: str = "torch", *, grad: bool = False, seed: int = 0) -> Inputs:
    """Standard-normal float32 ``q, k, v`` and ``dout`` (the same numbers for NumPy and torch)."""
    rng = np.random.default_rng(seed)
    arrays = [
        rng.standard_normal((w.b, w.h, w.nq, w.d), dtype=np.float32),
        rng.standard_normal((w.b, w.hkv, w.nk, w.d), dtype=np.float32),
        rng.standard_normal((w.b, w.hkv, w.nk, w.d), dtype=np.float32),
        rng.standard_normal((w.b, w.h, w.nq, w.d), dtype=np.float32),
    ]
    if lib == "numpy":
        if w.name.endswith("-bf16"):
            raise Unavailable("NumPy has no bfloat16")
        return Inputs(*arrays)
    if lib != "torch":
        raise ValueError(f"lib must be 'numpy' or 'torch', got {lib!r}")
    import torch

    t = [torch.from_numpy(a) for a in arrays]
    if w.name.endswith("-bf16"):  # bfloat16 inputs (torch only: NumPy has no bfloat16)
        t = [a.to(torch.bfloat16) for a in t]
    if grad:
        for x in t[:3]:
            x.requires_grad_(True)
    return Inputs(*t)


def allowed_entries(w: Workload, block: int = 512) -> int:
    """(query, key) pairs the mask allows in one ``nq x nk`` head (``complexity``'s pair count)."""
    return mask_pairs(w.mask, w.nq, w.nk, block)


def kept_tile_entries(w: Workload, block_q: int, block_k: int) -> int:
    """Entries of the tiles that are not EMPTY (the flash kernel's work) in one head."""
    return tile_pairs(w.mask, w.nq, w.nk, block_q, block_k)[0]


def flops(w: Workload, mode: str = "fwd", count: str = "entries") -> float:
    """Floating-point operations (a multiply-add is 2) of attention on ``w``.

    The model is ``qkv.complexity``'s (``_model.flops``: ``2·(Dk + Dv)`` per pair and head
    forward, ``2·(3·Dk + 2·Dv)`` more backward, FlashAttention-2's convention,
    arXiv:2307.08691). ``count``: ``"entries"`` (pairs the mask allows) or ``"tiles"`` (pairs in
    tiles the flash kernel keeps at its default tile sizes).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if count == "entries":
        pairs = allowed_entries(w)
    elif count == "tiles":
        from .._impls import DEFAULT_TILES

        pairs = kept_tile_entries(w, *DEFAULT_TILES)
    else:
        raise ValueError(f"count must be 'entries' or 'tiles', got {count!r}")
    return float(attention_flops(w.b * w.h, pairs, w.d, w.d, backward=mode == "fwdbwd"))
