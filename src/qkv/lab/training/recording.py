"""What a training run records, kept compactly: loss and accuracy per step, and the probe's
attention maps (every layer and head) as ``uint16`` arrays in units of 10⁻⁴ (the four decimals the
browser was always sent; ``NONFINITE`` marks a diverged run's NaN). ``Frames`` keeps at most
``Limits.max_frames_per_run`` maps and ``Limits.max_frame_values_per_run`` numbers in them: when a
run records more, it keeps every k-th recorded map (k doubling as needed) and always the newest.
"""

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

UNIT = 10_000  # a recorded weight is stored as round(w * UNIT): the four decimals sent to the browser
NONFINITE = np.iinfo(np.uint16).max  # a NaN or ±inf weight (a diverged run), sent as null
_CELL = np.full(NONFINITE + 1, "null", dtype=object)  # the JSON text of every stored value
_CELL[: UNIT + 1] = [json.dumps(round(k / UNIT, 4)) for k in range(UNIT + 1)]


def quantize(weights: Sequence[np.ndarray]) -> np.ndarray:
    """One recorded frame, ``(layers, H, T, T)`` ``uint16`` from the per-layer ``(H, T, T)`` maps."""
    w = np.stack([np.asarray(x, dtype=np.float64) for x in weights])
    finite = np.isfinite(w)
    q = np.rint(np.clip(np.where(finite, w, 0.0), 0.0, 1.0) * UNIT).astype(np.uint16)
    q[~finite] = NONFINITE
    return q


def frame_json(q: np.ndarray) -> str:
    """A stored frame as nested JSON lists (strict JSON: ``null`` for non-finite weights)."""
    items: list[str] = list(_CELL[q.ravel()])
    for size in reversed(q.shape):  # join the innermost axis first
        items = ["[" + ",".join(items[i : i + size]) + "]" for i in range(0, len(items), size)]
    return items[0]


def json_number(x: float) -> float | None:
    """A recorded float for JSON: ``None`` (``null``) for NaN."""
    return None if math.isnan(x) else x


def finite_value(x: Any) -> float:
    """A loss or an accuracy; NaN when a diverged run made it NaN or ±inf (sent as ``null``)."""
    return float(x) if x is not None and np.isfinite(x) else math.nan


class Frames:
    """The attention maps a run keeps: every ``stride``-th recorded one (``stride`` doubles when
    more than ``cap`` would be kept) and the newest."""

    def __init__(self, max_frames: int, max_values: int) -> None:
        self.max_frames, self.max_values = max(2, max_frames), max_values
        self.recorded, self.stride = 0, 1
        self.kept: dict[int, tuple[int, np.ndarray]] = {}  # step -> (recorded index, maps)
        self.newest: tuple[int, np.ndarray] | None = None  # (step, maps)

    def add(self, step: int, maps: np.ndarray) -> None:
        n, self.recorded = self.recorded, self.recorded + 1
        self.newest = (step, maps)
        if n % self.stride == 0:
            self.kept[step] = (n, maps)
        cap = max(2, min(self.max_frames, self.max_values // max(1, maps.size)))
        while len(self.kept) + (step not in self.kept) > cap:  # the first recorded map always stays
            self.stride *= 2
            self.kept = {s: (i, m) for s, (i, m) in self.kept.items() if i % self.stride == 0}

    def snapshot(self) -> dict[int, np.ndarray]:
        """``{step: maps}`` of every kept frame, in step order."""
        out = {s: m for s, (_, m) in self.kept.items()}
        if self.newest is not None:
            out[self.newest[0]] = self.newest[1]
        return dict(sorted(out.items()))

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m in self.snapshot().values())
