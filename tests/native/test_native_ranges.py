"""Exact key ranges per lane group and GQA rows stacked in the prefill forward (issue 22, items 1-2).

Intervals alone make each 16-row lane group loop over the union of its rows' intervals and mask
only the ragged edges outside their intersection; the H / Hkv query heads of a kv head are lane
groups of one work item. Every case is checked against the float64 oracle on every ISA path; the
shapes put window edges, causal diagonals and document boundaries in the middle of 128-key tiles
and 16-row lane groups (the ragged-edge path), and Nq off multiples of 16 (partial lane groups,
partial position chunks of a stacked item).
"""

import numpy as np
import pytest
from _native_helpers import make_qkv, max_err, run_forward
from _native_reference import EMPTY, FULL, PARTIAL, dense_allowed, keep_mask
from _native_reference import forward as ref_forward

from qkv import _native as native


def pos(nq, nk):
    """Key position of each query (queries are the last Nq of Nk: causal with an offset)."""
    return np.arange(nq) + (nk - nq)


def rows_of(lo, hi, b=1, h=1):
    r = np.stack([np.broadcast_to(lo, hi.shape), hi], -1).astype(np.int32)
    return np.broadcast_to(r, (b, h, *r.shape[-2:])).copy()


def interval_kinds(nq, nk, b):
    """name -> rows (Bm, 1, Nq, 2): the structured masks qkv.masks lowers to intervals."""
    p = pos(nq, nk)
    docs = np.unique(np.clip([0, 37, 38, 150, nk - 20], 0, nk - 1))  # a 1-token document, tile edges
    doc = np.searchsorted(docs, p, side="right") - 1
    doc_start, doc_end = docs[doc], np.append(docs, nk)[doc + 1]
    lens = np.array([nk, nk - 45, 70][:b])  # key padding per batch row
    out = {
        "causal": rows_of(np.zeros(nq), p + 1),
        "causal_offset_neg": rows_of(np.zeros(nq), p - 30),  # empty rows at the top
        "window_left": rows_of(p - 40, p + 1),
        "window_pair": rows_of(p - 23, p + 9),  # (left, right) = (23, 8)
        "window_wide": rows_of(p - 255, p + 1),
        "docs": rows_of(doc_start, p + 1),
        "docs_bidir": rows_of(doc_start, doc_end),
        "prefix_lm": rows_of(np.zeros(nq), np.maximum(p + 1, 100)),
        "chunked": rows_of(p // 48 * 48, p + 1),
        "window_docs": rows_of(np.maximum(doc_start, p - 30), p + 1),
    }
    hi = np.minimum(p + 1, lens[:, None])  # causal + key padding, per batch row
    out["causal_padding"] = np.stack([np.zeros_like(hi), hi], -1)[:, None].astype(np.int32)
    return out


def check(q, k, v, rows, tol=1e-12, **kw):
    b, h, nq, _ = q.shape
    nk = k.shape[2]
    allowed = dense_allowed(b, h, nq, nk, 64, 128, rows=rows)
    out, lse = run_forward(q, k, v, rows=rows, threads=2, **kw)
    mods = kw.get("mods", ())
    ro, rl, *_ = ref_forward(q, k, v, q.shape[3] ** -0.5, allowed=allowed, mods=mods)
    assert max_err(out, ro) < tol
    assert max_err(lse, rl) < 10 * tol
    return out, lse


@pytest.mark.parametrize("nq,nk", [(150, 300), (47, 129), (129, 129), (17, 400)])
def test_interval_masks_float64(isa, rng, nq, nk):
    q, k, v = make_qkv(rng, 3, 2, 1, nq, nk, 24, 16)
    for name, rows in interval_kinds(nq, nk, 3).items():
        try:
            check(q, k, v, rows)
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from e


@pytest.mark.parametrize("h,hkv", [(2, 2), (4, 2), (6, 2), (8, 2), (3, 1), (12, 2), (8, 1)])
@pytest.mark.parametrize("nq", [1 + 16, 37, 64, 79])
def test_gqa_groups_stacked(isa, rng, h, hkv, nq):
    # groups 1, 2, 3, 4, 6, 8: items of 64 x 1, 32 x 2, 16 x 3, 16 x 4, 2 x (16 x 3), 2 x (16 x 4)
    nk = nq + 90
    q, k, v = make_qkv(rng, 2, h, hkv, nq, nk, 16, 8)
    out, _ = check(q, k, v, interval_kinds(nq, nk, 2)["window_pair"])
    for name in ("causal", "docs", "causal_padding"):
        check(q, k, v, interval_kinds(nq, nk, 2)[name])
    # no mask at all: the dense path with stacked heads
    o2, l2 = run_forward(q, k, v, threads=2)
    ro, rl, *_ = ref_forward(q, k, v, 16**-0.5)
    assert max_err(o2, ro) < 1e-12 and max_err(l2, rl) < 1e-11


def test_per_head_intervals_with_gqa(isa, rng):
    # Hm = H: each query head of a group has its own window, so lanes of one stacked item differ
    b, h, hkv, nq, nk = 1, 8, 2, 70, 333
    q, k, v = make_qkv(rng, b, h, hkv, nq, nk, 16, 16)
    p = pos(nq, nk)
    rows = np.concatenate([rows_of(p - 10 * (hh + 1), p + 1 + hh) for hh in range(h)], axis=1)
    check(q, k, v, rows)


@pytest.mark.parametrize("h,hkv", [(4, 1), (8, 2)])
def test_mods_with_ranges_and_gqa(isa, rng, h, hkv):
    nq, nk = 77, 260
    q, k, v = make_qkv(rng, 1, h, hkv, nq, nk, 16, 16)
    rows = interval_kinds(nq, nk, 1)["window_pair"]
    slopes = 2.0 ** -np.arange(1, h + 1)
    table = rng.standard_normal((h, 2 * 7 + 1))
    for mods in ([("softcap", 3.0)], [("alibi", slopes)], [("relbias", table, 7)], [("mul", 0.5), ("softcap", 2.0)]):
        check(q, k, v, rows, tol=2e-12, mods=mods)


@pytest.mark.parametrize("h,hkv", [(2, 2), (8, 2)])
def test_dropout_with_ranges_and_gqa(isa, rng, h, hkv):
    # the keep mask is the same per (b, h, i, j) whichever lane group or item runs the row
    b, nq, nk, p, seed = 2, 45, 200, 0.3, 77
    q, k, v = make_qkv(rng, b, h, hkv, nq, nk, 16, 16)
    rows = interval_kinds(nq, nk, b)["window_left"]
    allowed = dense_allowed(b, h, nq, nk, 64, 128, rows=rows)
    keep = keep_mask(native.philox_keep, seed, b, h, nq, nk, p)
    out, lse = run_forward(q, k, v, rows=rows, dropout_p=p, seed=seed, threads=2)
    ro, rl, *_ = ref_forward(q, k, v, 16**-0.5, allowed=allowed, keep=keep, p=p)
    assert max_err(out, ro) < 1e-12 and max_err(lse, rl) < 1e-11


def test_tile_classes_and_bitmaps_with_gqa(isa, rng):
    # arbitrary masks keep the tile grid of the mask's plan; per-head classes looked up per lane of a stacked item
    b, h, hkv, nq, nk = 2, 4, 1, 70, 290
    q, k, v = make_qkv(rng, b, h, hkv, nq, nk, 16, 16)
    bq, bk = native.tile_shape(nq, nk, 16, 16, "float64")
    nbq, nbk = -(-nq // bq), -(-nk // bk)
    tc = rng.choice(np.array([EMPTY, PARTIAL, FULL], np.int8), size=(1, h, nbq, nbk), p=(0.2, 0.5, 0.3))
    p = pos(nq, nk)
    rows = rows_of(p - 50, p + 3, b, 1)
    bitmaps = rng.integers(0, 2**63, size=(3, bq, -(-bk // 64)), dtype=np.uint64)
    bi = rng.integers(-1, 3, size=(b, h, nbq, nbk)).astype(np.int32)
    kw = dict(tile_class=tc, rows=rows, bitmap_index=bi, bitmaps=bitmaps)
    allowed = dense_allowed(b, h, nq, nk, bq, bk, **kw)
    out, lse = run_forward(q, k, v, threads=2, **kw)
    ro, rl, *_ = ref_forward(q, k, v, 16**-0.5, allowed=allowed)
    assert max_err(out, ro) < 1e-12 and max_err(lse, rl) < 1e-11


def test_nonfinite_key_inside_one_span(isa, rng):
    # a NaN key row that only some rows' windows reach: exactly those rows are NaN and counted
    b, h, hkv, nq, nk = 1, 4, 2, 60, 300
    q, k, v = make_qkv(rng, b, h, hkv, nq, nk, 16, 16)
    k[0, 1, 270] = np.nan
    p = pos(nq, nk)
    rows = rows_of(p - 20, p + 1)
    out = np.empty((b, h, nq, 16))
    lse = np.empty((b, h, nq))
    bad, over = native.forward(q, k, v, out, lse, scale=0.25, rows=rows, threads=2)
    sees = (p - 20 <= 270) & (270 < p + 1)
    assert over == 0 and bad == 2 * sees.sum()  # heads 2, 3 share kv head 1
    assert np.isnan(out[0, 2:, sees]).all() and not np.isnan(out[0, :2]).any()
    assert not np.isnan(out[0, 2:, ~sees]).any()
    clean = ~np.isnan(lse)
    k2 = k.copy()
    k2[0, 1, 270] = 0.0
    ro, rl, *_ = ref_forward(q, k2, v, 0.25, allowed=dense_allowed(b, h, nq, nk, 64, 128, rows=rows))
    assert np.abs(out - ro)[np.broadcast_to(clean[..., None], out.shape)].max() < 1e-12


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_isa_paths_agree_on_ranges(rng, dtype):
    q, k, v = make_qkv(rng, 1, 8, 2, 150, 700, 32, 32, dtype)
    rows = interval_kinds(150, 700, 1)["window_wide"]
    res = []
    for name in native.isas():
        with native.use_isa(name):
            res.append(run_forward(q, k, v, rows=rows, threads=2))
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for o, l in res[1:]:
        assert max_err(o, res[0][0]) < tol and max_err(l, res[0][1]) < tol


def test_half_precision_ranges_and_gqa(isa, rng):
    torch = pytest.importorskip("torch")
    from _native_helpers import torch_forward

    nq, nk = 83, 300
    q, k, v = (torch.from_numpy(x) for x in make_qkv(rng, 1, 8, 2, nq, nk, 32, 32))
    rows = interval_kinds(nq, nk, 1)["window_pair"]
    allowed = dense_allowed(1, 8, nq, nk, 64, 128, rows=rows)
    for dt, tol in ((torch.float32, 2e-6), (torch.bfloat16, 3e-2), (torch.float16, 4e-3)):
        qq, kk, vv = (x.to(dt) for x in (q, k, v))
        out, _ = torch_forward(qq, kk, vv, threads=2, rows=rows)
        ro, *_ = ref_forward(*(x.double().numpy() for x in (qq, kk, vv)), 32**-0.5, allowed=allowed)
        assert np.abs(out.double().numpy() - ro).max() < tol
