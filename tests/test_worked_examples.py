"""Worked examples of the attention literature, each with its published numbers (4 decimals)."""

import numpy as np

import oracle as O
import qkv
from helpers import check_against_oracle

Q1 = np.array([[1.0, 0.0], [0.0, 1.0]])
K1 = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
V1 = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
A1 = np.array([[0.4223, 0.1554, 0.4223], [0.1554, 0.4223, 0.4223]])
O1 = np.array([[3.000, 4.000], [3.533, 4.533]])

# the built-in example of qkv.explain (default scale 1/sqrt(2))
Q2 = np.array([[1.0, 0.0], [0.0, 1.0]])
K2 = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
V2 = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
O2 = np.array([[0.5989, 1.0000], [0.5989, 1.2033]])


def to_4_decimals(x):
    return np.round(np.asarray(x, dtype=np.float64), 4)


def test_the_numbers_themselves_follow_from_the_oracle():
    out, weights, _ = O.attention_oracle(Q1, K1, V1, scale=1.0)
    assert (to_4_decimals(weights) == A1).all() and np.abs(out - O1).max() < 1e-3
    assert np.abs(O.attention_oracle(Q2, K2, V2)[0] - O2).max() < 5e-5


def test_unit_scale_example(impl):
    res = impl.attention(Q1, K1, V1, scale=1.0)
    assert (np.abs(res.out - O1) < 1e-3).all(), res.out  # O is published to 3 decimals
    if res.weights is not None:
        assert (to_4_decimals(res.weights) == A1).all(), res.weights
    check_against_oracle(res, O.attention_oracle(Q1, K1, V1, scale=1.0))


def test_unit_scale_example_backward_dv_is_a_transposed():
    out, _, lse = O.attention_oracle(Q1, K1, V1, scale=1.0)
    for impl in ("reference", "auto"):
        _, _, dv = qkv.attention_backward(np.eye(2), Q1, K1, V1, out, lse, scale=1.0, impl=impl)
        assert (to_4_decimals(dv) == A1.T).all(), dv
        grads = O.numerical_gradients(
            lambda q, k, v: O.attention_oracle(q, k, v, scale=1.0)[0], (Q1, K1, V1), np.eye(2)
        )
        got = qkv.attention_backward(np.eye(2), Q1, K1, V1, out, lse, scale=1.0, impl=impl)
        for g, want in zip(got, grads, strict=True):
            assert np.abs(np.asarray(g) - want).max() < 1e-8


def test_builtin_example_default_scale(impl):
    res = impl.attention(Q2, K2, V2)
    assert (np.abs(res.out - O2) < 5e-5).all(), res.out
    if res.weights is not None:
        assert np.abs(res.weights.sum(axis=-1) - 1).max() < 1e-12
    check_against_oracle(res, O.attention_oracle(Q2, K2, V2))
