"""qkv.diagnostics on distributions whose answers are known, and against formulas written here."""

import json
import math

import numpy as np
import pytest

import oracle as O
from helpers import HAS_TORCH, assert_close, to_numpy64, to_torch
from qkv import diagnostics as D
from qkv import masks
from qkv.errors import ArgumentError, DTypeError, MaskError, ShapeError

needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")


def random_rows(rng, shape):
    w = rng.random(shape) ** 3
    return w / w.sum(-1, keepdims=True)


def entropy_loop(w):
    out = np.zeros(w.shape[:-1])
    for idx in np.ndindex(*w.shape[:-1]):
        out[idx] = -sum(p * math.log(p) for p in w[idx] if p > 0)
    return out


# --------------------------------------------------------------------------- entropy


def test_uniform_rows_have_normalised_entropy_one_and_one_hot_rows_zero():
    n = 7
    uniform, one_hot = np.full((3, n), 1 / n), np.eye(3, n)
    e = D.entropy(uniform)
    assert_close(e.nats, np.full(3, math.log(n)))
    assert_close(e.normalised, np.ones(3))
    e = D.entropy(one_hot)
    assert (e.nats == 0).all() and (e.normalised == 0).all()


def test_normalised_entropy_counts_the_keys_each_row_may_attend():
    # causal 5 x 5, each row uniform over the keys it may attend: row i has i + 1 keys
    allowed = O.causal_allowed(5, 5)
    w = allowed / allowed.sum(-1, keepdims=True)
    for mask in (None, allowed, masks.causal()):
        e = D.entropy(w, mask=mask)
        assert_close(e.nats, np.log(np.arange(1, 6)))
        assert_close(e.normalised, [0.0, 1.0, 1.0, 1.0, 1.0])  # row 0 may attend one key: 0


def test_a_mask_larger_than_the_support_lowers_normalised_entropy():
    w = np.array([[0.5, 0.5, 0.0, 0.0]])
    assert_close(D.entropy(w).normalised, [1.0])  # support: 2 keys
    assert_close(D.entropy(w, mask=np.ones((1, 4), bool)).normalised, [0.5])  # log 2 / log 4


def test_entropy_matches_the_formula_and_empty_rows_give_zero(rng):
    w = random_rows(rng, (2, 3, 6))
    w[0, 1] = 0.0  # an empty row
    e = D.entropy(w)
    assert_close(e.nats, entropy_loop(w))
    assert_close(
        e.normalised, entropy_loop(w) / np.where((w > 0).sum(-1) > 1, np.log(np.maximum((w > 0).sum(-1), 2)), np.inf)
    )
    assert e.nats[0, 1] == 0 and e.normalised[0, 1] == 0 and not np.signbit(e.nats).any()


# --------------------------------------------------------------------------- check


def test_check_reports_row_sums_and_empty_rows(rng):
    w = random_rows(rng, (2, 4, 5))
    w[1, 2] = 0.0
    r = D.check(w)
    assert r.ok and r.finite and r.rows == 8 and r.empty_rows == 1 and r.negative == 0 and r.nonfinite == 0
    assert r.max_row_error < 1e-12 and r.row_sum_min == 0.0 and abs(r.row_sum_max - 1) < 1e-12
    json.dumps(r.to_dict())
    assert "ok" in str(r)


@pytest.mark.parametrize(
    "bad,what",
    [
        pytest.param(lambda w: w.__setitem__((0, 1), np.nan), "non-finite", id="nan"),
        pytest.param(lambda w: w.__setitem__((1, 0), -0.1), "negative", id="negative"),
        pytest.param(lambda w: w.__setitem__((2,), w[2] * 1.01), "sums to 1", id="row-sum"),
    ],
)
def test_check_finds_what_is_wrong_and_raises_on_request(bad, what, rng):
    w = random_rows(rng, (3, 4))
    bad(w)
    r = D.check(w)
    assert not r.ok and any(what in p for p in r.problems())
    with pytest.raises(ArgumentError, match=what):
        D.check(w, raise_on_error=True)
    assert D.check(random_rows(rng, (3, 4)), raise_on_error=True).ok


def test_check_tolerance_follows_the_dtype(rng):
    w = random_rows(rng, (64, 300)).astype(np.float16)  # rounded weights: sums off by ~1e-4
    assert D.check(w).ok and D.check(w).tolerance == 2e-3
    assert not D.check(w, tolerance=1e-9).ok


# --------------------------------------------------------------------------- compare, kl, mass_outside


def test_compare_gives_relative_error_per_row_and_overall(rng):
    exact, approx = rng.standard_normal((2, 5, 3)), rng.standard_normal((2, 5, 3))
    exact[1, 4] = 0.0  # an empty row: absolute error
    c = D.compare(approx, exact)
    rows = np.zeros((2, 5))
    for b in range(2):
        for i in range(5):
            diff = math.sqrt(sum((approx[b, i] - exact[b, i]) ** 2))
            norm = math.sqrt(sum(exact[b, i] ** 2))
            rows[b, i] = diff / norm if norm > 0 else diff
    assert_close(c.rows, rows)
    assert abs(c.overall - np.sqrt(((approx - exact) ** 2).sum() / (exact**2).sum())) < 1e-12
    assert abs(c.max - rows.max()) < 1e-12 and abs(c.mean - rows.mean()) < 1e-12
    assert D.compare(exact, exact).overall == 0.0
    json.dumps(c.to_dict())


def test_kl_of_identical_weights_is_zero_and_matches_the_formula(rng):
    p, q = random_rows(rng, (3, 6)), random_rows(rng, (3, 6))
    assert (D.kl(p, p) == 0).all()
    want = [sum(a * math.log(a / b) for a, b in zip(p[i], q[i], strict=True)) for i in range(3)]
    assert_close(D.kl(p, q), want)
    assert (D.kl(p, q) > 0).all()


def test_kl_zero_conventions():
    p = np.array([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 0.0]])
    q = np.array([[0.25, 0.25, 0.5], [1.0, 0.0, 0.0], [0.2, 0.3, 0.5]])
    got = D.kl(p, q)
    assert_close(got[0], math.log(2))  # p = 0 where q > 0: no contribution
    assert got[1] == np.inf  # q = 0 where p > 0: infinite
    assert got[2] == 0  # an empty reference row


def test_mass_outside_a_mask_that_keeps_everything_is_zero(rng):
    w = random_rows(rng, (2, 6, 6))
    assert (D.mass_outside(w, np.ones((6, 6), bool)) == 0).all()
    allowed = O.sliding_window_allowed(6, 6, 2, causal=False)
    want = np.array([[sum(w[b, i, j] for j in range(6) if not allowed[i, j]) for i in range(6)] for b in range(2)])
    assert_close(D.mass_outside(w, allowed), want)
    assert_close(D.mass_outside(w, masks.sliding_window(2, causal=False)), want)


def test_bad_inputs_raise_typed_errors(rng):
    w = random_rows(rng, (3, 4))
    with pytest.raises(DTypeError, match="weights has dtype int64"):
        D.entropy(np.ones((2, 2), np.int64))
    with pytest.raises(ShapeError, match=r"approx_out has shape \(3, 4\) but exact_out has \(4, 3\)"):
        D.compare(w, w.T)
    with pytest.raises(ShapeError, match="p_weights has shape"):
        D.kl(w, w[:2])
    with pytest.raises(MaskError, match=r"mask has shape \(3, 5\), which does not broadcast"):
        D.mass_outside(w, np.ones((3, 5), bool))
    with pytest.raises(MaskError, match="mask has dtype float64"):
        D.mass_outside(w, np.ones((3, 4)))


# --------------------------------------------------------------------------- torch


@needs_torch
def test_torch_in_torch_out(rng):
    import torch

    w = random_rows(rng, (2, 4, 5))
    t = to_torch(w)
    e = D.entropy(t, mask=masks.causal())
    assert isinstance(e.nats, torch.Tensor)
    assert_close(e.nats, D.entropy(w).nats)
    assert isinstance(D.kl(t, t), torch.Tensor) and (D.kl(t, t) == 0).all()
    assert isinstance(D.mass_outside(t, torch.ones(4, 5, dtype=torch.bool)), torch.Tensor)
    assert D.check(t.to(torch.bfloat16)).ok
    half = D.entropy(t.to(torch.float16))
    assert half.nats.dtype == torch.float32  # half precision is computed in float32
    assert_close(to_numpy64(half.nats), entropy_loop(w), tol=1e-3)
    assert isinstance(D.compare(t, t).rows, torch.Tensor)
    with pytest.raises(TypeError, match="mixed kinds"):
        D.kl(t, w)
