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

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from .. import _native as native
from .._backend import dtype_name, is_jax, is_traced, kind, namespace, unbroadcast
from .._finite import gradient_overflow_error, overflow_error
from .._heads import cast
from .._typing import Array, Result
from ._call import Call, Plan
from ._kernel_args import KV_FORMATS, KernelArgs, flat, flat_bias, kernel_args

# --------------------------------------------------------------------------- host libraries


class _Host(NamedTuple):
    """How the arrays of one library meet the binding in an eager call: ``enter`` turns an array
    into one the library's ``broadcast_to`` takes, ``ready`` a ``(B, H, N, D)`` layout into what
    the binding reads (detached, unit last stride, copied only when strided; with ``dense`` also
    when a head's rows are not adjacent: ``_dense_rows``), ``empty`` allocates
        a result, ``f32`` / ``f64`` are the accumulation dtypes, ``u8`` the dtype float8 codes enter
    the kernel as (their bits), ``leave`` hands a result back."""

    enter: Callable[[Any], Any]
    broadcast_to: Callable[[Any, tuple[int, ...]], Any]
    ready: Callable[..., Any]
    empty: Callable[[tuple[int, ...], Any], Any]
    f32: Any
    f64: Any
    u8: Any
    leave: Callable[[Any], Any]


def _scattered(shape: tuple[int, ...], strides: tuple[int, ...], unit: int) -> bool:
    """Whether a ``(B, H, N, D)`` array with these strides (in ``unit``s) holds its rows apart
    (a ``(B, N, H, D)`` tensor seen as ``(B, H, N, D)``: a projection's output split into heads)
    and is a permutation of dense memory (no broadcast axis, which a copy would materialise)."""
    return shape[-2] > 1 and strides[-2] != shape[-1] * unit and 0 not in strides


def _numpy_ready(x: np.ndarray, dense: bool = False) -> np.ndarray:
    if dense and _scattered(x.shape, x.strides, x.itemsize):
        return np.ascontiguousarray(x)
    return x if x.strides[-1] == x.itemsize or x.strides[-1] == 0 else np.ascontiguousarray(x)


def _dense_rows(nq: int) -> bool:
    """Whether a call of ``nq`` query rows copies q, k, v (and out, dO) whose rows lie apart into
    dense ``(B, H, N, D)`` first: the kernel reads each row ``Nq / BLOCK_Q`` or ``Nk / BLOCK_K``
    times, and rows 2 KiB apart (8 heads of D = 128 in bf16) cost it a page per row or two; the
    copy, O(N D) against O(Nq Nk D) work, measured 3-4% faster (bf16, Llama's 8/2 heads, N = 4096,
    forward and backward). A decode-sized call reads each K / V row about once: no copy."""
    return nq >= native.BLOCK_Q


def _same(x: Any) -> Any:
    return x


@functools.cache
def _host(library: str) -> _Host:
    """The host of ``library`` (``_backend.kind``): NumPy, torch, or eager JAX (its arrays read
    through NumPy views, the results handed back as JAX arrays)."""
    if library == "torch":
        import torch

        def ready(x: Any, dense: bool = False) -> Any:
            x = x.detach()
            if dense and _scattered(tuple(x.shape), x.stride(), 1):
                return x.contiguous()
            return x if x.stride(-1) == 1 else x.contiguous()

        def empty(shape: tuple[int, ...], dtype: Any) -> Any:
            return torch.empty(shape, dtype=dtype, device="cpu")

        return _Host(_same, torch.Tensor.expand, ready, empty, torch.float32, torch.float64, torch.uint8, _same)
    leave: Callable[[Any], Any] = _same
    if library == "jax":
        import jax.numpy as jnp

        leave = jnp.asarray
    return _Host(np.asarray, np.broadcast_to, _numpy_ready, np.empty, np.float32, np.float64, np.uint8, leave)


# --------------------------------------------------------------------------- arguments


def _args(h: _Host, c: Call, p: Plan) -> tuple[Array, Array, Array, KernelArgs]:
    """q, k, v as the kernel's ``(B, H, N, D)`` arrays and the call's other arguments."""
    d = c.dims
    dense = _dense_rows(d.nq)
    q, k, v = (
        h.ready(flat(h.enter(x), d, n, h.broadcast_to), dense) for x, n in ((c.q, d.h), (c.k, d.hkv), (c.v, d.hkv))
    )
    bias = None if c.bias is None else h.ready(flat_bias(h.enter(c.bias), d, h.broadcast_to))
    mods = () if c.score_mod is None else c.score_mod.native
    assert mods is not None  # the plan sends a mod the kernel cannot run to the array engine
    assert p.threads is not None  # a plan for the compiled engine has its threads
    lead = d.score_shape[:-2] if d.has_heads else ()
    if c.kv is None:
        return q, k, v, kernel_args(c.scale, p.threads, p.mask, mods, lead, bias, c.dropout, c.rng)
    k, v, ks, vs = _quantized(h, c, k, v)
    fmt = KV_FORMATS[c.kv.format]
    return q, k, v, kernel_args(c.scale, p.threads, p.mask, mods, lead, bias, c.dropout, c.rng, fmt, ks, vs)


def _quantized(h: _Host, c: Call, k: Any, v: Any) -> tuple[Any, Any, Any, Any]:
    """A quantized cache's codes as the kernel reads them (int8, or float8 as their ``uint8``
    bits: a view) and its scales ``(*B, Hkv, Nk|1)`` as ``(B, Hkv, Nk|1)``, in whatever strides
    they have (a transformers ``QuantizedCache`` keeps each scale beside its token's codes)."""
    assert c.kv is not None
    d = c.dims
    if c.kv.format != "int8":
        k, v = k.view(h.u8), v.view(h.u8)

    def scales(s: Any) -> Any:  # (*b, Hkv, Nk|1) as (B, Hkv, Nk|1): views where the batch axes allow
        s = flat(h.enter(s)[..., None], d, d.hkv, h.broadcast_to)[..., 0]
        return s.detach() if hasattr(s, "detach") else s

    return k, v, scales(c.kv.k.scales), scales(c.kv.v.scales)


def _check(c: Call, overflowed: int) -> None:
    """Rows whose finite inputs overflowed (the kernel wrote them NaN): the contract's error."""
    if overflowed:
        raise overflow_error(c.q, c.k, c.scale, rows=overflowed, score_mod=c.score_mod)


def forward(c: Call, p: Plan) -> Result:
    """``Result(out, None, lse)`` from the compiled kernel (through XLA's FFI for traced JAX arrays)."""
    return _forward(c, p, False)[0]


def forward_saved(c: Call, p: Plan) -> tuple[Result, Array | None]:
    """``forward`` whose result the backward will read: ``(result, lse_lo)``, lse's rounding
    residual ``(B, H, Nq)`` (the kernel's ``lse_lo``) kept beside it (None for traced JAX arrays,
    whose custom VJP keeps its own)."""
    return _forward(c, p, True)


def _forward(c: Call, p: Plan, residual: bool) -> tuple[Result, Array | None]:
    if is_jax(c.q) and any(is_traced(x) for x in (c.q, c.k, c.v)):
        from . import _jax_ffi

        return _jax_ffi.forward(c, p), None
    d = c.dims
    h = _host(kind(c.q))
    q, k, v, a = _args(h, c, p)
    b, nh = q.shape[0], q.shape[1]
    out = h.empty((b, nh, d.nq, d.dv), q.dtype)
    acc = h.f64 if dtype_name(q) == "float64" else h.f32
    lse = h.empty((b, nh, d.nq), acc)
    lse_lo = h.empty((b, nh, d.nq), acc) if residual else None
    _check(c, native.forward(q, k, v, out, lse, lse_lo=lse_lo, **a.keywords())[1])
    lead = d.score_shape[:-2]
    res = Result(h.leave(out.reshape(*lead, d.nq, d.dv)), None, h.leave(lse.reshape(*lead, d.nq)))
    return res, None if lse_lo is None else h.leave(lse_lo)


def backward(
    dout: Array,
    c: Call,
    p: Plan,
    out: Array,
    lse: Array,
    dlse: Array | None = None,
    lse_lo: Array | None = None,
) -> tuple[Array, ...]:
    """``(dq, dk, dv)`` from the compiled kernel (FlashAttention-2 Algorithm 2), reduced to the
    shapes of ``q``, ``k``, ``v`` (grouped heads summed by the kernel, broadcast axes here).
    ``lse_lo`` (``forward_saved``'s, ``(B, H, Nq)``): P is rebuilt from lse + lse_lo."""
    d = c.dims
    h = _host(kind(c.q))
    if is_jax(c.q) and any(is_traced(x) for x in (c.q, c.k, c.v, dout, out, lse, dlse) if x is not None):
        from . import _jax_ffi

        dq, dk, dv = _jax_ffi.backward(dout, c, p, out, lse, dlse)
    else:
        dq, dk, dv = _backward(h, dout, c, p, out, lse, dlse, lse_lo)
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
        grads.append(h.leave(cast(xp, g, _dtype_of(x, xp)).reshape(tuple(x.shape))))
    return tuple(grads)


def _backward(
    h: _Host, dout: Array, c: Call, p: Plan, out: Array, lse: Array, dlse: Array | None, lse_lo: Array | None
) -> tuple[Any, ...]:
    """The kernel's ``(dq, dk, dv)`` as ``(B, H, Nq, Dk)``, ``(B, Hkv, Nk, Dk)``, ``(B, Hkv, Nk, Dv)``."""
    d = c.dims
    q, k, v, a = _args(h, c, p)
    b, nh, hkv = q.shape[0], q.shape[1], k.shape[1]

    def rows(x: Array, dense: bool = False) -> Any:  # (*B, H, Nq, D) as (B, H, Nq, D)
        return h.ready(flat(h.enter(x), d, d.h, h.broadcast_to), dense)

    o, do = rows(out, _dense_rows(d.nq)), rows(dout, _dense_rows(d.nq))
    # lse and dlse (*B, H, Nq) as (B, H, Nq), laid out as rows of one element
    lse3 = rows(lse[..., None])[..., 0]
    dl = None if dlse is None else rows(dlse[..., None])[..., 0]
    acc = h.f64 if dtype_name(q) == "float64" else h.f32
    dq = h.empty((b, nh, d.nq, d.dk), acc)
    dk = h.empty((b, hkv, d.nk, d.dk), acc)
    dv = h.empty((b, hkv, d.nk, d.dv), acc)
    lo = None if lse_lo is None else h.ready(h.enter(lse_lo))
    overflowed = native.backward(q, k, v, o, lse3, do, dq, dk, dv, dlse=dl, lse_lo=lo, **a.keywords())[1]
    if overflowed:  # finite inputs, non-finite gradients: what overflowed, with its numbers
        raise gradient_overflow_error(c.q, c.k, c.v, dout, c.scale, overflowed, dlse=dlse, score_mod=c.score_mod)
    return dq, dk, dv


def _dtype_of(x: Array, xp: Any) -> Any:
    if is_jax(x):
        return np.dtype(str(x.dtype)) if dtype_name(x) != "bfloat16" else xp.float32
    return x.dtype
