"""Linformer: exact attention over ``r`` projected keys and values (Wang et al., arXiv:2006.04768)."""

from typing import Any

import numpy as np

from .._backend import as_array, dtype_name, is_floating, namespace
from .._checks import check_qkv
from .._core import attention
from .._typing import Array
from ..errors import DTypeError, ShapeError


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
