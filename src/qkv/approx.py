"""Approximate attention: linear attention, Performer (FAVOR+), Linformer; and sparse recipes.

Each trades accuracy for speed; ``qkv.diagnostics.compare`` and ``kl`` measure how much a given
input loses (BENCHMARKS.md, "Accuracy versus speed of the approximations"). Shapes and kinds
follow ``qkv.attention``: ``q (*B, H, Nq, Dk)``, ``k (*B, Hkv, Nk, Dk)``, ``v (*B, Hkv, Nk, Dv)``
-> ``(*B, H, Nq, Dv)``, grouped heads (``H % Hkv == 0``) without copying K or V, NumPy in ->
NumPy out, torch in -> torch out with autograd; half precision computes in float32.
``causal=True`` is bottom-right aligned like ``qkv.attention`` (query ``i`` sees ``j <= i + Nk - Nq``).

- ``linear_attention``: ``φ(q)(φ(k)ᵀ V) / φ(q)(φ(k)ᵀ 1)``, ``φ = elu + 1`` (Katharopoulos et al.,
  arXiv:2006.16236), O(N·D²); not an approximation of softmax but a different kernel.
- ``performer``: FAVOR+ positive orthogonal random features whose inner products estimate
  ``exp(q·k / √Dk)`` without bias (Choromanski et al., arXiv:2009.14794): softmax attention
  with the default scale, approximately, in O(N·m·D).
- ``linformer``: exact attention over ``r`` projected keys and values (Wang et al.,
  arXiv:2006.04768), O(N·r·D).

Sparse patterns are *exact* attention under a ``qkv.masks.Mask``, run by the flash kernel,
which skips every tile the mask empties (measured in BENCHMARKS.md):

    >>> from qkv import masks
    >>> longformer = masks.sliding_window(256, causal=False) | masks.global_tokens([0])  # arXiv:2004.05150
    >>> out = qkv.attention(q, k, v, mask=longformer, impl="flash")
    >>> bigbird = longformer | masks.random_blocks(64, per_row=3, seed=0)  # arXiv:2007.14062
    >>> out = qkv.attention(q, k, v, mask=bigbird, impl="flash")

``qkv.diagnostics.mass_outside(weights, mask)`` tells how much exact attention mass a pattern
leaves out.
"""

from collections.abc import Callable
from typing import Any

import numpy as np

from . import _approx_features as features
from ._approx_linear import causal_linear, linear
from ._backend import as_array, compute_dtype, device, dtype_name, is_floating, namespace
from ._checks import check_qkv
from ._core import attention
from ._typing import Array, Dims
from .errors import ArgumentError, DTypeError, ShapeError


def _prepare(q: Array, k: Array, v: Array) -> tuple[Any, Dims, tuple[Array, Array, Array]]:
    """Namespace, validated sizes, and ``q, k, v`` in the compute dtype (float32 for half precision)."""
    xp = namespace(q=q, k=k, v=v)
    dims = check_qkv(q, k, v)
    ct = compute_dtype(xp, q)
    qc, kc, vc = (x if x.dtype == ct else xp.astype(x, ct) for x in (q, k, v))
    return xp, dims, (qc, kc, vc)


def _group(xp: Any, x: Array, dims: Dims) -> Array:
    """``(*B, H, N, F) -> (*B, Hkv, H/Hkv, N, F)`` for grouped heads, so K and V broadcast uncopied."""
    if not dims.grouped:
        return x
    return xp.reshape(x, (*x.shape[:-3], dims.hkv, dims.h // dims.hkv, *x.shape[-2:]))


def _ungroup(xp: Any, x: Array, dims: Dims) -> Array:
    if not dims.grouped:
        return x
    return xp.reshape(x, (*x.shape[:-4], dims.h, *x.shape[-2:]))


def _kernelised(xp: Any, dims: Dims, fq: Array, fk: Array, v: Array, causal: bool, like: Array) -> Array:
    fq = _group(xp, fq, dims)
    if dims.grouped:
        fk, v = xp.expand_dims(fk, axis=-3), xp.expand_dims(v, axis=-3)
    out = causal_linear(xp, fq, fk, v) if causal else linear(xp, fq, fk, v)
    return xp.astype(_ungroup(xp, out, dims), like.dtype, copy=False)


def _nothing(xp: Any, dims: Dims, like: Array) -> Array | None:
    """Nq = 0 or Nk = 0: zeros of the output shape (every row attends nothing); else None."""
    if dims.nq * dims.nk:
        return None
    return xp.zeros((*dims.score_shape[:-1], dims.dv), dtype=like.dtype, device=device(like))


def _flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise ArgumentError(f"{name} must be True or False, got {value!r}")
    return value


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
    causal = _flag(causal, "causal")
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
    causal = _flag(causal, "causal")
    if isinstance(n_features, bool) or not isinstance(n_features, int) or n_features < 1:
        raise ArgumentError(f"n_features must be a positive integer, got {n_features!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ArgumentError(f"seed must be a non-negative integer, got {seed!r}")
    empty = _nothing(xp, dims, q)
    if empty is not None:
        return empty
    w = features.projection(qc, n_features, seed, qc.dtype)
    fq, fk = features.favor_features(xp, qc, w, query=True), features.favor_features(xp, kc, w, query=False)
    return _kernelised(xp, dims, fq, fk, vc, causal, q)


def _check_projection(p: Any, name: str, k: Array, nk: int) -> Array:
    p = as_array(p, name)
    if p.ndim < 2 or p.shape[-1] != nk:
        raise ShapeError(
            f"{name} must have shape (r, Nk) = (r, {nk}) (or leading axes that broadcast), "
            f"got {tuple(p.shape)} (k: {tuple(k.shape)})"
        )
    try:
        np.broadcast_shapes(tuple(p.shape[:-2]), tuple(k.shape[:-2]))
    except ValueError:
        raise ShapeError(
            f"{name} has leading axes {tuple(p.shape[:-2])}, which do not broadcast with k's "
            f"{tuple(k.shape[:-2])} ({name}: {tuple(p.shape)}, k: {tuple(k.shape)})"
        ) from None
    if not is_floating(p) or dtype_name(p) != dtype_name(k):
        raise DTypeError(f"{name} has dtype {dtype_name(p)} but k has {dtype_name(k)}; cast {name} to k's dtype")
    return p


def linformer(q: Array, k: Array, v: Array, proj_k: Array, proj_v: Array) -> Array:
    """Exact attention over projected keys and values (Wang et al., arXiv:2006.04768).

    ``qkv.attention(q, proj_k @ k, proj_v @ v)`` with ``proj_k, proj_v: (r, Nk)`` (leading axes,
    e.g. one projection per head ``(H, r, Nk)``, broadcast): ``Nk`` keys become ``r`` mixtures
    of keys, so the score matrix is ``Nq x r``. The paper learns the projections; a fixed
    Gaussian ``N(0, 1/r)`` projection is its Johnson-Lindenstrauss baseline.

    >>> e = rng.standard_normal((64, n)) / 8.0
    >>> out = linformer(q, k, v, e, e)
    """
    q, k, v = as_array(q, "q"), as_array(k, "k"), as_array(v, "v")
    namespace(q=q, k=k, v=v, proj_k=proj_k, proj_v=proj_v)
    dims = check_qkv(q, k, v)
    pk, pv = _check_projection(proj_k, "proj_k", k, dims.nk), _check_projection(proj_v, "proj_v", k, dims.nk)
    if pk.shape[-2] != pv.shape[-2]:
        raise ShapeError(
            f"proj_k has r={pk.shape[-2]} rows on axis -2 but proj_v has r={pv.shape[-2]}; "
            f"the projected keys and values must pair up (proj_k: {tuple(pk.shape)}, "
            f"proj_v: {tuple(pv.shape)})"
        )
    return attention(q, pk @ k, pv @ v)
