"""A table of bad inputs: each with the exception qkv must raise and the words its message must hold."""

import re

import numpy as np
import pytest

import qkv
from helpers import HAS_TORCH
from qkv import errors


def ones(*shape, dtype=np.float32):
    return np.ones(shape, dtype=dtype)


def _torch(x):
    import torch

    return torch.from_numpy(x)


# (id, call, exception type, words the message must contain: literal strings, case-insensitive,
#  or compiled patterns where the contract allows alternatives)
BAD_INPUTS = [
    (
        "dk-mismatch",
        lambda: qkv.attention(ones(2, 8, 128, 64), ones(2, 8, 128, 32), ones(2, 8, 128, 32)),
        errors.ShapeError,
        ["k has d_k=32", "q has d_k=64", "last axis", "(2, 8, 128, 64)", "(2, 8, 128, 32)"],
    ),
    (
        "nk-mismatch-k-v",
        lambda: qkv.attention(ones(1, 2, 4, 8), ones(1, 2, 5, 8), ones(1, 2, 6, 8)),
        errors.ShapeError,
        ["Nk", "5", "6", "(1, 2, 5, 8)", "(1, 2, 6, 8)"],
    ),
    (
        "h-not-multiple-of-hkv",
        lambda: qkv.attention(ones(1, 3, 4, 8), ones(1, 2, 4, 8), ones(1, 2, 4, 8)),
        errors.ShapeError,
        ["H=3 heads on axis -3", "Hkv=2", "(1, 3, 4, 8)", "(1, 2, 4, 8)"],
    ),
    (
        "k-v-head-mismatch",
        lambda: qkv.attention(ones(1, 4, 4, 8), ones(1, 2, 4, 8), ones(1, 4, 4, 8)),
        errors.ShapeError,
        [re.compile(r"heads|axis -3"), "v", "(1, 2, 4, 8)", "(1, 4, 4, 8)"],
    ),
    (
        "batch-not-broadcastable",
        lambda: qkv.attention(ones(2, 4, 5, 8), ones(3, 4, 7, 8), ones(3, 4, 7, 8)),
        errors.ShapeError,
        ["broadcast", "(2, 4, 5, 8)", "(3, 4, 7, 8)"],
    ),
    ("one-dimensional-q", lambda: qkv.attention(ones(8), ones(4, 8), ones(4, 8)), errors.ShapeError, ["q", "(8,)"]),
    (
        "mask-not-broadcastable",
        lambda: qkv.attention(ones(1, 2, 4, 8), ones(1, 2, 6, 8), ones(1, 2, 6, 8), mask=np.ones((3, 5), dtype=bool)),
        errors.MaskError,
        ["mask", "(3, 5)"],
    ),
    (
        "mask-object-wrong-batch",
        lambda: qkv.attention(
            ones(3, 2, 4, 8), ones(3, 2, 6, 8), ones(3, 2, 6, 8), mask=qkv.masks.padding(np.array([1, 2]))
        ),
        errors.MaskError,
        ["mask", "(2, 1, 4, 6)"],
    ),
    (
        "int-mask",
        lambda: qkv.attention(
            ones(1, 2, 4, 8), ones(1, 2, 6, 8), ones(1, 2, 6, 8), mask=np.ones((4, 6), dtype=np.int64)
        ),
        errors.QKVError,
        ["mask", "int"],
    ),
    (
        "bad-impl-name",
        lambda: qkv.attention(ones(4, 8), ones(4, 8), ones(4, 8), impl="flsh"),
        errors.ArgumentError,
        ["impl", "flsh", "reference"],
    ),
    (
        "dropout-1.5",
        lambda: qkv.attention(ones(4, 8), ones(4, 8), ones(4, 8), dropout=1.5, rng=np.random.default_rng(0)),
        errors.ArgumentError,
        ["dropout", "1.5"],
    ),
    (
        "dropout-1",
        lambda: qkv.attention(ones(4, 8), ones(4, 8), ones(4, 8), dropout=1.0, rng=np.random.default_rng(0)),
        errors.ArgumentError,
        ["dropout", "1.0"],
    ),
    (
        "dropout-negative",
        lambda: qkv.attention(ones(4, 8), ones(4, 8), ones(4, 8), dropout=-0.1, rng=np.random.default_rng(0)),
        errors.ArgumentError,
        ["dropout", "-0.1"],
    ),
    (
        "mixed-dtypes",
        lambda: qkv.attention(ones(4, 8), ones(4, 8, dtype=np.float64), ones(4, 8)),
        errors.DTypeError,
        ["float32", "float64"],
    ),
    (
        "int-dtype",
        lambda: qkv.attention(ones(4, 8, dtype=np.int64), ones(4, 8, dtype=np.int64), ones(4, 8, dtype=np.int64)),
        errors.DTypeError,
        ["int64"],
    ),
    (
        "scale-nan",
        lambda: qkv.attention(ones(4, 8), ones(4, 8), ones(4, 8), scale=float("nan")),
        errors.ArgumentError,
        ["scale", "nan"],
    ),
    (
        "scale-inf",
        lambda: qkv.attention(ones(4, 8), ones(4, 8), ones(4, 8), scale=float("inf")),
        errors.ArgumentError,
        ["scale", "inf"],
    ),
    (
        "torch-impl-numpy-inputs",
        lambda: qkv.attention(ones(4, 8), ones(4, 8), ones(4, 8), impl="torch"),
        ValueError,
        ["torch"],
    ),
    (
        "backward-dout-shape",
        lambda: qkv.attention_backward(ones(3, 8), ones(4, 8), ones(5, 8), ones(5, 8), ones(4, 8), ones(4)),
        errors.ShapeError,
        ["dout", "(3, 8)", "(4, 8)"],
    ),
]

TORCH_BAD_INPUTS = [
    (
        "mixed-numpy-torch",
        lambda: qkv.attention(ones(4, 8), _torch(ones(4, 8)), ones(4, 8)),
        TypeError,
        ["numpy", "torch"],
    ),
    (
        "torch-impl-return-weights",
        lambda: qkv.attention(*(_torch(ones(4, 8)) for _ in range(3)), impl="torch", return_weights=True),
        ValueError,
        ["torch"],
    ),
    (
        "torch-impl-softcap",
        lambda: qkv.attention(*(_torch(ones(4, 8)) for _ in range(3)), impl="torch", score_mod=qkv.scores.softcap(5.0)),
        ValueError,
        ["torch"],
    ),
    (
        "torch-impl-dropout-rng",
        lambda: qkv.attention(*(_torch(ones(4, 8)) for _ in range(3)), impl="torch", dropout=0.1, rng=_generator()),
        ValueError,
        ["rng"],
    ),
    (
        "mixed-torch-dtypes",
        lambda: qkv.attention(_torch(ones(4, 8)), _torch(ones(4, 8, dtype=np.float64)), _torch(ones(4, 8))),
        errors.DTypeError,
        ["float32", "float64"],
    ),
]


def _generator():
    import torch

    return torch.Generator().manual_seed(0)


def check_raises(call, exc_type, words):
    with pytest.raises(exc_type) as info:
        call()
    assert isinstance(info.value, errors.QKVError) or exc_type is TypeError, (
        f"{type(info.value).__name__} is not a qkv.errors.QKVError: {info.value}"
    )
    message = str(info.value)
    missing = [
        w if isinstance(w, str) else w.pattern
        for w in words
        if not (w.search(message) if isinstance(w, re.Pattern) else w.lower() in message.lower())
    ]
    assert not missing, f"message {message!r} lacks {missing}"


@pytest.mark.parametrize("call,exc_type,words", [pytest.param(*row[1:], id=row[0]) for row in BAD_INPUTS])
def test_bad_input_raises_with_a_clear_message(call, exc_type, words):
    check_raises(call, exc_type, words)


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
@pytest.mark.parametrize("call,exc_type,words", [pytest.param(*row[1:], id=row[0]) for row in TORCH_BAD_INPUTS])
def test_bad_torch_input_raises_with_a_clear_message(call, exc_type, words):
    check_raises(call, exc_type, words)


def test_shape_errors_fire_before_any_work_for_every_impl():
    for impl in ("reference", "auto"):
        with pytest.raises(errors.ShapeError, match=r"H=3 heads .* Hkv=2"):
            qkv.attention(np.ones((1, 3, 4, 8)), np.ones((1, 2, 4, 8)), np.ones((1, 2, 4, 8)), impl=impl)


# --------------------------------------------------------------------------- what is NaN (issue 20, item 4)

NAN_ENGINES = [("reference", None), ("flash", "native"), ("flash", "array"), ("auto", None)]


def _run(impl, engine, q, k, v, **kw):
    from qkv._impls import build_call

    if engine == "native" and not qkv._native.available():
        pytest.skip("compiled engine unavailable")
    extra = {} if engine is None else {"engine": engine}
    return qkv._core.run(build_call(q, k, v, want_lse=True, **kw, **extra), impl)


@pytest.mark.parametrize("impl,engine", NAN_ENGINES)
def test_a_nan_sink_is_an_input_nan_its_heads_rows_are_nan_on_every_engine(impl, engine):
    """sinks are an input: NaN propagates to the rows it joins (the non-finite rule), never an
    'overflow' error telling the caller to scale q and k."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 2, 4, 8)), rng.standard_normal((1, 2, 5, 8)), rng.standard_normal((1, 2, 5, 8)))
    res = _run(impl, engine, q, k, v, sinks=np.array([np.nan, 0.5]))
    assert np.isnan(res.out[:, 0]).all() and np.isnan(res.lse[:, 0]).all()
    good = _run("reference", None, q, k, v, sinks=np.array([0.0, 0.5]))  # head 1 is untouched
    assert np.allclose(res.out[:, 1], good.out[:, 1], atol=1e-12) and np.allclose(res.lse[:, 1], good.lse[:, 1])
    # and the sink's own meaning, from the oracle: an extra logit in the denominator
    s = q[0, 1] @ k[0, 1].T / np.sqrt(8)
    z = np.exp(s).sum(-1) + np.exp(0.5)
    assert np.allclose(res.lse[0, 1], np.log(z))


@pytest.mark.parametrize("impl,engine", [e for e in NAN_ENGINES if e[1] != "native"])  # from_fn: no compiled form
def test_a_score_mod_that_makes_nan_is_named_not_reported_as_an_overflow(impl, engine):
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((1, 2, 4, 8)) for _ in range(3))
    mod = qkv.scores.from_fn(lambda s, b, h, i, j: np.log(s), grad=lambda s, b, h, i, j: 1 / s)  # log of negatives
    with pytest.raises(errors.ArgumentError, match=r"the score mod from_fn\(<lambda>\) made scores NaN") as e:
        _run(impl, engine, q, k, v, score_mod=mod)
    assert "scale q and k" not in str(e.value)


def test_alibi_slopes_must_be_finite():
    for bad in ([np.inf, 1.0], np.array([[0.5, np.nan]])):  # inf · 0 on the diagonal would be NaN
        with pytest.raises(errors.ArgumentError, match=r"alibi slopes must be finite numbers, got \[.*(inf|nan)"):
            qkv.scores.alibi(slopes=bad)


def test_an_overflow_of_the_dot_products_is_still_reported_as_one():
    q = np.full((1, 1, 2, 4), 1e30, np.float32)
    with pytest.raises(errors.ArgumentError, match="overflow float32.*scale q and k down"):
        qkv.attention(q, q, q, score_mod=qkv.scores.temperature(2.0), impl="reference")


@pytest.mark.parametrize("impl", ["reference", "flash", "auto"])
def test_float16_calls_never_warn_when_a_check_sums_large_values(impl):
    """The overflow check summed the gradient in float16 (inf - inf: 'invalid value encountered in
    reduce'); pytest's filterwarnings=error turns any warning into a failure here."""
    rng = np.random.default_rng(5)
    q, k = (rng.standard_normal((1, 2, 300, 16)).astype(np.float16) for _ in range(2))
    v = (rng.standard_normal((1, 2, 300, 16)) * 15000).clip(-60000, 60000).astype(np.float16)
    out, lse = qkv.attention(q, k, v, impl=impl, return_lse=True)
    dq, dk, dv = qkv.attention_backward(np.full_like(out, 1000), q, k, v, out, lse, impl=impl)
    assert dq.dtype == np.float16 and not np.isnan(dq).any() and not np.isnan(dv).any()
