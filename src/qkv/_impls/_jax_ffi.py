"""The compiled kernel inside traced JAX programs (``jax.jit``, ``jax.grad``, ``jax.vmap``): XLA's FFI.

A traced array has no values for the kernel to read, so the call becomes a custom call in the
program XLA compiles (``jax.ffi.ffi_call``; the handlers are ``_native/ffi.cpp``), wired to the
kernel's backward with ``jax.custom_vjp``: ``jax.grad`` runs FlashAttention-2's Algorithm 2
(arXiv:2307.08691) in C++, and the ``Nq x Nk`` scores exist in neither direction. Everything
static is decided at trace time from shapes: the mask's plan (row intervals, or tile classes
and bitmaps: ``masks.plan``) and the score mods' tables become constants of the program, the
scale, dropout and mods its attributes. ``jax.vmap`` hands the handlers every operand with the
mapped axes in front (``vmap_method="broadcast_all"``); they fold them into the kernel's batch.

    q (B, H, Nq, Dk), k (B, Hkv, Nk, Dk), v (B, Hkv, Nk, Dv)
    -> out (B, H, Nq, Dv) in q's dtype, lse (B, H, Nq) float32 (float64 for float64), and lse_lo
       (B, H, Nq), lse's rounding residual, a residual of the custom VJP (the backward rebuilds P
       from lse + lse_lo; qkv.attention_backward's lse comes without one: zeros)

Inside a compiled program nothing can raise once it runs: a row that attends a non-finite
input, or whose finite inputs overflow, comes back NaN (the eager call raises the overflow's
``ArgumentError`` instead; docs/arrays.md).
"""

import functools
import importlib.util
from typing import Any, cast

import numpy as np

from .. import _native as native
from .._backend import is_traced
from .._typing import Array, Result
from ._call import Call
from ._kernel_args import flat, flat_bias, kernel_args

FORWARD, BACKWARD = "qkv_attention_forward", "qkv_attention_backward"


def built_reason() -> str | None:
    """Why the compiled kernel has no ``jax.ffi`` handlers (None: it has them); never imports JAX."""
    if not native.available():
        return native.reason()
    if getattr(native._need(), "ffi_handlers", None) is None:
        return (
            "qkv's compiled kernel was built without jaxlib's FFI header, so traced JAX arrays stay on "
            "the array engine (the build needs jaxlib: reinstall without QKV_JAX_FFI=0, on a platform "
            "jaxlib has wheels for, or with jaxlib installed and --no-build-isolation)"
        )
    return None


def handler_reason() -> str | None:
    """Why ``jax.jit`` cannot reach the kernel here (None: it can): the handlers are built, JAX
    imports and takes them (imports JAX when it is installed)."""
    why = built_reason()
    if why is not None:
        return why
    try:
        if importlib.util.find_spec("jax") is None:
            return "JAX is not installed (pip install 'qkv[jax]')"
        _register()
    except Exception as e:  # noqa: BLE001 - any failure here means "not usable", said with its cause
        return f"JAX did not take the handlers: {type(e).__name__}: {e}"
    return None


def reason(c: Call) -> str | None:
    """Why a traced JAX call cannot run on the compiled kernel (None: it can). Structure only."""
    why = built_reason()
    if why is not None:
        return why
    if c.bias is not None and is_traced(c.bias):
        return "a traced bias needs its gradient, which the array engine gives"
    if c.score_mod is not None and any(is_traced(t) for t in c.score_mod.tensors):
        return "a traced score-mod table needs its gradient, which the array engine gives"
    if c.mask is not None and _traced_recipe(c.mask.recipe):
        return "a mask built from traced arrays has no values to plan with at trace time"
    if c.dropout > 0 and is_traced(c.rng):
        return "a traced dropout seed: the kernel takes the seed as a number of the program"
    return None


def _traced_recipe(r: Any) -> bool:
    if isinstance(r, (tuple, list)):
        return any(_traced_recipe(x) for x in r)
    if isinstance(r, dict):
        return any(_traced_recipe(x) for x in r.values())
    return is_traced(r)


@functools.cache
def _register() -> None:
    import jax

    fwd, bwd = native._need().ffi_handlers()
    jax.ffi.register_ffi_target(FORWARD, fwd, platform="cpu")
    jax.ffi.register_ffi_target(BACKWARD, bwd, platform="cpu")


def _flat(x: Array, dims: Any, heads: int) -> Array:
    """``x (*b, h, N, D)`` as ``(B, heads, N, D)``."""
    import jax.numpy as jnp

    return flat(x, dims, heads, jnp.broadcast_to)


def _batch_full(a: np.ndarray, b: int) -> np.ndarray:
    """A mask array's axis 0 at the call's full batch: the handlers then fold ``jax.vmap``'s axes
    into one kernel call (a mask shared by the batch is small: rows or tile tables)."""
    return np.ascontiguousarray(np.broadcast_to(a, (b, *a.shape[1:]))) if a.shape[0] != b else a


def _operands(c: Call, p: Any, b: int) -> tuple[list[Any], dict[str, Any]]:
    """The constants after q, k, v (mask, bias, K/V scales, mod tables, in ``ffi.cpp``'s order) and
    the attributes of both calls, from the kernel's arguments (``kernel_args``)."""
    import jax

    d = c.dims
    bias = None if c.bias is None else np.ascontiguousarray(flat_bias(np.asarray(c.bias), d, np.broadcast_to))
    native_mods = () if c.score_mod is None else c.score_mod.native
    assert native_mods is not None  # the plan sends a mod the kernel cannot run to the array engine
    lead = d.score_shape[:-2] if d.has_heads else ()
    a = kernel_args(c.scale, p.threads, p.mask, native_mods, lead, bias, c.dropout, c.rng)
    # the bitmaps are shared by the batch; the other mask arrays are indexed by it
    ops = [np.ascontiguousarray(x) if name == "bitmaps" else _batch_full(x, b) for name, x in a.mask.items()]
    ops += [x for x in (a.bias, a.k_scale, a.v_scale) if x is not None]
    table_dtype = np.float64 if jax.config.read("jax_enable_x64") else np.float32
    ops += [np.ascontiguousarray(np.asarray(op.table, dtype=table_dtype)) for op in a.mods if op.positional]
    attrs = dict(
        scale=np.float64(a.scale),
        dropout_p=np.float64(a.dropout_p),
        seed=np.int64(a.seed - 2**64 if a.seed >= 2**63 else a.seed),
        threads=np.int64(a.threads),
        mask=np.int64(a.mask_kind),
        has_bias=np.int64(a.bias is not None),
        n_mods=np.int64(len(a.mods)),
        kv_format=np.int64(a.kv_format),
        # arrays of at least one element: the attribute needs a shape
        mod_kinds=np.asarray([int(op.kind) for op in a.mods] or [0], np.int64),
        mod_c=np.asarray([0.0 if op.positional else float(op.c) for op in a.mods] or [0.0], np.float64),
        mod_m=np.asarray([int(op.m) for op in a.mods] or [0], np.int64),
        has_dlse=np.int64(0),  # the backward's call passes dlse after dout
    )
    return ops, attrs


def _forward_call(q: Any, k: Any, v: Any, consts: list[Any], attrs: dict[str, Any]) -> tuple[Any, Any, Any]:
    """``(out, lse, lse_lo)``."""
    import jax
    import jax.numpy as jnp

    acc = jnp.float64 if q.dtype == jnp.float64 else jnp.float32
    shapes = (
        jax.ShapeDtypeStruct((*q.shape[:-1], v.shape[-1]), q.dtype),
        jax.ShapeDtypeStruct(q.shape[:-1], acc),
        jax.ShapeDtypeStruct(q.shape[:-1], acc),
    )
    out = jax.ffi.ffi_call(FORWARD, shapes, vmap_method="broadcast_all")(q, k, v, *consts, **attrs)
    return cast(tuple[Any, Any, Any], out)


def _backward_call(
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Any,
    lse_lo: Any,
    dout: Any,
    dlse: Any,
    consts: list[Any],
    attrs: dict[str, Any],
) -> tuple[Any, Any, Any]:
    """``(dq, dk, dv)`` in the compute dtype (float32; float64 for float64)."""
    import jax
    import jax.numpy as jnp

    acc = jnp.float64 if q.dtype == jnp.float64 else jnp.float32
    shapes = tuple(jax.ShapeDtypeStruct(x.shape, acc) for x in (q, k, v))
    call = jax.ffi.ffi_call(BACKWARD, shapes, vmap_method="broadcast_all")
    args = (q, k, v, out, lse.astype(acc), lse_lo.astype(acc), dout.astype(q.dtype), dlse.astype(acc))
    return cast(tuple[Any, Any, Any], call(*args, *consts, **(attrs | {"has_dlse": np.int64(1)})))


def forward(c: Call, p: Any) -> Result:
    """``Result(out, None, lse)`` of a traced call, differentiable by ``jax.grad`` (custom VJP)."""
    import jax
    import jax.numpy as jnp

    _register()
    d = c.dims
    q, k, v = _flat(c.q, d, d.h), _flat(c.k, d, d.hkv), _flat(c.v, d, d.hkv)
    consts, attrs = _operands(c, p, q.shape[0])

    @jax.custom_vjp
    def attention(q: Any, k: Any, v: Any) -> tuple[Any, Any]:
        return _forward_call(q, k, v, consts, attrs)[:2]

    def attention_fwd(q: Any, k: Any, v: Any) -> tuple[tuple[Any, Any], tuple[Any, ...]]:
        out, lse, lse_lo = _forward_call(q, k, v, consts, attrs)
        return (out, lse), (q, k, v, out, lse, lse_lo)

    def attention_bwd(res: tuple[Any, ...], g: tuple[Any, Any]) -> tuple[Any, Any, Any]:
        q, k, v, out, lse, lse_lo = res
        dq, dk, dv = _backward_call(q, k, v, out, lse, lse_lo, *g, consts, attrs)
        return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)

    attention.defvjp(attention_fwd, attention_bwd)
    out, lse = attention(q, k, v)
    lead = d.score_shape[:-2]
    # q, k, v were broadcast to (B, H, ...) by jnp operations: jax.grad sums their cotangents back
    return Result(jnp.reshape(out, (*lead, d.nq, d.dv)), None, jnp.reshape(lse, (*lead, d.nq)))


def backward(dout: Array, c: Call, p: Any, out: Array, lse: Array, dlse: Array | None) -> tuple[Array, Array, Array]:
    """``(dq, dk, dv)`` as ``(B, H, Nq, Dk)``, ``(B, Hkv, Nk, Dk)``, ``(B, Hkv, Nk, Dv)`` in the compute
    dtype, for ``qkv.attention_backward`` on traced arrays (the caller reduces them to the inputs')."""
    import jax.numpy as jnp

    _register()
    d = c.dims
    q, k, v = _flat(c.q, d, d.h), _flat(c.k, d, d.hkv), _flat(c.v, d, d.hkv)
    o, do = _flat(out, d, d.h), _flat(dout, d, d.h)
    lse4 = _flat(lse[..., None], d, d.h)[..., 0]
    dl = jnp.zeros_like(lse4) if dlse is None else _flat(dlse[..., None], d, d.h)[..., 0]
    consts, attrs = _operands(c, p, q.shape[0])
    return _backward_call(q, k, v, o.astype(q.dtype), lse4, jnp.zeros_like(lse4), do, dl, consts, attrs)
