"""Scoring functions beyond the dot product, with their analytic backward passes.

- ``general``: Luong's bilinear score ``q W kᵀ`` (Luong et al., arXiv:1508.04025, "general");
- ``additive``: Bahdanau's score ``vᵀ tanh(W_q q_i + W_k k_j)`` (Bahdanau et al.,
  arXiv:1409.0473, the "alignment model" of §3.1).

Each returns raw scores ``(..., Nq, Nk)`` that softmax and ``A V`` then use (no scale, no mask).
``q (..., Nq, Dq)``, ``k (..., Nk, Dk)``; leading axes broadcast. NumPy in -> NumPy out, torch in
-> torch out; half precision is computed in float32.

Memory: ``additive`` needs the ``(..., Nq, Nk, Da)`` tensor ``tanh(W_q q_i + W_k k_j)``. It is
built ``CHUNK`` elements at a time over query rows, both forward and backward, and under torch
autograd one ``torch.autograd.Function`` saves only the inputs and recomputes the chunks in
backward, so the peak extra memory is ``O(CHUNK + Nq·Nk)`` rather than ``O(Nq·Nk·Da)``.
"""

import math
from functools import cache
from typing import Any

import numpy as np

from .._backend import as_array, compute_dtype, dtype_name, is_floating, is_torch, namespace, unbroadcast
from .._typing import Array
from ..errors import DTypeError, ShapeError

CHUNK = 1 << 22
"""Elements of the ``(rows, Nk, Da)`` tanh tensor built at once by ``additive`` (16 MiB in float32)."""


def _inputs(names: tuple[str, ...], arrays: tuple[Any, ...]) -> tuple[Any, tuple[Array, ...], Any]:
    """``(xp, arrays cast to the compute dtype, the input dtype)`` after the kind and dtype checks."""
    arrays = tuple(as_array(a, n) for n, a in zip(names, arrays, strict=True))
    xp = namespace(**dict(zip(names, arrays, strict=True)))
    for n, a in zip(names, arrays, strict=True):
        if not is_floating(a):
            raise DTypeError(f"{n} has dtype {dtype_name(a)}; scoring functions need floating-point inputs")
    if len({dtype_name(a) for a in arrays}) > 1:
        listed = ", ".join(f"{n}: {dtype_name(a)}" for n, a in zip(names, arrays, strict=True))
        raise DTypeError(f"inputs have different dtypes ({listed}); cast them to one dtype")
    ct = compute_dtype(xp, arrays[0])
    return xp, tuple(a if a.dtype == ct else xp.astype(a, ct) for a in arrays), arrays[0].dtype


def _shapes(**arrays: Array) -> str:
    return ", ".join(f"{n}: {tuple(a.shape)}" for n, a in arrays.items())


def _check_qk(q: Array, k: Array) -> tuple[int, ...]:
    """The broadcast leading axes of ``q`` and ``k``."""
    for n, a in (("q", q), ("k", k)):
        if a.ndim < 2:
            raise ShapeError(f"{n} has {a.ndim} axes but needs at least 2, (..., N, D) ({_shapes(q=q, k=k)})")
    try:
        return tuple(np.broadcast_shapes(tuple(q.shape[:-2]), tuple(k.shape[:-2])))
    except ValueError:
        raise ShapeError(f"q and k have leading axes that do not broadcast ({_shapes(q=q, k=k)})") from None


def _check_general(q: Array, k: Array, w: Array) -> None:
    _check_qk(q, k)
    if w.ndim != 2 or w.shape[0] != q.shape[-1] or w.shape[1] != k.shape[-1]:
        raise ShapeError(
            f"w must have shape (Dq, Dk) = ({q.shape[-1]}, {k.shape[-1]}) to match q's and k's last axes, "
            f"got {tuple(w.shape)} ({_shapes(q=q, k=k, w=w)})"
        )


def _check_additive(q: Array, k: Array, w_q: Array, w_k: Array, v: Array) -> None:
    _check_qk(q, k)
    shapes = _shapes(q=q, k=k, w_q=w_q, w_k=w_k, v=v)
    if v.ndim != 1:
        raise ShapeError(f"v must be a vector (Da,), got shape {tuple(v.shape)} ({shapes})")
    da = v.shape[0]
    for name, w, x, d in (("w_q", w_q, q, "Dq"), ("w_k", w_k, k, "Dk")):
        if w.ndim != 2 or w.shape[0] != da or w.shape[1] != x.shape[-1]:
            raise ShapeError(
                f"{name} must have shape (Da, {d}) = ({da}, {x.shape[-1]}) (Da from v, {d} from the last axis of "
                f"{name[2:]}), got {tuple(w.shape)} ({shapes})"
            )


def _sum_to_2d(xp: Any, g: Array) -> Array:
    """Sum every axis of ``g (..., a, b)`` but the last two: the gradient of a shared 2-D parameter."""
    return xp.sum(xp.reshape(g, (-1, *g.shape[-2:])), axis=0)


def general(q: Array, k: Array, w: Array) -> Array:
    """Luong's "general" score ``q W kᵀ``: ``q (..., Nq, Dq)``, ``k (..., Nk, Dk)``, ``w (Dq, Dk)``
    -> scores ``(..., Nq, Nk)``.

    >>> general(np.eye(2), np.eye(2), np.array([[1.0, 2.0], [3.0, 4.0]]))
    array([[1., 2.],
           [3., 4.]])
    """
    xp, (q, k, w), dtype = _inputs(("q", "k", "w"), (q, k, w))
    _check_general(q, k, w)
    s = (q @ w) @ k.mT
    return s if s.dtype == dtype else xp.astype(s, dtype)


def general_backward(dscores: Array, q: Array, k: Array, w: Array) -> tuple[Array, Array, Array]:
    """Gradients ``(dq, dk, dw)`` of ``general`` for the upstream gradient ``dscores (..., Nq, Nk)``.

    With ``S = q W kᵀ``: ``dq = dS k Wᵀ``, ``dk = dSᵀ q W``, ``dW = Σ qᵀ dS k`` (summed over the
    leading axes); broadcast axes of ``q`` and ``k`` are summed back.
    """
    xp, (ds, q, k, w), dtype = _inputs(("dscores", "q", "k", "w"), (dscores, q, k, w))
    _check_general(q, k, w)
    _check_dscores(ds, q, k)
    dq = unbroadcast(xp, (ds @ k) @ w.mT, tuple(q.shape))
    qw = q @ w
    dk = unbroadcast(xp, ds.mT @ qw, tuple(k.shape))
    dw = _sum_to_2d(xp, q.mT @ (ds @ k))
    return tuple(g if g.dtype == dtype else xp.astype(g, dtype) for g in (dq, dk, dw))


def _check_dscores(ds: Array, q: Array, k: Array) -> None:
    expected = (*_check_qk(q, k), q.shape[-2], k.shape[-2])
    if tuple(ds.shape) != expected:
        raise ShapeError(
            f"dscores has shape {tuple(ds.shape)} but the scores have shape {expected} ({_shapes(q=q, k=k)})"
        )


def _chunks(q: Array, k: Array, v: Array) -> range:
    """Starts of query-row chunks whose ``(..., rows, Nk, Da)`` tanh tensor holds about ``CHUNK`` elements."""
    per_row = math.prod(_check_qk(q, k)) * k.shape[-2] * v.shape[0]
    return range(0, max(q.shape[-2], 1), max(1, CHUNK // max(1, per_row)))


def _additive_forward(xp: Any, q: Array, k: Array, w_q: Array, w_k: Array, v: Array) -> Array:
    aq, ak = q @ w_q.mT, k @ w_k.mT  # (..., Nq, Da), (..., Nk, Da)
    starts = _chunks(q, k, v)
    rows, parts = starts.step, []
    for r in starts:
        t = xp.tanh(aq[..., r : r + rows, None, :] + ak[..., None, :, :])  # (..., rows, Nk, Da)
        parts.append(t @ v)
    return parts[0] if len(parts) == 1 else xp.concat(parts, axis=-2)


def _additive_grads(xp: Any, ds: Array, q: Array, k: Array, w_q: Array, w_k: Array, v: Array) -> tuple[Array, ...]:
    aq, ak = q @ w_q.mT, k @ w_k.mT
    starts = _chunks(q, k, v)
    rows, daq_parts, dak, dv = starts.step, [], None, None
    for r in starts:
        t = xp.tanh(aq[..., r : r + rows, None, :] + ak[..., None, :, :])  # (..., rows, Nk, Da)
        d_s = ds[..., r : r + rows, :, None]
        dv_part = xp.sum(xp.reshape(d_s * t, (-1, v.shape[0])), axis=0)  # dv = Σ dS · tanh
        g = d_s * v * (1 - t * t)  # d(pre-activation) = dS · v ∘ tanh'
        daq_parts.append(xp.sum(g, axis=-2))
        dak_part = xp.sum(g, axis=-3)
        dv = dv_part if dv is None else dv + dv_part
        dak = dak_part if dak is None else dak + dak_part
    daq = daq_parts[0] if len(daq_parts) == 1 else xp.concat(daq_parts, axis=-2)
    daq, dak = unbroadcast(xp, daq, tuple(aq.shape)), unbroadcast(xp, dak, tuple(ak.shape))
    dq, dk = daq @ w_q, dak @ w_k
    dw_q, dw_k = _sum_to_2d(xp, daq.mT @ q), _sum_to_2d(xp, dak.mT @ k)
    return dq, dk, dw_q, dw_k, dv


def additive(q: Array, k: Array, w_q: Array, w_k: Array, v: Array) -> Array:
    """Bahdanau's score ``s_ij = vᵀ tanh(W_q q_i + W_k k_j)`` -> ``(..., Nq, Nk)``.

    ``q (..., Nq, Dq)``, ``k (..., Nk, Dk)``, ``w_q (Da, Dq)``, ``w_k (Da, Dk)``, ``v (Da,)``.
    Builds ``tanh(...)`` in chunks of query rows (see the module docstring for memory); torch
    tensors get a custom autograd node whose backward is ``additive_backward``.
    """
    xp, (q, k, w_q, w_k, v), dtype = _inputs(("q", "k", "w_q", "w_k", "v"), (q, k, w_q, w_k, v))
    _check_additive(q, k, w_q, w_k, v)
    if is_torch(q) and _needs_grad(q, k, w_q, w_k, v):
        s = _additive_function().apply(q, k, w_q, w_k, v)
    else:
        s = _additive_forward(xp, q, k, w_q, w_k, v)
    return s if s.dtype == dtype else xp.astype(s, dtype)


def additive_backward(
    dscores: Array, q: Array, k: Array, w_q: Array, w_k: Array, v: Array
) -> tuple[Array, Array, Array, Array, Array]:
    """Gradients ``(dq, dk, dw_q, dw_k, dv)`` of ``additive`` for ``dscores (..., Nq, Nk)``.

    With ``t_ij = tanh(W_q q_i + W_k k_j)`` and ``g_ij = dS_ij · v ∘ (1 - t_ij²)``:
    ``dv = Σ dS_ij t_ij``, ``dq_i = W_qᵀ Σ_j g_ij``, ``dk_j = W_kᵀ Σ_i g_ij``,
    ``dW_q = Σ (Σ_j g_ij) q_iᵀ``, ``dW_k = Σ (Σ_i g_ij) k_jᵀ``; recomputed chunk by chunk.
    """
    names = ("dscores", "q", "k", "w_q", "w_k", "v")
    xp, (ds, q, k, w_q, w_k, v), dtype = _inputs(names, (dscores, q, k, w_q, w_k, v))
    _check_additive(q, k, w_q, w_k, v)
    _check_dscores(ds, q, k)
    grads = _additive_grads(xp, ds, q, k, w_q, w_k, v)
    return tuple(g if g.dtype == dtype else xp.astype(g, dtype) for g in grads)


def _needs_grad(*xs: Array) -> bool:
    import torch

    return torch.is_grad_enabled() and any(x.requires_grad for x in xs)


@cache
def _additive_function() -> Any:
    """A ``torch.autograd.Function`` saving only the inputs (the tanh chunks are recomputed)."""
    import torch

    class AdditiveScores(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, w_q, w_k, v):
            ctx.save_for_backward(q, k, w_q, w_k, v)
            return _additive_forward(namespace(q=q), q, k, w_q, w_k, v)

        @staticmethod
        def backward(ctx, ds):
            return _additive_grads(namespace(q=ds), ds, *ctx.saved_tensors)

    return AdditiveScores
