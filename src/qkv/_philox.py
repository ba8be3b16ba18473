"""Dropout masks from a counter-based generator, so a tiled backward pass can redraw them.

Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011) maps a
128-bit counter and a 64-bit key to four pseudo-random 32-bit words; the same counter always
gives the same words, in any order and any tiling. The mask of entry ``(b, h, i, j)`` (flattened
batch index, query head, query row, key column) under ``seed``:

    key     = (seed mod 2³², seed div 2³²)
    counter = (j div 4, i, h, b)            word j mod 4 of the four
    keep    = word >= T,  T = min(p · 2³², 2³² − 1)   (kept with probability 1 − p)

so the flash kernel (array and compiled engines alike) and the reference draw bit-identical
masks for one seed. Counters are 32 bits each: sizes up to 2³² per axis.
"""

from typing import Any

import numpy as np

M0, M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)  # Philox multipliers
W0, W1 = 0x9E3779B9, 0xBB67AE85  # Weyl key increments (golden ratio, sqrt(3) - 1)
MASK32 = np.uint64(0xFFFFFFFF)
ROUNDS = 10


def philox4x32(c0: np.ndarray, c1: np.ndarray, c2: np.ndarray, c3: np.ndarray, seed: int) -> tuple[np.ndarray, ...]:
    """The four output words (uint32 arrays, broadcast) of Philox4x32-10 for counters ``c0..c3``."""
    c = [np.asarray(x, dtype=np.uint64) & MASK32 for x in np.broadcast_arrays(c0, c1, c2, c3)]
    k0, k1 = seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF
    for r in range(ROUNDS):
        if r:
            k0, k1 = (k0 + W0) & 0xFFFFFFFF, (k1 + W1) & 0xFFFFFFFF
        p0, p1 = M0 * c[0], M1 * c[2]  # 32 x 32 -> 64-bit products: (hi, lo) halves
        c = [
            (p1 >> np.uint64(32)) ^ c[1] ^ np.uint64(k0),
            p1 & MASK32,
            (p0 >> np.uint64(32)) ^ c[3] ^ np.uint64(k1),
            p0 & MASK32,
        ]
    return tuple(x.astype(np.uint32) for x in c)


def threshold(p: float) -> np.uint32:
    """``T``: a 32-bit word keeps its entry iff it is at least ``T`` (probability ``1 - p``)."""
    return np.uint32(min(p * 2.0**32, 2.0**32 - 1))


def keep_mask(seed: int, p: float, b: Any, h: Any, i: Any, j: Any) -> np.ndarray:
    """Boolean keep mask of the entries at broadcasting int index arrays ``b, h, i, j``."""
    j = np.asarray(j, dtype=np.int64)
    words = philox4x32(j >> 2, np.asarray(i, dtype=np.int64), np.asarray(h, dtype=np.int64), np.asarray(b), seed)
    lane = j & 3
    w = np.where(lane == 0, words[0], np.where(lane == 1, words[1], np.where(lane == 2, words[2], words[3])))
    return w >= threshold(p)


def index_grids(lead: tuple[int, ...], has_heads: bool) -> tuple[np.ndarray, np.ndarray]:
    """``b (*B, 1, 1, 1)`` (flattened batch index) and ``h (H, 1, 1)`` for scores ``(*lead, Nq, Nk)``."""
    if not has_heads:
        return np.zeros((), np.int64), np.zeros((), np.int64)
    *batch, heads = lead
    n = int(np.prod(batch, dtype=np.int64)) if batch else 1
    b = np.arange(n, dtype=np.int64).reshape(*batch, 1, 1, 1) if batch else np.zeros((), np.int64)
    return b, np.arange(heads, dtype=np.int64).reshape(heads, 1, 1)
