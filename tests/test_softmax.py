"""qkv.softmax and qkv.logsumexp: stable, an all -inf row gives zeros / -inf, never a warning."""

import warnings

import numpy as np
import pytest

import oracle as O
import qkv
from helpers import HAS_TORCH, assert_close

ROWS = np.array(
    [
        [0.0, 1.0, 2.0, 3.0],
        [1000.0, 1001.0, 999.0, -1000.0],  # would overflow exp without the max shift
        [-1000.0, -1001.0, -np.inf, -1002.0],  # would underflow to 0/0
        [-np.inf, -np.inf, -np.inf, -np.inf],  # an empty row
        [-np.inf, 5.0, -np.inf, -np.inf],  # a single live entry
    ]
)


def test_softmax_matches_the_oracle_without_warnings():
    with warnings.catch_warnings(), np.errstate(divide="raise", invalid="raise", over="raise"):
        warnings.simplefilter("error")
        got = qkv.softmax(ROWS)
    assert_close(got, O.softmax_oracle(ROWS), name="softmax")
    assert (got[3] == 0).all()


def test_logsumexp_matches_the_oracle_without_warnings():
    with warnings.catch_warnings(), np.errstate(divide="raise", invalid="raise", over="raise"):
        warnings.simplefilter("error")
        got = qkv.logsumexp(ROWS)
    assert_close(got, O.logsumexp_oracle(ROWS), name="logsumexp")
    assert np.isneginf(got[3])


@pytest.mark.parametrize("axis", [0, 1, -2])
def test_axis_argument(axis, rng):
    x = rng.standard_normal((3, 4, 5))
    x[1, 2, :] = -np.inf
    x[:, 1, 3] = -np.inf
    moved = np.moveaxis(x, axis, -1)
    assert_close(qkv.softmax(x, axis=axis), np.moveaxis(O.softmax_oracle(moved), -1, axis), name="softmax")
    assert_close(qkv.logsumexp(x, axis=axis), O.logsumexp_oracle(moved), name="logsumexp")


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
def test_torch_in_torch_out():
    import torch

    x = torch.from_numpy(ROWS)
    s, lse = qkv.softmax(x), qkv.logsumexp(x)
    assert isinstance(s, torch.Tensor) and isinstance(lse, torch.Tensor) and s.dtype == torch.float64
    assert_close(s.numpy(), O.softmax_oracle(ROWS), name="softmax")
    assert_close(lse.numpy(), O.logsumexp_oracle(ROWS), name="logsumexp")
