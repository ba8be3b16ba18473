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
