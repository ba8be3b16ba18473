"""The non-finite contract on every engine and ISA path, at every tile position.

A NaN or inf in a hidden key or value changes nothing; one in an attended k or v row, in a q row
that attends a key, or in an attended bias entry (NaN or +inf) makes exactly the rows that attend
it NaN, with ``lse`` NaN. The truth is the float64 loop oracle on the same inputs with the
poisoned entry made finite (rows that do not attend it cannot tell the difference) plus the rule.
Positions: the first, a middle and the last key of a 128-key tile (the compiled kernel's), the
first of the next; the prefill path (Nq = Nk = 200) and the decode path (a few grouped queries
against the cache). The compiled engine is forced onto each ISA path it can run here.
"""

from functools import cache

import numpy as np
import pytest

import oracle as O
import qkv
from helpers import assert_close
from qkv import _native, masks
from qkv._core import run
from qkv._impls import build_call

N, H, HKV, D = 200, 2, 1, 16
KEYS = [0, 63, 127, 128]  # first / middle / last key of the kernel's first 128-key tile; first of the next
VALUES = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf}


def _engines():
    out = [("reference", None, None), ("array", "flash", None)]
    if _native.available():
        out += [("native", "flash", isa) for isa in _native.isas()]
    return [pytest.param(e, id=f"{e[0]}-{e[2]}" if e[2] else e[0]) for e in out]


MASKS = {
    "none": (None, lambda nq, nk: np.ones((nq, nk), bool)),
    "causal": (masks.causal(), lambda nq, nk: O.causal_allowed(nq, nk)),
    "window": (masks.sliding_window(40), lambda nq, nk: O.sliding_window_allowed(nq, nk, 40)),
    "padding": (masks.padding(np.array([150])), lambda nq, nk: O.padding_allowed(nq, nk, [150])[0, 0]),
    "bitmap": (  # no row intervals: tile classes and bitmaps
        masks.from_dense(np.random.default_rng(5).random((N, N)) < 0.7),
        lambda nq, nk: np.random.default_rng(5).random((N, N)) < 0.7,
    ),
}


def _run(engine, q, k, v, **kw):
    kind, impl, isa = engine
    if kind == "reference":
        return run(build_call(q, k, v, want_lse=True, **kw), "reference")
    c = build_call(q, k, v, want_lse=True, engine=kind, **kw)
    if isa is None:
        return run(c, impl)
    with _native.use_isa(isa):
        return run(c, impl)


def _expect(q, k, v, allowed, bad_rows, bias=None):
    """The oracle on finite inputs, with ``bad_rows`` (H, Nq) made NaN."""
    out, _, lse = O.attention_oracle(q, k, v, allowed=allowed, bias=bias)
    out, lse = out.copy(), lse.copy()
    out[..., bad_rows, :] = np.nan
    lse[..., bad_rows] = np.nan
    return out, lse


def _check(res, want):
    out, lse = (np.asarray(x, dtype=np.float64) for x in (res.out, res.lse))
    assert np.array_equal(np.isnan(out), np.isnan(want[0])), "NaN rows of out"
    assert np.array_equal(np.isnan(lse), np.isnan(want[1])), "NaN rows of lse"
    ok = ~np.isnan(want[1])
    assert_close(out[..., ok, :], want[0][..., ok, :], tol=1e-10, name="out")
    assert_close(lse[ok], want[1][ok], tol=1e-10, name="lse")


@cache
def _inputs():
    """One set of inputs for the whole module (its oracle results are computed once per mask)."""
    rng = np.random.default_rng(7)
    q = rng.standard_normal((1, H, N, D))
    k = rng.standard_normal((1, HKV, N, D))
    v = rng.standard_normal((1, HKV, N, D))
    return q, k, v


@cache
def _clean(mask_name):
    q, k, v = _inputs()
    out, _, lse = O.attention_oracle(q, k, v, allowed=MASKS[mask_name][1](N, N))
    return out, lse


def _poisoned(mask_name, bad_rows):
    out, lse = (x.copy() for x in _clean(mask_name))
    out[..., bad_rows, :] = np.nan
    lse[..., bad_rows] = np.nan
    return out, lse


@pytest.mark.parametrize("engine", _engines())
@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("where", ["k", "v"])
@pytest.mark.parametrize("value", list(VALUES))
def test_a_non_finite_key_or_value_poisons_exactly_the_rows_that_attend_it(engine, mask_name, where, value):
    mask, dense = MASKS[mask_name]
    q, k, v = _inputs()
    allowed = dense(N, N)
    for j in KEYS:
        kk, vv = k.copy(), v.copy()
        (kk if where == "k" else vv)[..., j, 3] = VALUES[value]
        _check(_run(engine, q, kk, vv, mask=mask), _poisoned(mask_name, np.broadcast_to(allowed[:, j], (H, N))))


@pytest.mark.parametrize("engine", _engines())
@pytest.mark.parametrize("mask_name", ["none", "causal", "padding", "bitmap"])
def test_a_non_finite_query_row_poisons_its_row_if_it_attends_anything(engine, mask_name):
    mask, dense = MASKS[mask_name]
    q, k, v = _inputs()
    allowed = dense(N, N)
    qq = q.copy()
    rows = [0, 63, 64, 160, 199]  # padding hides keys, not queries: every row attends something
    qq[..., 1, rows, 2] = np.inf
    bad = np.zeros((H, N), bool)
    bad[1, rows] = allowed[rows].any(-1)
    _check(_run(engine, qq, k, v, mask=mask), _poisoned(mask_name, bad))


@pytest.mark.parametrize("engine", _engines())
def test_a_non_finite_query_row_that_attends_nothing_stays_empty(engine):
    q, k, v = _inputs()
    qq = q.copy()
    qq[..., 0, 5, :] = np.nan
    qq[..., 0, 150, :] = np.nan
    res = _run(engine, qq, k, v, mask=masks.padding(np.array([150]), np.array([100])))  # rows >= 100 see nothing
    out, lse = np.asarray(res.out), np.asarray(res.lse)
    assert np.isnan(lse[..., 0, 5]).all() and np.isneginf(lse[..., 0, 150]).all() and (out[..., 0, 150, :] == 0).all()


@pytest.mark.parametrize("engine", _engines())
def test_a_bias_entry_poisons_only_where_it_is_attended_and_minus_inf_hides(engine, rng):
    q, k, v = _inputs()
    bias = rng.standard_normal((1, 1, N, N))
    allowed = O.sliding_window_allowed(N, N, 40)
    b2 = bias.copy()
    b2[..., 10, 5] = np.nan  # attended by row 10
    b2[..., 10, 150] = np.nan  # hidden from row 10 by the window: changes nothing
    b2[..., 130, 128] = np.inf  # attended by row 130
    b2[..., 20, 19] = -np.inf  # hides key 19 from row 20, as a mask would
    want_bias = bias.copy()
    want_bias[..., 20, 19] = -np.inf
    bad = np.zeros((H, N), bool)
    bad[:, [10, 130]] = True
    _check(_run(engine, q, k, v, mask=masks.sliding_window(40), bias=b2), _expect(q, k, v, allowed, bad, want_bias))


@pytest.mark.parametrize("engine", _engines())
@pytest.mark.parametrize("nq", [1, 3])
@pytest.mark.parametrize("where", ["k", "v"])
def test_the_decode_path_keeps_the_contract(engine, nq, where, rng):
    """A few grouped queries against the cache (the compiled kernel's split-K decode path), the
    cache's last 50 slots hidden by padding (as uninitialised cache slots are)."""
    q = rng.standard_normal((1, 4, nq, D))
    k = rng.standard_normal((1, 2, N, D))
    v = rng.standard_normal((1, 2, N, D))
    mask = masks.padding(np.array([150]))
    allowed = O.padding_allowed(nq, N, [150])[0, 0]
    for j, value in ((0, np.nan), (127, np.inf), (128, -np.inf), (160, np.nan), (199, np.inf)):
        for m, dense in ((mask, allowed), (None, np.ones((nq, N), bool))):
            kk, vv = k.copy(), v.copy()
            (kk if where == "k" else vv)[:, 1, j, 0] = value  # kv head 1 serves query heads 2 and 3
            bad = np.zeros((4, nq), bool)
            bad[2:] = dense[:, j]
            _check(_run(engine, q, kk, vv, mask=m), _expect(q, k, v, dense, bad))


@pytest.mark.parametrize("engine", _engines())
def test_overflow_is_an_error_and_never_a_silent_row(engine):
    """Finite inputs whose scores overflow (towards +inf and towards -inf): ArgumentError."""
    q, k, v = _inputs()
    for sign in (1.0, -1.0):
        qq = np.ones_like(q) * 1e160 * sign
        kk = np.ones_like(k) * 1e160
        with pytest.raises(qkv.errors.ArgumentError, match="overflow"):
            _run(engine, qq, kk, v, mask=masks.causal())


@pytest.mark.skipif(not _native.available(), reason="compiled engine unavailable")
def test_the_compiled_path_reads_no_array_outside_the_kernel(monkeypatch):
    """No pass over K, V or the output outside the kernel: the front end never looks at their
    values (every NumPy reduction over them is counted while qkv.attention runs)."""
    q, k, v = (x.astype(np.float32) for x in _inputs())
    looked: list[tuple[int, ...]] = []
    for name in ("isfinite", "isnan", "all", "any", "sum", "max"):
        real = getattr(np, name)

        def spy(x, *a, _real=real, **kw):
            if isinstance(x, np.ndarray) and x.size >= k.size // 2:
                looked.append(x.shape)
            return _real(x, *a, **kw)

        monkeypatch.setattr(np, name, spy)
    qkv.attention(q, k, v, mask=masks.sliding_window(40), return_lse=True)
    qkv.attention(q, k, v, causal=True)
    assert looked == []


@pytest.mark.parametrize("engine", _engines())
def test_hidden_non_finite_keys_and_values_leave_the_gradients_unchanged(engine):
    """The backward never reads a hidden key or value either: gradients equal those of clean
    inputs, and the hidden keys get zero gradients."""
    from qkv._core import run_backward

    q, k, v = _inputs()
    mask = masks.padding(np.array([150]))
    k2, v2 = k.copy(), v.copy()
    k2[..., 150:, :] = np.nan
    v2[..., 150:, :] = np.inf
    dout = np.random.default_rng(3).standard_normal(q.shape)
    ref = run(build_call(q, k, v, mask=mask, want_lse=True), "reference")
    want = run_backward(build_call(q, k, v, mask=mask), dout, ref.out, ref.lse, "reference")
    kind, impl, isa = engine
    c = build_call(q, k2, v2, mask=mask, **({} if kind == "reference" else {"engine": kind}))
    if isa is None:
        got = run_backward(c, dout, ref.out, ref.lse, impl or "reference")
    else:
        with _native.use_isa(isa):
            got = run_backward(c, dout, ref.out, ref.lse, "flash")
    assert_close(got[0], want[0], tol=1e-10, name="dq")
    for g, w, name in ((got[1], want[1], "dk"), (got[2], want[2], "dv")):
        assert_close(g[..., :150, :], w[..., :150, :], tol=1e-10, name=name)
        assert (g[..., 150:, :] == 0).all(), name


def test_the_plan_cache_under_concurrent_threads():
    """Many threads planning and running many masks and sizes at once (the cache is shared and
    bounded): every result equals the same call made alone, and the cache never grows past its
    bound."""
    import threading

    from qkv.masks import _plan

    rng = np.random.default_rng(11)
    q = rng.standard_normal((1, 2, 70, 8)).astype(np.float32)
    cases = []
    for n in (17, 40, 70):
        for mask in (masks.causal(), masks.sliding_window(5), masks.padding(np.array([n - 3])), MASKS["bitmap"][0]):
            if mask.size is not None and mask.size != (n, n):
                continue
            cases.append((n, mask))
    alone = {i: qkv.attention(q[..., :n, :], q[..., :n, :], q[..., :n, :], mask=m) for i, (n, m) in enumerate(cases)}
    _plan.cache_clear()
    errors: list[BaseException] = []

    def worker(seed):
        order = np.random.default_rng(seed).permutation(len(cases))
        try:
            for _ in range(5):
                for i in order:
                    n, m = cases[i]
                    out = qkv.attention(q[..., :n, :], q[..., :n, :], q[..., :n, :], mask=m)
                    np.testing.assert_array_equal(out, alone[i])
                    assert len(_plan._cache) <= _plan.CACHE_SIZE
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
