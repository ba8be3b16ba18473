"""Score-mod arguments that used to give a wrong answer or a bare error (issue 20, item 4):
ALiBi slopes against the call's heads and batch axes on every engine, ALiBi beside
per-sequence masks, ``scores.from_fn`` checked at construction and first call."""

import numpy as np
import pytest

import oracle as O
import qkv
from helpers import HAS_TORCH, assert_close, engine_params, make_qkv
from qkv import _native, masks, scores
from qkv._impls import build_call
from qkv.errors import ShapeError

ENGINES = engine_params("torch", "auto")


def run(impl, engine, q, k, v, library="numpy", **kw):
    if library == "torch" or impl == "torch":
        if not HAS_TORCH:
            pytest.skip("torch not installed")
        import torch

        q, k, v = (torch.tensor(x) for x in (q, k, v))
    extra = {} if engine is None else {"engine": engine}
    return qkv._core.run(build_call(q, k, v, **kw, **extra), impl).out


def run_or_refused(impl, engine, q, k, v, **kw):
    """``run``, or None where the forced compiled engine refuses a mod measured per sequence (its
    documented refusal: the compiled kernel measures positions from the call's corner only)."""
    if engine != "native":
        return run(impl, engine, q, k, v, **kw)
    try:
        return run(impl, engine, q, k, v, **kw)
    except qkv.errors.ArgumentError as e:
        assert "per sequence has no compiled form" in str(e), e
        return None


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


@pytest.mark.parametrize("impl,engine", ENGINES)
@pytest.mark.parametrize("library", ["numpy", "torch"])
@pytest.mark.parametrize(
    "mod,built",
    [
        (lambda: scores.alibi(n_heads=4), 4),
        (lambda: scores.alibi(n_heads=1), 1),  # one head's slope would broadcast silently
        (lambda: scores.alibi(slopes=[0.5], n_heads=1), 1),
        (lambda: scores.softcap(5.0) + scores.alibi(n_heads=4), 4),  # inside a chain too
    ],
)
def test_a_score_mod_built_for_other_heads_is_a_shape_error_naming_both(impl, engine, library, mod, built, rng):
    q, k, v = make_qkv(rng, (2, 8, 5, 4), (2, 8, 6, 4))
    with pytest.raises(ShapeError, match=rf"built for {built} heads? but the call has H=8 query heads"):
        run(impl, engine, q, k, v, library, score_mod=mod())


@pytest.mark.skipif(not HAS_TORCH or not _native.available(), reason="torch.compile needs torch and the kernel")
def test_a_score_mod_built_for_other_heads_is_a_shape_error_inside_torch_compile(rng):
    import torch

    q, k, v = (torch.tensor(x) for x in make_qkv(rng, (1, 8, 5, 4), (1, 8, 6, 4)))
    f = torch.compile(lambda q, k, v: qkv.attention(q, k, v, score_mod=scores.alibi(n_heads=4)), backend="aot_eager")
    with pytest.raises(ShapeError, match=r"built for 4 heads but the call has H=8 query heads"):
        f(q, k, v)


# --------------------------------------------------------------------------- ALiBi per sequence


def varlen_alibi(slopes, cu_q, cu_k):
    """flash-attn's varlen ALiBi from its definition: local query ii of sequence s (Lq queries, Lk
    keys) sits at local key ii + Lk - Lq; it adds -slope[h] * |ii + Lk - Lq - jj| for local key jj."""

    def fn(s, h, i, j, nq, nk):
        seq = max(x for x in range(len(cu_q) - 1) if cu_q[x] <= i < cu_q[x + 1] or cu_q[x] == i == cu_q[-1])
        lq, lk = cu_q[seq + 1] - cu_q[seq], cu_k[seq + 1] - cu_k[seq]
        ii, jj = i - cu_q[seq], j - cu_k[seq]
        return s - slopes[h] * np.abs(ii + lk - lq - jj)

    return fn


def varlen_relative_bias(table, m, cu_q, cu_k):
    def fn(s, h, i, j, nq, nk):
        seq = max(x for x in range(len(cu_q) - 1) if cu_q[x] <= i < cu_q[x + 1])
        lq, lk = cu_q[seq + 1] - cu_q[seq], cu_k[seq + 1] - cu_k[seq]
        ii, jj = i - cu_q[seq], j - cu_k[seq]
        return s + table[h, np.clip(jj - (ii + lk - lq), -m, m) + m]

    return fn


PACKED = [  # (cu_q, cu_k, mask keywords)
    pytest.param([0, 2, 5], [0, 4, 6], {}, id="cross-lengths"),
    pytest.param([0, 2, 5], [0, 4, 6], {"causal": True}, id="cross-causal"),
    pytest.param([0, 3, 4, 9], [0, 1, 6, 8], {"window": (1, 2)}, id="cross-window"),
    pytest.param([0, 3, 7], [0, 3, 7], {}, id="self"),
]


@pytest.mark.parametrize("impl,engine", ENGINES)
@pytest.mark.parametrize("cu_q,cu_k,kw", PACKED)
@pytest.mark.parametrize("mod", ["alibi", "alibi-slopes", "relative_bias"])
def test_alibi_beside_packed_sequences_measures_within_each_sequence(impl, engine, cu_q, cu_k, kw, mod, rng):
    nq, nk = cu_q[-1], cu_k[-1]
    q, k, v = make_qkv(rng, (1, 2, nq, 4), (1, 2, nk, 4))
    mask = masks.packed(cu_q, cu_k, **kw)
    allowed = mask.dense(nq, nk)
    slopes, table = np.array([0.7, 0.3]), rng.standard_normal((2, 7))
    score_mod, score_fn = {
        "alibi": (scores.alibi(), varlen_alibi(O.alibi_slopes(2), cu_q, cu_k)),
        "alibi-slopes": (scores.alibi(slopes=slopes), varlen_alibi(slopes, cu_q, cu_k)),
        "relative_bias": (scores.relative_bias(table, 3), varlen_relative_bias(table, 3, cu_q, cu_k)),
    }[mod]
    golden = O.attention_oracle(
        q, k, v, allowed=allowed, score_fn=lambda s, h, i, j, nq, nk: score_fn(s, h, i, j, nq, nk)
    )[0]
    got = run_or_refused(impl, engine, q, k, v, mask=mask, score_mod=score_mod)
    if got is not None:
        assert_close(got, golden, tol=1e-11)


@pytest.mark.parametrize("impl,engine", ENGINES)
@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_alibi_beside_padding_measures_within_each_sequence(impl, engine, left, causal, rng):
    nq, nk = 4, 7
    kl, ql = np.array([7, 3, 5]), np.array([4, 1, 2])
    q, k, v = make_qkv(rng, (3, 2, nq, 4), (3, 2, nk, 4))
    mask = masks.padding(kl, ql, causal=causal, left=left)
    allowed = mask.dense(nq, nk)
    golden = []
    for b in range(3):  # one sequence per batch element, placed as the padding places it
        q0, k0 = (nq - ql[b], nk - kl[b]) if left else (0, 0)
        cu_q, cu_k = [0, q0, q0 + ql[b], nq], [0, k0, k0 + kl[b], nk]
        fn = varlen_alibi(O.alibi_slopes(2), cu_q, cu_k)
        golden.append(O.attention_oracle(q[b], k[b], v[b], allowed=allowed[b], score_fn=fn)[0])
    got = run_or_refused(impl, engine, q, k, v, mask=mask, score_mod=scores.alibi())
    if got is not None:
        assert_close(got, np.stack(golden), tol=1e-11)


def test_alibi_per_sequence_keeps_the_compiled_engine_where_the_corners_agree(rng):
    q, k, v = make_qkv(rng, (1, 2, 7, 4), (1, 2, 7, 4))
    packed_self = qkv.dispatch(q, k, v, mask=masks.packed([0, 3, 7]), score_mod=scores.alibi(), impl="flash")
    left = qkv.dispatch(q, k, v, mask=masks.padding([5], [3], left=True), score_mod=scores.alibi(), impl="flash")
    cross = qkv.dispatch(q, k, v, mask=masks.packed([0, 3, 7], [0, 5, 7]), score_mod=scores.alibi(), impl="flash")
    if _native.available():
        assert packed_self.engine == left.engine == "native", (packed_self, left)
    assert cross.engine == "array" and "alibi per sequence" in cross.reason


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
def test_alibi_per_sequence_with_torch_gradients_and_inside_the_operator(rng):
    import torch

    from qkv._impls import _torch_op

    cu_q, cu_k = [0, 2, 5], [0, 4, 6]
    q, k, v = make_qkv(rng, (1, 2, 5, 4), (1, 2, 6, 4))
    mask = masks.packed(cu_q, cu_k, causal=True)
    golden = O.attention_oracle(
        q, k, v, allowed=mask.dense(5, 6), score_fn=varlen_alibi(O.alibi_slopes(2), cu_q, cu_k)
    )[0]
    t = [torch.tensor(x, requires_grad=True) for x in (q, k, v)]
    out = qkv.attention(*t, mask=mask, score_mod=scores.alibi())
    assert_close(out, golden, tol=1e-11)
    out.sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in t)
    code, data = masks.encode(mask.recipe)  # what a traced program hands the operator
    tensors = [torch.as_tensor(d) for d in data]
    with pytest.raises(qkv.errors.ArgumentError, match="measure positions per sequence"):
        _torch_op._mask_plan(code, tensors, (1, 2), t[0], t[2], t[1].shape[-2], positional=True)


# --------------------------------------------------------------------------- scores.from_fn


@pytest.mark.parametrize(
    "fn,takes",
    [
        (lambda s, b: s, 2),
        (lambda s, b, h, i: s, 4),
        (lambda s, b, h, i, j, extra: s, 6),
        (lambda: 0.0, 0),
    ],
)
def test_from_fn_checks_its_arity_when_built(fn, takes):
    with pytest.raises(
        qkv.errors.ArgumentError, match=rf"fn takes {takes} positional arguments; a score mod is fn\(score"
    ):
        scores.from_fn(fn)
    with pytest.raises(qkv.errors.ArgumentError, match=rf"grad takes {takes} positional"):
        scores.from_fn(lambda s, b, h, i, j: s, grad=fn)


def test_from_fn_takes_defaults_and_star_args():
    scores.from_fn(lambda s, b, h, i, j, scale=2.0: s * scale)
    scores.from_fn(lambda *a: a[0])


@pytest.mark.parametrize(
    "result,kind",
    [
        (lambda s, b, h, i, j: None, "None"),
        (lambda s, b, h, i, j: s > 0, "dtype bool"),
        (lambda s, b, h, i, j: True, "a bool"),
        (lambda s, b, h, i, j: i - j, "dtype int64"),
        (lambda s, b, h, i, j: 3, "an int"),
        (lambda s, b, h, i, j: s + 1j, "dtype complex"),
        (lambda s, b, h, i, j: 1j, "a complex number"),
        (lambda s, b, h, i, j: "s", "a str"),
    ],
)
@pytest.mark.parametrize("impl", ["reference", "flash", "auto"])
@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_from_fn_results_that_are_not_float_scores_are_a_dtype_error(result, kind, impl, library, rng):
    q, k, v = make_qkv(rng, (1, 2, 4, 8), (1, 2, 4, 8))
    if library == "torch":
        if not HAS_TORCH:
            pytest.skip("torch not installed")
        import torch

        q, k, v = (torch.tensor(x) for x in (q, k, v))
    with pytest.raises(
        qkv.errors.DTypeError, match=rf"from_fn\(<lambda>\): fn returned {kind}.*a score mod returns float"
    ):
        qkv.attention(q, k, v, score_mod=scores.from_fn(result), impl=impl)


def _other_library(s, b, h, q_idx, kv_idx):
    """``s`` as an array of another library: NumPy for torch scores, torch for NumPy ones."""
    import torch

    return s.detach().numpy() if isinstance(s, torch.Tensor) else torch.from_numpy(np.asarray(s))


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
@pytest.mark.parametrize("impl", ["reference", "flash", "auto"])
@pytest.mark.parametrize(
    "library,where,other",
    [("numpy", "fn", "a torch tensor"), ("torch", "fn", "a NumPy array"), ("numpy", "grad", "a torch tensor")],
)  # (torch differentiates fn itself: its grad= is never called)
def test_from_fn_results_of_another_array_library_are_a_dtype_error(impl, library, where, other, rng):
    import torch

    q, k, v = make_qkv(rng, (1, 2, 4, 8), (1, 2, 4, 8))
    if library == "torch":
        q, k, v = (torch.tensor(x) for x in (q, k, v))
    same = lambda s, b, h, i, j: 2 * s  # noqa: E731
    fn, grad = (_other_library, same) if where == "fn" else (same, _other_library)
    mod = scores.from_fn(fn, grad=grad, name="from_fn(mine)")
    with pytest.raises(qkv.errors.DTypeError, match=rf"from_fn\(mine\): {where} returned {other} for {library} scores"):
        out, lse = qkv.attention(q, k, v, score_mod=mod, impl=impl, return_lse=True)
        qkv.attention_backward(np.ones_like(out), q, k, v, out, lse, score_mod=mod, impl=impl)


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
@pytest.mark.parametrize("impl", ["reference", "flash"])
@pytest.mark.parametrize("library", ["numpy", "torch"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_from_fn_float_results_of_another_precision_take_the_scores_dtype(impl, library, dtype, rng):
    # 0.1 * (q_idx - kv_idx) is float64 in NumPy, float32 in torch: either way the call keeps its dtype
    import torch

    q, k, v = (x.astype(dtype) for x in make_qkv(rng, (1, 2, 5, 8), (1, 2, 5, 8)))
    golden = O.attention_oracle(q, k, v, score_fn=lambda s, h, i, j, nq, nk: s - 0.1 * (i - j))[0]
    args = (q, k, v) if library == "numpy" else tuple(torch.tensor(x) for x in (q, k, v))
    fn = lambda s, b, h, i, j: s - 0.1 * (i - j)  # noqa: E731
    mod = scores.from_fn(fn, grad=lambda s, b, h, i, j: 1.0 + 0 * s)
    out = qkv.attention(*args, score_mod=mod, impl=impl)
    assert str(out.dtype).removeprefix("torch.") == dtype
    # torch computes 0.1 * (q_idx - kv_idx) in float32 (its default dtype), also for float64 scores
    assert_close(out, golden, tol=1e-12 if dtype == "float64" and library == "numpy" else 1e-5)


@pytest.mark.parametrize("impl,engine", [e for e in ENGINES if e.id != "compiled-engine"])
def test_a_relative_bias_table_with_minus_inf_hides_that_distance_on_every_engine(impl, engine, rng):
    q, k, v = make_qkv(rng, (1, 2, 5, 4), (1, 2, 6, 4))
    table = np.array([-np.inf, 0.3, 0.0, -0.2, 0.1])  # distance j - p = -2 hidden
    golden = O.attention_oracle(q, k, v, score_fn=O.relative_bias_score(table, 2))[0]
    assert_close(run(impl, engine, q, k, v, score_mod=scores.relative_bias(table, 2)), golden, tol=1e-11)


def test_two_masks_that_align_their_sequences_differently_leave_alibi_no_distance(rng):
    q, k, v = make_qkv(rng, (1, 2, 5, 4), (1, 2, 6, 4))
    both = masks.packed([0, 2, 5], [0, 4, 6]) & masks.padding([6], [3])
    with pytest.raises(qkv.errors.MaskError, match="align their sequences differently"):
        qkv.attention(q, k, v, mask=both, score_mod=scores.alibi())
    qkv.attention(q, k, v, mask=both)  # without a position-based mod the intersection is just a mask
    one = masks.packed([0, 2, 5], [0, 4, 6]) & masks.sliding_window(3, causal=False)  # one alignment: kept
    golden = O.attention_oracle(
        q, k, v, allowed=one.dense(5, 6), score_fn=varlen_alibi(O.alibi_slopes(2), [0, 2, 5], [0, 4, 6])
    )[0]
    assert_close(qkv.attention(q, k, v, mask=one, score_mod=scores.alibi()), golden, tol=1e-11)
