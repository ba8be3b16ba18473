"""qkv.merge_attention: partial results over disjoint key sets merge into attention over their union.

The partial results and the expected result both come from the float64 loop oracle (which
imports nothing from qkv), so the only qkv code under test is the merge itself.
"""

import numpy as np
import pytest

import oracle as O
import qkv
from helpers import HAS_TORCH, assert_close
from qkv.errors import ArgumentError, DTypeError, ShapeError

needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")


def split_keys(rng, q, k, v, allowed, n_parts, empty_part=True):
    """Partial (out, lse) of the oracle over a random partition of the keys (one part may be empty)."""
    nk = k.shape[-2]
    owner = rng.integers(0, n_parts - 1 if empty_part else n_parts, size=nk)  # the last part may own no key
    outs, lses = [], []
    for p in range(n_parts):
        js = np.flatnonzero(owner == p)
        out, _, lse = O.attention_oracle(q, k[..., js, :], v[..., js, :], allowed[..., js])
        outs.append(out)
        lses.append(lse)
    return outs, lses


def case(rng, nq=5, nk=11):
    q = rng.standard_normal((2, 3, nq, 4))
    k = rng.standard_normal((2, 3, nk, 4))
    v = rng.standard_normal((2, 3, nk, 6))
    allowed = rng.random((2, 3, nq, nk)) < 0.6
    allowed[0, 0, 1] = False  # a row every part finds empty
    allowed[1, 2, 3, :] = False
    allowed[1, 2, 3, 0] = True  # a row with one key, so every other part is empty for it
    return q, k, v, allowed


@pytest.mark.parametrize("n_parts", [1, 2, 4])
def test_merge_equals_attention_over_the_union_of_key_sets(rng, n_parts):
    q, k, v, allowed = case(rng)
    outs, lses = split_keys(rng, q, k, v, allowed, n_parts, empty_part=n_parts > 1)
    expected_out, _, expected_lse = O.attention_oracle(q, k, v, allowed)
    out, lse = qkv.merge_attention(outs, lses)
    assert isinstance(out, np.ndarray) and out.dtype == np.float64 and lse.dtype == np.float64
    assert_close(out, expected_out, tol=1e-12, name="out")
    assert_close(lse, expected_lse, tol=1e-12, name="lse")


def test_all_empty_row_gives_zeros_and_minus_inf():
    outs = [np.zeros((2, 3)), np.zeros((2, 3))]
    lses = [np.array([-np.inf, 0.5]), np.array([-np.inf, -np.inf])]
    out, lse = qkv.merge_attention(outs, lses)  # filterwarnings=error: no RuntimeWarning either
    assert (out[0] == 0).all() and np.isneginf(lse[0])
    assert lse[1] == 0.5 and (out[1] == 0).all()


def test_parts_with_huge_lse_merge_without_overflow():
    outs = [np.ones((1, 2)), 3 * np.ones((1, 2))]
    lses = [np.array([1000.0]), np.array([1000.0 + np.log(3.0)])]  # exp(1000) overflows float64
    out, lse = qkv.merge_attention(outs, lses)
    assert_close(out, np.full((1, 2), (1 + 3 * 3) / 4), tol=1e-14)
    assert_close(lse, [1000.0 + np.log(4.0)], tol=1e-14)


def test_merge_accepts_a_stacked_array_of_parts(rng):
    outs, lses = rng.standard_normal((3, 4, 5, 2)), rng.standard_normal((3, 4, 5))
    out, lse = qkv.merge_attention(outs, lses)
    w = np.exp(lses - lses.max(0))
    assert_close(out, (w[..., None] * outs).sum(0) / w.sum(0)[..., None], tol=1e-13)


@needs_torch
def test_torch_in_torch_out_same_result(rng):
    import torch

    q, k, v, allowed = case(rng)
    outs, lses = split_keys(rng, q, k, v, allowed, 3)
    expected_out, _, expected_lse = O.attention_oracle(q, k, v, allowed)
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-6)):
        out, lse = qkv.merge_attention(
            [torch.tensor(o, dtype=dtype) for o in outs], [torch.tensor(s, dtype=dtype) for s in lses]
        )
        assert isinstance(out, torch.Tensor) and out.dtype == dtype and lse.dtype == dtype
        assert_close(out, expected_out, tol=tol)
        assert_close(lse, expected_lse, tol=tol)


@needs_torch
def test_half_precision_merges_in_float32_and_returns_the_output_dtype(rng):
    import torch

    outs = [torch.tensor(rng.standard_normal((3, 4)), dtype=torch.bfloat16) for _ in range(2)]
    lses = [torch.tensor(rng.standard_normal(3), dtype=torch.float32) for _ in range(2)]
    out, lse = qkv.merge_attention(outs, lses)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    l64 = torch.stack(lses).double()
    w = torch.softmax(l64, dim=0)[..., None]
    expected = (w * torch.stack(outs).double()).sum(0)
    assert float((out.double() - expected).abs().max()) <= 2**-7 * float(expected.abs().max())


@needs_torch
def test_gradients_through_merge_pass_gradcheck(rng):
    import torch

    outs = [torch.tensor(rng.standard_normal((2, 3, 4)), requires_grad=True) for _ in range(3)]
    lse_values = rng.standard_normal((3, 2, 3))
    lse_values[1, 0, 1] = -np.inf  # one empty part in a row that other parts fill
    lses = [torch.tensor(x, requires_grad=True) for x in lse_values]

    def merged(*xs):
        return qkv.merge_attention(list(xs[:3]), list(xs[3:]))

    assert torch.autograd.gradcheck(merged, (*outs, *lses), eps=1e-6, atol=1e-9)


@needs_torch
def test_all_empty_row_gets_zero_gradients_not_nan():
    import torch

    outs = [torch.zeros(2, 3, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    lses = [
        torch.tensor([-np.inf, 1.0], dtype=torch.float64, requires_grad=True),
        torch.tensor([-np.inf, -np.inf], dtype=torch.float64, requires_grad=True),
    ]
    out, lse = qkv.merge_attention(outs, lses)
    (out.sum() + torch.where(torch.isfinite(lse), lse, 0).sum()).backward()
    for x in (*outs, *lses):
        assert torch.isfinite(x.grad).all()
    assert (outs[0].grad[0] == 0).all() and lses[0].grad[0] == 0 and lses[1].grad[0] == 0
    assert (outs[0].grad[1] == 1).all() and (outs[1].grad[1] == 0).all()  # part 1 is empty in row 1


@pytest.mark.parametrize(
    "outs,lses,error,words",
    [
        ([], [], ArgumentError, "at least one part"),
        ([np.zeros((2, 3))], [np.zeros(2), np.zeros(2)], ArgumentError, "outs has 1 parts but lses has 2"),
        ([np.zeros((2, 3)), np.zeros((2, 4))], [np.zeros(2), np.zeros(2)], ShapeError, r"outs\[1\] has shape \(2, 4\)"),
        ([np.zeros((2, 3))], [np.zeros(3)], ShapeError, r"lses\[0\] has shape \(3,\)"),
        ([np.zeros((2, 3), dtype=int)], [np.zeros(2)], DTypeError, "floating-point"),
        (np.zeros((2, 3)), np.zeros(2), ShapeError, r"outs\[0\] has shape \(3,\)"),
    ],
)
def test_bad_parts_raise_named_errors(outs, lses, error, words):
    with pytest.raises(error, match=words):
        qkv.merge_attention(outs, lses)


@needs_torch
def test_mixed_numpy_and_torch_parts_raise_type_error():
    import torch

    with pytest.raises(TypeError, match="mixed kinds"):
        qkv.merge_attention([np.zeros((2, 3)), torch.zeros(2, 3, dtype=torch.float64)], [np.zeros(2), np.zeros(2)])
