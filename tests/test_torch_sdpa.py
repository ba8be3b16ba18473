"""impl="torch" against torch.nn.functional.scaled_dot_product_attention itself (the second oracle).

SDPA's is_causal is top-left; qkv's causal is bottom-right, so for Nq != Nk qkv must differ
from is_causal=True and match SDPA given an explicit bottom-right mask.
"""

import numpy as np
import pytest

import qkv
from helpers import assert_close, assert_close_to_golden

torch = pytest.importorskip("torch")
F = torch.nn.functional


def randn(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def bottom_right(nq, nk):
    return torch.ones(nq, nk, dtype=torch.bool).tril(diagonal=nk - nq)


def sdpa64(q, k, v, **kw):
    """The float64 golden: SDPA on the float64 upcast of the very same inputs."""
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), **kw)


def test_causal_square_matches_sdpa_is_causal():
    q, k, v = (randn(2, 4, 9, 16, seed=s) for s in range(3))
    out = qkv.attention(q, k, v, causal=True, impl="torch")
    golden = sdpa64(q, k, v, is_causal=True)
    assert_close_to_golden(out, golden, F.scaled_dot_product_attention(q, k, v, is_causal=True))


@pytest.mark.parametrize("nq,nk", [(3, 8), (1, 6)])
def test_causal_nq_lt_nk_is_bottom_right_not_is_causal(nq, nk):
    q, k, v = randn(2, 2, nq, 8, seed=1), randn(2, 2, nk, 8, seed=2), randn(2, 2, nk, 8, seed=3)
    out = qkv.attention(q, k, v, causal=True, impl="torch")
    mask = bottom_right(nq, nk)
    golden = sdpa64(q, k, v, attn_mask=mask)
    assert_close_to_golden(out, golden, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    top_left = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert (out - top_left).abs().max() > 1e-3


def test_causal_nq_gt_nk_has_empty_rows_where_sdpa_has_none_to_attend():
    nq, nk = 6, 3
    q, k, v = randn(1, 2, nq, 8, seed=4), randn(1, 2, nk, 8, seed=5), randn(1, 2, nk, 8, seed=6)
    out = qkv.attention(q, k, v, causal=True, impl="torch")
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert (out[..., : nq - nk, :] == 0).all()  # rows 0..2 may attend no key
    rows = slice(nq - nk, nq)
    mask = bottom_right(nq, nk)
    golden = sdpa64(q[..., rows, :], k, v, attn_mask=mask[rows])
    baseline = F.scaled_dot_product_attention(q[..., rows, :], k, v, attn_mask=mask[rows])
    assert_close_to_golden(out[..., rows, :], golden, baseline)


def test_gqa_matches_sdpa_enable_gqa():
    q, k, v = randn(2, 8, 5, 16, seed=7), randn(2, 2, 11, 16, seed=8), randn(2, 2, 11, 16, seed=9)
    out = qkv.attention(q, k, v, impl="torch")
    golden = sdpa64(q, k, v, enable_gqa=True)
    assert_close_to_golden(out, golden, F.scaled_dot_product_attention(q, k, v, enable_gqa=True))


def test_gqa_causal_matches_sdpa_with_explicit_mask():
    q, k, v = randn(1, 6, 4, 8, seed=10), randn(1, 3, 9, 8, seed=11), randn(1, 3, 9, 8, seed=12)
    out = qkv.attention(q, k, v, causal=True, impl="torch")
    mask = bottom_right(4, 9)
    golden = sdpa64(q, k, v, attn_mask=mask, enable_gqa=True)
    assert_close_to_golden(out, golden, F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True))


def test_bool_mask_float_bias_and_scale_match_sdpa():
    q, k, v = randn(2, 2, 5, 8, seed=13), randn(2, 2, 7, 8, seed=14), randn(2, 2, 7, 8, seed=15)
    mask = randn(2, 1, 5, 7, seed=16) > -0.5
    mask[..., 0] = True  # no empty rows: SDPA's behaviour for them is not the oracle's business here
    out = qkv.attention(q, k, v, mask=mask, scale=0.3, impl="torch")
    golden = sdpa64(q, k, v, attn_mask=mask, scale=0.3)
    assert_close_to_golden(out, golden, F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3))
    bias = randn(5, 7, seed=17)
    out = qkv.attention(q, k, v, mask=bias, impl="torch")
    golden = sdpa64(q, k, v, attn_mask=bias.double())
    assert_close_to_golden(out, golden, F.scaled_dot_product_attention(q, k, v, attn_mask=bias))


def test_alibi_matches_sdpa_with_the_alibi_bias():
    h, nq, nk = 4, 5, 8
    q, k, v = randn(1, h, nq, 8, seed=18), randn(1, h, nk, 8, seed=19), randn(1, h, nk, 8, seed=20)
    out = qkv.attention(q, k, v, score_mod=qkv.scores.alibi(n_heads=h), impl="torch")
    slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / h) for i in range(h)], dtype=torch.float64)
    dist = (torch.arange(nq)[:, None] + (nk - nq) - torch.arange(nk)[None, :]).abs()
    bias = -slopes[:, None, None] * dist
    golden = sdpa64(q, k, v, attn_mask=bias)
    assert_close_to_golden(out, golden, F.scaled_dot_product_attention(q, k, v, attn_mask=bias.float()))


def test_float64_matches_sdpa_to_1e_12():
    q, k, v = (randn(2, 3, 6, 5, dtype=torch.float64, seed=s) for s in (21, 22, 23))
    out = qkv.attention(q, k, v, causal=True, impl="torch")
    assert out.dtype == torch.float64
    assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))


@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_half_precision_matches_sdpa(dtype_name, causal):
    dtype = getattr(torch, dtype_name)
    q, k, v = (
        randn(2, 4, 32, 64, dtype=dtype, seed=24),
        randn(2, 2, 96, 64, dtype=dtype, seed=25),
        randn(2, 2, 96, 64, dtype=dtype, seed=26),
    )
    kw = {"attn_mask": bottom_right(32, 96)} if causal else {}
    out = qkv.attention(q, k, v, causal=causal, impl="torch")
    assert out.dtype == dtype
    golden = sdpa64(q, k, v, enable_gqa=True, **kw)
    baseline = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)
    assert_close_to_golden(out, golden, baseline)


def test_torch_impl_gradients_match_sdpa_autograd():
    q, k, v = (randn(1, 2, 4, 8, dtype=torch.float64, seed=s).requires_grad_() for s in (27, 28, 29))
    mask = bottom_right(4, 4)
    out = qkv.attention(q, k, v, causal=True, impl="torch")
    dout = randn(*out.shape, dtype=torch.float64, seed=30)
    grads = torch.autograd.grad((out * dout).sum(), (q, k, v))
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    ref_grads = torch.autograd.grad((ref * dout).sum(), (q, k, v))
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref_grads, strict=True):
        assert_close(g, r.detach(), tol=1e-12, name=name)
    assert np.isfinite(out.detach().numpy()).all()
