"""``qkv.attention`` over a quantized cache: exact with respect to the dequantized values.

The reference is the float64 oracle run on ``values · scales`` computed in float64 (the cache
the call reads), for every impl and engine, NumPy and torch, float64 and float32 queries, GQA,
odd head dims, a decode step, a prefill chunk against a cache (causal, bottom-right) and a
padded batch. Then what ``qkv.dispatch`` says, the non-finite rule through attention, gradients,
``torch.compile`` and JAX, and the typed errors.
"""

import numpy as np
import pytest

import oracle as O
import qkv
from helpers import HAS_TORCH, assert_close, engine_params, to_numpy64, to_torch
from qkv import _native, masks
from qkv._core import run
from qkv._impls import build_call
from qkv.errors import ArgumentError, DTypeError, ShapeError

FORMATS = ["int8", "float8_e4m3fn", "float8_e5m2"]
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")


def _golden(q, qk, qv, allowed=None, bias=None):
    k64, v64 = (to_numpy64(qkv.dequantize(x, "float64")) for x in (qk, qv))
    return O.attention_oracle(to_numpy64(q), k64, v64, allowed=allowed, bias=bias)


CASES = {  # name -> (q shape, k shape, v shape, attention keywords, the oracle's allowed grid)
    "gqa-dense": ((2, 4, 9, 8), (2, 2, 23, 8), (2, 2, 23, 8), {}, None),
    "decode-step": ((1, 8, 1, 16), (1, 2, 37, 16), (1, 2, 37, 16), {"causal": True}, None),
    "rows-7": ((2, 6, 7, 8), (2, 3, 40, 8), (2, 3, 40, 8), {"causal": True}, O.causal_allowed(7, 40)),
    "prefill-chunk": ((1, 4, 20, 8), (1, 2, 50, 8), (1, 2, 50, 8), {"causal": True}, O.causal_allowed(20, 50)),
    "odd-d": ((2, 2, 5, 5), (2, 1, 19, 5), (2, 1, 19, 3), {"causal": True}, O.causal_allowed(5, 19)),
    "padding": (
        (2, 4, 6, 8),
        (2, 2, 30, 8),
        (2, 2, 30, 8),
        {"mask": masks.padding(np.array([30, 17])), "causal": True},
        O.padding_allowed(6, 30, [30, 17]) & O.causal_allowed(6, 30)[None, None],
    ),
    "no-heads": ((6, 8), (33, 8), (33, 4), {"causal": True}, O.causal_allowed(6, 33)),
}


def _attend(impl, engine, q, qk, qv, **kw):
    if impl == "flash":
        return run(build_call(q, qk, qv, engine=engine, want_lse=True, **kw), "flash")
    return run(build_call(q, qk, qv, want_lse=impl != "torch", **kw), impl)  # SDPA returns no lse


@pytest.mark.parametrize("impl,engine", engine_params("torch", "auto"))
@pytest.mark.parametrize("lib", ["numpy", pytest.param("torch", marks=needs_torch)])
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_engine_attends_the_dequantized_cache_exactly(impl, engine, lib, fmt, rng):
    if impl == "torch" and lib == "numpy":
        pytest.skip("impl='torch' takes torch tensors")
    for name, (qs, ks, vs, kw, allowed) in CASES.items():
        for dtype, tol in (("float64", 1e-11), ("float32", 2e-5)):
            q, k, v = (rng.standard_normal(s).astype(dtype) for s in (qs, ks, vs))
            k[..., ::3, :] *= 30.0  # tokens of different sizes: their scales differ
            if lib == "torch":
                q, k, v = to_torch(q), to_torch(k), to_torch(v)
            qk, qv = qkv.quantize(k, fmt), qkv.quantize(v, fmt)
            out, lse = _golden(q, qk, qv, allowed)[0::2]
            res = _attend(impl, engine, q, qk, qv, **kw)
            assert type(res.out) is type(q)
            assert_close(res.out, out, tol=tol, name=f"{name} {dtype} out")
            if res.lse is not None:
                assert_close(res.lse, lse, tol=tol, name=f"{name} {dtype} lse")


@pytest.mark.parametrize("fmt", FORMATS)
def test_dispatch_reports_the_format_and_whether_the_kernel_reads_it(fmt):
    q, k = np.ones((1, 4, 1, 16), np.float32), np.ones((1, 2, 64, 16), np.float32)
    qk = qkv.quantize(k, fmt)
    d = qkv.dispatch(q, qk, qk, causal=True)
    assert d.kv_format == fmt
    assert qkv.dispatch(q, k, k).kv_format is None
    if _native.available():
        assert d.engine == "native" and "read in place" in d.reason
    else:
        assert d.engine != "native" and f"{fmt} K/V dequantized" in d.reason
    r = qkv.dispatch(q, qk, qk, impl="reference")
    assert (r.impl, r.kv_format) == ("reference", fmt) and "dequantized" in r.reason


@pytest.mark.skipif(not _native.available(), reason="compiled engine unavailable")
@pytest.mark.parametrize("lib", ["numpy", pytest.param("torch", marks=needs_torch)])
@pytest.mark.parametrize("fmt", FORMATS)
def test_the_compiled_kernel_reads_the_codes_never_a_dequantized_copy(lib, fmt, rng, monkeypatch):
    """``impl="auto"`` on the compiled engine hands the codes and scales to the kernel: with
    ``qkv.dequantize`` unusable the decode step and the prefill chunk still give the oracle's answer."""

    def refused(*args, **kwargs):
        raise AssertionError("the cache was dequantized in Python")

    cases = {name: CASES[name] for name in ("decode-step", "rows-7", "prefill-chunk", "odd-d", "no-heads")}
    for name, (qs, ks, vs, kw, allowed) in cases.items():
        q, k, v = (rng.standard_normal(s).astype(np.float32) for s in (qs, ks, vs))
        if lib == "torch":
            q, k, v = to_torch(q), to_torch(k), to_torch(v)
        qk, qv = qkv.quantize(k, fmt), qkv.quantize(v, fmt)
        want = _golden(q, qk, qv, allowed)[0]
        with monkeypatch.context() as m:
            m.setattr(qkv._impls._call, "dequantize", refused)
            assert qkv.dispatch(q, qk, qv, **kw).engine == "native"
            got = qkv.attention(q, qk, qv, **kw)
        assert type(got) is type(q)
        assert_close(got, want, tol=2e-5, name=name)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("impl,engine", engine_params())
def test_a_non_finite_token_is_nan_when_attended_and_changes_nothing_when_hidden(fmt, impl, engine, rng):
    """README "Conventions": the NaN-scaled token dequantizes to a NaN row; the rows that attend
    it are NaN (lse NaN), the rows whose mask hides it equal the result without it."""
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((1, 2, 6, 8), (1, 2, 12, 8), (1, 2, 12, 8)))
    for side in ("k", "v"):
        kk, vv = k.copy(), v.copy()
        (kk if side == "k" else vv)[0, 1, 9, 3] = np.nan  # kv head 1, key 9: the causal rows 3.. attend it
        qk, qv = qkv.quantize(kk, fmt), qkv.quantize(vv, fmt)
        res = _attend(impl, engine, q, qk, qv, causal=True)
        out, lse = to_numpy64(res.out), to_numpy64(res.lse)
        assert np.isnan(out[0, 1, 3:]).all() and np.isnan(lse[0, 1, 3:]).all()
        assert np.isfinite(out[0, 0]).all() and np.isfinite(out[0, 1, :3]).all()
        want = _golden(q, qk, qv, O.causal_allowed(6, 12))
        assert_close(out[0, 1, :3], want[0][0, 1, :3], tol=2e-5, name=f"{side} hidden rows")
        assert_close(out[0, 0], want[0][0, 0], tol=2e-5, name=f"{side} other head")


@needs_torch
@pytest.mark.parametrize("fmt", FORMATS)
def test_q_gets_its_gradient_against_a_quantized_cache(fmt, rng):
    import torch

    q = torch.randn(2, 4, 5, 8, dtype=torch.float64, requires_grad=True)
    k, v = torch.randn(2, 2, 11, 8, dtype=torch.float64), torch.randn(2, 2, 11, 8, dtype=torch.float64)
    qk, qv = qkv.quantize(k, fmt), qkv.quantize(v, fmt)
    for impl in ("reference", "flash", "auto"):
        (qkv.attention(q, qk, qv, causal=True, impl=impl) ** 2).sum().backward()
        got, q.grad = q.grad.clone(), None
        k64, v64 = qkv.dequantize(qk, torch.float64), qkv.dequantize(qv, torch.float64)
        (qkv.attention(q, k64, v64, causal=True, impl="reference") ** 2).sum().backward()
        want, q.grad = q.grad.clone(), None
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


def test_attention_backward_refuses_a_quantized_cache(rng):
    q, k, v = (rng.standard_normal((1, 2, 4, 8)) for _ in range(3))
    out, lse = qkv.attention(q, k, v, return_lse=True)
    with pytest.raises(ArgumentError, match="inference state"):
        qkv.attention_backward(out, q, qkv.quantize(k, "int8"), qkv.quantize(v, "int8"), out, lse)


def test_both_or_neither_one_format_one_library(rng):
    q, k, v = (rng.standard_normal((1, 2, 4, 8)).astype(np.float32) for _ in range(3))
    qk = qkv.quantize(k, "int8")
    with pytest.raises(DTypeError, match="both be qkv.Quantized"):
        qkv.attention(q, qk, v)
    with pytest.raises(DTypeError, match="both be qkv.Quantized"):
        qkv.attention(q, k, qk)
    with pytest.raises(DTypeError, match="different formats"):
        qkv.attention(q, qk, qkv.quantize(v, "float8_e4m3fn"))
    with pytest.raises(ShapeError, match="d_k"):
        qkv.attention(q, qkv.quantize(k[..., :4], "int8"), qkv.quantize(v, "int8"))
    with pytest.raises(ShapeError, match="Nk"):
        qkv.attention(q, qk, qkv.quantize(v[..., :3, :], "int8"))
    with pytest.raises(DTypeError, match="float"):
        qkv.attention(q.astype(np.int32), qk, qk)
    if HAS_TORCH:
        with pytest.raises(DTypeError, match="mixed kinds"):
            qkv.attention(to_torch(q), qk, qk)


def test_half_precision_queries_read_the_cache_too(rng):
    torch = pytest.importorskip("torch")
    for dtype in (torch.bfloat16, torch.float16):
        q = torch.randn(1, 4, 3, 16).to(dtype)
        k, v = torch.randn(1, 2, 40, 16), torch.randn(1, 2, 40, 16)
        qk, qv = qkv.quantize(k, "int8"), qkv.quantize(v, "int8")
        out = qkv.attention(q, qk, qv, causal=True)
        assert out.dtype == dtype
        want = _golden(q, qk, qv, O.causal_allowed(3, 40))[0]
        assert np.abs(to_numpy64(out) - want).max() < 2e-2


@needs_torch
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_compiled_function_reads_a_quantized_cache_in_one_graph(fmt, rng):
    import torch

    if not _native.available():
        pytest.skip("compiled engine unavailable")
    q, k, v = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 20, 8), torch.randn(1, 2, 20, 8)
    qk, qv = qkv.quantize(k, fmt), qkv.quantize(v, fmt)

    def fn(q, values_k, scales_k, values_v, scales_v):
        return qkv.attention(q, qkv.Quantized(values_k, scales_k, fmt), qkv.Quantized(values_v, scales_v, fmt))

    args = (q, qk.values, qk.scales, qv.values, qv.scales)
    explained = torch._dynamo.explain(fn)(*args)
    assert explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()
    got = torch.compile(fn, fullgraph=True, backend="aot_eager")(*args)
    assert_close(got, _golden(q, qk, qv)[0], tol=2e-5)


def test_jax_reads_a_quantized_cache_eagerly_and_under_jit(rng):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((1, 4, 3, 8), (1, 2, 20, 8), (1, 2, 20, 8)))
    for fmt in FORMATS:
        qk, qv = qkv.quantize(jnp.asarray(k), fmt), qkv.quantize(jnp.asarray(v), fmt)
        want = _golden(q, qkv.quantize(k, fmt), qkv.quantize(v, fmt), O.causal_allowed(3, 20))[0]
        got = qkv.attention(jnp.asarray(q), qk, qv, causal=True)
        assert_close(np.asarray(got), want, tol=2e-5, name=f"{fmt} eager")
        jitted = jax.jit(lambda a, b, c: qkv.attention(a, b, c, causal=True))(jnp.asarray(q), qk, qv)
        assert_close(np.asarray(jitted), want, tol=2e-5, name=f"{fmt} jit")


def test_explain_shows_the_steps_over_the_stored_values(rng):
    q, k, v = (rng.standard_normal(s) for s in ((2, 3, 8), (2, 7, 8), (2, 7, 8)))
    qk, qv = qkv.quantize(k, "float8_e4m3fn"), qkv.quantize(v, "float8_e4m3fn")
    trace = qkv.explain(q, qk, qv, causal=True)
    want = _golden(q, qk, qv, O.causal_allowed(3, 7))[0]
    assert_close(trace.out, want, tol=1e-12)
    assert trace.options["dispatch"]["kv_format"] == "float8_e4m3fn"
