"""The decode path at the memory floor (decode.hpp): keys across lanes for <= 8 stacked rows, K/V
read in their own dtype in FULL tiles, split-K over every thread with fixed split points, and
the general step on mask edges, bias, mods and dropout; against the float64 oracle on every ISA
path, tile and vector edges, grouped heads, 1-3 threads, the four dtypes and non-finite inputs."""

import numpy as np
import pytest
import torch
from _native_helpers import make_qkv, max_err, run_forward, torch_forward
from _native_reference import EMPTY, FULL, PARTIAL, dense_allowed, keep_mask
from _native_reference import forward as ref_forward

from qkv import _native as native

NK_EDGES = (1, 15, 16, 17, 127, 128, 129, 1031, 4099)
# (H, Hkv, Nq): 1 row, grouped rows (3, 4, 5, 7 and the thin maximum 8, from heads and queries),
# 9 and 16+ rows (the wide path), MHA with several kv heads
SHAPES = ((1, 1, 1), (4, 1, 1), (8, 1, 1), (2, 1, 4), (8, 2, 2), (3, 1, 3), (1, 1, 16), (2, 2, 5), (3, 1, 1), (7, 1, 1))


def _tol(dtype, nk):
    return 1e-12 if dtype == np.float64 else 3e-6


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("dk,dv", [(64, 64), (128, 32), (40, 24)])  # direct reads; odd sizes take copies
def test_thin_and_wide_vs_oracle(isa, rng, dtype, dk, dv):
    for n, nk in enumerate(NK_EDGES):
        h, hkv, nq = SHAPES[n % len(SHAPES)]
        q, k, v = make_qkv(rng, 2 if nk < 200 else 1, h, hkv, nq, nk, dk, dv, dtype)
        ro, rl, *_ = ref_forward(q, k, v, dk**-0.5)
        for threads in (1, 2, 3):
            out, lse = run_forward(q, k, v, threads=threads)
            again = run_forward(q, k, v, threads=threads)
            assert np.array_equal(out, again[0]) and np.array_equal(lse, again[1]), (nk, threads)
            assert max_err(out, ro) < _tol(dtype, nk), (h, hkv, nq, nk, threads)
            assert max_err(lse, rl) < _tol(dtype, nk), (h, hkv, nq, nk, threads)


@pytest.mark.parametrize("h,hkv,nq", SHAPES)
def test_every_row_count(isa, rng, h, hkv, nq):
    # one long cache (split over 3 threads) for every shape: the row groups of the P.V pass (4, 2, 1)
    q, k, v = make_qkv(rng, 1, h, hkv, nq, 2053, 64, 48, np.float32)
    ro, rl, *_ = ref_forward(q, k, v, 0.125)
    for threads in (1, 3):
        out, lse = run_forward(q, k, v, threads=threads, scale=0.125)
        assert max_err(out, ro) < 3e-6 and max_err(lse, rl) < 3e-6


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("h,hkv,d", [(8, 8, 64), (8, 2, 128), (4, 4, 40)])
def test_half_caches(isa, rng, dtype, h, hkv, d):
    from _native_helpers import torch_naive

    tdt = getattr(torch, dtype)
    for nk in (1, 17, 129, 1031, 4099):
        q, k, v = (torch.from_numpy(x).to(tdt) for x in make_qkv(rng, 1, h, hkv, 1, nk, d, d))
        gold, glse, *_ = ref_forward(q.double().numpy(), k.double().numpy(), v.double().numpy(), d**-0.5)
        base = max_err(torch_naive(q, k, v, d**-0.5).double().numpy(), gold)
        for threads in (1, 2, 3):
            out, lse = torch_forward(q, k, v, threads=threads)
            assert max_err(out.double().numpy(), gold) <= 2 * base + 1e-7, (nk, threads)
            assert max_err(lse.double().numpy(), glse) < 1e-5


# The thin path's score blocks (decode.hpp dec_block_t): rows in blocks of 4, 2 and 1 (every row
# count 1..8), 16 / R keys per fold (key counts ending mid-fold: Nk % 4 and % 8 in 1..7), q's
# chunks taken 8, 6, 4, 3, 2 or 1 at a time (Dk / 16 = 1..10; odd Dk through the padded copy), and
# the P.V pass's two key sets (one or two rows at Dv <= 64) with an odd key left over.
ROW_SHAPES = ((1, 1, 1), (2, 1, 1), (3, 1, 1), (4, 1, 1), (5, 1, 1), (6, 1, 1), (7, 1, 1), (8, 1, 1), (2, 1, 3))
BLOCK_DIMS = (
    (16, 16),
    (32, 48),
    (48, 64),
    (80, 33),
    (96, 96),
    (112, 7),
    (128, 128),
    (160, 144),
    (1, 1),
    (7, 129),
    (33, 40),
    (129, 17),
)


@pytest.mark.parametrize("h,hkv,nq", ROW_SHAPES)
def test_row_blocks_vs_oracle(isa, rng, h, hkv, nq):
    for n, (dk, dv) in enumerate(BLOCK_DIMS):
        nk = (129, 130, 131, 134, 263, 1029)[n % 6]
        q, k, v = make_qkv(rng, 1, h, hkv, nq, nk, dk, dv, np.float32)
        ro, rl, *_ = ref_forward(q, k, v, dk**-0.5)
        for threads in (1, 2):
            out, lse = run_forward(q, k, v, threads=threads)
            assert max_err(out, ro) < 3e-6 and max_err(lse, rl) < 3e-6, (dk, dv, nk, threads)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 7, 8])
def test_row_blocks_half_caches(isa, rng, dtype, rows):
    from _native_helpers import torch_naive

    tdt = getattr(torch, dtype)
    for dk, dv, nk in ((64, 64, 1029), (128, 128, 263), (96, 48, 131), (7, 33, 130)):
        q, k, v = (torch.from_numpy(x).to(tdt) for x in make_qkv(rng, 1, rows, 1, 1, nk, dk, dv))
        gold, glse, *_ = ref_forward(q.double().numpy(), k.double().numpy(), v.double().numpy(), dk**-0.5)
        base = max_err(torch_naive(q, k, v, dk**-0.5).double().numpy(), gold)
        for threads in (1, 2):
            out, lse = torch_forward(q, k, v, threads=threads)
            assert max_err(out.double().numpy(), gold) <= 2 * base + 1e-7, (dk, nk, threads)
            assert max_err(lse.double().numpy(), glse) < 1e-5


def test_isas_agree(rng):
    q, k, v = make_qkv(rng, 1, 8, 2, 1, 3001, 128, 128, np.float32)
    outs = []
    for isa in native.isas():
        with native.use_isa(isa):
            outs.append(run_forward(q, k, v, threads=2)[0])
    for o in outs[1:]:
        assert max_err(o, outs[0]) < 3e-6


def _allowed_rows(rows, nk):
    b, h, nq, _ = rows.shape
    a = np.zeros((b, h, nq, nk), bool)
    for idx in np.ndindex(b, h, nq):
        lo, hi = rows[idx]
        a[idx][max(lo, 0) : max(min(hi, nk), 0)] = True
    return a


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_masks_on_the_thin_path(isa, rng, dtype):
    # padding (the last keys hidden), a window, an empty row, and classes + bitmaps
    nk, h, hkv, nq = 1500, 4, 1, 2
    q, k, v = make_qkv(rng, 1, h, hkv, nq, nk, 64, 64, dtype)
    tol = _tol(dtype, nk)
    rows = np.zeros((1, h, nq, 2), np.int32)
    rows[..., 1] = nk - 37
    rows[0, 1, 1] = [900, 1201]
    rows[0, 2, 0] = [5, 5]  # empty: zeros and lse -inf
    allowed = _allowed_rows(rows, nk)
    for threads in (1, 2, 3):
        out, lse = run_forward(q, k, v, rows=rows, threads=threads)
        ro, rl, *_ = ref_forward(q, k, v, 0.125, allowed=allowed)
        assert max_err(out, ro) < tol and max_err(lse, rl) < tol
    bq, bk = native.tile_shape(nq, nk, 64, 64, np.dtype(dtype).name)
    nbq, nbk = -(-nq // bq), -(-nk // bk)
    tc = rng.choice(np.array([EMPTY, PARTIAL, FULL], np.int8), size=(1, h, nbq, nbk), p=(0.2, 0.4, 0.4))
    bidx = np.where(tc == PARTIAL, 0, -1).astype(np.int32)
    words = -(-bk // 64)
    bits = rng.integers(0, 2, size=(1, bq, bk), dtype=np.uint8)
    bitmaps = np.zeros((1, bq, words), np.uint64)
    for i in range(bq):
        for j in range(bk):
            if bits[0, i, j]:
                bitmaps[0, i, j // 64] |= np.uint64(1) << np.uint64(j % 64)
    kw = {"tile_class": tc, "bitmap_index": bidx, "bitmaps": bitmaps}
    allowed = dense_allowed(1, h, nq, nk, bq, bk, tile_class=tc, bitmap_index=bidx, bitmaps=bitmaps)
    ro, rl, *_ = ref_forward(q, k, v, 0.125, allowed=allowed)
    for threads in (1, 3):
        out, lse = run_forward(q, k, v, threads=threads, **kw)
        assert max_err(out, ro) < tol and max_err(lse, rl) < tol


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mods_bias_dropout_on_the_thin_path(isa, rng, dtype):
    nk, h, hkv, nq = 1300, 4, 2, 2
    q, k, v = make_qkv(rng, 1, h, hkv, nq, nk, 64, 64, dtype)
    tol = 1e-11 if dtype == np.float64 else 5e-6
    slopes = rng.uniform(0.0, 0.05, h)
    for mods, ref_mods in (
        ((("alibi", slopes),), [("alibi", slopes)]),
        ((("softcap", 5.0),), [("softcap", 5.0)]),
    ):
        ro, rl, *_ = ref_forward(q, k, v, 0.125, mods=ref_mods)
        for threads in (1, 2, 3):
            out, lse = run_forward(q, k, v, mods=mods, threads=threads)
            assert max_err(out, ro) < tol and max_err(lse, rl) < tol
    bias = rng.standard_normal((1, h, nq, nk)).astype(dtype)
    bias[0, 0, 0, 100:200] = -np.inf
    ro, rl, *_ = ref_forward(q, k, v, 0.125, bias=bias)
    for threads in (1, 3):
        out, lse = run_forward(q, k, v, bias=bias, threads=threads)
        assert max_err(out, ro) < tol and max_err(lse, rl) < tol
    p, seed = 0.3, 77
    keep = keep_mask(native.philox_keep, seed, 1, h, nq, nk, p)
    ro, rl, *_ = ref_forward(q, k, v, 0.125, keep=keep, p=p)
    for threads in (1, 2):
        out, lse = run_forward(q, k, v, dropout_p=p, seed=seed, threads=threads)
        assert max_err(out, ro) < tol and max_err(lse, rl) < tol


def _counts(q, k, v, threads, **kw):
    b, h, nq, _ = q.shape
    out = np.empty((b, h, nq, v.shape[3]), q.dtype)
    lse = np.empty((b, h, nq), np.float64 if q.dtype == np.float64 else np.float32)
    bad, over = native.forward(q, k, v, out, lse, scale=q.shape[3] ** -0.5, threads=threads, **kw)
    return out, lse, bad, over


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_nonfinite_on_the_thin_path(isa, rng, dtype, value):
    # one kv head shared by 4 query heads: a bad k or v row in a FULL tile reaches all four rows
    # (read in place, no scan); a bad row every lane masks changes nothing
    nk = 1000
    q, k, v = make_qkv(rng, 1, 4, 1, 1, nk, 64, 64, dtype)
    for which in ("k", "v"):
        kk, vv = k.copy(), v.copy()
        (kk if which == "k" else vv)[0, 0, 333, 7] = value
        for threads in (1, 2, 3):
            out, lse, bad, over = _counts(q, kk, vv, threads)
            assert bad == 4 and over == 0, (which, threads)
            assert np.isnan(out).all() and np.isnan(lse).all()
        rows = np.zeros((1, 4, 1, 2), np.int32)
        rows[..., 1] = 300  # the bad row (key 333) hidden
        out, lse, bad, over = _counts(q, kk, vv, 2, rows=rows)
        ro, rl, *_ = ref_forward(q, k, v, 0.125, allowed=_allowed_rows(rows, nk))
        assert bad == 0 and over == 0
        assert max_err(out, ro) < _tol(dtype, nk)
    qq = q.copy()
    qq[0, 2, 0, 3] = value
    out, lse, bad, over = _counts(qq, k, v, 2)
    assert bad == 1 and np.isnan(out[0, 2]).all() and not np.isnan(out[0, [0, 1, 3]]).any()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_nonfinite_half_caches(isa, rng, dtype):
    tdt = getattr(torch, dtype)
    q, k, v = (torch.from_numpy(x).to(tdt) for x in make_qkv(rng, 1, 4, 1, 1, 1100, 64, 64))
    for which in ("k", "v"):
        for value in (float("nan"), float("-inf")):
            kk, vv = k.clone(), v.clone()
            (kk if which == "k" else vv)[0, 0, 1050, 60] = value
            out = torch.empty(1, 4, 1, 64, dtype=tdt)
            lse = torch.empty(1, 4, 1)
            bad, over = native.forward(q, kk, vv, out, lse, scale=0.125, threads=2)
            assert bad == 4 and over == 0 and torch.isnan(out).all()


def test_overflow_is_counted_not_bad_input(isa, rng):
    q, k, v = make_qkv(rng, 1, 2, 1, 1, 500, 64, 64, np.float32)
    k[0, 0, 10] = 3e19  # finite, but q . k overflows float32
    q[:] = 1e19
    out, lse, bad, over = _counts(q, k, v, 2)
    assert bad == 0 and over == 2 and np.isnan(out).all()
