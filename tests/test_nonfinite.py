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
    """(kind, impl, ISA path, dtype): every engine in float64, and the compiled one on each ISA path in
    float32 too (its own vector code: the attended-NaN bug of round 3 was float32-only)."""
    out = [("reference", None, None, "float64"), ("array", "flash", None, "float64")]
    if _native.available():
        out += [("native", "flash", isa, dt) for isa in _native.isas() for dt in ("float64", "float32")]
    return [pytest.param(e, id="-".join(x for x in (e[0], e[2], e[3]) if x)) for e in out]


def _tol(dtype):
    """The tolerance of a result in ``dtype`` against the float64 oracle: 256 of its ulps at 1."""
    return 256 * float(np.finfo(dtype).eps)


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
    kind, impl, isa, dtype = engine
    q, k, v = (x.astype(dtype) for x in (q, k, v))  # the inputs hold float32 values (_f32): exact in both
    if kw.get("bias") is not None:
        kw["bias"] = kw["bias"].astype(dtype)
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
    tol = _tol(res.out.dtype)
    out, lse = (np.asarray(x, dtype=np.float64) for x in (res.out, res.lse))
    assert np.array_equal(np.isnan(out), np.isnan(want[0])), "NaN rows of out"
    assert np.array_equal(np.isnan(lse), np.isnan(want[1])), "NaN rows of lse"
    ok = ~np.isnan(want[1])
    assert_close(out[..., ok, :], want[0][..., ok, :], tol=tol, name="out")
    assert_close(lse[ok], want[1][ok], tol=tol, name="lse")


def _f32(*xs):
    """float64 arrays holding float32 values: the same numbers for the float64 and float32 runs."""
    return tuple(x.astype(np.float32).astype(np.float64) for x in xs)


@cache
def _inputs():
    """One set of inputs for the whole module (its oracle results are computed once per mask)."""
    rng = np.random.default_rng(7)
    return _f32(
        rng.standard_normal((1, H, N, D)), rng.standard_normal((1, HKV, N, D)), rng.standard_normal((1, HKV, N, D))
    )


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
    (bias,) = _f32(rng.standard_normal((1, 1, N, N)))
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
    q, k, v = _f32(
        rng.standard_normal((1, 4, nq, D)), rng.standard_normal((1, 2, N, D)), rng.standard_normal((1, 2, N, D))
    )
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
    big = 1e160 if engine[3] == "float64" else 1e20  # |q·k| beyond the dtype's range
    for sign in (1.0, -1.0):
        qq = np.ones_like(q) * big * sign
        kk = np.ones_like(k) * big
        with pytest.raises(qkv.errors.ArgumentError, match="overflow"):
            _run(engine, qq, kk, v, mask=masks.causal())


# What the front end may do with K and V without reading their values: views and metadata.
NUMPY_VIEWS = {"broadcast_to", "reshape", "expand_dims", "squeeze", "moveaxis", "swapaxes", "transpose", "ndim"}
TORCH_VIEWS = {"__get__", "__getitem__", "detach", "dim", "expand", "is_contiguous", "reshape", "stride", "view"}


class Watched(np.ndarray):
    """A NumPy array that logs every ufunc (``np.isfinite(k)``, ``k.max()``, ``k * 0``: functions,
    methods and ``xp.*`` alike) and every array function other than a view; views stay Watched."""

    log: list[str] = []

    def __array_ufunc__(self, ufunc, method, *inputs, **kw):
        Watched.log.append(f"{ufunc.__name__}.{method}")
        plain = tuple(x.view(np.ndarray) if isinstance(x, Watched) else x for x in inputs)
        return getattr(ufunc, method)(*plain, **kw)

    def __array_function__(self, func, types, args, kwargs):
        if func.__name__ not in NUMPY_VIEWS:
            Watched.log.append(func.__name__)
        out = super().__array_function__(func, types, args, kwargs)
        return out.view(Watched) if func.__name__ in NUMPY_VIEWS and isinstance(out, np.ndarray) else out


def _kernel_calls(q, k, v):
    """The calls of the compiled path most made: a mask with rows, causal, dense, padding, lse."""
    qkv.attention(q, k, v, mask=masks.sliding_window(40), return_lse=True)
    qkv.attention(q, k, v, causal=True)
    qkv.attention(q, k, v)
    qkv.attention(q, k, v, mask=masks.padding([150]))


@pytest.mark.skipif(not _native.available(), reason="compiled engine unavailable")
def test_the_compiled_path_reads_no_numpy_array_outside_the_kernel():
    """No pass over K or V outside the kernel: NumPy functions, array methods and the array-API
    namespace's functions on them (or on any view of them) are all logged."""
    q, k, v = (x.astype(np.float32) for x in _inputs())
    k, v = k.view(Watched), v.view(Watched)
    Watched.log = []
    _kernel_calls(q, k, v)
    assert Watched.log == []
    k.max()  # the spy sees a method and an xp.* function (it can fail)
    array_api_compat_numpy = pytest.importorskip("array_api_compat.numpy")
    array_api_compat_numpy.sum(np.broadcast_to(v, (2, *v.shape)))
    assert Watched.log == ["maximum.reduce", "sum", "add.reduce"]


@pytest.mark.skipif(not _native.available(), reason="compiled engine unavailable")
def test_the_compiled_path_reads_no_torch_tensor_outside_the_kernel():
    """The same for torch: every torch function and tensor method on K, V or a view of them (the
    same storage) while qkv.attention runs, except views and metadata."""
    torch = pytest.importorskip("torch")
    from torch.overrides import TorchFunctionMode

    q, k, v = (torch.tensor(x.astype(np.float32)) for x in _inputs())
    watched = {k.untyped_storage().data_ptr(), v.untyped_storage().data_ptr()}

    def reads(x):
        return isinstance(x, torch.Tensor) and x.untyped_storage().data_ptr() in watched

    class Spy(TorchFunctionMode):
        log: list[str] = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            flat = [y for x in (*args, *kwargs.values()) for y in (x if isinstance(x, (list, tuple)) else [x])]
            name = getattr(func, "__name__", str(func))
            if name not in TORCH_VIEWS and any(reads(x) for x in flat):
                Spy.log.append(name)
            return func(*args, **kwargs)

    with Spy():
        _kernel_calls(q, k, v)
        assert Spy.log == []
        torch.isfinite(k[:, :, 3:]).all()  # the spy sees them (it can fail)
        v.sum()
    assert Spy.log == ["isfinite", "sum"]


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
    (dout,) = _f32(np.random.default_rng(3).standard_normal(q.shape))
    ref = run(build_call(q, k, v, mask=mask, want_lse=True), "reference")
    want = run_backward(build_call(q, k, v, mask=mask), dout, ref.out, ref.lse, "reference")
    kind, impl, isa, dtype = engine
    q, k2, v2, dout, out, lse = (x.astype(dtype) for x in (q, k2, v2, dout, ref.out, ref.lse))
    c = build_call(q, k2, v2, mask=mask, **({} if kind == "reference" else {"engine": kind}))
    if isa is None:
        got = run_backward(c, dout, out, lse, impl or "reference")
    else:
        with _native.use_isa(isa):
            got = run_backward(c, dout, out, lse, "flash")
    tol = _tol(dtype)
    assert_close(got[0], want[0], tol=tol, name="dq")
    for g, w, name in ((got[1], want[1], "dk"), (got[2], want[2], "dv")):
        assert_close(g[..., :150, :], w[..., :150, :], tol=tol, name=name)
        assert (g[..., 150:, :] == 0).all(), name


def test_the_plan_cache_under_concurrent_threads():
    """Many threads planning and running many masks and sizes at once, with more distinct plans
    than the cache holds (it evicts while they run): every result equals the same call made
    alone, and the cache never grows past its bound."""
    import threading

    from qkv.masks import _cache

    rng = np.random.default_rng(11)
    q = rng.standard_normal((1, 2, 70, 8)).astype(np.float32)
    cases = []
    for n in range(17, 71):  # 54 sizes x 4 masks: ~2 x 216 entries (lead shape, plan) for 128 places
        dense = masks.from_dense(np.random.default_rng(n).random((n, n)) < 0.7)
        for mask in (masks.causal(), masks.sliding_window(5), masks.padding(np.array([n - 3])), dense):
            cases.append((n, mask))
    assert 2 * len(cases) > 2 * _cache.CACHE_SIZE
    alone = {i: qkv.attention(q[..., :n, :], q[..., :n, :], q[..., :n, :], mask=m) for i, (n, m) in enumerate(cases)}
    _cache.cache_clear()
    errors: list[BaseException] = []
    largest = [0]

    def worker(seed):
        order = np.random.default_rng(seed).permutation(len(cases))
        try:
            for _ in range(2):
                for i in order:
                    n, m = cases[i]
                    out = qkv.attention(q[..., :n, :], q[..., :n, :], q[..., :n, :], mask=m)
                    np.testing.assert_array_equal(out, alone[i])
                    largest[0] = max(largest[0], len(_cache._cache))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert largest[0] == _cache.CACHE_SIZE  # it filled up and evicted, never grew past its bound
