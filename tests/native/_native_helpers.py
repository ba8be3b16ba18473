"""Helpers of the native-kernel tests (array allocation, error measures)."""

from __future__ import annotations

import numpy as np

from qkv import _native as native

_KINDS = {"mul": native.ModKind.MUL, "softcap": native.ModKind.SOFTCAP}


def kernel_mods(specs):
    """The reference's mod specs (``("mul", c)``, ``("softcap", c)``, ``("alibi", slopes)``,
    ``("relbias", table, M)``; ``_native_reference.apply_mods``) as the kernel's KernelMods."""
    out = []
    for s in specs:
        if s[0] in _KINDS:
            out.append(native.KernelMod(_KINDS[s[0]], s[1]))
        elif s[0] == "alibi":
            out.append(native.KernelMod(native.ModKind.ALIBI, table=s[1]))
        else:
            assert s[0] == "relbias", s
            out.append(native.KernelMod(native.ModKind.RELBIAS, table=s[1], m=s[2]))
    return tuple(out)


def _typed(kw):
    if "mods" in kw:
        kw["mods"] = kernel_mods(kw["mods"])
    return kw


def make_qkv(rng, b, h, hkv, nq, nk, dk, dv, dtype=np.float64, scale=1.0):
    q = rng.standard_normal((b, h, nq, dk)) * scale
    k = rng.standard_normal((b, hkv, nk, dk)) * scale
    v = rng.standard_normal((b, hkv, nk, dv))
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


def acc_dtype(dtype):
    return np.float64 if np.dtype(dtype) == np.float64 else np.float32


def run_forward(q, k, v, **kw):
    """Allocates out/lse (NumPy) and calls native.forward; returns them."""
    b, h, nq, _ = q.shape
    dv = v.shape[3]
    out = np.empty((b, h, nq, dv), dtype=np.dtype(q.dtype))
    lse = np.empty((b, h, nq), dtype=acc_dtype(q.dtype))
    kw.setdefault("scale", 1.0 / np.sqrt(q.shape[3]))
    native.forward(q, k, v, out, lse, **_typed(kw))
    return out, lse


def run_backward(q, k, v, out, lse, dout, **kw):
    b, h, nq, dk = q.shape
    hkv, nk, dv = v.shape[1], v.shape[2], v.shape[3]
    a = acc_dtype(q.dtype)
    dq = np.empty((b, h, nq, dk), a)
    dk_ = np.empty((b, hkv, nk, dk), a)
    dv_ = np.empty((b, hkv, nk, dv), a)
    kw.setdefault("scale", 1.0 / np.sqrt(q.shape[3]))
    native.backward(q, k, v, out, lse, dout, dq, dk_, dv_, **_typed(kw))
    return dq, dk_, dv_


def max_err(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    both_inf = np.isneginf(a) & np.isneginf(b)
    assert np.array_equal(np.isneginf(a), np.isneginf(b)), "-inf pattern differs"
    assert not np.isnan(a).any(), "NaN in result"
    d = np.where(both_inf, 0.0, np.abs(np.where(both_inf, 0, a) - np.where(both_inf, 0, b)))
    return float(d.max()) if d.size else 0.0


TORCH_DTYPES = {"float32": "float32", "float64": "float64", "float16": "float16", "bfloat16": "bfloat16"}


def torch_forward(q, k, v, threads=1, **kw):
    """native.forward on torch tensors (any of the four dtypes); returns (out, lse) tensors."""
    import torch

    b, h, nq, dk = q.shape
    out = torch.empty((b, h, nq, v.shape[3]), dtype=q.dtype)
    lse = torch.empty((b, h, nq), dtype=torch.float64 if q.dtype == torch.float64 else torch.float32)
    kw.setdefault("scale", 1.0 / dk**0.5)
    native.forward(q, k, v, out, lse, threads=threads, **_typed(kw))
    return out, lse


def torch_backward(q, k, v, out, lse, dout, threads=1, **kw):
    import torch

    b, h, nq, dk = q.shape
    a = torch.float64 if q.dtype == torch.float64 else torch.float32
    dq = torch.empty((b, h, nq, dk), dtype=a)
    dk_ = torch.empty(k.shape, dtype=a)
    dv_ = torch.empty(v.shape, dtype=a)
    kw.setdefault("scale", 1.0 / dk**0.5)
    native.backward(q, k, v, out, lse, dout, dq, dk_, dv_, threads=threads, **_typed(kw))
    return dq, dk_, dv_


def torch_naive(q, k, v, scale, allowed=None, dout=None):
    """The textbook formula in the inputs' own dtype (the same-dtype baseline of the tolerances):
    out, and with dout the gradients (dq, dk, dv), GQA by repeat_interleave."""
    import torch

    g = q.shape[1] // k.shape[1]
    q, k, v = (t.detach().clone().requires_grad_(dout is not None) for t in (q, k, v))
    kk, vv = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s = (q @ kk.transpose(-1, -2)) * scale
    if allowed is not None:
        s = s.masked_fill(~torch.as_tensor(allowed), float("-inf"))
    w = torch.softmax(s, dim=-1)
    out = w @ vv
    if dout is None:
        return out.detach()
    out.backward(dout)
    return out.detach(), q.grad, k.grad, v.grad
