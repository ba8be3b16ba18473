"""Position masks with any ``offset=``, far outside ``[-Nq, Nk]`` included, on every engine.

Each mask kind is checked over a grid of offsets (both signs, just inside and far outside the
rows' reach, beyond int64) × sizes (Nq < Nk, Nq > Nk, decode): ``dense``, ``intervals`` and
``blocks`` against the definition evaluated cell by cell in Python ints, and attention forward
and backward on every engine against the float64 loop oracle.
"""

import numpy as np
import pytest

import oracle as O
import qkv
from helpers import HAS_TORCH, assert_close, engine_params, make_qkv
from qkv import masks
from qkv._impls import build_call

KINDS = {  # name: (constructor(offset), the definition over Python ints with d = i + offset - j)
    "causal": (lambda o: masks.causal(o), lambda i, j, d: d >= 0),
    "window": (lambda o: masks.sliding_window(3, offset=o), lambda i, j, d: 0 <= d < 3),
    "window-both-sides": (lambda o: masks.sliding_window(3, causal=False, offset=o), lambda i, j, d: abs(d) < 3),
    "prefix-lm": (lambda o: masks.prefix_lm(2, offset=o), lambda i, j, d: j < 2 or d >= 0),
    "dilated": (lambda o: masks.dilated(2, 3, offset=o), lambda i, j, d: abs(d) < 6 and d % 3 == 0),
    # flash-attn's window_size pairs, -1 = unbounded: -right <= d <= left
    "pair-unbounded-right": (lambda o: masks.sliding_window((2, -1), causal=False, offset=o), lambda i, j, d: d <= 2),
    "pair-unbounded-left": (lambda o: masks.sliding_window((-1, 1), causal=False, offset=o), lambda i, j, d: d >= -1),
    "pair-causal": (lambda o: masks.sliding_window((-1, -1), offset=o), lambda i, j, d: d >= 0),
    # causal within chunks counted from key 0: p = i + offset = d + j
    "chunked": (lambda o: masks.chunked(3, offset=o), lambda i, j, d: d >= 0 and j // 3 == (d + j) // 3),
    "chunked-1": (lambda o: masks.chunked(1, offset=o), lambda i, j, d: d == 0),
}
SIZES = [(5, 7), (7, 5), (1, 9)]


def offsets(nq: int, nk: int) -> list[int]:
    """Both signs: inside, at and just beyond ``[-Nq, Nk]``, far beyond it, and beyond int64."""
    edges = [-nq - 8, -nq - 1, -nq, -nq + 1, -2, 0, 1, nk - 1, nk, nk + 1, nk + 8]
    return sorted({*edges, -30, 30, -(2**40) + 1, 2**40 + 1, -(2**70), 2**70 + 5})


CASES = [
    pytest.param(kind, nq, nk, o, id=f"{kind}-{nq}x{nk}-offset{o}")
    for kind in KINDS
    for nq, nk in SIZES
    for o in offsets(nq, nk)
]


def definition(kind: str, nq: int, nk: int, offset: int) -> np.ndarray:
    rule = KINDS[kind][1]
    return np.array([[rule(i, j, i + offset - j) for j in range(nk)] for i in range(nq)], dtype=bool)


def test_the_issue_example():
    assert masks.sliding_window(5, causal=False, offset=-30).dense(10, 10).sum() == 0
    assert masks.sliding_window(5, causal=False, offset=30).dense(10, 10).sum() == 0
    assert masks.dilated(2, 3, offset=-30).dense(10, 10).sum() == 0


@pytest.mark.parametrize("kind,nq,nk,offset", CASES)
def test_dense_intervals_and_tiles_match_the_definition(kind, nq, nk, offset):
    mask = KINDS[kind][0](offset)
    want = definition(kind, nq, nk, offset)
    got = mask.dense(nq, nk)
    assert np.array_equal(np.broadcast_to(got, want.shape), want), f"\ngot\n{got.astype(int)}\nwant\n{want.astype(int)}"
    rows = mask.intervals(nq, nk)
    if rows is not None:
        lo, hi = rows
        j = np.arange(nk)
        assert np.array_equal((lo[:, None] <= j) & (j < hi[:, None]), want)
    for bq, bk in ((2, 3), (3, 2), (1, 1)):
        assert np.array_equal(mask.blocks(nq, nk, bq, bk), O.tile_classes(want, bq, bk)), (bq, bk)


needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
ENGINES = engine_params("torch")


def oracle_backward(q, k, v, weights, out, dout, scale):
    """The float64 backward from the oracle's weights (API.md's formulas; H = Hkv)."""
    ds = weights * (dout @ np.swapaxes(v, -1, -2) - (dout * out).sum(-1, keepdims=True))
    return ds @ k * scale, np.swapaxes(ds, -1, -2) @ q * scale, np.swapaxes(weights, -1, -2) @ dout


@needs_torch
@pytest.mark.parametrize("impl,engine", ENGINES)
@pytest.mark.parametrize("kind", list(KINDS))
def test_attention_forward_and_backward_on_every_engine(kind, impl, engine, rng):
    import torch

    for nq, nk in SIZES:
        q, k, v = make_qkv(rng, (2, nq, 4), (2, nk, 4))
        dout = rng.standard_normal((2, nq, 4))
        scale = 0.5
        for offset in offsets(nq, nk):
            allowed = definition(kind, nq, nk, offset)
            out, weights, _ = O.attention_oracle(q, k, v, allowed=allowed, scale=scale)
            grads = oracle_backward(q, k, v, weights, out, dout, scale)
            t = [torch.tensor(x, requires_grad=True) for x in (q, k, v)]
            kw = {} if engine is None else {"engine": engine}
            res = qkv._core.run(build_call(*t, mask=KINDS[kind][0](offset), scale=scale, **kw), impl)
            label = f"{impl}/{engine} offset={offset} {nq}x{nk}"
            assert_close(res.out, out, tol=1e-11, name=f"{label} out")
            (res.out * torch.tensor(dout)).sum().backward()
            for name, x, g in zip(("dq", "dk", "dv"), t, grads, strict=True):
                assert_close(x.grad, g, tol=1e-10, name=f"{label} {name}")
