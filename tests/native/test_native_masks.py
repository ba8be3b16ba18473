"""Mask representations: intervals alone (classes derived), classes + intervals, bitmaps, their
combinations, EMPTY rows and tiles, all-FULL; forward and backward against the dense reference."""

import numpy as np
import pytest
from _native_helpers import make_qkv, max_err, run_backward, run_forward
from _native_reference import EMPTY, FULL, PARTIAL, dense_allowed
from _native_reference import backward as ref_backward
from _native_reference import forward as ref_forward

from qkv import _native as native


def intervals(nq, nk, kind, rng, b=1, h=1):
    i = np.arange(nq)
    p = i + (nk - nq)
    if kind == "causal":
        lo, hi = np.zeros(nq), p + 1
    elif kind == "window":
        lo, hi = p - 20, p + 1
    elif kind == "docs":  # 3 causal documents
        starts = np.array([0, nk // 3, nk // 2])
        doc = np.searchsorted(starts, p, side="right") - 1
        lo, hi = starts[doc], p + 1
    elif kind == "random":
        lo = rng.integers(-5, nk, size=(b, h, nq))
        hi = lo + rng.integers(0, nk, size=(b, h, nq))
        return np.stack([lo, hi], -1).astype(np.int32)
    else:
        raise ValueError(kind)
    r = np.stack([lo, hi], -1).astype(np.int32)
    return np.broadcast_to(r, (b, h, nq, 2)).copy()


def check(q, k, v, mask_kw, allowed, threads=2, grads=True):
    scale = q.shape[3] ** -0.5
    out, lse = run_forward(q, k, v, threads=threads, **mask_kw)
    ro, rl, *_ = ref_forward(q, k, v, scale, allowed=allowed)
    assert max_err(out, ro) < 1e-12
    assert max_err(lse, rl) < 1e-11
    if grads:
        dout = np.random.default_rng(5).standard_normal(out.shape)
        dq, dk, dv = run_backward(q, k, v, out, lse, dout, threads=threads, **mask_kw)
        _, _, rq, rk, rv = ref_backward(q, k, v, dout, scale, allowed=allowed)
        for got, want in ((dq, rq), (dk, rk), (dv, rv)):
            assert max_err(got, want) < 1e-11


@pytest.mark.parametrize("kind", ["causal", "window", "docs", "random"])
@pytest.mark.parametrize("nq,nk", [(150, 150), (100, 300), (9, 260), (70, 1300)])  # 1300: long ranges
def test_intervals_alone(isa, rng, kind, nq, nk):
    q, k, v = make_qkv(rng, 2, 2, 1, nq, nk, 24, 16)
    rows = intervals(nq, nk, kind, rng, 2, 2)
    bq, bk = native.tile_shape(nq, nk, 24, 16, "float64")
    check(q, k, v, {"rows": rows}, dense_allowed(2, 2, nq, nk, bq, bk, rows=rows))


def random_classes(rng, b, h, nbq, nbk, probs=(0.2, 0.5, 0.3)):
    return rng.choice(np.array([EMPTY, PARTIAL, FULL], np.int8), size=(b, h, nbq, nbk), p=probs)


@pytest.mark.parametrize("nq,nk", [(140, 290), (12, 400)])
def test_classes_with_intervals_and_bitmaps(isa, rng, nq, nk):
    b, h = 2, 2
    q, k, v = make_qkv(rng, b, h, 2, nq, nk, 16, 16)
    bq, bk = native.tile_shape(nq, nk, 16, 16, "float64")
    nbq, nbk = -(-nq // bq), -(-nk // bk)
    tc = random_classes(rng, 1, h, nbq, nbk)  # broadcast over the batch
    rows = intervals(nq, nk, "random", rng, b, 1)  # broadcast over heads
    nbm = 5
    bitmaps = rng.integers(0, 2**63, size=(nbm, bq, -(-bk // 64)), dtype=np.uint64)
    bitmaps |= rng.integers(0, 2**63, size=bitmaps.shape, dtype=np.uint64) << np.uint64(1)
    bi = rng.integers(-1, nbm, size=(b, h, nbq, nbk)).astype(np.int32)
    cases = [
        ({"tile_class": tc}, dict(tile_class=tc)),
        ({"tile_class": tc, "rows": rows}, dict(tile_class=tc, rows=rows)),
        (
            {"tile_class": tc, "bitmap_index": bi, "bitmaps": bitmaps},
            dict(tile_class=tc, bitmap_index=bi, bitmaps=bitmaps),
        ),
        (
            {"tile_class": tc, "rows": rows, "bitmap_index": bi, "bitmaps": bitmaps},
            dict(tile_class=tc, rows=rows, bitmap_index=bi, bitmaps=bitmaps),
        ),
    ]
    for kw, dense_kw in cases:
        allowed = dense_allowed(b, h, nq, nk, bq, bk, **dense_kw)
        check(q, k, v, kw, allowed)


def test_all_full_equals_no_mask(isa, rng):
    q, k, v = make_qkv(rng, 1, 2, 2, 100, 200, 16, 16)
    bq, bk = native.tile_shape(100, 200, 16, 16, "float64")
    tc = np.full((1, 1, -(-100 // bq), -(-200 // bk)), FULL, np.int8)
    a = run_forward(q, k, v, tile_class=tc)
    b = run_forward(q, k, v)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_empty_rows_and_tiles_give_zeros_and_minus_inf(isa, rng):
    nq, nk = 70, 140
    q, k, v = make_qkv(rng, 1, 1, 1, nq, nk, 8, 8)
    rows = intervals(nq, nk, "causal", rng)
    rows[0, 0, 10:30] = (5, 5)  # empty intervals
    rows[0, 0, 40, :] = (-7, 0)
    check(q, k, v, {"rows": rows}, dense_allowed(1, 1, nq, nk, 64, 128, rows=rows))
    bq, bk = native.tile_shape(nq, nk, 8, 8, "float64")
    tc = np.full((1, 1, 2, 2), EMPTY, np.int8)
    out, lse = run_forward(q, k, v, tile_class=tc)
    assert (out == 0).all() and np.isneginf(lse).all()
    for dtype in (np.float32,):
        out, lse = run_forward(q.astype(dtype), k.astype(dtype), v.astype(dtype), tile_class=tc)
        assert (out == 0).all() and np.isneginf(lse).all()
    dq, dk, dv = run_backward(
        q, k, v, out.astype(np.float64), lse.astype(np.float64), np.ones_like(out, np.float64), tile_class=tc
    )
    assert not dq.any() and not dk.any() and not dv.any()


def test_float32_masked_matches_unmasked_on_allowed_keys(isa, rng):
    # a window of keys [20, 90) as intervals equals slicing K/V to it
    q, k, v = make_qkv(rng, 1, 2, 1, 50, 200, 32, 32, np.float32)
    rows = np.broadcast_to(np.array([20, 90], np.int32), (1, 1, 50, 2)).copy()
    a = run_forward(q, k, v, rows=rows)
    b = run_forward(q, np.ascontiguousarray(k[:, :, 20:90]), np.ascontiguousarray(v[:, :, 20:90]))
    assert max_err(a[0], b[0]) < 2e-6 and max_err(a[1], b[1]) < 2e-6
