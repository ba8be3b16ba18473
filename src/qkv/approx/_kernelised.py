"""Kernelised attention: ``φ(q)(φ(k)ᵀ V) / φ(q)(φ(k)ᵀ 1)`` for a feature map ``φ``.

``linear_attention`` (Katharopoulos et al., arXiv:2006.16236) uses a fixed ``φ``; ``performer``
(Choromanski et al., arXiv:2009.14794) random features that estimate the softmax kernel.
"""

from collections.abc import Callable
from typing import Any

from .._backend import as_array, compute_dtype, device, namespace
from .._checks import check_flag, check_int, check_qkv
from .._heads import merge_heads, split_heads
from .._softmax import empty_result
from .._typing import Array, Dims
from ..errors import ShapeError
from . import _features as features
from ._sums import causal_linear, linear


def _prepare(q: Array, k: Array, v: Array) -> tuple[Any, Dims, tuple[Array, Array, Array]]:
    """Namespace, validated sizes, and ``q, k, v`` in the compute dtype (float32 for half precision)."""
    xp = namespace(q=q, k=k, v=v)
    dims = check_qkv(q, k, v)
    ct = compute_dtype(xp, q)
    qc, kc, vc = (x if x.dtype == ct else xp.astype(x, ct) for x in (q, k, v))
    return xp, dims, (qc, kc, vc)


def _kernelised(xp: Any, dims: Dims, fq: Array, fk: Array, v: Array, causal: bool, like: Array) -> Array:
    fq = split_heads(xp, fq, dims)
    if dims.grouped:
        fk, v = xp.expand_dims(fk, axis=-3), xp.expand_dims(v, axis=-3)
    out = causal_linear(xp, fq, fk, v) if causal else linear(xp, fq, fk, v)
    return xp.astype(merge_heads(xp, out, dims), like.dtype, copy=False)


def _nothing(xp: Any, dims: Dims, like: Array) -> Array | None:
    """Nq = 0 or Nk = 0: zeros of the output shape (every row attends nothing); else None."""
    if dims.nq * dims.nk:
        return None
    lead = dims.score_shape[:-1]
    return empty_result(xp, lead, dims.nk, dims.dv, like.dtype, like.dtype, device(like), weights=False).out


def linear_attention(
    q: Array, k: Array, v: Array, feature_map: str | Callable[[Array], Array] = "elu", causal: bool = False
) -> Array:
    """Linear attention ``φ(q)(φ(k)ᵀ V) / φ(q)(φ(k)ᵀ 1)`` (Katharopoulos et al., arXiv:2006.16236).

    ``feature_map``: ``"elu"`` (``elu(x) + 1``, positive), ``"relu"``, or a callable mapping
    ``(..., N, Dk)`` to non-negative features ``(..., N, F)`` (negative features raise
    ``ArgumentError``: the normaliser needs ``φ >= 0``). φ is applied to unscaled ``q`` and ``k``.
    ``causal=True`` uses chunked prefix sums: O(N·F·Dv) time and no ``N x N`` matrix. A row whose
    normaliser is exactly 0 (e.g. all-zero relu features) gives zeros, like an empty row.

    >>> out = linear_attention(q, k, v, causal=True)
    """
    q, k, v = as_array(q, "q"), as_array(k, "k"), as_array(v, "v")
    xp, dims, (qc, kc, vc) = _prepare(q, k, v)
    causal = check_flag(causal, "causal")
    features.check_feature_map(feature_map)
    empty = _nothing(xp, dims, q)
    if empty is not None:
        return empty
    fq, fk = features.feature_map(xp, feature_map, qc, "q"), features.feature_map(xp, feature_map, kc, "k")
    if fq.shape[-1] != fk.shape[-1]:
        raise ShapeError(
            f"feature_map gave F={fq.shape[-1]} features for q but F={fk.shape[-1]} for k "
            f"(q features: {tuple(fq.shape)}, k features: {tuple(fk.shape)})"
        )
    return _kernelised(xp, dims, fq, fk, vc, causal, q)


def performer(q: Array, k: Array, v: Array, n_features: int = 256, seed: int = 0, causal: bool = False) -> Array:
    """Softmax attention (scale ``1/√Dk``) approximated by FAVOR+ (Choromanski et al., arXiv:2009.14794).

    ``n_features`` positive orthogonal random features ``φ(x) = exp(ω·x' − |x'|²/2)`` with
    ``x' = x / Dk^(1/4)``, drawn from ``seed`` (NumPy's generator, so NumPy and torch inputs get
    the same features); ``E[φ(q)·φ(k)] = exp(q·k/√Dk)``. The error falls like
    ``1/√n_features``. Stabilised against overflow by subtracting a maximum from the exponents
    (per row for queries, per head for keys), which cancels exactly in the normalised output.
    ``causal=True`` uses chunked prefix sums (bottom-right, like ``qkv.attention``).

    >>> out = performer(q, k, v, n_features=256, seed=0)
    """
    q, k, v = as_array(q, "q"), as_array(k, "k"), as_array(v, "v")
    xp, dims, (qc, kc, vc) = _prepare(q, k, v)
    causal = check_flag(causal, "causal")
    n_features = check_int(n_features, "n_features", minimum=1)
    seed = check_int(seed, "seed", minimum=0)
    empty = _nothing(xp, dims, q)
    if empty is not None:
        return empty
    w = features.projection(qc, n_features, seed, qc.dtype)
    fq, fk = features.favor_features(xp, qc, w, query=True), features.favor_features(xp, kc, w, query=False)
    return _kernelised(xp, dims, fq, fk, vc, causal, q)
