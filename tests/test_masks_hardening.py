"""Mask arguments that used to give a wrong answer or a bare error (issue 20, item 4).

Window pairs with flash-attn's ``-1``; 0-D masks and biases broadcast as SDPA's do; bad sizes
and lengths are typed errors naming the argument, the axis and the sizes.
"""

import numpy as np
import pytest

import oracle as O
import qkv
from helpers import HAS_TORCH, assert_close, make_qkv
from qkv import masks
from qkv.errors import MaskError

needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")


def packed_definition(cu_q, cu_k, left, right, causal):
    """flash-attn varlen: local query ii of sequence s sits at p = ii + Lk - Lq and sees local
    key jj iff -right <= p - jj <= left (None: unbounded; causal: right = 0)."""
    nq, nk = cu_q[-1], cu_k[-1]
    out = np.zeros((nq, nk), dtype=bool)
    for s in range(len(cu_q) - 1):
        lq, lk = cu_q[s + 1] - cu_q[s], cu_k[s + 1] - cu_k[s]
        for ii in range(lq):
            for jj in range(lk):
                d = ii + lk - lq - jj
                ok = (left is None or d <= left) and (right is None or d >= -right) and (not causal or d >= 0)
                out[cu_q[s] + ii, cu_k[s] + jj] = ok
    return out


WINDOWS = [((-1, -1), None, None), ((-1, 0), None, 0), ((2, -1), 2, None), ((0, -1), 0, None), ((1, 1), 1, 1)]


@pytest.mark.parametrize("window,left,right", WINDOWS, ids=[str(w[0]) for w in WINDOWS])
@pytest.mark.parametrize("causal", [False, True])
def test_window_pairs_take_minus_one_for_an_unbounded_side(window, left, right, causal):
    cu_q, cu_k = [0, 3, 4, 9], [0, 5, 5, 11]
    want = packed_definition(cu_q, cu_k, left, right, causal)
    got = masks.packed(cu_q, cu_k, causal=causal, window=window).dense(9, 11)
    assert np.array_equal(got, want), f"\n{got.astype(int)}\n{want.astype(int)}"
    # padding: one sequence per batch element, right padding
    kl, ql = np.array([5, 2]), np.array([3, 1])
    got = masks.padding(kl, ql, causal=causal, window=window).dense(4, 6)
    for b in range(2):
        rows = packed_definition([0, ql[b]], [0, kl[b]], left, right, causal)
        want = np.zeros((4, 6), dtype=bool)
        want[: ql[b], : kl[b]] = rows
        assert np.array_equal(got[b, 0], want), (b, got[b, 0].astype(int), want.astype(int))
    # sliding_window over the whole call (Nq = 4 queries against Nk = 6 keys, bottom-right)
    got = masks.sliding_window(window, causal=causal).dense(4, 6)
    assert np.array_equal(got, packed_definition([0, 4], [0, 6], left, right, causal))


@pytest.mark.parametrize("bad", [(-2, 0), (0, -5), (1,), (1, 2, 3), (1.5, 2), ("1", 2)])
def test_a_bad_window_pair_is_a_mask_error_naming_the_side(bad):
    for build, name in (
        (lambda: masks.sliding_window(bad), "sliding_window size"),
        (lambda: masks.packed([0, 3], window=bad), "packed window"),
        (lambda: masks.padding([3], window=bad), "padding window"),
    ):
        with pytest.raises(MaskError, match=name):
            build()


ZERO_D = [
    pytest.param("mask", True, id="bool-true"),
    pytest.param("mask", False, id="bool-false"),
    pytest.param("mask", 0.75, id="float-mask"),
    pytest.param("mask", -np.inf, id="float-mask-minus-inf"),
    pytest.param("bias", 0.75, id="bias"),
]


def _zero_d_expected(q, k, v, kind, value):
    if kind == "mask" and isinstance(value, bool):
        return O.attention_oracle(q, k, v, allowed=np.full((1, 1), value))
    return O.attention_oracle(q, k, v, bias=np.full((1, 1), value))  # a constant bias: weights unchanged


@pytest.mark.parametrize("kind,value", ZERO_D)
@pytest.mark.parametrize("impl", ["reference", "flash", "auto", "torch"])
@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_0d_masks_and_biases_broadcast_as_in_sdpa(kind, value, impl, library, rng):
    q, k, v = make_qkv(rng, (2, 2, 5, 4), (2, 2, 7, 4))
    out, _, lse = _zero_d_expected(q, k, v, kind, value)
    dtype = np.bool_ if isinstance(value, bool) else np.float64
    x = np.array(value, dtype=dtype)
    args = (q, k, v)
    if library == "torch":
        if not HAS_TORCH:
            pytest.skip("torch not installed")
        import torch

        args, x = tuple(torch.tensor(a) for a in args), torch.tensor(x)
    elif impl == "torch":
        pytest.skip("impl='torch' takes torch tensors")
    got = qkv.attention(*args, **{kind: x}, impl=impl)
    assert_close(got, out, tol=1e-11)
    if impl != "torch":  # SDPA returns no lse
        got_lse = qkv.attention(*args, **{kind: x}, impl=impl, return_lse=True)[1]
        assert_close(got_lse, lse, tol=1e-11, name="lse")
    if library == "numpy":  # a NumPy scalar (np.bool_, np.float64) is a 0-D array too
        assert_close(qkv.attention(*args, **{kind: dtype(value)}, impl=impl), out, tol=1e-11)


def test_padding_lengths_of_two_batch_sizes_are_a_mask_error():
    with pytest.raises(MaskError, match=r"q_lengths has B=3 entries on axis 0 but kv_lengths has B=2"):
        masks.padding([3, 4], q_lengths=[1, 2, 3])
    masks.padding([3, 4], q_lengths=[2])  # one length for every batch element broadcasts
    masks.padding([3], q_lengths=[1, 2, 3])


@pytest.mark.parametrize("dtype", [np.uint64, np.int64])
def test_lengths_beyond_any_sequence_are_a_mask_error_not_a_wrapped_negative(dtype):
    big = np.array([2**63 + 5 if dtype == np.uint64 else 2**62 + 1, 3], dtype=dtype)
    for build in (lambda: masks.padding(big), lambda: masks.padding([3, 3], q_lengths=big)):
        with pytest.raises(MaskError, match=r"lengths must be at most 4611686018427387904 .*got"):
            build()
    ok = masks.padding(np.array([2**62, 3], dtype=dtype)).dense(4, 4)  # a length beyond Nk: every key
    assert ok[0].all() and ok[1, 0, :, :3].all() and not ok[1, 0, :, 3].any()


def test_a_four_argument_from_fn_with_extra_leading_axes_is_a_mask_error(rng):
    q, k, v = make_qkv(rng, (2, 2, 4, 8), (2, 2, 4, 8))
    extra = masks.from_fn(lambda b, h, i, j: np.ones((5, 1, 1, 1, 1), dtype=bool) & (i >= j))
    with pytest.raises(MaskError, match=r"returned shape \(5, 1, 1, 1, 1\).*\(2, 2, 1, 1\) \(more axes than"):
        qkv.attention(q, k, v, mask=extra)
    fine = masks.from_fn(lambda b, h, i, j: np.ones((1, 1, 1, 1), dtype=bool) & (i >= j))
    assert_close(qkv.attention(q, k, v, mask=fine), qkv.attention(q, k, v, causal=True), tol=1e-12)
    # a call without heads: b and h are size-1 grids, and their size-1 axes in the result go
    q2, k2, v2 = q[0, 0], k[0, 0], v[0, 0]
    on_b = masks.from_fn(lambda b, h, i, j: (b == 0) & (h == 0) & (i >= j))
    assert_close(qkv.attention(q2, k2, v2, mask=on_b), qkv.attention(q2, k2, v2, causal=True), tol=1e-12)


@pytest.mark.parametrize("nq,nk,bad", [(-1, 4, "nq"), (4, -2, "nk"), (2.5, 4, "nq"), (4, "4", "nk")])
def test_negative_or_non_integer_sizes_are_a_mask_error(nq, nk, bad):
    for call, where in (
        (lambda m: m.dense(nq, nk), "Mask.dense"),
        (lambda m: m.blocks(nq, nk, 2, 2), "Mask.blocks"),
        (lambda m: m.intervals(nq, nk), "Mask.intervals"),
    ):
        with pytest.raises(MaskError, match=rf"{where} {bad} must be an integer"):
            call(masks.causal())
