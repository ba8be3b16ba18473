"""JSON-safe float32 values, shared by ``Inspection`` and ``Approximations``."""

from typing import Any

import numpy as np


def floats(x: np.ndarray) -> Any:
    """Nested lists of the float32 values (non-finite as None: strict JSON has no NaN)."""
    a = np.asarray(x, dtype=np.float32)
    return a.tolist() if np.isfinite(a).all() else _nulls(a)


def _nulls(a: np.ndarray) -> Any:
    if a.ndim == 0:
        return float(a) if np.isfinite(a) else None
    return [_nulls(x) for x in a]
