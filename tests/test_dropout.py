"""Inverted dropout on the weights: kept weights are A / (1 - p), dropped ones exactly 0, the
returned weights are the ones multiplied into v, and the same rng seed gives the same result."""

import numpy as np
import pytest

import oracle as O
import qkv
from helpers import HAS_TORCH, assert_close, make_qkv

P = 0.3
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")


def check_dropped_weights(out, weights, lse, q, k, v, allowed=None):
    weights = np.asarray(weights, dtype=np.float64)
    g_out, g_w, g_lse = O.attention_oracle(q, k, v, allowed=allowed)
    kept = weights != 0
    assert_close(np.where(kept, weights, 0), np.where(kept, g_w / (1 - P), 0), name="kept weights")
    live = np.broadcast_to(g_w > 0, weights.shape)
    assert not (kept & ~live).any(), "a masked weight survived dropout"
    dropped = 1 - kept[live].mean()
    assert abs(dropped - P) < 0.05, f"dropped fraction {dropped:.3f}, p = {P}"
    assert_close(out, O.weighted_values(weights, v), name="out = dropped weights @ v")
    assert_close(lse, g_lse, name="lse (softmax statistics, before dropout)")
    assert np.abs(np.asarray(out, np.float64) - g_out).max() > 1e-3  # dropout did something


@pytest.mark.parametrize("impl", ["reference", "auto"])
def test_dropout_numpy_generator(impl, rng):
    q, k, v = make_qkv(rng, (2, 2, 8, 4), (2, 2, 64, 4))
    out, w, lse = qkv.attention(
        q, k, v, dropout=P, rng=np.random.default_rng(5), impl=impl, return_weights=True, return_lse=True
    )
    check_dropped_weights(out, w, lse, q, k, v)
    again = qkv.attention(q, k, v, dropout=P, rng=np.random.default_rng(5), impl=impl, return_weights=True)
    assert (again[0] == out).all() and (again[1] == w).all(), "same seed, different result"
    other = qkv.attention(q, k, v, dropout=P, rng=np.random.default_rng(6), impl=impl)
    assert (other != out).any(), "different seeds, same result"


@pytest.mark.parametrize("impl", ["reference", "auto"])
def test_dropout_with_a_causal_mask_keeps_masked_weights_zero(impl, rng):
    q, k, v = make_qkv(rng, (1, 4, 16, 4), (1, 2, 24, 4))
    out, w, lse = qkv.attention(
        q, k, v, causal=True, dropout=P, rng=np.random.default_rng(1), impl=impl, return_weights=True, return_lse=True
    )
    check_dropped_weights(out, w, lse, q, k, v, allowed=O.causal_allowed(16, 24))


@pytest.mark.parametrize("impl", ["reference", "auto"])
def test_dropout_zero_is_deterministic_and_equals_no_dropout(impl, rng):
    q, k, v = make_qkv(rng, (2, 2, 5, 4), (2, 2, 7, 4))
    plain = qkv.attention(q, k, v, impl=impl)
    for r in (None, np.random.default_rng(0), np.random.default_rng(1)):
        assert (qkv.attention(q, k, v, dropout=0.0, rng=r, impl=impl) == plain).all()
    assert_close(plain, O.attention_oracle(q, k, v)[0])


@needs_torch
@pytest.mark.parametrize("impl", ["reference", "auto"])
def test_dropout_torch_generator(impl, rng):
    import torch

    q, k, v = make_qkv(rng, (2, 2, 8, 4), (2, 2, 64, 4))
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    out, w, lse = qkv.attention(
        tq, tk, tv, dropout=P, rng=torch.Generator().manual_seed(5), impl=impl, return_weights=True, return_lse=True
    )
    assert isinstance(out, torch.Tensor) and isinstance(w, torch.Tensor)
    check_dropped_weights(out.numpy(), w.numpy(), lse.numpy(), q, k, v)
    again = qkv.attention(tq, tk, tv, dropout=P, rng=torch.Generator().manual_seed(5), impl=impl)
    assert torch.equal(again, out)
    other = qkv.attention(tq, tk, tv, dropout=P, rng=torch.Generator().manual_seed(6), impl=impl)
    assert not torch.equal(other, out)
    assert torch.equal(qkv.attention(tq, tk, tv, dropout=0.0, impl=impl), qkv.attention(tq, tk, tv, impl=impl))


@needs_torch
@pytest.mark.parametrize("impl", ["reference", "auto"])
def test_dropout_gradient_flows_through_the_kept_weights(impl, rng):
    import torch

    q, k, v = make_qkv(rng, (1, 2, 6, 4), (1, 2, 9, 4))
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    out, w = qkv.attention(tq, tk, tv, dropout=P, rng=torch.Generator().manual_seed(3), impl=impl, return_weights=True)
    dout = rng.standard_normal(out.shape)
    (out * torch.from_numpy(dout)).sum().backward()
    w = w.detach().numpy()
    assert_close(tv.grad.numpy(), np.swapaxes(w, -1, -2) @ dout, name="dv = (dropped weights)ᵀ dout")
    assert np.isfinite(tq.grad.numpy()).all() and np.isfinite(tk.grad.numpy()).all()
