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


SEED_IMPLS = ["reference", "flash", "auto"]


@pytest.mark.parametrize("seed", [-1, -(2**63), 2**64, 2**80])
@pytest.mark.parametrize("impl", SEED_IMPLS)
def test_a_seed_outside_the_64_bit_key_is_an_argument_error(seed, impl, rng):
    from qkv.errors import ArgumentError

    q, k, v = make_qkv(rng, (1, 2, 8, 4), (1, 2, 8, 4), dtype=np.float32)
    arrays = [(q, k, v)]
    if HAS_TORCH:
        import torch

        arrays.append(
            tuple(torch.tensor(x, requires_grad=g) for x, g in zip((q, k, v), (False, True, False), strict=True))
        )
    for a in arrays:
        with pytest.raises(ArgumentError, match=rf"rng seed must be an integer in 0\.\.2\*\*64 - 1.*got {seed}"):
            qkv.attention(*a, dropout=P, rng=seed, impl=impl)


@pytest.mark.parametrize("seed", [0, 2**63, 2**64 - 1, np.uint64(2**64 - 1)])
def test_seeds_across_the_whole_64_bit_key_give_one_mask_on_every_impl(seed, rng):
    q, k, v = make_qkv(rng, (1, 2, 8, 4), (1, 2, 16, 4))
    ref = qkv.attention(q, k, v, dropout=P, rng=seed, impl="reference")
    for impl in ("flash", "auto"):
        assert_close(qkv.attention(q, k, v, dropout=P, rng=seed, impl=impl), ref, tol=1e-12, name=impl)


@pytest.mark.parametrize("bad", ["0.5", b"0.5", None, [0.5], float("nan"), 1.0, -0.1])
def test_dropout_must_be_a_probability_given_as_a_number(bad, rng):
    from qkv.errors import ArgumentError

    q, k, v = make_qkv(rng, (1, 1, 4, 4), (1, 1, 4, 4))
    for impl in SEED_IMPLS:
        with pytest.raises(ArgumentError, match="dropout must be"):
            qkv.attention(q, k, v, dropout=bad, rng=1, impl=impl)
