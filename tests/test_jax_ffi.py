"""Traced JAX (``jax.jit``, ``jax.grad``, ``jax.vmap``) on the compiled kernel through XLA's FFI.

The program XLA compiles must hold qkv's two custom calls and no ``Nq x Nk`` buffer; its
forward and gradients must match an independent float64 reference: the loop oracle
(``tests/oracle.py``) for the forward, and for gradients ``jax.grad`` of a dense softmax written
here with plain ``jax.numpy`` (checked against the oracle in the same test). Every mask kind
(row intervals, tile classes with bitmaps), score mods, GQA, odd sizes across the kernel's
64 x 128 tiles, the four dtypes, dropout, the non-finite rules, and vmap's two paths in the
handler (the mapped axes merged into the batch, or walked one index at a time).
"""

import os
import re

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import oracle as O  # noqa: E402
import qkv  # noqa: E402
from helpers import MASK_CASES, SCORE_CASES  # noqa: E402
from qkv import _native, masks, scores  # noqa: E402
from qkv.errors import ArgumentError  # noqa: E402

BUILT = _native.available() and hasattr(_native._need(), "ffi_handlers")
if not BUILT and os.environ.get("QKV_REQUIRE_NATIVE") == "1":  # CI: scripts/setup builds the handler
    raise RuntimeError("QKV_REQUIRE_NATIVE=1 but the kernel was built without its jax.ffi handler")
pytestmark = pytest.mark.skipif(not BUILT, reason="the compiled kernel was built without jaxlib's FFI header")


@pytest.fixture(autouse=True, scope="module")
def x64():
    before = jax.config.read("jax_enable_x64")
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", before)


def dense(q, k, v, allowed=None, bias=None, score_fn=None, scale=None):
    """softmax(score_fn(q k^T scale) + bias, masked) v in plain jax.numpy (GQA by repetition):
    differentiable, independent of qkv. Rows with nothing allowed give zeros."""
    h, hkv = q.shape[-3], k.shape[-3]
    k = jnp.repeat(k, h // hkv, axis=-3)
    v = jnp.repeat(v, h // hkv, axis=-3)
    s = jnp.einsum("...id,...jd->...ij", q, k) * (scale if scale is not None else q.shape[-1] ** -0.5)
    nq, nk = s.shape[-2:]
    if score_fn is not None:
        s = score_fn(s, np.arange(h)[:, None, None], np.arange(nq)[:, None], np.arange(nk), nq, nk, xp=jnp)
    if bias is not None:
        s = s + bias
    keep = jnp.ones(s.shape, bool) if allowed is None else jnp.broadcast_to(jnp.asarray(allowed), s.shape)
    s = jnp.where(keep, s, -jnp.inf)
    m = jnp.max(jnp.where(keep, s, -1e300), axis=-1, keepdims=True)
    e = jnp.where(keep, jnp.exp(s - m), 0.0)
    z = jnp.sum(e, axis=-1, keepdims=True)
    return jnp.einsum("...ij,...jd->...id", e / jnp.where(z > 0, z, 1.0), v)


def qkv_inputs(seed, b=2, h=4, hkv=2, nq=70, nk=130, dk=24, dv=20, dtype=np.float64):
    r = np.random.default_rng(seed)
    return tuple(jnp.asarray(r.standard_normal(s), dtype) for s in ((b, h, nq, dk), (b, hkv, nk, dk), (b, hkv, nk, dv)))


def kernel_calls(f, *args):
    """The program XLA compiles for ``jax.jit(f)(*args)``: how many custom calls of the kernel's
    forward and backward it holds, and whether it loops (``jax.vmap`` walked one index at a time
    would). A silent fallback to the array engine holds none: every test asks here."""
    text = jax.jit(f).lower(*args).as_text()
    names = ("qkv_attention_forward", "qkv_attention_backward")
    counts = tuple(len(re.findall(rf"stablehlo\.custom_call @{name}\b", text)) for name in names)
    return counts, "stablehlo.while" in text


def assert_kernel(f, *args, forward=1, backward=0):
    """``jax.jit(f)`` runs the compiled kernel: ``forward`` / ``backward`` custom calls, no loop."""
    counts, loops = kernel_calls(f, *args)
    assert counts == (forward, backward) and not loops, f"kernel calls (forward, backward) {counts}, loops: {loops}"


def check_fwd_and_grad(q, k, v, kw, allowed=None, bias=None, score_fn=None, scale=None, tol=1e-10):
    """jit forward vs the loop oracle and the dense reference; jit(grad) vs the reference's grad;
    both programs hold the kernel's custom calls."""
    w = jnp.asarray(np.random.default_rng(1).standard_normal((*q.shape[:-1], v.shape[-1])))
    assert_kernel(lambda q, k, v: qkv.attention(q, k, v, **kw), q, k, v)
    loss = lambda q, k, v: jnp.sum(qkv.attention(q, k, v, **kw) * w)  # noqa: E731
    assert_kernel(jax.grad(loss, argnums=(0, 1, 2)), q, k, v, backward=1)
    out = jax.jit(lambda q, k, v: qkv.attention(q, k, v, **kw))(q, k, v)
    want = dense(q, k, v, allowed, bias, score_fn, scale)
    oracle = O.attention_oracle(q, k, v, allowed=allowed, bias=bias, scale=scale, score_fn=score_fn)[0]
    np.testing.assert_allclose(np.asarray(want), oracle, rtol=1e-12, atol=1e-12)  # the reference is right
    np.testing.assert_allclose(np.asarray(out), oracle, rtol=tol, atol=tol)
    grads = jax.jit(jax.grad(lambda q, k, v: jnp.sum(qkv.attention(q, k, v, **kw) * w), argnums=(0, 1, 2)))(q, k, v)
    wants = jax.grad(lambda q, k, v: jnp.sum(dense(q, k, v, allowed, bias, score_fn, scale) * w), argnums=(0, 1, 2))(
        q, k, v
    )
    for g, x, name in zip(grads, wants, "qkv", strict=True):
        assert g.dtype == q.dtype, name
        np.testing.assert_allclose(np.asarray(g), np.asarray(x), rtol=tol, atol=tol, err_msg=f"d{name}")


def test_jit_grad_runs_the_compiled_kernel_without_a_score_matrix():
    n, h = 2048, 2
    q, k, v = qkv_inputs(0, b=1, h=h, hkv=h, nq=n, nk=n, dk=16, dv=16, dtype=np.float32)

    def loss(q, k, v):
        return jnp.sum(qkv.attention(q, k, v, causal=True) ** 2)

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    assert_kernel(jax.grad(loss, argnums=(0, 1, 2)), q, k, v, backward=1)
    ours = grad.lower(q, k, v).compile().memory_analysis().temp_size_in_bytes
    scores_bytes = h * n * n * 4

    def xla_loss(q, k, v):  # XLA's own attention materialises the scores: the measure can fail
        t = lambda x: jnp.swapaxes(x, 1, 2)  # noqa: E731
        return jnp.sum(jax.nn.dot_product_attention(t(q), t(k), t(v), is_causal=True) ** 2)

    theirs = jax.jit(jax.grad(xla_loss, argnums=(0, 1, 2))).lower(q, k, v).compile().memory_analysis()
    assert theirs.temp_size_in_bytes >= scores_bytes
    assert ours < scores_bytes / 8, (ours, scores_bytes)
    seen = []

    def traced(q, k, v):
        seen.append(qkv.dispatch(q, k, v, causal=True))
        return loss(q, k, v)

    jax.jit(jax.grad(traced))(q, k, v)
    assert seen[0].impl == "flash" and seen[0].engine == "native" and "XLA's FFI" in seen[0].reason


@pytest.mark.parametrize("case", [c.param() for c in MASK_CASES])
def test_every_mask_case_matches_the_oracle(case):
    q, k, v = qkv_inputs(2, b=2, h=2, hkv=1, nq=case.nq, nk=case.nk, dk=5, dv=3)
    check_fwd_and_grad(q, k, v, {"mask": case.build(masks)}, allowed=case.oracle(case.nq, case.nk, masks))


def _tile_masks():
    r = np.random.default_rng(3)
    dense_bits = r.random((70, 130)) < 0.6
    return [
        ("causal", masks.causal(), O.causal_allowed(70, 130)),
        ("causal-offset0", masks.causal(offset=0), O.causal_allowed(70, 130, 0)),
        ("window-33", masks.sliding_window(33), O.sliding_window_allowed(70, 130, 33)),
        ("padding-per-batch", masks.padding([100, 130]), O.padding_allowed(70, 130, [100, 130])),
        ("from-dense-bitmaps", masks.from_dense(dense_bits), dense_bits),
        ("chunked-48", masks.chunked(48), _chunked(70, 130, 48)),
    ]


def _chunked(nq, nk, size):
    p = np.arange(nq)[:, None] + (nk - nq)
    j = np.arange(nk)
    return (j <= p) & (j // size == p // size)


@pytest.mark.parametrize(("name", "mask", "allowed"), _tile_masks(), ids=[m[0] for m in _tile_masks()])
def test_masks_across_tile_edges_with_grouped_heads(name, mask, allowed):
    q, k, v = qkv_inputs(4)
    check_fwd_and_grad(q, k, v, {"mask": mask}, allowed=allowed)


@pytest.mark.parametrize("case", [c.param() for c in SCORE_CASES])
def test_score_mods_match_the_oracle(case):
    q, k, v = qkv_inputs(5, b=2, h=case.h, hkv=case.hkv, nq=19, nk=37, dk=8, dv=6)
    kw = {"score_mod": case.build(scores), "causal": True}
    if case.scale is not None:
        kw["scale"] = case.scale
    check_fwd_and_grad(
        q, k, v, kw, allowed=O.causal_allowed(19, 37), score_fn=case.oracle(), scale=case.scale, tol=1e-9
    )


def test_a_constant_bias_and_lse_through_sinks():
    q, k, v = qkv_inputs(6, b=2, h=4, hkv=4, nq=33, nk=65, dk=8, dv=8)
    bias = jnp.asarray(np.random.default_rng(7).standard_normal((1, 4, 33, 65)))  # a constant of the program
    check_fwd_and_grad(q, k, v, {"bias": bias}, bias=bias)
    # sinks read lse: its cotangent reaches the kernel's backward (dlse)
    sinks = jnp.asarray([0.5, -1.0, 0.0, 2.0])

    def f(q, k, v):
        return jnp.sum(qkv.attention(q, k, v, causal=True, sinks=sinks) ** 2)

    assert_kernel(jax.grad(f, (0, 1, 2)), q, k, v, backward=1)

    def ref(q, k, v):
        return jnp.sum(qkv.attention(q, k, v, causal=True, sinks=sinks, impl="reference") ** 2)

    for a, b in zip(jax.jit(jax.grad(f, (0, 1, 2)))(q, k, v), jax.grad(ref, (0, 1, 2))(q, k, v), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-10)
    # and the sinks' own gradient (through lse, outside the kernel)
    ds = jax.jit(jax.grad(lambda s: jnp.sum(qkv.attention(q, k, v, causal=True, sinks=s) ** 2)))(sinks)
    ds_ref = jax.grad(lambda s: jnp.sum(qkv.attention(q, k, v, causal=True, sinks=s, impl="reference") ** 2))(sinks)
    np.testing.assert_allclose(np.asarray(ds), np.asarray(ds_ref), rtol=1e-10, atol=1e-12)


def _err(x, golden):
    return float(np.abs(np.asarray(jnp.asarray(x, jnp.float64)) - np.asarray(golden)).max())


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_low_precision_dtypes(dtype):
    """Output and gradients against a float64 golden, within 2x (3x for gradients) the error of the
    same softmax written in plain jax.numpy in ``dtype`` (flash-attn's rule: the dtype's own error,
    not a constant), plus 4 of the dtype's ulps of the largest value."""
    q, k, v = (x.astype(dtype) for x in qkv_inputs(8))
    q64, k64, v64 = (x.astype(jnp.float64) for x in (q, k, v))
    allowed = O.causal_allowed(70, 130)
    eps = float(jnp.finfo(dtype).eps)
    f = lambda q, k, v: qkv.attention(q, k, v, causal=True)  # noqa: E731
    assert_kernel(f, q, k, v)
    out = jax.jit(f)(q, k, v)
    assert out.dtype == dtype
    golden = O.attention_oracle(q64, k64, v64, allowed=allowed)[0]
    base = dense(q, k, v, allowed)
    assert _err(out, golden) <= 2 * _err(base, golden) + 4 * eps * float(np.abs(golden).max())
    w = jnp.asarray(np.random.default_rng(9).standard_normal(golden.shape))

    def loss(f, q, k, v):
        return jnp.sum(f(q, k, v).astype(jnp.float32) * w.astype(jnp.float32))

    assert_kernel(jax.grad(lambda q, k, v: loss(f, q, k, v), (0, 1, 2)), q, k, v, backward=1)
    grads = jax.jit(jax.grad(lambda q, k, v: loss(f, q, k, v), (0, 1, 2)))(q, k, v)
    wants = jax.grad(lambda q, k, v: jnp.sum(dense(q, k, v, allowed) * w), (0, 1, 2))(q64, k64, v64)
    bases = jax.grad(lambda q, k, v: loss(lambda q, k, v: dense(q, k, v, allowed), q, k, v), (0, 1, 2))(q, k, v)
    for g, want, b, name in zip(grads, wants, bases, "qkv", strict=True):
        assert g.dtype == dtype
        err, base_err = _err(g, want), _err(b, want)
        assert err <= 3 * base_err + 4 * eps * float(jnp.abs(want).max()), f"d{name}: {err:.3g} > 3 x {base_err:.3g}"


def test_vmap_merges_into_the_batch_or_walks_each_index():
    q, k, v = qkv_inputs(9, b=2, h=4, hkv=2, nq=21, nk=45, dk=8, dv=8)
    qs, ks, vs = (jnp.stack([x, 2 * x, -x]) for x in (q, k, v))
    for kw in ({"causal": True}, {"mask": masks.padding([30, 45])}, {"dropout": 0.3, "rng": 5}):
        f = lambda q, k, v, kw=kw: qkv.attention(q, k, v, **kw)  # noqa: E731
        assert_kernel(jax.vmap(f), qs, ks, vs)  # one call over the mapped axis, not a loop of calls
        mapped = jax.jit(jax.vmap(f))(qs, ks, vs)
        for i in range(3):  # each index as if called alone (dropout: the same masks at every index)
            np.testing.assert_allclose(np.asarray(mapped[i]), np.asarray(jax.jit(f)(qs[i], ks[i], vs[i])), rtol=1e-12)
        loss = lambda q, k, v, f=f: jnp.sum(jnp.sin(f(q, k, v)))  # noqa: E731
        assert_kernel(jax.vmap(jax.grad(loss, (0, 1, 2))), qs, ks, vs, backward=1)
        g1 = jax.jit(jax.vmap(jax.grad(loss, (0, 1, 2))))(qs, ks, vs)
        g2 = jax.jit(jax.grad(lambda q, k, v, loss=loss: jnp.sum(jax.vmap(loss)(q, k, v)), (0, 1, 2)))(qs, ks, vs)
        for i in range(3):
            gi = jax.grad(loss, (0, 1, 2))(qs[i], ks[i], vs[i])
            for a, b, c in zip(g1, g2, gi, strict=True):
                np.testing.assert_allclose(np.asarray(a[i]), np.asarray(c), rtol=1e-10, atol=1e-12)
                np.testing.assert_allclose(np.asarray(b[i]), np.asarray(c), rtol=1e-10, atol=1e-12)


def test_value_and_grad_and_dropout_match_the_eager_kernel():
    q, k, v = qkv_inputs(10, dtype=np.float32)
    kw = {"causal": True, "dropout": 0.25, "rng": 1234}
    out = jax.jit(lambda q, k, v: qkv.attention(q, k, v, **kw))(q, k, v)
    eager = qkv.attention(q, k, v, **kw, impl="flash")  # concrete arrays: the kernel through NumPy views
    np.testing.assert_array_equal(np.asarray(out), np.asarray(eager))
    loss = lambda q, k, v, impl="auto": jnp.sum(jnp.sin(qkv.attention(q, k, v, impl=impl, **kw)))  # noqa: E731
    assert_kernel(jax.value_and_grad(loss, (0, 1, 2)), q, k, v, backward=1)
    val, grads = jax.jit(jax.value_and_grad(loss, (0, 1, 2)))(q, k, v)
    assert np.isclose(float(val), float(jnp.sum(jnp.sin(eager))), rtol=1e-5)
    # the reference impl draws the same counter-based dropout masks: its jax.grad is the truth
    wants = jax.grad(lambda q, k, v: loss(q, k, v, "reference"), (0, 1, 2))(q, k, v)
    bases = jax.grad(lambda q, k, v: loss(q, k, v, "reference"), (0, 1, 2))(*(x.astype(jnp.float64) for x in (q, k, v)))
    for g, want, golden in zip(grads, wants, bases, strict=True):  # float32 vs float64: 3x the reference's error
        assert _err(g, golden) <= 3 * _err(want, golden) + 4 * 2**-23 * float(jnp.abs(golden).max())


def test_non_finite_rows_come_back_nan_inside_jit():
    q, k, v = (np.asarray(x) for x in qkv_inputs(11, dtype=np.float32))
    k = k.copy()
    k[0, 1, 100] = np.nan  # read by every query row of heads 2, 3 of batch 0 that may see key 100
    assert_kernel(lambda q, k, v: qkv.attention(q, k, v, causal=True), *(jnp.asarray(x) for x in (q, k, v)))
    f = jax.jit(lambda q, k, v: qkv.attention(q, k, v, causal=True))
    out = np.asarray(f(*(jnp.asarray(x) for x in (q, k, v))))
    eager = np.asarray(qkv.attention(*(jnp.asarray(x) for x in (q, k, v)), causal=True, impl="flash"))
    np.testing.assert_array_equal(np.isnan(out), np.isnan(eager))
    assert np.isnan(out[0, 2:, 40:]).all() and not np.isnan(out[0, 2:, :40]).any()
    assert not np.isnan(out[1]).any()
    # an overflow raises on eager arrays; inside a compiled program the rows come back NaN (docs/arrays.md)
    big = jnp.asarray(q * 1e20)
    with pytest.raises(ArgumentError, match="overflow"):
        qkv.attention(big, jnp.asarray(k * 1e20), jnp.asarray(v), impl="flash")
    over = np.asarray(jax.jit(lambda q, k: qkv.attention(q, k, jnp.asarray(v)))(big, jnp.asarray(k * 1e20)))
    assert np.isnan(over).any()


def test_what_stays_on_the_array_engine_says_why():
    q, k, v = qkv_inputs(12, b=1, h=2, hkv=2, nq=9, nk=9, dk=4, dv=4)
    bias = jnp.asarray(np.random.default_rng(0).standard_normal((2, 9, 9)))
    seen = []

    def f(b):
        seen.append(qkv.dispatch(q, k, v, bias=b, impl="flash").reason)
        return jnp.sum(qkv.attention(q, k, v, bias=b) ** 2)

    assert kernel_calls(jax.grad(f), bias)[0] == (0, 0)  # the documented array-engine road
    g = jax.jit(jax.grad(f))(bias)
    assert "traced bias" in seen[0]
    want = jax.grad(lambda b: jnp.sum(dense(q, k, v, bias=b) ** 2))(bias)
    np.testing.assert_allclose(np.asarray(g), np.asarray(want), rtol=1e-10, atol=1e-12)


_N = 24
_R = np.random.default_rng(13)
_ALLOWED = _R.random((_N, _N)) < 0.7
_BIAS = _R.standard_normal((1, 4, _N, _N))
_TABLE = _R.standard_normal((4, 7))
TORCH_OP_CASES = {  # tests/test_compile.py's cases for torch.ops.qkv.attention, on traced JAX arrays
    "dense": lambda: {},
    "causal": lambda: {"causal": True},
    "window": lambda: {"mask": masks.sliding_window(5)},
    "window-two-sided": lambda: {"mask": masks.sliding_window(5, causal=False)},
    "padding": lambda: {"mask": masks.padding(np.array([20, 13]), causal=True)},
    "padding-left": lambda: {"mask": masks.padding(np.array([24, 17]), left=True)},
    "packed": lambda: {"mask": masks.packed(np.array([0, 10, 24]), causal=True)},
    "document": lambda: {"mask": masks.document(np.array([0] * 9 + [1] * 15)) & masks.causal()},
    "prefix-lm": lambda: {"mask": masks.prefix_lm(6)},
    "longformer": lambda: {"mask": masks.sliding_window(4, causal=False) | masks.global_tokens([0, 3])},
    "dilated": lambda: {"mask": masks.dilated(3, 2)},
    "chunked": lambda: {"mask": masks.chunked(5)},
    "bool-array": lambda: {"mask": jnp.asarray(_ALLOWED)},
    "float-bias": lambda: {"mask": masks.causal(), "bias": jnp.asarray(_BIAS)},
    "softcap": lambda: {"causal": True, "score_mod": scores.softcap(2.0)},
    "alibi": lambda: {"causal": True, "score_mod": scores.alibi()},
    "relative-temperature": lambda: {"score_mod": scores.relative_bias(_TABLE, 3) + scores.temperature(0.5)},
    "sinks": lambda: {"causal": True, "sinks": jnp.asarray([0.5, -1.0, 0.0, 2.0])},
}


@pytest.mark.parametrize("name", list(TORCH_OP_CASES))
def test_the_torch_operators_cases_run_the_kernel_and_match_the_reference(name):
    q, k, v = qkv_inputs(14, b=2, h=4, hkv=2, nq=_N, nk=_N, dk=8, dv=8)
    w = jnp.asarray(np.random.default_rng(15).standard_normal((2, 4, _N, 8)))

    kw = TORCH_OP_CASES[name]()  # built outside the trace: constants of the program

    def loss(q, k, v, impl="auto"):
        return jnp.sum(qkv.attention(q, k, v, impl=impl, **kw) * w)

    assert_kernel(jax.value_and_grad(loss, argnums=(0, 1, 2)), q, k, v, backward=1)
    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
    val, grads = step(q, k, v)
    want_val, want = jax.value_and_grad(lambda q, k, v: loss(q, k, v, "reference"), argnums=(0, 1, 2))(q, k, v)
    np.testing.assert_allclose(float(val), float(want_val), rtol=1e-11)
    for g, x in zip(grads, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(x), rtol=1e-9, atol=1e-11)


def test_a_boolean_mask_passed_into_jit_hides_its_keys():
    # a jit argument is traced: no values to plan with, so it hides as a bias of 0 / -inf would
    q, k, v = qkv_inputs(16, b=1, h=2, hkv=2, nq=9, nk=11, dk=4, dv=4)
    allowed = np.random.default_rng(17).random((9, 11)) < 0.5
    allowed[3] = False  # a row that sees nothing: zeros, as everywhere
    f = lambda q, k, v, m: qkv.attention(q, k, v, mask=m)  # noqa: E731
    # a traced bias is the array engine's (its gradient): the documented road, no kernel call
    assert kernel_calls(f, q, k, v, jnp.asarray(allowed))[0] == (0, 0)
    out = jax.jit(f)(q, k, v, jnp.asarray(allowed))
    np.testing.assert_allclose(np.asarray(out), O.attention_oracle(q, k, v, allowed=allowed)[0], rtol=1e-12, atol=1e-12)


def test_attention_backward_inside_jit_runs_the_kernels_backward():
    q, k, v = qkv_inputs(18, b=2, h=4, hkv=2, nq=40, nk=70, dk=8, dv=6)
    mask = masks.sliding_window(17)

    def grads(q, k, v):
        out, lse = qkv.attention(q, k, v, mask=mask, return_lse=True)
        return qkv.attention_backward(jnp.sin(out), q, k, v, out, lse, mask=mask)

    assert_kernel(grads, q, k, v, backward=1)
    step = jax.jit(grads)
    allowed = O.sliding_window_allowed(40, 70, 17)

    def loss(q, k, v):  # attention_backward(dout) is the vector-Jacobian product with dout
        out = dense(q, k, v, allowed)
        return jnp.sum(out * jax.lax.stop_gradient(jnp.sin(out)))

    for g, want in zip(step(q, k, v), jax.grad(loss, (0, 1, 2))(q, k, v), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(want), rtol=1e-10, atol=1e-12)
