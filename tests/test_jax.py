"""The functional core on JAX arrays: the same numbers as NumPy (the float64 reference), JAX out.

NumPy results are themselves checked against the loop oracle elsewhere; a few cases here are
checked against ``oracle.attention_oracle`` directly too. Gradients: ``jax.grad`` through the
reference path against ``qkv.attention_backward`` on NumPy.
"""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import oracle as O  # noqa: E402
import qkv  # noqa: E402
from qkv import masks, scores  # noqa: E402
from qkv.errors import ArgumentError, DTypeError  # noqa: E402

TOL64 = dict(rtol=1e-12, atol=1e-12)
TOL32 = dict(rtol=2e-5, atol=2e-6)


@pytest.fixture(autouse=True, scope="module")
def x64():
    """float64 JAX arrays for this module only (JAX defaults to float32); restored afterwards."""
    before = jax.config.read("jax_enable_x64")
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", before)


def inputs(rng, q_shape=(2, 4, 6, 8), k_shape=(2, 2, 9, 8), dv=5):
    q = rng.standard_normal(q_shape)
    k = rng.standard_normal(k_shape)
    v = rng.standard_normal((*k_shape[:-1], dv))
    return q, k, v


def J(*arrays):
    return tuple(jnp.asarray(a) for a in arrays)


def assert_jax_equal(got, want, tol=TOL64):
    assert isinstance(got, jax.Array), f"expected a JAX array, got {type(got).__name__}"
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_allclose(np.asarray(got), want, **tol)


DOC = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2])  # Nk = 9 packed documents
CASES = {
    "none": dict(),
    "causal": dict(causal=True),
    "sliding-window": dict(mask=masks.sliding_window(3)),
    "sliding-window-noncausal": dict(mask=masks.sliding_window(2, causal=False)),
    "document-causal": dict(mask=masks.document(DOC), causal=True),
    "padding": dict(mask=masks.padding(np.array([9, 4]))),
    "padding-empty-rows": dict(mask=masks.padding(np.array([0, 9]), q_lengths=np.array([6, 3]))),
    "longformer": dict(mask=masks.sliding_window(2, causal=False) | masks.global_tokens([0])),
    "alibi": dict(score_mod=scores.alibi(), causal=True),
    "softcap": dict(score_mod=scores.softcap(1.5)),
    "relative-bias": dict(score_mod=scores.relative_bias(np.linspace(-1, 1, 4 * 7).reshape(4, 7), 3)),
    "temperature": dict(score_mod=scores.temperature(0.7)),
    "chained": dict(score_mod=scores.alibi() + scores.softcap(2.0), mask=masks.sliding_window(4)),
    "scale": dict(scale=0.3, causal=True),
}


@pytest.mark.parametrize("name", list(CASES))
def test_forward_equals_numpy(rng, name):
    """GQA (H=4 over Hkv=2), Nq=6 != Nk=9, Dv=5 != Dk=8; out, weights and lse; impl auto and reference."""
    kw = CASES[name]
    q, k, v = inputs(rng)
    want = qkv.attention(q, k, v, return_weights=True, return_lse=True, **kw)
    for impl in ("auto", "reference"):
        got = qkv.attention(*J(q, k, v), return_weights=True, return_lse=True, impl=impl, **kw)
        for g, w in zip(got, want, strict=True):
            assert_jax_equal(g, w)
    assert np.isfinite(want[0]).all()


def test_empty_rows_give_zeros_and_minus_inf(rng):
    q, k, v = inputs(rng)
    allowed = rng.random((2, 1, 6, 9)) > 0.5
    allowed[:, :, 2] = False  # row 2 attends nothing
    out, w, lse = qkv.attention(*J(q, k, v), mask=jnp.asarray(allowed), return_weights=True, return_lse=True)
    assert (np.asarray(out)[:, :, 2] == 0).all() and (np.asarray(w)[:, :, 2] == 0).all()
    assert np.isneginf(np.asarray(lse)[:, :, 2]).all()
    ref_out, ref_w, ref_lse = O.attention_oracle(q, k, v, allowed=allowed)  # the independent loop
    np.testing.assert_allclose(np.asarray(out), ref_out, **TOL64)
    np.testing.assert_allclose(np.asarray(w), ref_w, **TOL64)


def test_dense_masks_and_float_bias(rng):
    q, k, v = inputs(rng)
    allowed = rng.random((2, 4, 6, 9)) > 0.3
    bias = rng.standard_normal((1, 4, 6, 9))
    bias[0, 1, 3, :4] = -np.inf
    for mask in (allowed, bias):
        want = qkv.attention(q, k, v, mask=mask)
        assert_jax_equal(qkv.attention(*J(q, k, v), mask=jnp.asarray(mask)), want)
    ref, _, _ = O.attention_oracle(q, k, v, bias=bias)
    np.testing.assert_allclose(np.asarray(qkv.attention(*J(q, k, v), mask=jnp.asarray(bias))), ref, **TOL64)
    # masks built from JAX data: padding lengths, document ids, from_dense
    assert_jax_equal(qkv.attention(*J(q, k, v), mask=masks.padding(jnp.asarray([3, 9]))),
                     qkv.attention(q, k, v, mask=masks.padding(np.array([3, 9]))))
    assert_jax_equal(qkv.attention(*J(q, k, v), mask=masks.document(jnp.asarray(DOC))),
                     qkv.attention(q, k, v, mask=masks.document(DOC)))
    assert_jax_equal(qkv.attention(*J(q, k, v), mask=masks.from_dense(jnp.asarray(allowed)) & masks.causal()),
                     qkv.attention(q, k, v, mask=allowed, causal=True))
    assert np.array_equal(masks.from_dense(jnp.asarray(allowed)).dense(6, 9), allowed)


def test_broadcast_batch_mqa_and_2d(rng):
    q, k, v = inputs(rng, q_shape=(3, 4, 5, 8), k_shape=(1, 1, 7, 8))  # MQA, k/v broadcast over batch
    assert_jax_equal(qkv.attention(*J(q, k, v), causal=True), qkv.attention(q, k, v, causal=True))
    q, k, v = inputs(rng, q_shape=(5, 8), k_shape=(7, 8))
    assert_jax_equal(qkv.attention(*J(q, k, v)), qkv.attention(q, k, v))


def test_float32_and_bfloat16(rng):
    q, k, v = inputs(rng)
    q32, k32, v32 = (x.astype(np.float32) for x in (q, k, v))
    want = qkv.attention(q32, k32, v32, causal=True)
    assert_jax_equal(qkv.attention(*J(q32, k32, v32), causal=True), want, TOL32)
    out = qkv.attention(*(jnp.asarray(x, dtype=jnp.bfloat16) for x in (q, k, v)), causal=True)
    assert out.dtype == jnp.bfloat16  # computed in float32, returned in the input dtype
    np.testing.assert_allclose(np.asarray(out, dtype=np.float64), qkv.attention(q, k, v, causal=True), atol=3e-2)


def test_softmax_logsumexp(rng):
    x = rng.standard_normal((3, 7))
    x[1] = -np.inf
    x[2, :3] = -np.inf
    assert_jax_equal(qkv.softmax(jnp.asarray(x)), qkv.softmax(x))
    assert_jax_equal(qkv.logsumexp(jnp.asarray(x)), qkv.logsumexp(x))
    assert (np.asarray(qkv.softmax(jnp.asarray(x)))[1] == 0).all()
    assert_jax_equal(qkv.softmax(jnp.asarray(x), axis=0), qkv.softmax(x, axis=0))


@pytest.mark.parametrize("name", ["none", "causal", "padding-empty-rows", "alibi", "softcap", "relative-bias",
                                  "chained", "document-causal"])
def test_jax_grad_equals_attention_backward(rng, name):
    kw = CASES[name]
    q, k, v = inputs(rng)
    out, lse = qkv.attention(q, k, v, return_lse=True, **kw)
    dout = rng.standard_normal(out.shape)
    want = qkv.attention_backward(dout, q, k, v, out, lse, **kw)

    def loss(q, k, v):
        return jnp.sum(qkv.attention(q, k, v, impl="reference", **kw) * dout)

    got = jax.grad(loss, argnums=(0, 1, 2))(*J(q, k, v))
    for g, w in zip(got, want, strict=True):
        assert_jax_equal(g, w, dict(rtol=1e-10, atol=1e-12))
        assert np.isfinite(np.asarray(g)).all()
    # attention_backward itself on JAX arrays gives the same
    got = qkv.attention_backward(*J(dout, q, k, v, out, lse), **kw)
    for g, w in zip(got, want, strict=True):
        assert_jax_equal(g, w)


def test_jax_grad_through_a_jax_table_and_jit(rng):
    """A learnable JAX relative-bias table gets its gradient; jit traces without touching NumPy."""
    q, k, v = inputs(rng)
    table = rng.standard_normal((4, 7))

    def loss(t):
        return jnp.sum(qkv.attention(*J(q, k, v), score_mod=scores.relative_bias(t, 3)) ** 2)

    g = jax.grad(loss)(jnp.asarray(table))
    eps, e = 1e-6, np.zeros_like(table)
    e[2, 3] = eps  # central finite difference on one entry
    fd = (float(loss(jnp.asarray(table + e))) - float(loss(jnp.asarray(table - e)))) / (2 * eps)
    np.testing.assert_allclose(float(g[2, 3]), fd, rtol=1e-6)
    slopes = np.array([0.5, 0.25, 0.125, 0.0625])

    def alibi_loss(m):  # slopes that are JAX arrays (traced here) are differentiable too
        return jnp.sum(qkv.attention(*J(q, k, v), score_mod=scores.alibi(m), causal=True) ** 2)

    g = jax.grad(alibi_loss)(jnp.asarray(slopes))
    e = np.zeros(4)
    e[1] = eps
    fd = (float(alibi_loss(jnp.asarray(slopes + e))) - float(alibi_loss(jnp.asarray(slopes - e)))) / (2 * eps)
    np.testing.assert_allclose(float(g[1]), fd, rtol=1e-6)
    assert scores.alibi(jnp.asarray(slopes)).name == "alibi(slopes=[0.5, 0.25, 0.125, 0.0625])"
    f = jax.jit(lambda q, k, v: qkv.attention(q, k, v, causal=True, mask=masks.sliding_window(3)))
    assert_jax_equal(f(*J(q, k, v)), qkv.attention(q, k, v, causal=True, mask=masks.sliding_window(3)))


def test_explain_accepts_jax(rng):
    q, k, v = inputs(rng, q_shape=(2, 3, 4), k_shape=(2, 5, 4))
    got = qkv.explain(*J(q, k, v), causal=True, grad=True)
    want = qkv.explain(q, k, v, causal=True, grad=True)
    assert got.names == want.names
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a.value, b.value, **TOL64)
    assert got.to_dict()["options"]["dtype"] == "float64"


def test_mixed_kinds_flash_and_dropout(rng):
    q, k, v = inputs(rng)
    jq, jk, jv = J(q, k, v)
    with pytest.raises(DTypeError, match="q is jax, k is numpy"):
        qkv.attention(jq, k, v)
    with pytest.raises(TypeError, match="mixed kinds"):
        qkv.attention(jq, jk, jv, mask=np.ones((6, 9), dtype=bool))
    with pytest.raises(ArgumentError, match="JAX arrays are immutable"):
        qkv.attention(jq, jk, jv, impl="flash")
    with pytest.raises(ArgumentError, match="impl='torch'"):
        qkv.attention(jq, jk, jv, impl="torch")
    with pytest.raises(DTypeError, match="PRNG key"):
        qkv.attention(jq, jk, jv, dropout=0.5)
    base, w = qkv.attention(jq, jk, jv, return_weights=True)
    a, wa = qkv.attention(jq, jk, jv, dropout=0.5, rng=jax.random.key(0), return_weights=True)
    b = qkv.attention(jq, jk, jv, dropout=0.5, rng=jax.random.key(0))
    assert np.array_equal(np.asarray(a), np.asarray(b))  # the key decides the draw
    kept = np.asarray(wa) != 0  # inverted dropout: kept weights doubled, the rest zero
    np.testing.assert_allclose(np.asarray(wa)[kept], 2 * np.asarray(w)[kept], **TOL64)
    assert 0.3 < kept.mean() < 0.7
    np.testing.assert_allclose(np.asarray(a), np.asarray(wa) @ np.repeat(v, 2, axis=1), **TOL64)


def test_other_array_functions_equal_numpy(rng):
    """Beyond the core: hopfield, rope, linear attention and the Luong score also take JAX arrays."""
    from qkv import approx, positional

    q, k, v = inputs(rng, q_shape=(2, 4, 6, 8), k_shape=(2, 4, 6, 8), dv=8)
    w = rng.standard_normal((8, 8))
    for f in (lambda q, k, v, w: qkv.hopfield(q, k, beta=0.5, steps=2),
              lambda q, k, v, w: positional.rope(q),
              lambda q, k, v, w: approx.linear_attention(q, k, v),
              lambda q, k, v, w: scores.general(q, k, w)):
        assert_jax_equal(f(*J(q, k, v, w)), f(q, k, v, w))
