"""Bad arguments raise ValueError / TypeError naming the argument (never a crash)."""

import numpy as np
import pytest
import torch

from qkv import _native as native
from qkv._native import KernelMod, ModKind


def arrays(b=1, h=2, hkv=1, nq=20, nk=30, dk=8, dv=8, dtype=np.float32):
    q = np.zeros((b, h, nq, dk), dtype)
    k = np.zeros((b, hkv, nk, dk), dtype)
    v = np.zeros((b, hkv, nk, dv), dtype)
    out = np.zeros((b, h, nq, dv), dtype)
    lse = np.zeros((b, h, nq), np.float64 if dtype == np.float64 else np.float32)
    return q, k, v, out, lse


def fwd(*a, **kw):
    kw.setdefault("scale", 1.0)
    native.forward(*a, **kw)


def test_wrong_ndim():
    q, k, v, out, lse = arrays()
    with pytest.raises(ValueError, match=r"q must be 4-D"):
        fwd(q[0], k, v, out, lse)
    with pytest.raises(ValueError, match=r"lse must be 3-D"):
        fwd(q, k, v, out, lse[..., None])


def test_dtype_mismatch_and_unsupported():
    q, k, v, out, lse = arrays()
    with pytest.raises(TypeError, match="one dtype"):
        fwd(q, k.astype(np.float64), v, out, lse)
    with pytest.raises(TypeError, match="float32, float64, float16 or bfloat16"):
        fwd(q.astype(np.int32), k, v, out, lse)
    with pytest.raises(TypeError, match="out must be float32"):
        fwd(q, k, v, out.astype(np.float64), lse)
    with pytest.raises(TypeError, match="lse must be float32"):
        fwd(q, k, v, out, lse.astype(np.float64))


def test_shape_mismatch():
    q, k, v, out, lse = arrays()
    with pytest.raises(ValueError, match=r"k must have shape .*axis 3"):
        fwd(q, k[..., :4], v, out, lse)
    with pytest.raises(ValueError, match=r"v must have shape .*axis 2"):
        fwd(q, k, v[:, :, :10], out, lse)
    with pytest.raises(ValueError, match="multiple of the kv heads"):
        fwd(
            np.zeros((1, 3, 20, 8), np.float32),
            np.zeros((1, 2, 30, 8), np.float32),
            np.zeros((1, 2, 30, 8), np.float32),
            np.zeros((1, 3, 20, 8), np.float32),
            np.zeros((1, 3, 20), np.float32),
        )
    with pytest.raises(ValueError, match=r"out must have shape"):
        fwd(q, k, v, out[:, :, :5], lse)
    with pytest.raises(ValueError, match="Nk must be >= 1"):
        fwd(q, k[:, :, :0], v[:, :, :0], out, lse)


def test_last_axis_stride():
    q, k, v, out, lse = arrays()
    qq = np.zeros((1, 2, 20, 16), np.float32)[..., ::2]
    with pytest.raises(ValueError, match="q: the last axis must have stride 1"):
        fwd(qq, k, v, out, lse)
    with pytest.raises(ValueError, match="v: the last axis"):
        fwd(q, k, torch.zeros(1, 1, 8, 30).transpose(-1, -2), out, lse)


def test_non_contiguous_outputs():
    q, k, v, out, lse = arrays()
    big = np.zeros((1, 2, 40, 8), np.float32)
    with pytest.raises(ValueError, match="out must be C-contiguous"):
        fwd(q, k, v, big[:, :, ::2], lse)
    with pytest.raises(TypeError):
        fwd(q, k, v, np.broadcast_to(out, out.shape), lse)  # read-only


def test_mask_arrays():
    q, k, v, out, lse = arrays(nq=100, nk=300)
    nbq, nbk = 2, 3
    tc = np.full((1, 1, nbq, nbk), 2, np.int8)
    with pytest.raises(ValueError, match=r"tile_class must have shape .*nbq"):
        fwd(q, k, v, out, lse, tile_class=tc[:, :, :1])
    with pytest.raises(TypeError, match="tile_class must be int8"):
        fwd(q, k, v, out, lse, tile_class=tc.astype(np.int32))
    with pytest.raises(ValueError, match="axis 1 must be 1 or H=2"):
        fwd(q, k, v, out, lse, tile_class=np.full((1, 3, nbq, nbk), 2, np.int8))
    with pytest.raises(ValueError, match="tile_class values"):
        fwd(q, k, v, out, lse, tile_class=np.full((1, 1, nbq, nbk), 3, np.int8))
    with pytest.raises(ValueError, match=r"rows must have shape"):
        fwd(q, k, v, out, lse, rows=np.zeros((1, 1, 99, 2), np.int32))
    with pytest.raises(TypeError, match="rows must be int32"):
        fwd(q, k, v, out, lse, rows=np.zeros((1, 1, 100, 2), np.int64))
    bm = np.zeros((2, 64, 2), np.uint64)
    bi = np.zeros((1, 1, nbq, nbk), np.int32)
    with pytest.raises(ValueError, match="bitmap_index values"):
        fwd(q, k, v, out, lse, tile_class=tc, bitmap_index=bi + 2, bitmaps=bm)
    with pytest.raises(ValueError, match="bitmap_index needs tile_class"):
        fwd(q, k, v, out, lse, bitmap_index=bi, bitmaps=bm)
    with pytest.raises(ValueError, match="given together"):
        fwd(q, k, v, out, lse, tile_class=tc, bitmap_index=bi)
    with pytest.raises(ValueError, match=r"bitmaps must have shape"):
        fwd(q, k, v, out, lse, tile_class=tc, bitmap_index=bi, bitmaps=np.zeros((2, 64, 1), np.uint64))
    with pytest.raises(TypeError, match="tile_class must be a CPU array"):
        fwd(q, k, v, out, lse, tile_class=[[1]])


def test_mods_bias_options():
    q, k, v, out, lse = arrays()
    with pytest.raises(TypeError, match="KernelMod"):  # string-tagged tuples are gone
        fwd(q, k, v, out, lse, mods=(("softcap", 2.0),))
    with pytest.raises(TypeError, match="KernelMod"):  # the binding too refuses them
        native._ext.forward(q, k, v, out, lse, scale=1.0, mods=(("softcap", 2.0),))
    with pytest.raises(ValueError, match="unknown mod kind 7"):
        native._ext.forward(q, k, v, out, lse, scale=1.0, mods=((7, 2.0, None, 0),))
    with pytest.raises(ValueError, match="softcap.*> 0"):
        fwd(q, k, v, out, lse, mods=(KernelMod(ModKind.SOFTCAP, 0.0),))
    with pytest.raises(ValueError, match="mul.*takes no table"):
        fwd(q, k, v, out, lse, mods=(KernelMod(ModKind.MUL, 2.0, np.ones(2)),))
    with pytest.raises(ValueError, match=r"head axis must be 1 or H=2"):
        fwd(q, k, v, out, lse, mods=(KernelMod(ModKind.ALIBI, table=np.ones(3)),))
    with pytest.raises(ValueError, match=r"2M\+1"):
        fwd(q, k, v, out, lse, mods=(KernelMod(ModKind.RELBIAS, table=np.ones((2, 4)), m=2),))
    with pytest.raises(ValueError, match=r"bias: axis 3 must be Nk=30"):
        fwd(q, k, v, out, lse, bias=np.zeros((1, 1, 1, 29)))
    with pytest.raises(ValueError, match="dropout_p"):
        fwd(q, k, v, out, lse, dropout_p=1.0)
    with pytest.raises(ValueError, match="threads"):
        fwd(q, k, v, out, lse, threads=0)
    with pytest.raises(ValueError, match="scale must be finite"):
        fwd(q, k, v, out, lse, scale=float("nan"))


def test_backward_arguments():
    q, k, v, out, lse = arrays()
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    native.backward(q, k, v, out, lse, out, dq, dk, dv, scale=1.0)
    with pytest.raises(TypeError, match="dq must be float32"):
        native.backward(q, k, v, out, lse, out, dq.astype(np.float64), dk, dv, scale=1.0)
    with pytest.raises(ValueError, match=r"dk must have shape"):
        native.backward(q, k, v, out, lse, out, dq, dk[:, :, :3], dv, scale=1.0)
    with pytest.raises(ValueError, match=r"dlse must have shape"):
        native.backward(q, k, v, out, lse, out, dq, dk, dv, dlse=lse[..., :3], scale=1.0)
    with pytest.raises(TypeError, match="dout must have q's dtype"):
        native.backward(q, k, v, out, lse, out.astype(np.float64), dq, dk, dv, scale=1.0)
    with pytest.raises(ValueError, match="dv must be C-contiguous"):
        native.backward(q, k, v, out, lse, out, dq, dk, np.zeros((1, 1, 30, 16), np.float32)[..., ::2], scale=1.0)


def test_philox_keep_arguments():
    with pytest.raises(ValueError, match="p must be in"):
        native.philox_keep(0, 0, 0, 0, 2, 0, 2, 1.5)
    with pytest.raises(ValueError, match="i0 <= i1"):
        native.philox_keep(0, 0, 0, 3, 2, 0, 2, 0.5)
