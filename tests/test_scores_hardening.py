"""Score-mod arguments that used to give a wrong answer or a bare error (issue 20, item 4):
ALiBi slopes against the call's heads and batch axes on every engine, ALiBi beside
per-sequence masks, ``scores.from_fn`` checked at construction and first call."""

import numpy as np
import pytest

import oracle as O
import qkv
from helpers import HAS_TORCH, assert_close, make_qkv
from qkv import _native, masks, scores
from qkv._impls import build_call
from qkv.errors import ShapeError

ENGINES = [
    pytest.param("reference", None, id="reference"),
    pytest.param("flash", "array", id="array-engine"),
    pytest.param(
        "flash",
        "native",
        id="compiled-engine",
        marks=pytest.mark.skipif(not _native.available(), reason=f"compiled engine unavailable: {_native.reason()}"),
    ),
    pytest.param("torch", None, id="torch-sdpa"),
    pytest.param("auto", None, id="auto"),
]


def run(impl, engine, q, k, v, library="numpy", **kw):
    if library == "torch" or impl == "torch":
        if not HAS_TORCH:
            pytest.skip("torch not installed")
        import torch

        q, k, v = (torch.tensor(x) for x in (q, k, v))
    extra = {} if engine is None else {"engine": engine}
    return qkv._core.run(build_call(q, k, v, **kw, **extra), impl).out


@pytest.mark.parametrize("impl,engine", ENGINES)
@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_per_batch_alibi_slopes_on_a_call_with_two_batch_axes(impl, engine, library, rng):
    q, k, v = make_qkv(rng, (2, 3, 2, 5, 4), (2, 3, 2, 6, 4))
    slopes = rng.uniform(0.1, 1.0, (3, 2))  # (B, H): B is the last batch axis
    golden = np.stack(
        [
            np.stack(
                [
                    O.attention_oracle(q[b0, b1], k[b0, b1], v[b0, b1], score_fn=O.alibi_score(slopes[b1]))[0]
                    for b1 in range(3)
                ]
            )
            for b0 in range(2)
        ]
    )
    got = run(impl, engine, q, k, v, library, score_mod=scores.alibi(slopes=slopes))
    assert_close(got, golden, tol=1e-11)


@pytest.mark.parametrize("impl,engine", ENGINES)
@pytest.mark.parametrize(
    "slopes,words",
    [
        ([1.0, 2.0, 3.0], r"alibi slopes has 3 heads on axis 0 but the scores have H=2 on axis -3"),
        (np.ones((4, 2)), r"alibi slopes have shape \(4, 2\) \(B, H\) but the scores.*per-batch slopes need"),
        (np.ones((3, 3)), r"alibi slopes has 3 heads on axis 1 but the scores have H=2 on axis -3"),
    ],
)
def test_alibi_slopes_that_do_not_fit_the_call_are_a_shape_error_on_every_engine(impl, engine, slopes, words, rng):
    q, k, v = make_qkv(rng, (2, 3, 2, 5, 4), (2, 3, 2, 6, 4))
    with pytest.raises(ShapeError, match=words):
        run(impl, engine, q, k, v, score_mod=scores.alibi(slopes=slopes))


@pytest.mark.parametrize("impl,engine", ENGINES)
def test_a_relative_bias_table_with_the_wrong_heads_is_a_shape_error(impl, engine, rng):
    q, k, v = make_qkv(rng, (1, 2, 5, 4), (1, 2, 6, 4))
    with pytest.raises(ShapeError, match=r"relative_bias table has 3 heads on axis 0 but the scores have H=2"):
        run(impl, engine, q, k, v, score_mod=scores.relative_bias(np.zeros((3, 5)), 2))
