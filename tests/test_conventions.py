"""One test per convention of API.md ("Conventions (everywhere)"), each named after it."""

import math
import warnings

import numpy as np
import pytest

import oracle as O
import qkv
from helpers import HAS_TORCH, Runner, assert_close, assert_close_to_golden, check_against_oracle, make_qkv

needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")


def test_layout_is_leading_axes_then_sequence_then_feature(impl, rng):
    """(..., N, D): q (..., Nq, Dk), k (..., Nk, Dk), v (..., Nk, Dv) -> out (..., Nq, Dv)."""
    q, k, v = make_qkv(rng, (2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 6))
    res = impl.attention(q, k, v)
    assert res.out.shape == (2, 3, 5, 6)
    check_against_oracle(res, O.attention_oracle(q, k, v))
    # The sequence axis is -2: attending over keys in another order permutes nothing in out.
    perm = rng.permutation(7)
    assert_close(impl.attention(q, k[..., perm, :], v[..., perm, :], weights=False, lse=False).out, res.out)


def test_layout_two_dimensional_inputs(impl, rng):
    """A single head without leading axes: q (Nq, Dk), k (Nk, Dk), v (Nk, Dv) -> (Nq, Dv)."""
    q, k, v = make_qkv(rng, (3, 5), (6, 5), (6, 2))
    res = impl.attention(q, k, v)
    assert res.out.shape == (3, 2)
    check_against_oracle(res, O.attention_oracle(q, k, v))


def test_leading_axes_broadcast(impl, rng):
    q, k, v = make_qkv(rng, (2, 4, 5, 8), (1, 4, 7, 8))
    check_against_oracle(impl.attention(q, k, v), O.attention_oracle(q, k, v))


def test_nq_ne_nk_and_dv_ne_dk_are_allowed(impl, rng):
    for nq, nk, dk, dv in [(1, 9, 4, 7), (9, 2, 3, 1)]:
        q, k, v = make_qkv(rng, (2, nq, dk), (2, nk, dk), (2, nk, dv))
        check_against_oracle(impl.attention(q, k, v), O.attention_oracle(q, k, v))


def test_mask_polarity_true_means_may_attend(impl, rng):
    q, k, v = make_qkv(rng, (1, 2, 3, 4), (1, 2, 5, 4))
    mask = np.zeros((3, 5), dtype=bool)
    mask[:, 1] = True  # every query may attend key 1 only
    res = impl.attention(q, k, v, mask=mask)
    assert_close(res.out, np.broadcast_to(v[..., 1:2, :], (1, 2, 3, 4)))
    if res.weights is not None:
        assert_close(res.weights, np.broadcast_to(mask, (1, 2, 3, 5)).astype(float), name="weights")
    # and the complement: everything but key 1
    res = impl.attention(q, k, v, mask=~mask)
    check_against_oracle(res, O.attention_oracle(q, k, v, allowed=~mask))


def test_float_mask_is_an_additive_bias(impl, rng):
    q, k, v = make_qkv(rng, (2, 2, 4, 3), (2, 2, 6, 3))
    bias = rng.standard_normal((4, 6))
    bias[1, [0, 2]] = -np.inf  # -inf entries hide keys
    check_against_oracle(impl.attention(q, k, v, mask=bias), O.attention_oracle(q, k, v, bias=bias))


def test_masks_broadcast_to_scores(impl, rng):
    q, k, v = make_qkv(rng, (2, 3, 4, 5), (2, 3, 6, 5))
    mask = rng.random((2, 1, 4, 6)) < 0.6  # per batch, shared by the heads
    check_against_oracle(impl.attention(q, k, v, mask=mask), O.attention_oracle(q, k, v, allowed=mask))


def test_causal_is_bottom_right(impl, rng):
    """causal=True aligns the diagonal to the bottom-right: j <= i + (Nk - Nq).

    Nq=3, Nk=4 (1 = may attend):
        1 1 0 0
        1 1 1 0
        1 1 1 1
    """
    picture = np.array([[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=bool)
    q, k, v = make_qkv(rng, (2, 2, 3, 5), (2, 2, 4, 5))
    res = impl.attention(q, k, v, causal=True)
    check_against_oracle(res, O.attention_oracle(q, k, v, allowed=picture))
    if res.weights is not None:
        assert ((res.weights > 0) == picture).all()
    # not the top-left alignment of torch SDPA's is_causal
    top_left = O.attention_oracle(q, k, v, allowed=np.tril(np.ones((3, 4), dtype=bool)))[0]
    assert np.abs(res.out - top_left).max() > 1e-3


def test_causal_one_query_against_a_kv_cache_attends_every_key(impl, rng):
    q, k, v = make_qkv(rng, (2, 4, 1, 8), (2, 4, 9, 8))
    res = impl.attention(q, k, v, causal=True)
    check_against_oracle(res, O.attention_oracle(q, k, v))


def test_causal_with_a_mask_combines_with_and(impl, rng):
    q, k, v = make_qkv(rng, (1, 2, 5, 4), (1, 2, 5, 4))
    mask = rng.random((5, 5)) < 0.7
    expected = O.attention_oracle(q, k, v, allowed=mask & O.causal_allowed(5, 5))
    check_against_oracle(impl.attention(q, k, v, mask=mask, causal=True), expected)


def test_empty_row_gives_zero_output_zero_weights_and_minus_inf_lse(impl, rng):
    q, k, v = make_qkv(rng, (2, 2, 3, 4), (2, 2, 4, 4))
    mask = np.ones((3, 4), dtype=bool)
    mask[0] = False  # query 0 may attend nothing
    with warnings.catch_warnings(), np.errstate(divide="raise", invalid="raise", over="raise"):
        warnings.simplefilter("error")
        res = impl.attention(q, k, v, mask=mask)
    assert (res.out[..., 0, :] == 0).all()
    if res.weights is not None:
        assert (res.weights[..., 0, :] == 0).all()
    if res.lse is not None:
        assert np.isneginf(res.lse[..., 0]).all()
    check_against_oracle(res, O.attention_oracle(q, k, v, allowed=mask))


def test_empty_row_from_minus_inf_bias_and_from_causal(impl, rng):
    q, k, v = make_qkv(rng, (1, 2, 5, 3), (1, 2, 3, 3))
    bias = np.zeros((5, 3))
    bias[4] = -np.inf
    with warnings.catch_warnings(), np.errstate(divide="raise", invalid="raise", over="raise"):
        warnings.simplefilter("error")
        res_bias = impl.attention(q, k, v, mask=bias)
        res_causal = impl.attention(q, k, v, causal=True)  # Nq > Nk: rows 0 and 1 see nothing
    check_against_oracle(res_bias, O.attention_oracle(q, k, v, bias=bias))
    check_against_oracle(res_causal, O.attention_oracle(q, k, v, allowed=O.causal_allowed(5, 3)))
    assert (res_causal.out[..., :2, :] == 0).all()


def test_empty_row_gives_zero_gradients(rng):
    q, k, v = make_qkv(rng, (1, 2, 3, 4), (1, 2, 4, 4))
    mask = np.ones((3, 4), dtype=bool)
    mask[1] = False
    out, _, lse = O.attention_oracle(q, k, v, allowed=mask)
    dout = rng.standard_normal(out.shape)
    with warnings.catch_warnings(), np.errstate(divide="raise", invalid="raise", over="raise"):
        warnings.simplefilter("error")
        dq, dk, dv = qkv.attention_backward(dout, q, k, v, out, lse, mask=mask)
    assert (np.asarray(dq)[..., 1, :] == 0).all()
    # row 1 contributes nothing to dk, dv: they equal those of the problem without row 1
    keep = [0, 2]
    out2, _, lse2 = O.attention_oracle(q[..., keep, :], k, v, allowed=mask[keep])
    _, dk2, dv2 = qkv.attention_backward(dout[..., keep, :], q[..., keep, :], k, v, out2, lse2, mask=mask[keep])
    assert_close(dk, dk2, name="dk")
    assert_close(dv, dv2, name="dv")


@needs_torch
@pytest.mark.parametrize("impl_name", ["reference", "torch", "auto"])
def test_empty_row_gives_zero_gradients_through_torch_autograd(impl_name, rng):
    import torch

    q, k, v = (torch.tensor(a, requires_grad=True) for a in make_qkv(rng, (1, 2, 3, 4), (1, 2, 4, 4)))
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[1] = False
    out = qkv.attention(q, k, v, mask=mask, impl=impl_name)
    out.sum().backward()
    for g in (q.grad, k.grad, v.grad):
        assert torch.isfinite(g).all()
    assert (q.grad[..., 1, :] == 0).all()


@pytest.mark.parametrize(("nq", "nk"), [(0, 4), (3, 0), (0, 0)])
def test_no_queries_or_no_keys_give_zeros_and_minus_inf(impl, rng, nq, nk):
    q, k, v = make_qkv(rng, (2, 4, nq, 3), (2, 2, nk, 3), (2, 2, nk, 5))  # GQA, Dv != Dk
    res = impl.attention(q, k, v)
    assert tuple(res.out.shape) == (2, 4, nq, 5) and (np.asarray(res.out) == 0).all()
    if res.weights is not None:
        assert tuple(res.weights.shape) == (2, 4, nq, nk)
    if res.lse is not None:
        assert tuple(res.lse.shape) == (2, 4, nq) and np.isneginf(np.asarray(res.lse)).all()


@needs_torch
@pytest.mark.parametrize("impl_name", ["reference", "flash", "torch", "auto"])
@pytest.mark.parametrize(("nq", "nk"), [(0, 4), (3, 0)])
def test_no_queries_or_no_keys_give_zero_gradients_through_torch_autograd(impl_name, nq, nk, rng):
    import torch

    q, k, v = (torch.tensor(a, requires_grad=True) for a in make_qkv(rng, (2, 4, nq, 3), (2, 2, nk, 3)))
    if impl_name == "torch":  # SDPA gives no lse
        out = qkv.attention(q, k, v, impl=impl_name)
        loss = out.sum()
    else:
        out, lse = qkv.attention(q, k, v, impl=impl_name, return_lse=True)
        loss = out.sum() + lse.exp().sum()
    assert out.requires_grad and out.grad_fn is not None  # part of the graph, not a detached constant
    loss.backward()
    for x in (q, k, v):
        assert x.grad is not None and x.grad.shape == x.shape and (x.grad == 0).all()


def _half_case(rng):
    # Many keys, so that float16 accumulation would visibly lose accuracy.
    return make_qkv(rng, (1, 2, 16, 64), (1, 2, 512, 64), (1, 2, 512, 32))


def _naive(q, k, v, dtype):
    """softmax(q kᵀ/√d) v computed entirely in ``dtype`` (NumPy)."""
    q, k, v = (np.asarray(t, dtype=dtype) for t in (q, k, v))
    s = (q @ np.swapaxes(k, -1, -2)) * dtype(1 / math.sqrt(q.shape[-1]))
    m = s.max(axis=-1, keepdims=True)
    e = np.exp(s - m)
    z = e.sum(axis=-1, keepdims=True)
    return (e / z) @ v, e / z, (m + np.log(z))[..., 0]


def test_half_precision_accumulates_in_float32_and_returns_input_dtype(impl, rng):
    """float16 in -> float16 out and weights, lse float32; error within 2x that of a float32
    computation rounded to float16 (the float64 golden is computed from the float16 inputs)."""
    q, k, v = (t.astype(np.float16) for t in _half_case(rng))
    golden = O.attention_oracle(q, k, v)
    base_out, base_w, base_lse = _naive(q, k, v, np.float32)
    res = impl.attention(q, k, v)
    out = res.raw[0] if isinstance(res.raw, tuple) else res.raw
    assert str(out.dtype).endswith("float16")
    assert_close_to_golden(res.out, golden[0], base_out.astype(np.float16), name="out")
    if res.weights is not None:
        assert str(res.raw[1].dtype).endswith("float16")
        assert_close_to_golden(res.weights, golden[1], base_w.astype(np.float16), name="weights")
    if res.lse is not None:
        assert str(res.raw[-1].dtype).endswith("float32")
        assert_close_to_golden(res.lse, golden[2], base_lse, floor=8 * 2.0**-23 * np.abs(golden[2]).max(), name="lse")


def test_half_precision_bound_rejects_float16_accumulation(rng):
    """The bound above can fail: a computation that accumulates in float16 violates it."""
    q, k, v = (t.astype(np.float16) for t in _half_case(rng))
    golden = O.attention_oracle(q, k, v)[0]
    in_half = _naive(q, k, v, np.float16)[0]
    base = _naive(q, k, v, np.float32)[0].astype(np.float16)
    with pytest.raises(AssertionError):
        assert_close_to_golden(in_half, golden, base)


@needs_torch
@pytest.mark.parametrize("impl_name", ["reference", "torch", "flash", "auto"])
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_half_precision_torch_accumulates_in_float32(dtype_name, impl_name, rng):
    import torch

    dtype = getattr(torch, dtype_name)
    q, k, v = (torch.from_numpy(t).to(dtype) for t in _half_case(rng))
    golden = O.attention_oracle(*(t.double().numpy() for t in (q, k, v)))
    s = (q.float() @ k.float().transpose(-1, -2)) / 8.0
    w32 = torch.softmax(s, dim=-1)
    base_out, base_w, base_lse = (w32 @ v.float()).to(dtype), w32.to(dtype), torch.logsumexp(s, dim=-1)
    res = Runner(impl_name, True).attention(q, k, v)
    out = res.raw[0] if isinstance(res.raw, tuple) else res.raw
    assert out.dtype == dtype
    assert_close_to_golden(res.out, golden[0], base_out, name="out")
    if res.weights is not None:
        assert res.raw[1].dtype == dtype
        assert_close_to_golden(res.weights, golden[1], base_w, name="weights")
    if res.lse is not None:
        assert res.raw[-1].dtype == torch.float32
        assert_close_to_golden(res.lse, golden[2], base_lse, floor=8 * 2.0**-23 * np.abs(golden[2]).max(), name="lse")


def test_gqa_head_order_is_repeat_interleave(impl, rng):
    """H=4 query heads, Hkv=2: query heads 0, 1 read kv head 0; heads 2, 3 read kv head 1."""
    q, k, v = make_qkv(rng, (2, 4, 3, 5), (2, 2, 6, 5))
    res = impl.attention(q, k, v)
    interleaved = O.attention_oracle(q, np.repeat(k, 2, axis=-3), np.repeat(v, 2, axis=-3))
    check_against_oracle(res, interleaved)
    tiled = O.attention_oracle(q, np.tile(k, (1, 2, 1, 1)), np.tile(v, (1, 2, 1, 1)))[0]
    assert np.abs(res.out - tiled).max() > 1e-3


def test_mqa_one_kv_head_serves_every_query_head(impl, rng):
    q, k, v = make_qkv(rng, (2, 6, 1, 8), (2, 1, 13, 8))
    check_against_oracle(impl.attention(q, k, v), O.attention_oracle(q, np.repeat(k, 6, -3), np.repeat(v, 6, -3)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_in_numpy_out(dtype, rng):
    q, k, v = make_qkv(rng, (1, 2, 3, 4), (1, 2, 5, 4), dtype=dtype)
    for impl_name in ("reference", "auto"):
        out, weights, lse = qkv.attention(q, k, v, impl=impl_name, return_weights=True, return_lse=True)
        for x in (out, weights, lse):
            assert type(x) is np.ndarray
            assert x.dtype == dtype
        assert type(qkv.attention(q, k, v, impl=impl_name)) is np.ndarray


@needs_torch
@pytest.mark.parametrize("dtype_name", ["float32", "float64", "float16", "bfloat16"])
def test_torch_in_torch_out_same_dtype_and_device(dtype_name, rng):
    import torch

    dtype = getattr(torch, dtype_name)
    q, k, v = (torch.from_numpy(t).to(dtype) for t in make_qkv(rng, (1, 2, 3, 4), (1, 2, 5, 4)))
    for impl_name in ("reference", "torch", "auto"):
        out = qkv.attention(q, k, v, impl=impl_name)
        assert isinstance(out, torch.Tensor) and out.dtype == dtype and out.device == q.device
    out, weights, lse = qkv.attention(q, k, v, impl="auto", return_weights=True, return_lse=True)
    assert isinstance(weights, torch.Tensor) and weights.dtype == dtype
    assert isinstance(lse, torch.Tensor) and lse.device == q.device
    assert lse.dtype == (torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype)


@needs_torch
@pytest.mark.parametrize("torch_arg", ["q", "k", "v"])
def test_mixed_kinds_raise_type_error(torch_arg, rng):
    import torch

    arrays = dict(zip("qkv", make_qkv(rng, (1, 2, 3, 4), (1, 2, 5, 4)), strict=True))
    arrays[torch_arg] = torch.from_numpy(arrays[torch_arg])
    for impl_name in ("reference", "torch", "auto"):
        with pytest.raises(TypeError):
            qkv.attention(arrays["q"], arrays["k"], arrays["v"], impl=impl_name)


def test_default_scale_is_one_over_sqrt_dk(impl, rng):
    q, k, v = make_qkv(rng, (1, 2, 4, 7), (1, 2, 5, 7))
    res = impl.attention(q, k, v)
    check_against_oracle(res, O.attention_oracle(q, k, v, scale=1 / math.sqrt(7)))
    assert np.abs(res.out - O.attention_oracle(q, k, v, scale=1.0)[0]).max() > 1e-3


def test_scale_overrides_the_default(impl, rng):
    q, k, v = make_qkv(rng, (1, 2, 4, 7), (1, 2, 5, 7))
    for scale in (1.0, 0.1, 2.5):
        check_against_oracle(impl.attention(q, k, v, scale=scale), O.attention_oracle(q, k, v, scale=scale))


def test_returns_out_weights_lse_in_that_order(rng):
    q, k, v = make_qkv(rng, (1, 2, 3, 4), (1, 2, 5, 4))
    g_out, g_w, g_lse = O.attention_oracle(q, k, v)
    out = qkv.attention(q, k, v)
    assert isinstance(out, np.ndarray)
    assert_close(out, g_out)
    out, w = qkv.attention(q, k, v, return_weights=True)
    assert_close(out, g_out)
    assert_close(w, g_w, name="weights")
    out, lse = qkv.attention(q, k, v, return_lse=True)
    assert_close(out, g_out)
    assert_close(lse, g_lse, name="lse")
    res = qkv.attention(q, k, v, return_weights=True, return_lse=True)
    assert len(res) == 3
    assert_close(res[0], g_out)
    assert_close(res[1], g_w, name="weights")
    assert_close(res[2], g_lse, name="lse")


def test_errors_are_qkv_errors_with_the_documented_bases():
    from qkv import errors

    assert issubclass(errors.ShapeError, errors.QKVError) and issubclass(errors.ShapeError, ValueError)
    assert issubclass(errors.MaskError, errors.QKVError) and issubclass(errors.MaskError, ValueError)
    assert issubclass(errors.DTypeError, errors.QKVError) and issubclass(errors.DTypeError, TypeError)
    assert issubclass(errors.ArgumentError, errors.QKVError) and issubclass(errors.ArgumentError, ValueError)
