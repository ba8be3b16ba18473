"""The functional core on JAX arrays: the same numbers as NumPy (the float64 reference), JAX out.

NumPy results are themselves checked against the loop oracle elsewhere; a few cases here are
checked against ``oracle.attention_oracle`` directly too. Gradients: ``jax.grad`` through the
reference path against ``qkv.attention_backward`` on NumPy. The flash kernel on JAX arrays is
checked against itself on NumPy with tiles small enough that the masks have EMPTY, PARTIAL and
FULL tiles.
"""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import oracle as O  # noqa: E402
import qkv  # noqa: E402
from helpers import tiled_attention, tiled_backward  # noqa: E402
from qkv import masks, scores  # noqa: E402
from qkv._impls import build_call  # noqa: E402
from qkv._impls._plan import JAX_FLASH_BYTES  # noqa: E402
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
    assert_jax_equal(
        qkv.attention(*J(q, k, v), mask=masks.padding(jnp.asarray([3, 9]))),
        qkv.attention(q, k, v, mask=masks.padding(np.array([3, 9]))),
    )
    assert_jax_equal(
        qkv.attention(*J(q, k, v), mask=masks.document(jnp.asarray(DOC))),
        qkv.attention(q, k, v, mask=masks.document(DOC)),
    )
    assert_jax_equal(
        qkv.attention(*J(q, k, v), mask=masks.from_dense(jnp.asarray(allowed)) & masks.causal()),
        qkv.attention(q, k, v, mask=allowed, causal=True),
    )
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


@pytest.mark.parametrize(
    "name", ["none", "causal", "padding-empty-rows", "alibi", "softcap", "relative-bias", "chained", "document-causal"]
)
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
    for f in (
        lambda q, k, v, w: qkv.hopfield(q, k, beta=0.5, steps=2),
        lambda q, k, v, w: positional.rope(q),
        lambda q, k, v, w: approx.linear_attention(q, k, v),
        lambda q, k, v, w: scores.general(q, k, w),
    ):
        assert_jax_equal(f(*J(q, k, v, w)), f(q, k, v, w))


# --------------------------------------------------------------------------- the flash kernel

TILES = (4, 8)  # Nq = 16, Nk = 24: 4 x 3 tiles of one shape (eager JAX compiles each op per shape)
DOC24 = np.repeat([0, 1, 2, 3], [5, 9, 3, 7])
FLASH_CASES = {
    "none": dict(),
    "causal": dict(causal=True),
    "sliding-window": dict(mask=masks.sliding_window(6)),
    "document-causal": dict(mask=masks.document(DOC24), causal=True),
    "padding-empty-rows": dict(mask=masks.padding(np.array([0, 24]), q_lengths=np.array([16, 9]))),
    "alibi-causal": dict(score_mod=scores.alibi(), causal=True),
    "softcap-window": dict(score_mod=scores.softcap(1.5), mask=masks.sliding_window(9, causal=False)),
    "relative-bias": dict(score_mod=scores.relative_bias(np.linspace(-1, 1, 4 * 9).reshape(4, 9), 4), causal=True),
    "scale": dict(scale=0.3, mask=masks.sliding_window(6)),
}


def flash_inputs(rng):
    """GQA (H=4 over Hkv=2), Nq=16 != Nk=24, Dv=5 != Dk=8."""
    return inputs(rng, q_shape=(2, 4, 16, 8), k_shape=(2, 2, 24, 8))


def test_flash_cases_have_empty_partial_and_full_tiles():
    """Every masked case skips EMPTY tiles and evaluates PARTIAL ones; causal and padding also run FULL ones."""
    for name in ("causal", "sliding-window", "document-causal", "padding-empty-rows"):
        c = build_call(
            *J(*flash_inputs(np.random.default_rng(0))),
            mask=FLASH_CASES[name].get("mask"),
            causal=FLASH_CASES[name].get("causal", False),
        )
        classes = set(np.unique(c.mask.blocks(16, 24, *TILES)).tolist())  # padding: per batch element
        assert {masks.EMPTY, masks.PARTIAL} <= classes, name
        assert masks.FULL in classes or name in ("sliding-window", "document-causal"), name


@pytest.mark.parametrize("name", list(FLASH_CASES))
def test_flash_forward_and_backward_equal_numpy(rng, name):
    """out, weights, lse and attention_backward of impl="flash" on JAX = the same on NumPy (float64)."""
    kw = FLASH_CASES[name]
    q, k, v = flash_inputs(rng)
    want = tiled_attention(q, k, v, tiles=TILES, impl="flash", return_weights=True, return_lse=True, **kw)
    got = tiled_attention(*J(q, k, v), tiles=TILES, impl="flash", return_weights=True, return_lse=True, **kw)
    for g, w in zip(got, want, strict=True):
        assert_jax_equal(g, w)
    dout = rng.standard_normal(want[0].shape)
    want_g = tiled_backward(dout, q, k, v, want[0], want[2], tiles=TILES, impl="flash", **kw)
    got_g = tiled_backward(*J(dout, q, k, v, want[0], want[2]), tiles=TILES, impl="flash", **kw)
    for g, w in zip(got_g, want_g, strict=True):
        assert_jax_equal(g, w)
        assert np.isfinite(w).all()
    ref = qkv.attention(q, k, v, impl="reference", return_weights=True, return_lse=True, **kw)
    for g, w in zip(got, ref, strict=True):  # and the kernel did tile: same numbers as the reference
        assert_jax_equal(g, w)


def test_flash_dense_masks_and_float32(rng):
    q, k, v = flash_inputs(rng)
    allowed = rng.random((2, 1, 16, 24)) > 0.4
    allowed[1, :, 5] = False  # an empty row
    bias = rng.standard_normal((1, 4, 16, 24))
    q32, k32, v32 = (x.astype(np.float32) for x in (q, k, v))
    for mask in (allowed, bias):
        want = tiled_attention(q, k, v, tiles=TILES, mask=mask, impl="flash", return_lse=True)
        got = tiled_attention(*J(q, k, v), tiles=TILES, mask=jnp.asarray(mask), impl="flash", return_lse=True)
        for g, w in zip(got, want, strict=True):
            assert_jax_equal(g, w)
    sw = masks.sliding_window(6)
    want32 = tiled_attention(q32, k32, v32, tiles=TILES, mask=sw, impl="flash", return_lse=True)
    got32 = tiled_attention(*J(q32, k32, v32), tiles=TILES, mask=sw, impl="flash", return_lse=True)
    for g, w in zip(got32, want32, strict=True):
        assert_jax_equal(g, w, TOL32)


def test_jax_grad_through_flash(rng):
    """jax.grad (here under jax.jit) differentiates the tile loop itself: the analytic backward pass, no NaN."""
    q, k, v = inputs(rng, q_shape=(1, 2, 12, 4), k_shape=(1, 1, 16, 4), dv=4)
    kw = dict(mask=masks.padding(np.array([8]), q_lengths=np.array([10])), causal=True)  # empty rows 10, 11
    out, lse = qkv.attention(q, k, v, return_lse=True, **kw)
    dout = rng.standard_normal(out.shape)
    want = qkv.attention_backward(dout, q, k, v, out, lse, **kw)
    classes = (kw["mask"] & masks.causal()).blocks(12, 16, *TILES)
    assert len(np.unique(classes)) == 3, classes
    got = jax.jit(
        jax.grad(
            lambda q, k, v: jnp.sum(tiled_attention(q, k, v, tiles=TILES, impl="flash", **kw) * dout),
            argnums=(0, 1, 2),
        )
    )(*J(q, k, v))
    for g, w in zip(got, want, strict=True):
        assert_jax_equal(g, w, dict(rtol=1e-10, atol=1e-12))


def test_flash_on_jax_skips_empty_tiles_and_never_evaluates_the_mask_on_full_ones(rng):
    plain = masks.causal()
    evaluated, scored = [], []
    counting = masks.Mask(
        lambda i, j, nq, nk: evaluated.append(i.shape) or plain.allowed(i, j, nq, nk), "counting-causal", plain.tiles
    )
    mod = scores.ScoreMod(lambda xp, s, i, j, nq, nk: scored.append(i.shape) or (s, None), "counting")
    q, k, v = flash_inputs(rng)
    classes = plain.blocks(16, 24, *TILES)
    kept, partial = int((classes != masks.EMPTY).sum()), int((classes == masks.PARTIAL).sum())
    assert 0 < partial < kept < classes.size
    kw = dict(tiles=TILES, mask=counting, score_mod=mod, impl="flash")
    out, lse = tiled_attention(*J(q, k, v), return_lse=True, **kw)
    assert len(scored) == kept and len([s for s in evaluated if s == (4, 1)]) == partial
    scored.clear(), evaluated.clear()
    dout = jnp.ones_like(out)
    grads = tiled_backward(dout, *J(q, k, v), out, lse, **kw)
    assert len(scored) == kept and len([s for s in evaluated if s == (4, 1)]) == partial
    golden = O.attention_oracle(q, k, v, allowed=O.causal_allowed(16, 24))[0]
    np.testing.assert_allclose(np.asarray(out), golden, **TOL64)
    want = qkv.attention_backward(np.ones_like(golden), q, k, v, golden, np.asarray(lse), causal=True)
    for g, w in zip(grads, want, strict=True):
        assert_jax_equal(g, w)


def _chosen(q, k, v, **kw):
    return qkv.dispatch(q, k, v, **kw).impl


def test_auto_on_jax_picks_flash_for_large_concrete_problems_only():
    """Rule J: flash from JAX_FLASH_BYTES of scores (concrete arrays), else the reference."""
    n = 1024  # (1, H, n, 8): the arrays stay small, the scores are H · 4 MiB in float32
    big = [jnp.zeros((1, 8, n, 8), jnp.float32)] * 3
    assert 8 * n * n * 4 >= JAX_FLASH_BYTES > 4 * n * n * 4
    assert _chosen(*big) == "flash"
    assert _chosen(*big, mask=masks.sliding_window(64)) == "flash"
    from qkv import _native

    # below the bytes of rule J the array engine loses to the reference; the compiled engine does not
    assert _chosen(*(x[:, :4] for x in big), causal=True) == ("flash" if _native.available() else "reference")
    assert _chosen(*(jnp.zeros((1, 4, n, 8), jnp.float64),) * 3) == "flash"  # bytes, not entries
    assert _chosen(*(x.astype(jnp.bfloat16) for x in big)) == "flash"  # scores in float32
    small = J(*inputs(np.random.default_rng(0)))
    assert _chosen(*small, causal=True) == ("flash" if _native.available() else "reference")  # rule C, else J
    picked = []

    def traced(q, k, v):  # under jax.grad and jax.jit the arrays are tracers: XLA's FFI (rule C), else rule J
        picked.append(_chosen(q, k, v))
        return jnp.sum(q)

    jax.grad(traced)(*big)
    jax.jit(traced)(*big)
    table = jnp.zeros((8, 5))
    # a traced table needs its gradient, which only the array engine gives: rule J
    jax.grad(lambda t: picked.append(_chosen(*big, score_mod=scores.relative_bias(t, 2))) or jnp.sum(t))(table)
    ffi = _native.available() and hasattr(_native._need(), "ffi_handlers")
    assert picked == ["flash" if ffi else "reference"] * 2 + ["reference"]
