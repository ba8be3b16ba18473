"""``qkv.diagnostics.cache_error``: what a quantized cache changes, per head, against the oracle.

The reference computes both attentions with the float64 oracle (over ``k, v`` and over their
dequantized values) and reduces the difference per query head by hand."""

import json

import numpy as np
import pytest

import oracle as O
import qkv


@pytest.mark.parametrize("fmt", ["int8", "float8_e4m3fn", "float8_e5m2"])
def test_per_head_errors_match_the_oracle(fmt, rng):
    q, k, v = (rng.standard_normal(s) for s in ((2, 6, 5, 8), (2, 3, 17, 8), (2, 3, 17, 4)))
    allowed = O.causal_allowed(5, 17)
    e = qkv.diagnostics.cache_error(q, k, v, fmt, causal=True)
    exact = O.attention_oracle(q, k, v, allowed=allowed)[0]
    stored = [qkv.dequantize(qkv.quantize(x, fmt), "float64") for x in (k, v)]
    approx = O.attention_oracle(q, *stored, allowed=allowed)[0]
    diff = np.abs(approx - exact)
    for h in range(6):
        assert e.max_error[h] == pytest.approx(diff[:, h].max(), rel=1e-9, abs=1e-13)
        assert e.mean_error[h] == pytest.approx(diff[:, h].mean(), rel=1e-9, abs=1e-13)
        rms = np.sqrt((diff[:, h] ** 2).mean() / (exact[:, h] ** 2).mean())
        assert e.relative[h] == pytest.approx(rms, rel=1e-9, abs=1e-13)
    for x, err, d in ((k, e.k_error, stored[0]), (v, e.v_error, stored[1])):
        token = np.abs(d - x).max(-1) / np.abs(x).max(-1)  # (B, Hkv, Nk)
        np.testing.assert_allclose(err, token.max(axis=(0, 2)), rtol=1e-12)
    if fmt == "int8":
        assert (e.k_error <= 0.5 / 127 * (1 + 1e-6)).all()  # half a step of the token's own scale
    assert e.nbytes == qkv.quantize(k, fmt).nbytes + qkv.quantize(v, fmt).nbytes
    assert e.float_nbytes == k.nbytes + v.nbytes
    assert json.loads(json.dumps(e.to_dict()))["format"] == fmt


def test_without_heads_one_head(rng):
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((4, 8), (9, 8), (9, 8)))
    e = qkv.diagnostics.cache_error(q, k, v, "int8")
    assert e.max_error.shape == e.k_error.shape == (1,)


def test_attention_keywords_reach_both_calls_scale_included(rng):
    """``per`` names the quantization's granularity, so attention's own ``scale=`` passes through."""
    q, k, v = (rng.standard_normal(s) for s in ((1, 2, 3, 8), (1, 2, 9, 8), (1, 2, 9, 8)))
    e = qkv.diagnostics.cache_error(q, k, v, "float8_e5m2", per="head", scale=0.25, causal=True)
    stored = [qkv.dequantize(qkv.quantize(x, "float8_e5m2", scale="head"), "float64") for x in (k, v)]
    allowed = O.causal_allowed(3, 9)
    diff = np.abs(
        O.attention_oracle(q, *stored, allowed=allowed, scale=0.25)[0]
        - O.attention_oracle(q, k, v, allowed=allowed, scale=0.25)[0]
    )
    np.testing.assert_allclose(e.max_error, diff.max(axis=(0, 2, 3)), rtol=1e-9, atol=1e-13)
    assert e.per == "head"
