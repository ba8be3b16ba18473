"""The lean road to the compiled kernel (``_impls._lean``): the calls most made (plain CPU torch
tensors, ``causal`` or nothing) take it, and give exactly what the full path gives; everything
unusual falls through to the full path, which checks and reports as always."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import oracle as O  # noqa: E402
import qkv  # noqa: E402
from helpers import assert_close  # noqa: E402
from qkv import _native  # noqa: E402
from qkv._core import run  # noqa: E402
from qkv._impls import build_call, lean_attention  # noqa: E402
from qkv.errors import ArgumentError, ShapeError  # noqa: E402

pytestmark = pytest.mark.skipif(not _native.available(), reason="compiled engine unavailable")

SHAPES = [  # q, k/v shapes: MHA, GQA, decode, Nq > Nk, Dv != Dk
    ((2, 4, 37, 16), (2, 4, 37, 16), 16),
    ((1, 8, 5, 32), (1, 2, 70, 32), 32),
    ((1, 8, 1, 64), (1, 2, 300, 64), 64),
    ((1, 2, 9, 8), (1, 2, 4, 8), 8),
    ((1, 2, 20, 8), (1, 2, 20, 8), 12),
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("qs,ks,dv", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_lean_road_is_taken_and_equals_the_oracle_and_the_full_path(qs, ks, dv, causal, dtype, rng):
    q = torch.from_numpy(rng.standard_normal(qs)).to(dtype)
    k = torch.from_numpy(rng.standard_normal(ks)).to(dtype)
    v = torch.from_numpy(rng.standard_normal((*ks[:-1], dv))).to(dtype)
    lean = lean_attention(q, k, v, causal, None)
    assert lean is not None
    full = run(build_call(q, k, v, causal=causal, want_lse=True), "flash")
    assert torch.equal(lean.out, full.out) and torch.equal(lean.lse, full.lse)
    nq, nk = qs[-2], ks[-2]
    allowed = O.causal_allowed(nq, nk) if causal else None
    golden = O.attention_oracle(q.double().numpy(), k.double().numpy(), v.double().numpy(), allowed=allowed)
    tol = 1e-11 if dtype == torch.float64 else 2e-5
    out, lse = qkv.attention(q, k, v, causal=causal, return_lse=True)
    assert_close(out.double().numpy(), golden[0], tol=tol)
    assert_close(lse.double().numpy(), golden[2], tol=tol)


def test_unusual_calls_take_the_full_path_with_its_errors(rng):
    q = torch.randn(1, 2, 8, 4)
    assert lean_attention(q, q.numpy(), q, False, None) is None  # mixed kinds
    assert lean_attention(q.requires_grad_(), q.detach(), q.detach(), False, None) is None  # autograd
    q = q.detach()
    assert lean_attention(q, q, q, False, 2) is None  # an int scale: the full path checks it
    assert lean_attention(q[..., ::2], q[..., ::2], q[..., ::2], False, None) is None  # strided last axis
    with pytest.raises(ShapeError, match="d_k"):
        qkv.attention(q, torch.randn(1, 2, 8, 3), q)
    with pytest.raises(ArgumentError, match="overflow"):  # the kernel reports it, the full path raises
        qkv.attention(q * 1e20, q * 1e20, q)
    k = q.clone()
    k[..., 3, 0] = float("nan")
    out = qkv.attention(q, k, q, causal=True)  # rows 3.. attend key 3: NaN; rows 0..2 do not
    assert torch.isnan(out[..., 3:, :]).all() and torch.isfinite(out[..., :3, :]).all()
    np.testing.assert_array_equal(
        out[..., :3, :].numpy(), qkv.attention(q[..., :3, :], q[..., :3, :], q[..., :3, :], causal=True).numpy()
    )


def test_other_devices_fall_through_and_transposed_layouts_stay_lean(rng):
    q = torch.randn(1, 2, 8, 4)
    assert lean_attention(q, q.to("meta"), q, False, None) is None  # not every array on the CPU
    assert lean_attention(q.to("meta"), q.to("meta"), q.to("meta"), False, None) is None
    # (B, N, H, D) storage seen as (B, H, N, D), as transformers' attention layers hand it over:
    # not contiguous, yet every row is dense, so the kernel reads it in place
    x = torch.from_numpy(rng.standard_normal((3, 2, 13, 4, 8))).float()
    q, k, v = (t.transpose(1, 2) for t in x)
    assert not q.is_contiguous()
    lean = lean_attention(q, k, v, True, None)
    assert lean is not None
    golden = O.attention_oracle(*(t.double().numpy() for t in (q, k, v)), allowed=O.causal_allowed(13, 13))
    assert_close(lean.out.double().numpy(), golden[0], tol=2e-5)


FORMATS = ["int8", "float8_e4m3fn", "float8_e5m2"]


def _packed(x, fmt):
    """``x`` quantized and held as a transformers ``QuantizedCache`` layer holds it: each token's
    codes followed by its float32 scale in one uint8 row, read back as strided views."""
    qx = qkv.quantize(x, fmt)
    row = torch.cat([qx.values.view(torch.uint8), qx.scales.unsqueeze(-1).contiguous().view(torch.uint8)], -1)
    d = x.shape[-1]
    return qkv.Quantized(row[..., :d].view(qx.values.dtype), row[..., d:].view(torch.float32)[..., 0], fmt)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_a_quantized_cache_takes_the_lean_road_and_equals_the_oracle_and_the_full_path(fmt, causal, dtype, rng):
    """A decode step (or a chunk) against an 8-bit cache reaches the kernel by the lean road, with
    the codes and scales as they are stored (contiguous, or the strided rows of a packed layer, a
    scale per token or per kv head): the full path's result bit for bit, the oracle's over the
    dequantized cache."""
    for qs, ks, dv in SHAPES:
        q = torch.from_numpy(rng.standard_normal(qs)).to(dtype)
        k = torch.from_numpy(rng.standard_normal(ks)).float()
        v = torch.from_numpy(rng.standard_normal((*ks[:-1], dv))).float()
        k[..., ::3, :] *= 30.0  # tokens of different sizes: their scales differ
        layouts = [(qkv.quantize(k, fmt), qkv.quantize(v, fmt)), (_packed(k, fmt), _packed(v, fmt))]
        if fmt != "int8":
            layouts.append((qkv.quantize(k, fmt, scale="head"), qkv.quantize(v, fmt, scale="head")))
        for qk, qv in layouts:
            lean = lean_attention(q, qk, qv, causal, None)
            assert lean is not None
            full = run(build_call(q, qk, qv, causal=causal, want_lse=True), "flash")
            assert torch.equal(lean.out, full.out) and torch.equal(lean.lse, full.lse)
            nq, nk = qs[-2], ks[-2]
            k64, v64 = (qkv.dequantize(x, "float64").numpy() for x in (qk, qv))
            golden = O.attention_oracle(
                q.double().numpy(), k64, v64, allowed=O.causal_allowed(nq, nk) if causal else None
            )
            tol = {torch.float64: 1e-11, torch.float32: 2e-5, torch.bfloat16: 1e-2}[dtype]
            out, lse = qkv.attention(q, qk, qv, causal=causal, return_lse=True)
            assert_close(out.double().numpy(), golden[0], tol=tol)
            assert_close(lse.double().numpy(), golden[2], tol=tol)


def test_an_unusual_quantized_call_takes_the_full_path_with_its_errors(rng):
    q, k = torch.randn(1, 4, 1, 8), torch.randn(1, 2, 20, 8)
    qk, q8 = qkv.quantize(k, "int8"), qkv.quantize(k, "float8_e5m2")
    assert lean_attention(q, qk, k, False, None) is None  # one side quantized
    assert lean_attention(q, k, qk, False, None) is None
    assert lean_attention(q, qk, q8, False, None) is None  # two formats
    assert lean_attention(q.clone().requires_grad_(), qk, qk, False, None) is None  # q's gradient
    grad_scales = qkv.Quantized(qk.values, qk.scales.clone().requires_grad_(), "int8")
    assert lean_attention(q, grad_scales, qk, False, None) is None
    flat = qkv.quantize(k[0], "int8")  # (Hkv, Nk, D): the full path broadcasts it
    assert lean_attention(q, flat, flat, False, None) is None
    with pytest.raises(qkv.errors.DTypeError, match="both be qkv.Quantized"):
        qkv.attention(q, qk, k)
    with pytest.raises(qkv.errors.DTypeError, match="different formats"):
        qkv.attention(q, qk, q8)
    with pytest.raises(ShapeError, match="d_k"):
        qkv.attention(torch.randn(1, 4, 1, 6), qk, qk)
    out = qkv.attention(q.clone().requires_grad_(), qk, qk)  # the full path, with its gradient
    out.sum().backward()
