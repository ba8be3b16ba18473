"""qkv.positional: the sinusoidal table, RoPE (rotate-half) and ALiBi slopes, against formulas written here."""

import math

import numpy as np
import pytest

from qkv import positional
from qkv.errors import ArgumentError, ShapeError


def sinusoidal_loops(n, d, base=10000.0):
    """PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(pos / base^(2i/d)), one entry at a time."""
    pe = np.zeros((n, d))
    for pos in range(n):
        for c in range(d):
            i2 = c - c % 2  # 2i for both columns of the pair
            angle = pos / base ** (i2 / d)
            pe[pos, c] = math.sin(angle) if c % 2 == 0 else math.cos(angle)
    return pe


def rope_complex(x, positions, base=10000.0):
    """RoPE written as complex rotations: z_c = x_c + i x_{c + D/2}, z_c <- z_c e^{i pos θ_c}, θ_c = base^(-2c/D)."""
    x = np.asarray(x, dtype=np.float64)
    half = x.shape[-1] // 2
    z = x[..., :half] + 1j * x[..., half:]
    theta = base ** (-2.0 * np.arange(half) / x.shape[-1])
    z = z * np.exp(1j * np.asarray(positions, dtype=np.float64)[..., None] * theta)
    return np.concatenate([z.real, z.imag], axis=-1)


@pytest.mark.parametrize("n,d,base", [(7, 8, 10000.0), (5, 7, 10000.0), (4, 1, 10000.0), (6, 10, 100.0), (0, 4, 1e4)])
def test_sinusoidal_matches_the_formula(n, d, base):
    got = positional.sinusoidal(n, d, base)
    assert got.shape == (n, d) and got.dtype == np.float64
    np.testing.assert_allclose(got, sinusoidal_loops(n, d, base), rtol=0, atol=1e-12)


def test_sinusoidal_known_row():
    np.testing.assert_allclose(
        positional.sinusoidal(2, 4)[1], [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)], atol=1e-15
    )


@pytest.mark.parametrize(
    "kw",
    [dict(n=-1, d=4), dict(n=3, d=0), dict(n=3.5, d=4), dict(n=3, d=4, base=0.0), dict(n=3, d=4, base=float("inf"))],
)
def test_sinusoidal_rejects_bad_arguments(kw):
    with pytest.raises(ArgumentError):
        positional.sinusoidal(**kw)


@pytest.mark.parametrize("d", [2, 8, 6])
def test_rope_matches_complex_rotation(rng, d):
    x = rng.standard_normal((2, 3, 5, d))
    np.testing.assert_allclose(positional.rope(x), rope_complex(x, np.arange(5)), atol=1e-12)
    pos = np.array([3, 1, 4, 1, 5])
    np.testing.assert_allclose(positional.rope(x, pos), rope_complex(x, pos), atol=1e-12)


def test_rope_rotate_half_pairs_c_with_c_plus_half():
    """Feature c pairs with c + D/2 (GPT-NeoX / Llama), not with c + 1 (the interleaved GPT-J layout)."""
    x = np.zeros((1, 4))
    x[0, 0] = 1.0  # (x_0, x_2) = (1, 0) rotated by pos * θ_0 = 1 radian
    out = positional.rope(x, positions=np.array([1]))
    np.testing.assert_allclose(out[0], [math.cos(1), 0.0, math.sin(1), 0.0], atol=1e-15)


@pytest.mark.parametrize("torch_in", [False, True])
def test_rope_dot_product_depends_only_on_the_offset(rng, torch_in):
    """rope(q, m) · rope(k, n) = f(q, k, m - n) (RoFormer, arXiv:2104.09864, eq. 16)."""
    q, k = rng.standard_normal((2, 16))
    pairs = [(5, 2), (3, 0), (103, 100), (1002, 999)]  # all m - n = 3
    dots = []
    for m, n in pairs:
        qq, kk = q[None], k[None]
        if torch_in:
            torch = pytest.importorskip("torch")
            qq, kk = torch.from_numpy(qq), torch.from_numpy(kk)
        rq, rk = positional.rope(qq, np.array([m])), positional.rope(kk, np.array([n]))
        dots.append(float((rq * rk).sum()))
    np.testing.assert_allclose(dots, dots[0], rtol=1e-9)
    other = positional.rope(q[None], np.array([7])) @ positional.rope(k[None], np.array([2])).T
    assert abs(float(other[0, 0]) - dots[0]) > 1e-6  # a different offset gives a different product


def test_rope_with_offset_positions_continues_the_sequence(rng):
    """What a KV cache relies on: rotating the tail alone at positions L.. equals the tail of the whole."""
    x = rng.standard_normal((2, 9, 8))
    whole = positional.rope(x)
    np.testing.assert_allclose(positional.rope(x[:, 6:], positions=np.arange(6, 9)), whole[:, 6:], atol=1e-12)


def test_rope_broadcast_positions_per_batch(rng):
    x = rng.standard_normal((2, 3, 4, 6))  # (B, H, N, D)
    pos = np.array([[0, 1, 2, 3], [10, 11, 12, 13]])[:, None, :]  # (B, 1, N)
    out = positional.rope(x, pos)
    np.testing.assert_allclose(out[1], rope_complex(x[1], np.arange(10, 14)), atol=1e-12)


def test_rope_torch_keeps_dtype_device_and_gradients():
    torch = pytest.importorskip("torch")
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64, requires_grad=True)
    out = positional.rope(x, np.arange(2, 7))
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float64
    np.testing.assert_allclose(out.detach().numpy(), rope_complex(x.detach().numpy(), np.arange(2, 7)), atol=1e-12)
    assert torch.autograd.gradcheck(lambda t: positional.rope(t, np.arange(5)), (x,))
    half = positional.rope(x.detach().to(torch.bfloat16))
    assert half.dtype == torch.bfloat16
    np.testing.assert_allclose(half.float().numpy(), rope_complex(x.detach().numpy(), np.arange(5)), atol=5e-2)
    tpos = positional.rope(x.detach(), torch.arange(5))
    np.testing.assert_allclose(tpos.numpy(), rope_complex(x.detach().numpy(), np.arange(5)), atol=1e-12)


def test_rope_rotation_preserves_norms(rng):
    x = rng.standard_normal((4, 10))
    np.testing.assert_allclose(
        np.linalg.norm(positional.rope(x, np.arange(100, 104)), axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-12
    )


def test_rope_errors_name_the_problem(rng):
    with pytest.raises(ShapeError, match=r"even D .* D=7"):
        positional.rope(rng.standard_normal((3, 7)))
    with pytest.raises(ShapeError, match=r"positions have shape \(4,\)"):
        positional.rope(rng.standard_normal((3, 8)), positions=np.arange(4))
    with pytest.raises(ShapeError, match="needs x of shape"):
        positional.rope(rng.standard_normal(8))
    with pytest.raises(ArgumentError, match="finite"):
        positional.rope(rng.standard_normal((2, 8)), positions=np.array([0.0, np.nan]))
    with pytest.raises(ArgumentError, match="base"):
        positional.rope(rng.standard_normal((2, 8)), base=-1.0)


def test_alibi_slopes_for_eight_heads_are_powers_of_one_half():
    np.testing.assert_allclose(positional.alibi_slopes(8), [2.0**-k for k in range(1, 9)], rtol=0, atol=0)
