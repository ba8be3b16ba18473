"""Feature maps for the kernelised attentions of ``qkv.approx``.

Linear attention (Katharopoulos et al., arXiv:2006.16236) replaces ``exp(q·k)`` by
``φ(q)·φ(k)`` with a deterministic ``φ`` (``elu + 1``, ``relu`` or a callable). FAVOR+
(Choromanski et al., arXiv:2009.14794) uses *positive random features*

    φ(x) = exp(ω·x' − |x'|²/2) / √m,   x' = x / Dk^(1/4),   ω₁ … ω_m ~ N(0, I_Dk)

whose expectation gives the softmax kernel exactly: ``E[φ(q)·φ(k)] = exp(q·k / √Dk)``. The ω
are drawn in blocks of ``Dk`` mutually orthogonal directions (orthogonal random features,
which lower the variance) with Gaussian lengths, so each ω is still marginally ``N(0, I)``.
"""

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .._backend import from_numpy, is_torch
from .._typing import Array
from ..errors import ArgumentError, ShapeError

FEATURE_MAPS = ("elu", "relu")


def elu_plus_one(xp: Any, x: Array) -> Array:
    """``elu(x) + 1``: ``x + 1`` for ``x > 0``, ``exp(x)`` otherwise; strictly positive until exp underflows.

    ``exp`` sees ``min(x, 0)`` so the branch ``where`` discards cannot overflow (no warning, and
    no ``inf · 0 = nan`` in autograd's backward).
    """
    return xp.where(x > 0, x + 1.0, xp.exp(xp.minimum(x, xp.zeros_like(x))))


def relu(xp: Any, x: Array) -> Array:
    return xp.maximum(x, xp.zeros_like(x))


def check_feature_map(fmap: Any) -> None:
    if (isinstance(fmap, str) and fmap not in FEATURE_MAPS) or not (isinstance(fmap, str) or callable(fmap)):
        shown = repr(fmap) if isinstance(fmap, str) else f"a {type(fmap).__name__}"
        raise ArgumentError(f"feature_map must be one of {list(FEATURE_MAPS)} or a callable, got {shown}")


def feature_map(xp: Any, fmap: str | Callable[[Array], Array], x: Array, name: str) -> Array:
    """``φ(x)`` for ``x (..., N, D)`` -> ``(..., N, F)``; a callable must keep every axis but the last."""
    check_feature_map(fmap)
    if fmap == "elu":
        return elu_plus_one(xp, x)
    if fmap == "relu":
        return relu(xp, x)
    f = fmap(x)  # type: ignore[operator]
    if not hasattr(f, "shape") or tuple(f.shape[:-1]) != tuple(x.shape[:-1]) or f.ndim != x.ndim:
        raise ShapeError(
            f"feature_map({name}) must map {name} {tuple(x.shape)} to (..., N, F) keeping every "
            f"axis but the last, got {getattr(f, 'shape', type(f).__name__)}"
        )
    if f.dtype != x.dtype:
        f = xp.astype(f, x.dtype)
    if bool(xp.any(f < 0)):  # a negative feature can make the normaliser zero or negative
        raise ArgumentError(
            f"feature_map({name}) returned negative features; linear attention normalises by "
            "φ(q)·Σφ(k), which needs φ >= 0"
        )
    return f


def orthogonal_gaussian(n_features: int, d: int, seed: int) -> np.ndarray:
    """``(n_features, d)`` float64: blocks of ``d`` orthogonal rows, each row's length drawn
    as the norm of a ``N(0, I_d)`` vector, so every row is marginally ``N(0, I_d)``.

    The sign fix ``Q · sign(diag R)`` makes ``Q`` Haar-distributed (a plain QR of a Gaussian
    matrix is not), which is what unbiasedness needs.
    """
    rng = np.random.default_rng(seed)
    blocks = []
    for _ in range(math.ceil(n_features / d)):
        qm, r = np.linalg.qr(rng.standard_normal((d, d)))
        blocks.append((qm * np.where(np.diag(r) < 0, -1.0, 1.0)).T)  # rows orthonormal
    w = np.concatenate(blocks, axis=0)[:n_features]
    lengths = np.linalg.norm(rng.standard_normal((n_features, d)), axis=1)
    return w * lengths[:, None]


def _stop_gradient(x: Array) -> Array:
    """A shift that cancels in the normalised output needs no gradient (torch: detached)."""
    return x.detach() if is_torch(x) else x


def favor_exponent(xp: Any, x: Array, w: Array) -> Array:
    """``ω·x' − |x'|²/2`` for every feature, ``x (..., N, D)``, ``w (m, D)`` -> ``(..., N, m)``."""
    x = x * (float(x.shape[-1]) ** -0.25)  # the 1/√Dk of softmax attention, split between q and k
    return x @ w.mT - xp.sum(x * x, axis=-1, keepdims=True) / 2.0


def projection(x: Array, n_features: int, seed: int, dtype: Any) -> Array:
    """The FAVOR+ projection for inputs like ``x``, in the library, device and ``dtype`` of ``x``."""
    return from_numpy(orthogonal_gaussian(n_features, int(x.shape[-1]), seed), x, dtype)


def favor_features(xp: Any, x: Array, w: Array, *, query: bool) -> Array:
    """Stabilised positive random features ``exp(ω·x' − |x'|²/2 − shift)``, ``(..., N, m)``.

    The shift is one constant per query row, and one per head for the keys (over every key and
    feature of it, "global" as in the paper's code, which takes it over the whole tensor; per
    head keeps one head's large scores from underflowing another's features). Each scales the
    numerator and the normaliser alike, so it cancels exactly while keeping ``exp`` from
    overflowing. For a query row ``|q'|²/2`` is such a constant too, so query features are just
    ``exp(ω·q' − max_m ω_m·q')``: the largest is 1. The ``1/√m`` of the estimator cancels as well.
    """
    x = x * (float(x.shape[-1]) ** -0.25)
    proj = x @ w.mT  # ω·x' for every feature
    row_max = xp.max(proj, axis=-1, keepdims=True)
    if query:
        return xp.exp(proj - _stop_gradient(row_max))
    half_sq = xp.sum(x * x, axis=-1, keepdims=True) / 2.0  # part of each key's kernel value: keeps its gradient
    top = _stop_gradient(xp.max(row_max - half_sq, axis=-2, keepdims=True))  # max exponent of the head
    return xp.exp(proj - (half_sq + top))
