"""qkv.hopfield: modern Hopfield retrieval (Ramsauer et al., arXiv:2008.02217) as iterated attention."""

import numpy as np
import pytest

import qkv
from qkv.errors import ArgumentError, ShapeError


def update(xi, patterns, beta):
    """One step of ξ <- Xᵀ softmax(β X ξ), written per query row."""
    out = np.zeros_like(xi)
    for r, x in enumerate(xi):
        s = beta * patterns @ x
        p = np.exp(s - s.max())
        out[r] = patterns.T @ (p / p.sum())
    return out


def test_large_beta_recovers_stored_patterns_from_noisy_queries(rng):
    patterns = np.sign(rng.standard_normal((20, 64)))  # 20 random ±1 patterns in 64 dimensions
    which = rng.integers(0, 20, size=8)
    noisy = patterns[which].copy()
    flip = rng.random(noisy.shape) < 0.2  # 20 % of the signs flipped
    noisy[flip] *= -1
    noisy += 0.3 * rng.standard_normal(noisy.shape)
    out = qkv.hopfield(noisy, patterns, beta=8.0)
    np.testing.assert_allclose(out, patterns[which], atol=1e-6)  # one step: a hard lookup


def test_small_beta_averages_the_patterns(rng):
    patterns = rng.standard_normal((6, 5))
    out = qkv.hopfield(rng.standard_normal((3, 5)), patterns, beta=1e-8)
    np.testing.assert_allclose(out, np.broadcast_to(patterns.mean(0), (3, 5)), atol=1e-6)


@pytest.mark.parametrize("beta,steps", [(0.5, 1), (2.0, 3)])
def test_steps_iterate_the_update_rule(rng, beta, steps):
    patterns, xi = rng.standard_normal((7, 4)), rng.standard_normal((3, 4))
    want = xi
    for _ in range(steps):
        want = update(want, patterns, beta)
    np.testing.assert_allclose(qkv.hopfield(xi, patterns, beta=beta, steps=steps), want, atol=1e-12)


def test_batched_torch_inputs_and_gradients(rng):
    torch = pytest.importorskip("torch")
    patterns, xi = rng.standard_normal((2, 7, 4)), rng.standard_normal((2, 3, 4))
    tq = torch.tensor(xi, requires_grad=True)
    out = qkv.hopfield(tq, torch.tensor(patterns), beta=1.5, steps=2)
    assert isinstance(out, torch.Tensor) and out.shape == (2, 3, 4)
    for b in range(2):
        want = update(update(xi[b], patterns[b], 1.5), patterns[b], 1.5)
        np.testing.assert_allclose(out[b].detach().numpy(), want, atol=1e-12)
    out.sum().backward()
    assert tq.grad is not None and torch.isfinite(tq.grad).all()


def test_errors(rng):
    x = rng.standard_normal((2, 4))
    with pytest.raises(ArgumentError, match="steps"):
        qkv.hopfield(x, x, steps=0)
    with pytest.raises(ArgumentError, match="beta"):
        qkv.hopfield(x, x, beta=0.0)
    with pytest.raises(ArgumentError, match="beta"):
        qkv.hopfield(x, x, beta=float("nan"))
    with pytest.raises(ShapeError, match=r"patterns have D=3 .* query has D=4"):
        qkv.hopfield(x, rng.standard_normal((5, 3)))
