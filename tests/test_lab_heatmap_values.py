"""The lab's number serializer (``lab.compute._rounded``): every finite value arrives, subnormal
weights included (their rounding unit underflowed: NaN, sent as null), to 7 significant digits."""

import json

import numpy as np
import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

import qkv  # noqa: E402
from qkv.lab.app import create_app  # noqa: E402
from qkv.lab.compute import _rounded  # noqa: E402


@pytest.mark.parametrize("x", [5e-324, -1e-310, 2.2250738585072014e-308, 1e-300, 1e-291])
def test_a_subnormal_or_tiny_number_is_sent_as_itself(x):
    (got,) = _rounded(np.array([x]))
    assert got == x and json.loads(json.dumps(got)) == x


def test_numbers_are_rounded_to_seven_significant_digits_and_non_finite_ones_are_null():
    got = _rounded(np.array([[0.123456789, 1 / 3, 123456789.0], [0.0, np.inf, np.nan]]))
    assert got == [[0.1234568, 0.3333333, 123456800.0], [0.0, None, None]]


def test_the_heatmap_sends_every_weight_that_is_not_zero():
    """A large scale makes some weights subnormal: each nonzero weight arrives nonzero, none null."""
    body = {"n_q": 6, "n_k": 8, "d": 4, "heads": 2, "seed": 2, "scale": 90.0, "mask": "none", "mask_params": {}}
    with TestClient(create_app()) as c:
        r = c.post("/api/heatmap", json=body)
    assert r.status_code == 200, r.text
    sent = np.array(r.json()["weights"], dtype=object)
    rng = np.random.default_rng(2)
    q, k, v = rng.standard_normal((2, 6, 4)), rng.standard_normal((2, 8, 4)), rng.standard_normal((2, 8, 4))
    with np.errstate(all="ignore"):
        _, w = qkv.attention(q, k, v, scale=90.0, impl="reference", return_weights=True)
    subnormal = (w > 0) & (w < np.finfo(np.float64).tiny)
    assert subnormal.any(), "the case must hold a subnormal weight"
    assert not any(x is None for x in sent.ravel())
    assert ((sent.astype(float) > 0) == (w > 0)).all()
