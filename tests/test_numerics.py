"""Non-finite numbers and careless inputs in the core: a clear error or the documented result.

- finite inputs whose scores overflow: ``ArgumentError`` naming the overflow from every impl
  and from ``explain``, never NaN, never a warning (``filterwarnings = error`` checks that);
- a NaN or inf in a key or value the mask hides changes nothing (the oracle reads only the
  allowed keys); one that is attended makes that row NaN, with ``lse`` NaN, not ``-inf``;
- and a table of bad inputs, each with its exception type and the words its message must hold.
"""

import numpy as np
import pytest

import oracle as O
import qkv
from helpers import HAS_TORCH, assert_close, make_qkv, runner_params, tiled_attention, tiled_backward
from qkv import masks, scores
from qkv.errors import ArgumentError, DTypeError, MaskError, ShapeError

needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
IMPLS = ["reference", "flash", "auto", pytest.param("torch", marks=needs_torch)]


def _kind(x, impl):
    if impl == "torch":
        import torch

        return torch.from_numpy(x)
    return x


# --------------------------------------------------------------------------- overflow


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype,big", [(np.float32, 1e20), (np.float64, 1e200)], ids=["float32", "float64"])
def test_overflowing_scores_raise_instead_of_nan(impl, dtype, big, rng):
    q, k, v = make_qkv(rng, (2, 16, 8), (2, 16, 8), dtype=dtype)
    with pytest.raises(ArgumentError, match=r"overflow float.*max \|q\| = .*scale q and k down"):
        qkv.attention(*(_kind(x, impl) for x in (q * big, k * big, v)), impl=impl)


def test_explain_and_backward_report_overflow_too(rng):
    q, k, v = make_qkv(rng, (3, 4), (5, 4))
    with pytest.raises(ArgumentError, match="overflow float64"):
        qkv.explain(q * 1e200, k * 1e200, v)
    out, lse = qkv.attention(q, k, v, return_lse=True)
    for impl in ("reference", "flash"):
        with pytest.raises(ArgumentError, match="overflow"):
            qkv.attention_backward(np.ones_like(out), q * 1e200, k * 1e200, v, out, lse, impl=impl)


def test_large_but_representable_scores_are_exact(rng):
    """No false alarm: scores near float32's range still give the oracle's result."""
    q, k, v = make_qkv(rng, (2, 8, 4), (2, 8, 4), dtype=np.float32)
    q, k = q * 3e8, k * 3e8  # |s| ~ 1e17 * Dk: far from 3.4e38
    for impl in ("reference", "flash"):
        out = qkv.attention(q, k, v, impl=impl)
        assert np.isfinite(out).all()


# --------------------------------------------------------------------------- hidden non-finite keys and values


def _poisoned(rng, value):
    """q, k, v with the last 3 keys and values set to ``value``, and a padding mask hiding them."""
    q, k, v = make_qkv(rng, (2, 3, 9, 4), (2, 3, 12, 4))
    k2, v2 = k.copy(), v.copy()
    k2[..., 9:, :] = value
    v2[..., 9:, :] = value
    return q, k, v, k2, v2, masks.padding(np.array([9, 9]))


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("runner", runner_params())
def test_a_hidden_key_or_value_changes_nothing(runner, value, rng):
    q, k, v, k2, v2, mask = _poisoned(rng, value)
    golden = O.attention_oracle(q, k, v, allowed=mask.dense(9, 12))
    res = runner.attention(q, k2, v2, mask=mask)  # SDPA reads every key: qkv zeroes such rows first
    assert np.isfinite(res.out).all()
    assert_close(res.out, golden[0], tol=1e-11)


@pytest.mark.parametrize("impl", ["reference", "flash"])
def test_hidden_non_finite_keys_and_values_get_finite_gradients(impl, rng):
    q, k, v, k2, v2, mask = _poisoned(rng, np.nan)
    dout = rng.standard_normal((2, 3, 9, 4))
    out, lse = qkv.attention(q, k2, v2, mask=mask, return_lse=True)
    got = tiled_backward(dout, q, k2, v2, out, lse, mask=mask, impl=impl, tiles=(4, 5) if impl == "flash" else None)
    want = qkv.attention_backward(dout, q, k[..., :9, :], v[..., :9, :], out, lse, impl="reference")
    assert_close(got[0], want[0], tol=1e-11, name="dq")
    for g, w, name in ((got[1], want[1], "dk"), (got[2], want[2], "dv")):
        assert_close(g[..., :9, :], w, tol=1e-11, name=name)
        assert (g[..., 9:, :] == 0).all()  # hidden keys get no gradient


@pytest.mark.parametrize("impl", ["reference", "flash"])
def test_an_attended_nan_makes_its_rows_nan_and_their_lse_nan(impl, rng):
    q, k, v = make_qkv(rng, (1, 10, 4), (1, 10, 4))
    k[..., 5, :] = np.nan
    out, lse = tiled_attention(
        q, k, v, mask=masks.sliding_window(2), impl=impl, return_lse=True, tiles=(3, 4) if impl == "flash" else None
    )
    reads = np.isin(np.arange(10), [5, 6])  # rows 5 and 6 see key 5
    assert np.isnan(out[..., reads, :]).all() and np.isnan(lse[..., reads]).all()
    assert np.isfinite(out[..., ~reads, :]).all() and np.isfinite(lse[..., ~reads]).all()
    assert not np.isneginf(lse).any()  # -inf is kept for "nothing to attend"


@needs_torch
def test_dispatch_never_reads_values_and_sdpa_keeps_the_contract(rng):
    """The decision reads shapes and structure only (a NaN changes nothing in it); SDPA, asked
    for by name, still never lets a hidden NaN through and makes attending rows NaN."""
    import torch

    q, k, v, k2, v2, mask = _poisoned(rng, np.nan)
    t = [torch.from_numpy(x) for x in (q, k2, v2)]
    clean = [torch.from_numpy(x) for x in (q, k, v)]
    assert qkv.dispatch(*t, mask=mask) == qkv.dispatch(*clean, mask=mask)
    out = qkv.attention(*t, mask=mask, impl="torch")
    assert_close(out.numpy(), O.attention_oracle(q, k, v, allowed=mask.dense(9, 12))[0], tol=1e-11)
    k3 = k.copy()
    k3[..., 4, :] = np.nan  # attended by the rows that see key 4: rows 4..8 (causal is not set: all rows)
    out = qkv.attention(*(torch.from_numpy(x) for x in (q, k3, v)), mask=mask, impl="torch")
    assert torch.isnan(out).all()


def test_a_nan_lse_is_refused_by_every_backward(rng):
    q, k, v = make_qkv(rng, (2, 5, 4), (2, 5, 4))
    out, lse = qkv.attention(q, k, v, return_lse=True)
    lse[0, 2] = np.nan
    for impl in ("reference", "flash"):
        with pytest.raises(ArgumentError, match="lse holds NaN"):
            qkv.attention_backward(np.ones_like(out), q, k, v, out, lse, impl=impl)


# --------------------------------------------------------------------------- a key-only mask (Nk,)


@pytest.mark.parametrize("runner", runner_params())
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_a_one_dimensional_mask_is_one_row_for_every_query(runner, kind, rng):
    q, k, v = make_qkv(rng, (2, 2, 5, 4), (2, 2, 7, 4))
    keep = np.array([True, False, True, True, False, True, True])
    mask = keep if kind == "bool" else np.where(keep, 0.5, -np.inf)
    res = runner.attention(q, k, v, mask=mask)
    golden = O.attention_oracle(q, k, v, allowed=keep[None, :], bias=np.where(keep, 0.5 if kind == "float" else 0, 0))
    assert_close(res.out, golden[0], tol=1e-11)


# --------------------------------------------------------------------------- softmax and logsumexp


def test_softmax_of_integers_is_computed_in_float64():
    got = qkv.softmax([1, 2, 3])
    assert got.dtype == np.float64
    assert_close(got, O.softmax_oracle(np.array([1.0, 2.0, 3.0])))
    assert_close(qkv.logsumexp(np.array([[1, 2]], np.int32)), np.log(np.exp(1) + np.exp(2))[None])


BAD = [  # (call, exception, words in the message)
    (lambda: qkv.softmax([True, False]), DTypeError, "dtype bool"),
    (lambda: qkv.softmax(np.float64(3.0)), ShapeError, "0-d"),
    (lambda: qkv.softmax([1.0, 2.0], axis=5), ShapeError, "axis=5 is not an axis of x of shape (2,)"),
    (lambda: qkv.logsumexp(np.ones((2, 3)), axis=1.5), ShapeError, "axis=1.5"),
    (lambda: masks.from_fn(lambda i, j: (i + j) % 2).dense(3, 4), MaskError, "returned dtype int64"),
    (lambda: masks.from_fn(lambda i, j: np.ones(5, bool)).dense(3, 4), MaskError, "returned shape (5,)"),
    (lambda: masks.causal().blocks(8, 8, 2.5, 4), MaskError, "block_q must be an integer"),
    (lambda: masks.causal().blocks(8, 8, 2, 0), MaskError, "block_k must be an integer >= 1"),
    (lambda: scores.alibi(n_heads=0), ArgumentError, "alibi n_heads must be an integer >= 1, got 0"),
    (lambda: scores.alibi(slopes=np.ones((2, 3, 4))), ShapeError, "alibi slopes must be (H,) or (B, H)"),
    (lambda: qkv.attention(np.ones((3, 4)), np.ones((3, 4)), np.ones((3, 4)), causal=1), ArgumentError, "causal"),
    (lambda: qkv.attention(np.ones((3, 4)), np.ones((3, 4)), np.ones((3, 4)), impl="xyz"), ArgumentError, "impl"),
]


@pytest.mark.parametrize("call,error,words", BAD, ids=[w for _, _, w in BAD])
def test_bad_input_raises_a_named_error(call, error, words):
    with pytest.raises(error) as e:
        call()
    assert words in str(e.value)


@needs_torch
def test_torch_devices_and_dtypes_are_named():
    import torch

    from qkv.nn import MultiHeadAttention

    x = torch.zeros(2, 4, 8)
    with pytest.raises(DTypeError, match="v is a meta tensor"):
        qkv.attention(x, x, torch.zeros(2, 4, 8, device="meta"))
    with pytest.raises(ArgumentError, match="impl must be one of"):
        MultiHeadAttention(8, 2, impl="xyz")
    with pytest.raises(DTypeError, match="x has dtype torch.float64 but the module's parameters are torch.float32"):
        MultiHeadAttention(8, 2)(x.double())
