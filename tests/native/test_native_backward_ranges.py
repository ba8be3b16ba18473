"""Backward over exact ranges (issue 22, item 1): each key tile visits only the query blocks that can
see it, each lane group only its own keys, and dQ is added in key-tile order. Gradients against the
float64 reference for every interval shape (causal, sliding windows narrower than a lane group's
span, documents, prefix-LM, padding, intervals that move backwards), at tile edges, with grouped
heads, mods, dropout and dlse, on every ISA path; dQ, dK, dV bit-identical for any thread count;
finite differences across a tile boundary."""

import numpy as np
import pytest
from _native_helpers import make_qkv, max_err, run_backward, run_forward
from _native_reference import backward as ref_backward
from _native_reference import dense_allowed, keep_mask

from qkv import _native as native


def rows_of(kind, nq, nk, b=1, h=1):
    """int32 (b, h, Nq, 2) key intervals [lo, hi) per query, bottom-right aligned (p = i + Nk - Nq)."""
    i = np.arange(nq)
    p = i + (nk - nq)
    if kind == "causal":
        lo, hi = np.zeros(nq), p + 1
    elif kind.startswith("window"):  # sliding window of w keys ending at the diagonal
        w = int(kind[6:])
        lo, hi = p - w + 1, p + 1
    elif kind == "docs":  # causal documents of uneven lengths, one starting mid-tile
        starts = np.array([0, 7, nk // 3 + 1, nk // 2 + 5])
        doc = np.searchsorted(starts, p, side="right") - 1
        lo, hi = starts[doc], p + 1
    elif kind == "prefix":  # prefix-LM: the first 40 keys bidirectional, causal after
        lo, hi = np.zeros(nq), np.maximum(p + 1, 40)
    elif kind == "padding":  # keys past 3/4 of Nk padded away, queries past 2/3 see nothing
        lo, hi = np.zeros(nq), np.where(i < 2 * nq // 3, 3 * nk // 4, 0)
    elif kind == "backwards":  # later queries see earlier keys: key tiles meet query blocks out of order
        lo = np.maximum(nk - 1 - p - 30, 0)
        lo, hi = lo, lo + 31
    else:
        raise ValueError(kind)
    r = np.stack([lo, hi], -1).astype(np.int32)
    return np.broadcast_to(r, (b, h, nq, 2)).copy()


KINDS = ["causal", "window1", "window5", "window37", "window200", "docs", "prefix", "padding", "backwards"]
SIZES = [(1, 1), (15, 17), (63, 65), (64, 128), (65, 129), (127, 127), (129, 257), (200, 200), (17, 300)]


def check(q, k, v, rows, threads, mods=(), dlse=None, p=0.0, seed=0, tol=1e-11):
    b, h, nq, dk = q.shape
    nk = k.shape[2]
    scale = dk**-0.5
    kw = {"rows": rows, "mods": mods, "dropout_p": p, "seed": seed}
    out, lse = run_forward(q, k, v, threads=threads, **kw)
    dout = np.random.default_rng(5).standard_normal(out.shape)
    grads = run_backward(q, k, v, out, lse, dout, threads=threads, dlse=dlse, **kw)
    allowed = dense_allowed(b, h, nq, nk, 64, 128, rows=rows)
    keep = keep_mask(native.philox_keep, seed, b, h, nq, nk, p) if p else None
    _, _, *want = ref_backward(q, k, v, dout, scale, allowed=allowed, mods=mods, keep=keep, p=p, dlse=dlse)
    for name, g, w in zip("qkv", grads, want, strict=True):
        assert max_err(g, w) < tol, name


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("nq,nk", SIZES, ids=lambda s: str(s))
def test_gradients_match_reference_on_exact_ranges(isa, rng, kind, nq, nk):
    q, k, v = make_qkv(rng, 1, 4, 2, nq, nk, 24, 16)  # grouped heads: dK, dV summed over 2 query heads
    check(q, k, v, rows_of(kind, nq, nk), threads=3)


@pytest.mark.parametrize("kind", ["window37", "docs", "backwards"])
def test_mods_dropout_and_dlse_on_exact_ranges(isa, rng, kind):
    nq, nk = 130, 260
    q, k, v = make_qkv(rng, 2, 2, 1, nq, nk, 16, 32)
    rows = rows_of(kind, nq, nk, 2, 2)
    mods = (("softcap", 2.0), ("alibi", np.array([0.3, 0.1])))
    dlse = rng.standard_normal((2, 2, nq))
    check(q, k, v, rows, threads=2, mods=mods, dlse=dlse)
    check(q, k, v, rows, threads=2, p=0.25, seed=7, dlse=dlse)


@pytest.mark.parametrize("kind", [None, "causal", "window37", "backwards"])
def test_gradients_bit_identical_for_any_thread_count(isa, rng, kind):
    # dQ is summed in key-tile order whatever thread adds it: 1, 2, 3 or 5 threads give the same bits
    nq, nk = 300, 700
    q, k, v = make_qkv(rng, 2, 4, 2, nq, nk, 32, 48, np.float32)
    kw = {} if kind is None else {"rows": rows_of(kind, nq, nk)}
    out, lse = run_forward(q, k, v, **kw)
    dout = rng.standard_normal(out.shape).astype(np.float32)
    first = run_backward(q, k, v, out, lse, dout, threads=1, **kw)
    for threads in (2, 3, 5):
        for a, b_ in zip(first, run_backward(q, k, v, out, lse, dout, threads=threads, **kw), strict=True):
            assert np.array_equal(a, b_), threads


def test_isas_agree_on_exact_ranges(rng):
    nq, nk = 129, 257
    q, k, v = make_qkv(rng, 1, 2, 1, nq, nk, 64, 64, np.float32)
    rows = rows_of("window37", nq, nk)
    res = []
    for isa in native.isas():
        with native.use_isa(isa):
            out, lse = run_forward(q, k, v, rows=rows)
            dout = np.random.default_rng(3).standard_normal(out.shape).astype(np.float32)
            res.append(run_backward(q, k, v, out, lse, dout, rows=rows, threads=2))
    for other in res[1:]:
        for a, b_ in zip(res[0], other, strict=True):
            assert max_err(a, b_) < 2e-5


def test_finite_differences_across_a_tile_boundary(isa, rng):
    # a window of 9 keys at Nq = Nk = 140: the diagonal crosses key tiles 0 / 1 and lane groups
    nq = nk = 140
    q, k, v = make_qkv(rng, 1, 2, 1, nq, nk, 4, 3)
    rows = rows_of("window9", nq, nk)
    mods = (("softcap", 1.5),)
    dout = rng.standard_normal((1, 2, nq, 3))
    dlse = rng.standard_normal((1, 2, nq))

    def loss(q_, k_, v_):
        o, lse = run_forward(q_, k_, v_, rows=rows, mods=mods)
        return float((o * dout).sum() + (lse * dlse).sum())

    out, lse = run_forward(q, k, v, rows=rows, mods=mods)
    grads = run_backward(q, k, v, out, lse, dout, dlse=dlse, rows=rows, mods=mods, threads=2)
    eps = 1e-6
    for x, g in zip((q, k, v), grads, strict=True):
        # coordinates on both sides of the tile boundary (keys / queries 120..135) and at the ends
        for i in (0, 63, 64, 127, 128, 129, 139):
            idx = (0, i % x.shape[1], i, i % x.shape[3])
            old = x[idx]
            x[idx] = old + eps
            plus = loss(q, k, v)
            x[idx] = old - eps
            minus = loss(q, k, v)
            x[idx] = old
            assert abs(g[idx] - (plus - minus) / (2 * eps)) < 1e-7, idx
