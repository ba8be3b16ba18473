"""The lean road to the compiled kernel, for the calls most made: plain torch tensors on the CPU.

``qkv.attention(q, k, v)`` / ``causal=True`` on 4-D ``(B, H, N, D)`` float CPU tensors with no
mask array, bias, sinks, score mod, dropout, weights or gradient is exactly what ``plan``
decides to run on the compiled engine (rule C) with the kernel's own arguments; this module
makes that decision in a dozen cheap tests instead of the whole front end, and returns None
whenever anything is unusual — the full path then runs, checks and reports as always (every
typed error comes from there). It reads no values: the kernel keeps the non-finite contract
and reports an overflow, which the full path then raises.

``k`` and ``v`` may be a quantized cache (two ``qkv.Quantized`` of one format, values
``(B, Hkv, Nk, D)``, scales ``(B, Hkv, Nk|1)`` in any strides): the decode step against an
8-bit cache, whose whole point is a shorter step. The full path's argument handling costs
~0.1-0.2 ms a call there (measured on Zen 4), up to a tenth of the kernel's read of a 32k-key
cache; this road hands the codes and scales to the kernel as views, as ``plan`` would.
"""

import math
from typing import Any

from .. import _native as native
from .. import masks
from .._quant import Quantized
from .._typing import Result
from ._kernel_args import KV_FORMATS, kernel_args
from ._plan import threads

_DTYPES: dict[Any, Any] = {}  # torch dtype -> the lse dtype, once torch is loaded


def _lse_dtypes() -> dict[Any, Any]:
    """The kernel's dtypes (``_native.DTYPES``) as torch dtypes, each with its lse dtype."""
    if not _DTYPES:
        import torch

        for name in native.DTYPES:
            _DTYPES[getattr(torch, name)] = torch.float64 if name == "float64" else torch.float32
    return _DTYPES


def _u8() -> Any:
    import torch

    return torch.uint8


def lean_attention(q: Any, k: Any, v: Any, causal: bool, scale: Any) -> Result | None:
    """``Result(out, None, lse)`` from the kernel, or None (the full path takes the call)."""
    cache: dict[str, Any] = {}
    if type(k) is Quantized:
        if type(v) is not Quantized or v.format != k.format:
            return None
        ks, vs = k.scales, v.scales
        if type(ks) is not type(q) or type(vs) is not type(q) or ks.requires_grad or vs.requires_grad:
            return None
        fmt = KV_FORMATS[k.format]
        k, v = k.values, v.values
        if k.dtype is not v.dtype or v.dim() != 4:
            return None
        if fmt != KV_FORMATS["int8"]:  # float8 codes enter the kernel as their bits
            k, v = k.view(_u8()), v.view(_u8())
        cache = {"kv_format": int(fmt), "k_scale": ks, "v_scale": vs}
    if not native.available() or causal not in (True, False) or type(k) is not type(q) or type(v) is not type(q):
        return None
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or not (q.is_cpu and k.is_cpu and v.is_cpu):
        return None
    lse_dtype = _lse_dtypes().get(q.dtype)
    if lse_dtype is None or (not cache and (k.dtype != q.dtype or v.dtype != q.dtype)):
        return None
    if q.requires_grad or k.requires_grad or v.requires_grad:
        return None  # autograd: the full path records the node
    b, h, nq, dk = q.shape
    _, hkv, nk, dv = v.shape
    if k.shape != (b, hkv, nk, dk) or v.shape[0] != b or h % max(hkv, 1) or 0 in (b, h, hkv, nq, nk, dk, dv):
        return None
    if not (q.is_contiguous() or q.stride()[-1] == 1) or not (k.is_contiguous() or k.stride()[-1] == 1):
        return None  # the kernel reads rows in place: the last axis must be dense
    if not (v.is_contiguous() or v.stride()[-1] == 1):
        return None
    if scale is None:
        scale = 1.0 / math.sqrt(dk)
    elif type(scale) is not float or not math.isfinite(scale):
        return None
    mask_plan = None
    if causal and nq > 1:  # for one query the bottom-right causal mask hides nothing
        mask_plan = masks.plan(masks.causal(), nq, nk, (b, h), *native.tile_shape(nq, nk, dk, dv, "float32"))
    a = kernel_args(scale, threads(), mask_plan)
    # new_empty with the sizes as arguments: a third cheaper than torch.empty(shape, dtype=) (~0.7 us
    # against ~1.1 a tensor, most of it torch's keyword parsing), which a decode step notices
    out = q.new_empty(b, h, nq, dv)
    lse = q.new_empty(b, h, nq) if lse_dtype is q.dtype else q.new_empty((b, h, nq), dtype=lse_dtype)
    nonfinite, overflowed = native.forward_tensors(q, k, v, out, lse, a.scale, a.threads, a.mask, **cache)
    if overflowed:
        return None  # the full path runs it again and raises the contract's error
    return Result(out, None, lse)
