"""qkv's compiled kernel as torch custom operators: ``torch.ops.qkv.attention`` and its backward.

Registered with ``torch.library.custom_op`` (a fake implementation for shapes, a registered
autograd formula), so ``torch.compile`` and ``torch.export`` trace a qkv call as one node and
``torch.library.opcheck`` can check it. Everything crosses as tensors, numbers and strings: the
mask as its recipe (``masks._recipe``: a code string and its data tensors), the score mods as
the kernel's ops (a code string and their tables), the dropout seed as an int64 tensor (so a
compiled graph draws a new one per call). The operator plans the mask itself (``masks.plan``,
cached by the recipe), so a traced program never runs NumPy.

    q (B, H, Nq, Dk), k (B, Hkv, Nk, Dk), v (B, Hkv, Nk, Dv), bias (B|1, H|1, Nq|1, Nk) or None
    -> out (B, H, Nq, Dv), lse (B, H, Nq) (float32; float64 for float64), lse_lo (B, H, Nq)

lse_lo is lse's rounding residual (the kernel's ``lse_lo``), saved for the backward operator
(its last argument, ``Tensor? lse_lo=None``), which rebuilds P from lse + lse_lo.

``torch.ops.qkv.attention_quantized`` reads a quantized cache in place: k, v the codes (int8,
or float8 as their ``uint8`` bits) with float32 scales ``k_scale``, ``v_scale`` ``(B|1, Hkv|1,
Nk|1)`` and the kernel's ``kv_format``; no dropout. Its gradient reaches q only (the backward runs
on the dequantized K/V: the forward is attention over those values).

The operators exist once this module is imported (by the first torch call that needs them).
"""

from typing import Any

import numpy as np
import torch
from torch import Tensor

from .. import _native as native
from .. import masks
from .._finite import gradient_overflow_error, overflow_error
from .._native import KernelMod, KvFormat
from .._quant import Quantized, dequantize
from ..errors import ArgumentError, MaskError
from ._kernel_args import KV_FORMATS, KernelArgs, kernel_args
from ._plan import threads


def _lse_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def encode_mods(native_ops: tuple[KernelMod, ...] | None) -> tuple[str, list[Tensor]]:
    """A score mod's kernel ops (``ScoreMod.native``) as ``(code, tables)`` (``masks.encode``:
    each KernelMod as its tuple ``(kind, c, table, m)``, the kind an int, the tables in ``tables``)."""
    code, tables = masks.encode(tuple(tuple(op) for op in native_ops or ()))
    return code, [t if isinstance(t, Tensor) else torch.as_tensor(t) for t in tables]


def _mask_plan(
    code: str, data: list[Tensor], lead: tuple[int, ...], q: Tensor, v: Tensor, nk: int, positional: bool
) -> masks.BlockPlan | None:
    """The mask's plan on the kernel's tiles, rebuilt from its recipe (None: no mask)."""
    if not code:
        return None
    mask = masks.decode(code, [d.detach().cpu().numpy() for d in data])
    nq = q.shape[-2]
    if positional and mask.align is not None:
        shift = np.asarray(mask.align(np.arange(nq), nq, nk))
        if not bool((shift == nk - nq).all()):  # eager calls run these on the array engine (_compiled declines)
            raise ArgumentError(
                f"mask {mask.name} aligns its sequences on their own, so alibi / relative_bias measure positions "
                "per sequence, which the compiled kernel behind torch.compile cannot (it measures from the call's "
                "bottom-right corner); call qkv.attention outside torch.compile, or pass the bias as bias="
            )
    mask = mask.bound(lead)
    mlead = masks.lead_shape(mask, nq, nk)
    score = (*lead, nq, nk)
    if len(mlead) + 2 > len(score) or any(m not in (1, s) for m, s in zip(mlead[::-1], lead[::-1], strict=False)):
        raise MaskError(f"mask {mask.name} has leading axes {mlead}, which do not broadcast to the scores {score}")
    return masks.plan(mask, nq, nk, lead, *native.tile_shape(nq, nk, q.shape[-1], v.shape[-1], "float32"))


# What both operators take after their own tensors, in this order (their schemas share it; the
# functions receive it as ``*call``): the bias, the mask's recipe, the score's leading axes, the
# score mods' recipe, the scale, dropout and its seed.
_CALL = (
    "Tensor? bias, str mask_code, Tensor[] mask_data, SymInt[] lead, str mods_code, Tensor[] mod_tables, "
    "float scale, float dropout, Tensor seed"
)
_N_CALL = _CALL.count(",") + 1


def _kernel_args(
    q: Tensor, k: Tensor, v: Tensor, call: tuple[Any, ...], kv: tuple[int, Tensor, Tensor] | None = None
) -> KernelArgs:
    """The operator's inputs as the kernel's arguments (``kernel_args``); ``kv`` a quantized cache's
    ``(kv_format, k_scale, v_scale)``."""
    bias, mask_code, mask_data, lead, mods_code, mod_tables, scale, dropout, seed = call
    mods = tuple(KernelMod.decoded(op) for op in masks.decode_tree(mods_code, [t.detach() for t in mod_tables]))
    lead_t = tuple(int(x) for x in lead)
    plan = _mask_plan(mask_code, mask_data, lead_t, q, v, k.shape[-2], any(op.positional for op in mods))
    rng = int(seed.item()) if dropout > 0 else None
    b = None if bias is None else bias.detach()
    if kv is None:
        return kernel_args(scale, threads(), plan, mods, lead_t, b, dropout, rng)
    fmt, ks, vs = kv
    return kernel_args(scale, threads(), plan, mods, lead_t, b, dropout, rng, KvFormat(fmt), ks.detach(), vs.detach())


def _check(counts: tuple[int, int], q: Tensor, k: Tensor, a: KernelArgs) -> None:
    """Raise for rows whose finite inputs overflowed (the kernel's second count; ``finite.hpp``)."""
    if counts[1]:
        raise overflow_error(q, k, a.scale, rows=counts[1])


def _results(q: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The forward's empty ``out (B, H, Nq, Dv)``, ``lse`` and ``lse_lo (B, H, Nq)`` (real or fake,
    as q is)."""
    b, h, nq, _ = q.shape
    acc = _lse_dtype(q.dtype)
    return q.new_empty((b, h, nq, v.shape[-1])), q.new_empty((b, h, nq), dtype=acc), q.new_empty((b, h, nq), dtype=acc)


def _grads(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The backward's empty ``dq``, ``dk``, ``dv`` in the compute dtype (real or fake, as q is)."""
    acc = _lse_dtype(q.dtype)
    return q.new_empty(q.shape, dtype=acc), k.new_empty(k.shape, dtype=acc), v.new_empty(v.shape, dtype=acc)


def _operator(name: str, schema: str) -> Any:
    """A qkv operator ``qkv::name``: pure (it mutates none of its arguments) and CPU-only."""
    return torch.library.custom_op(f"qkv::{name}", mutates_args=(), device_types="cpu", schema=schema)


@_operator(
    "attention",
    f"(Tensor q, Tensor k, Tensor v, {_CALL}) -> (Tensor, Tensor, Tensor)",
)
def attention_op(q: Tensor, k: Tensor, v: Tensor, *call: Any) -> tuple[Tensor, Tensor, Tensor]:
    """The forward pass: ``(out, lse, lse_lo)`` (see the module docstring)."""
    out, lse, lse_lo = _results(q, v)
    a = _kernel_args(q, k, v, call)
    _check(native.forward(q.detach(), k.detach(), v.detach(), out, lse, lse_lo=lse_lo, **a.keywords()), q, k, a)
    return out, lse, lse_lo


@attention_op.register_fake
def _attention_fake(q: Tensor, k: Tensor, v: Tensor, *call: Any) -> tuple[Tensor, Tensor, Tensor]:
    return _results(q, v)


@_operator(
    "attention_backward",
    # lse_lo last, defaulted: a graph compiled against the schema without it (torch's caches
    # outlive an upgrade) still calls this operator, and gets P from lse alone
    f"(Tensor dout, Tensor? dlse, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, {_CALL}, "
    "Tensor? lse_lo=None) -> (Tensor, Tensor, Tensor)",
)
def attention_backward_op(
    dout: Tensor, dlse: Tensor | None, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, *rest: Any
) -> tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)`` in the compute dtype (FlashAttention-2, Algorithm 2, recomputed; P from
    lse + lse_lo when the forward's residual is given: the call's arguments, then lse_lo)."""
    call, lse_lo = (rest[:-1], rest[-1]) if len(rest) > _N_CALL else (rest, None)
    dq, dk, dv = _grads(q, k, v)
    a = _kernel_args(q, k, v, call)
    q_, k_, v_, o_, lse_, do_ = (x.detach() for x in (q, k, v, out, lse, dout.contiguous()))
    dl, lo = (None if x is None else x.detach() for x in (dlse, lse_lo))
    overflowed = native.backward(q_, k_, v_, o_, lse_, do_, dq, dk, dv, dlse=dl, lse_lo=lo, **a.keywords())[1]
    if overflowed:  # finite inputs, non-finite gradients: what overflowed, with its numbers
        raise gradient_overflow_error(q, k, v, dout, a.scale, overflowed, dlse=dlse)
    return dq, dk, dv


@attention_backward_op.register_fake
def _attention_backward_fake(
    dout: Tensor, dlse: Tensor | None, q: Tensor, k: Tensor, v: Tensor, *rest: Any
) -> tuple[Tensor, Tensor, Tensor]:
    return _grads(q, k, v)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor, Tensor]) -> None:
    q, k, v, bias, mask_code, mask_data, lead, mods_code, mod_tables, scale, dropout, seed = inputs
    out, lse, lse_lo = output
    ctx.mark_non_differentiable(lse_lo)
    saved = (q, k, v, out, lse, lse_lo, seed, *([] if bias is None else [bias]), *mask_data, *mod_tables)
    ctx.save_for_backward(*saved)
    ctx.statics = (bias is not None, len(mask_data), mask_code, lead, mods_code, scale, dropout)


def _backward(ctx: Any, dout: Tensor, dlse: Tensor | None, _dlse_lo: Any = None) -> tuple[Any, ...]:
    has_bias, n_mask, mask_code, lead, mods_code, scale, dropout = ctx.statics
    q, k, v, out, lse, lse_lo, seed, *rest = ctx.saved_tensors
    bias = rest.pop(0) if has_bias else None
    mask_data, mod_tables = rest[:n_mask], rest[n_mask:]
    call = (bias, mask_code, mask_data, lead, mods_code, mod_tables, scale, dropout, seed)
    dq, dk, dv = torch.ops.qkv.attention_backward(dout, dlse, q, k, v, out, lse, *call, lse_lo)
    grads = (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype))
    # one entry per input, a list for each list input (bias, masks and tables get no gradient here)
    return (*grads, None, None, [None] * n_mask, None, None, [None] * len(mod_tables), None, None, None)


attention_op.register_autograd(_backward, setup_context=_setup_context)


_FORMAT_NAMES = {int(code): name for name, code in KV_FORMATS.items()}


def dequantized(codes: Tensor, scales: Tensor, kv_format: int, dtype: torch.dtype) -> Tensor:
    """The values ``codes (B, Hkv, Nk, D)`` stand for (``qkv.dequantize``), in ``dtype``; float8
    codes arrive as their ``uint8`` bits (the operator's schema has no float8 dtype to promise)."""
    name = _FORMAT_NAMES[kv_format]
    c = codes.view(getattr(torch, name)) if name.startswith("float8") else codes
    return dequantize(Quantized(c, scales, name), dtype)


@_operator(
    "attention_quantized",
    f"(Tensor q, Tensor k, Tensor v, Tensor k_scale, Tensor v_scale, int kv_format, {_CALL}) "
    "-> (Tensor, Tensor, Tensor)",
)
def attention_quantized_op(
    q: Tensor, k: Tensor, v: Tensor, k_scale: Tensor, v_scale: Tensor, kv_format: int, *call: Any
) -> tuple[Tensor, Tensor, Tensor]:
    """The forward pass over a quantized cache read in place: ``(out, lse, lse_lo)`` (see the
    module docstring)."""
    if call[7] > 0:
        raise ArgumentError("torch.ops.qkv.attention_quantized takes no dropout (qkv.attention dequantizes for it)")
    out, lse, lse_lo = _results(q, v)
    a = _kernel_args(q, k, v, call, (kv_format, k_scale, v_scale))
    counts = native.forward(q.detach(), k.detach(), v.detach(), out, lse, lse_lo=lse_lo, **a.keywords())
    if counts[1]:
        _check(counts, q, dequantized(k, k_scale, kv_format, q.dtype), a)
    return out, lse, lse_lo


@attention_quantized_op.register_fake
def _attention_quantized_fake(q: Tensor, k: Tensor, v: Tensor, *rest: Any) -> tuple[Tensor, Tensor, Tensor]:
    return _results(q, v)


def _setup_quantized(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor, Tensor]) -> None:
    q, k, v, k_scale, v_scale, kv_format, bias, mask_code, mask_data, lead, mods_code, mod_tables, scale, _, seed = (
        inputs
    )
    out, lse, lse_lo = output
    ctx.mark_non_differentiable(lse_lo)
    ctx.save_for_backward(
        q, k, v, k_scale, v_scale, out, lse, lse_lo, seed, *([] if bias is None else [bias]), *mask_data, *mod_tables
    )
    ctx.statics = (kv_format, bias is not None, len(mask_data), mask_code, lead, mods_code, scale)


def _backward_quantized(ctx: Any, dout: Tensor, dlse: Tensor | None, _dlse_lo: Any = None) -> tuple[Any, ...]:
    """q's gradient: FlashAttention-2's backward over the dequantized cache (the values the forward
    attended); the codes and scales are inference state and get none."""
    kv_format, has_bias, n_mask, mask_code, lead, mods_code, scale = ctx.statics
    q, k, v, k_scale, v_scale, out, lse, lse_lo, seed, *rest = ctx.saved_tensors
    bias = rest.pop(0) if has_bias else None
    mask_data, mod_tables = rest[:n_mask], rest[n_mask:]
    kf, vf = dequantized(k, k_scale, kv_format, q.dtype), dequantized(v, v_scale, kv_format, q.dtype)
    call = (bias, mask_code, mask_data, lead, mods_code, mod_tables, scale, 0.0, seed)
    dq, _, _ = torch.ops.qkv.attention_backward(dout, dlse, q, kf, vf, out, lse, *call, lse_lo)
    # one entry per input: q, k, v, k_scale, v_scale, kv_format, then the call (lists for list inputs)
    none_call = (None, None, [None] * n_mask, None, None, [None] * len(mod_tables), None, None, None)
    return (dq.to(q.dtype), None, None, None, None, None, *none_call)


attention_quantized_op.register_autograd(_backward_quantized, setup_context=_setup_quantized)
