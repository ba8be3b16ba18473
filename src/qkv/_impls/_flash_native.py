"""The flash kernel's compiled engine: a planned ``Call`` turned into ``qkv._native``'s arguments.

The kernel (``src/qkv/_native``, FlashAttention-2 in C++, arXiv:2307.08691) takes 4-D
``(B, H, N, D)`` arrays with any strides but a unit last one, writes into arrays the caller
allocates, and masks with data, never with Python: the mask's plan (``masks.plan``: per-row key
intervals, or tile classes and a bitmap per PARTIAL tile), made once per mask and size. Score
mods it knows (``ScoreMod.native``) run inside the tile. Non-finite numbers are the kernel's to
find, inside its own pass: it writes the rows that attend one as NaN and reports how many rows
overflowed, which become the ``ArgumentError`` here. This module brings the results back to the
caller's array library.
"""

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _native as native
from .._backend import dtype_name, is_jax, is_torch, is_traced, namespace, unbroadcast
from .._finite import overflow_error
from .._heads import cast
from .._native import KernelMod
from .._typing import Array, Result
from ..scores import kernel_ops
from ._call import Call

if TYPE_CHECKING:
    from ._plan import Plan


# --------------------------------------------------------------------------- arguments


def _flat(x: Array, batch: tuple[int, ...], heads: int, has_heads: bool) -> Array:
    """``x (*b, h, N, D)`` as ``(B, heads, N, D)`` with stride-0 broadcasting (no copy unless the
    batch axes cannot be merged, or the last axis is strided)."""
    if not has_heads:  # 2-D call: one batch element, one head
        x = x[None, None]
    else:
        x = x.reshape((1,) * (len(batch) + 3 - x.ndim) + tuple(x.shape))
        shape = (*batch, heads, *x.shape[-2:])
        x = x.expand(*shape) if is_torch(x) else np.broadcast_to(x, shape)
        x = x.reshape(math.prod(batch), heads, *x.shape[-2:])
    if is_torch(x):
        x = x.detach()
        return x if x.stride(-1) == 1 else x.contiguous()
    x = np.asarray(x) if is_jax(x) else x  # the kernel reads JAX arrays through NumPy views
    return x if x.strides[-1] == x.itemsize else np.ascontiguousarray(x)


def _mask_args(p: "Plan") -> dict[str, Any]:
    """The kernel's mask arguments from the plan (``masks.BlockPlan``)."""
    m = p.mask
    if m is None or m.hides_nothing:
        return {}
    if m.rows is not None:
        return {"rows": m.rows}
    return {"tile_class": m.classes, "bitmap_index": m.bitmap_index, "bitmaps": m.bitmaps}


def _mods(c: Call) -> tuple[KernelMod, ...]:
    if c.score_mod is None:
        return ()
    assert c.score_mod.native is not None
    lead = c.dims.score_shape[:-2] if c.dims.has_heads else ()
    ops = []
    for op in kernel_ops(c.score_mod.native, lead):  # slopes and tables checked against H, batch flattened
        ops.append(op._replace(table=_table(op.table)) if op.positional else op)
    return tuple(ops)


def _table(t: Any) -> Any:
    if is_torch(t):
        return t.detach().contiguous()
    return np.ascontiguousarray(np.asarray(t))


def _bias(c: Call) -> Any:
    if c.bias is None:
        return None
    d = c.dims
    b: Any = c.bias
    shape = d.score_shape if d.has_heads else (1, 1, d.nq, d.nk)
    if not d.has_heads:
        b = b.reshape((1,) * (4 - b.ndim) + tuple(b.shape)) if b.ndim < 4 else b
    else:
        b = b.reshape((1,) * (len(shape) - b.ndim) + tuple(b.shape))
    b = b.expand(*shape) if is_torch(b) else np.broadcast_to(np.asarray(b), shape)
    lead = shape[:-3]
    b = b.reshape(math.prod(lead) if lead else 1, *shape[-3:])
    if is_torch(b):
        b = b.detach()
        return b if b.stride(-1) == 1 else b.contiguous()
    return b if b.strides[-1] == b.itemsize or b.strides[-1] == 0 else np.ascontiguousarray(b)


def _empty(like: Array, shape: tuple[int, ...], dtype: Any) -> Array:
    if is_torch(like):
        import torch

        return torch.empty(shape, dtype=dtype, device="cpu")
    return np.empty(shape, dtype=dtype)


def _acc_dtype(like: Array) -> Any:
    f64 = dtype_name(like) == "float64"
    if is_torch(like):
        import torch

        return torch.float64 if f64 else torch.float32
    return np.float64 if f64 else np.float32


def _back(x: Array, like: Array, shape: tuple[int, ...]) -> Array:
    """A kernel output as an array of ``like``'s library with the caller's ``shape``."""
    x = x.reshape(shape)
    if is_jax(like):
        import jax.numpy as jnp

        return jnp.asarray(x)
    return x


def _args(c: Call, p: "Plan") -> tuple[Array, Array, Array, dict[str, Any]]:
    d = c.dims
    q = _flat(c.q, d.batch, d.h, d.has_heads)
    k = _flat(c.k, d.batch, d.hkv, d.has_heads)
    v = _flat(c.v, d.batch, d.hkv, d.has_heads)
    kw = dict(
        scale=c.scale,
        mods=_mods(c),
        bias=_bias(c),
        dropout_p=c.dropout,
        seed=int(c.rng) if c.dropout > 0 else 0,
        threads=p.threads,
        **_mask_args(p),
    )
    return q, k, v, kw


def _check(c: Call, overflowed: int) -> None:
    """Rows whose finite inputs overflowed (the kernel wrote them NaN): the contract's error."""
    if overflowed:
        raise overflow_error(c.q, c.k, c.scale, rows=overflowed, score_mod=c.score_mod)


def forward(c: Call, p: "Plan") -> Result:
    """``Result(out, None, lse)`` from the compiled kernel (through XLA's FFI for traced JAX arrays)."""
    if is_jax(c.q) and any(is_traced(x) for x in (c.q, c.k, c.v)):
        from . import _jax_ffi

        return _jax_ffi.forward(c, p)
    d = c.dims
    q, k, v, kw = _args(c, p)
    b, h = q.shape[0], q.shape[1]
    out = _empty(q, (b, h, d.nq, d.dv), q.dtype)
    lse = _empty(q, (b, h, d.nq), _acc_dtype(q))
    _check(c, native.forward(q, k, v, out, lse, **kw)[1])
    lead = d.score_shape[:-2]
    return Result(_back(out, c.q, (*lead, d.nq, d.dv)), None, _back(lse, c.q, (*lead, d.nq)))


def backward(dout: Array, c: Call, p: "Plan", out: Array, lse: Array, dlse: Array | None = None) -> tuple[Array, ...]:
    """``(dq, dk, dv)`` from the compiled kernel (FlashAttention-2 Algorithm 2), reduced to the
    shapes of ``q``, ``k``, ``v`` (grouped heads summed by the kernel, broadcast axes here)."""
    d = c.dims
    if is_jax(c.q) and any(is_traced(x) for x in (c.q, c.k, c.v, dout, out, lse, dlse) if x is not None):
        from . import _jax_ffi

        dq, dk, dv = _jax_ffi.backward(dout, c, p, out, lse, dlse)
    else:
        dq, dk, dv = _backward(dout, c, p, out, lse, dlse)
    xp = namespace(q=dq)
    lead = d.score_shape[:-2]
    kv_lead = (*d.batch, d.hkv) if d.has_heads else ()
    grads = []
    for g, x, shape in (
        (dq, c.q, (*lead, d.nq, d.dk)),
        (dk, c.k, (*kv_lead, d.nk, d.dk)),
        (dv, c.v, (*kv_lead, d.nk, d.dv)),
    ):
        g = unbroadcast(xp, g.reshape(shape), tuple(x.shape))
        grads.append(_back(cast(xp, g, _dtype_of(x, xp)), c.q, tuple(x.shape)))
    return tuple(grads)


def _backward(dout: Array, c: Call, p: "Plan", out: Array, lse: Array, dlse: Array | None) -> tuple[Array, ...]:
    """The kernel's ``(dq, dk, dv)`` as ``(B, H, Nq, Dk)``, ``(B, Hkv, Nk, Dk)``, ``(B, Hkv, Nk, Dv)``."""
    d = c.dims
    q, k, v, kw = _args(c, p)
    b, h, hkv = q.shape[0], q.shape[1], k.shape[1]
    o, do = (_flat(x, d.batch, d.h, d.has_heads) for x in (out, dout))
    lse4 = _flat(lse[..., None], d.batch, d.h, d.has_heads)[..., 0]
    dl = None if dlse is None else _flat(dlse[..., None], d.batch, d.h, d.has_heads)[..., 0]
    acc = _acc_dtype(q)
    dq = _empty(q, (b, h, d.nq, d.dk), acc)
    dk = _empty(q, (b, hkv, d.nk, d.dk), acc)
    dv = _empty(q, (b, hkv, d.nk, d.dv), acc)
    if is_torch(lse4):
        lse4, dl = lse4.contiguous(), None if dl is None else dl.contiguous()
    else:
        lse4 = np.ascontiguousarray(lse4)
        dl = None if dl is None else np.ascontiguousarray(dl)
    _check(c, native.backward(q, k, v, o, lse4, do, dq, dk, dv, dlse=dl, **kw)[1])
    return dq, dk, dv


def _dtype_of(x: Array, xp: Any) -> Any:
    if is_jax(x):
        return np.dtype(str(x.dtype)) if dtype_name(x) != "bfloat16" else xp.float32
    return x.dtype
