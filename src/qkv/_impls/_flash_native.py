"""The flash kernel's compiled engine: a ``Call`` turned into ``qkv._native``'s arguments.

The kernel (``src/qkv/_native``, FlashAttention-2 in C++, arXiv:2307.08691) takes 4-D
``(B, H, N, D)`` arrays with any strides but a unit last one, writes into arrays the caller
allocates, and masks with data, never with Python: per-row key intervals for masks that have
them (``Mask.rows``), else per-tile classes and a bitmap for each PARTIAL tile. Score mods it
knows (``ScoreMod.native``) run inside the tile. This module builds those (once per mask and
size: ``Mask._memo``), chooses the thread count, and brings the results back to the caller's
array library. ``reason(c)`` says why a call must stay on the array engine.
"""

import math
import os
import sys
from typing import Any

import numpy as np

from .. import _native as native
from .. import masks
from .._backend import dtype_name, is_jax, is_torch, is_traced, namespace, unbroadcast
from .._finite import bad_rows
from .._heads import cast
from .._typing import Array, Result
from ..positional import alibi_slopes
from ._call import Call

DTYPES = ("float32", "float64", "float16", "bfloat16")


def threads() -> int:
    """The kernel's worker count: torch's when torch is loaded (one pool's worth, never two fighting),
    else ``OMP_NUM_THREADS``, else the CPUs this process may use."""
    if "torch" in sys.modules:
        return max(1, int(sys.modules["torch"].get_num_threads()))
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return min(int(env), 256)
    return max(1, min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1, 256))


def reason(c: Call) -> str | None:
    """Why the compiled engine cannot run ``c`` (None: it can)."""
    if not native.available():
        return native.reason()
    arrays = [c.q, c.k, c.v, c.bias, *(c.score_mod.tensors if c.score_mod is not None else ())]
    if any(is_traced(x) for x in arrays if x is not None):
        return "JAX traced arrays stay on the array engine, which jax.grad and jax.jit differentiate"
    if is_torch(c.q) and c.q.device.type != "cpu":
        return f"the compiled kernel runs on the CPU, the tensors are on {c.q.device}"
    if dtype_name(c.q) not in DTYPES:
        return f"the compiled kernel takes {', '.join(DTYPES)}, not {dtype_name(c.q)}"
    if is_jax(c.q) and dtype_name(c.q) == "bfloat16":
        return "JAX bfloat16 arrays stay on the array engine"
    if c.want_weights:
        return "the weights are rebuilt tile by tile by the array engine"
    if c.score_mod is not None and c.score_mod.native is None:
        return f"score_mod {c.score_mod.name} has no compiled form"
    if c.bias is not None and getattr(c.bias, "requires_grad", False):
        return "a bias that needs its gradient goes through the array engine"
    if (c.mask is not None or c.bias is not None) and (
        bad_rows(namespace(k=c.k), c.k) is not None or bad_rows(namespace(v=c.v), c.v) is not None
    ):
        return "k or v holds NaN or inf under a mask: the array engine keeps hidden rows unread"
    return None


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


def _plan(c: Call, bq: int, bk: int) -> dict[str, Any]:
    """The kernel's mask arguments for ``c`` (remembered on the mask per size and tiles)."""
    m, d = c.mask, c.dims
    if m is None:
        return {}
    key = ("native-plan", d.nq, d.nk, bq, bk, d.score_shape[:-2])
    if key in m._memo:
        return m._memo[key]
    intervals = m.intervals(d.nq, d.nk)
    if intervals is not None:
        lo, hi = intervals
        rows = np.stack(np.broadcast_arrays(lo, hi), axis=-1).astype(np.int32)  # (*lead, Nq, 2)
        plan = {"rows": np.ascontiguousarray(_bh(rows, d, 2))}
    else:
        cls = np.ascontiguousarray(_bh(m.blocks(d.nq, d.nk, bq, bk), d, 2))
        index, bitmaps = _bitmaps(m, cls, d, bq, bk)
        plan = {"tile_class": cls, "bitmap_index": index, "bitmaps": bitmaps}
    m._remember(key, plan)
    return plan


def _bh(a: np.ndarray, d: Any, trailing: int) -> np.ndarray:
    """``a (*lead, t...)`` with ``trailing`` axes after the (batch..., head) ones as ``(Bm, Hm, t...)``."""
    lead, tail = a.shape[: a.ndim - trailing], a.shape[a.ndim - trailing :]
    if not d.has_heads:
        return a.reshape(1, 1, *tail)
    score_lead = d.score_shape[:-2]  # (*batch, H)
    lead = (1,) * (len(score_lead) - len(lead)) + tuple(lead)
    a = a.reshape(*lead, *tail)
    batch = math.prod(lead[:-1])
    return a.reshape(batch, lead[-1], *tail)


def _bitmaps(m: masks.Mask, cls: np.ndarray, d: Any, bq: int, bk: int) -> tuple[np.ndarray, np.ndarray]:
    """A bit per cell of each PARTIAL tile: ``bitmap_index (Bm, Hm, nbq, nbk)`` int32 (-1: none) and
    ``bitmaps (n, bq, ceil(bk / 64))`` uint64, evaluating the mask one row of tiles at a time."""
    bm, hm, nbq, nbk = cls.shape
    words = -(-bk // 64)
    index = np.full(cls.shape, -1, dtype=np.int32)
    chunks: list[np.ndarray] = []
    n = 0
    for r in range(nbq):
        cols = np.flatnonzero((cls[:, :, r, :] == masks.PARTIAL).any(axis=(0, 1)))
        if cols.size == 0:
            continue
        q0, q1 = r * bq, min((r + 1) * bq, d.nq)
        dense = np.broadcast_to(_bh(m.tile(q0, q1, 0, d.nk, d.nq, d.nk), d, 2), (bm, hm, q1 - q0, d.nk))
        for c in cols:
            k0, k1 = c * bk, min((c + 1) * bk, d.nk)
            tile = np.zeros((bm, hm, bq, words * 64), dtype=bool)
            tile[:, :, : q1 - q0, : k1 - k0] = dense[:, :, :, k0:k1]
            bits = np.packbits(tile, axis=-1, bitorder="little").view(np.uint64)  # (bm, hm, bq, words)
            sel = cls[:, :, r, c] == masks.PARTIAL
            index[:, :, r, c] = np.where(sel, n + np.arange(bm * hm).reshape(bm, hm), -1)
            chunks.append(bits.reshape(bm * hm, bq, words))
            n += bm * hm
    bitmaps = np.concatenate(chunks) if chunks else np.zeros((1, bq, words), dtype=np.uint64)
    return index, np.ascontiguousarray(bitmaps)


def _mods(c: Call) -> tuple[tuple[Any, ...], ...]:
    if c.score_mod is None:
        return ()
    assert c.score_mod.native is not None
    h = c.dims.h if c.dims.has_heads else 1
    ops: list[tuple[Any, ...]] = []
    for op in c.score_mod.native:
        if op[0] == "alibi":
            slopes = alibi_slopes(h) if op[1] is None else op[1]
            ops.append(("alibi", _table(slopes)))
        elif op[0] == "relbias":
            ops.append(("relbias", _table(op[1]), op[2]))
        else:
            ops.append(op)
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


def _args(c: Call) -> tuple[Array, Array, Array, dict[str, Any]]:
    d = c.dims
    q = _flat(c.q, d.batch, d.h, d.has_heads)
    k = _flat(c.k, d.batch, d.hkv, d.has_heads)
    v = _flat(c.v, d.batch, d.hkv, d.has_heads)
    bq, bk = native.tile_shape(d.nq, d.nk, d.dk, d.dv, dtype_name(c.q))
    kw = dict(
        scale=c.scale,
        mods=_mods(c),
        bias=_bias(c),
        dropout_p=c.dropout,
        seed=int(c.rng) if c.dropout > 0 else 0,
        threads=threads(),
        **_plan(c, bq, bk),
    )
    return q, k, v, kw


def forward(c: Call) -> Result:
    """``Result(out, None, lse)`` from the compiled kernel."""
    d = c.dims
    q, k, v, kw = _args(c)
    b, h = q.shape[0], q.shape[1]
    out = _empty(q, (b, h, d.nq, d.dv), q.dtype)
    lse = _empty(q, (b, h, d.nq), _acc_dtype(q))
    native.forward(q, k, v, out, lse, **kw)
    lead = d.score_shape[:-2]
    return Result(_back(out, c.q, (*lead, d.nq, d.dv)), None, _back(lse, c.q, (*lead, d.nq)))


def backward(dout: Array, c: Call, out: Array, lse: Array, dlse: Array | None = None) -> tuple[Array, ...]:
    """``(dq, dk, dv)`` from the compiled kernel (FlashAttention-2 Algorithm 2), reduced to the
    shapes of ``q``, ``k``, ``v`` (grouped heads summed by the kernel, broadcast axes here)."""
    d = c.dims
    q, k, v, kw = _args(c)
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
    native.backward(q, k, v, o, lse4, do, dq, dk, dv, dlse=dl, **kw)
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


def _dtype_of(x: Array, xp: Any) -> Any:
    if is_jax(x):
        return np.dtype(str(x.dtype)) if dtype_name(x) != "bfloat16" else xp.float32
    return x.dtype


def decode(q: Any, k: Any, v: Any, scale: float) -> Any:
    """A decode step's ``out (B, H, Nq, Dv)`` straight from the kernel, or None when this lean path
    does not apply and ``qkv.attention`` must run the call.

    For callers that already hold validated 4-D float32 CPU torch tensors (the transformers
    backend): ``q (B, H, Nq, Dk)``, ``k (B, Hkv, Nk, Dk)``, ``v (B, Hkv, Nk, Dv)``, no mask
    (every key, as a decode step against its cache sees), no bias, no gradient. It skips the
    front end's argument normalisation (~0.3-0.5 ms a call, more than the kernel at Nk = 1024)
    but keeps its promises: a row whose ``lse`` is not finite (an overflow or a NaN input)
    returns None, and ``qkv.attention`` then reports it as it would.
    """
    import torch

    if not native.available() or q.dtype != torch.float32 or k.dtype != q.dtype or v.dtype != q.dtype:
        return None
    if q.device.type != "cpu" or (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
        return None
    b, h, nq, _ = q.shape
    if k.shape[0] != b or h % k.shape[1] or k.shape[-2] == 0 or q.stride(-1) != 1 or k.stride(-1) != 1:
        return None
    if v.stride(-1) != 1:
        return None
    out = torch.empty((b, h, nq, v.shape[-1]), dtype=q.dtype)
    lse = torch.empty((b, h, nq), dtype=torch.float32)
    native.forward(q, k, v, out, lse, scale=scale, threads=threads())
    return out if bool(torch.isfinite(lse).all()) else None
