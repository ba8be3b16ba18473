"""Backward pass: the analytic reference, finite differences (float64), dlse, dtypes against the
same-dtype naive baseline, grouped heads (dK/dV summed over each kv head's query heads),
determinism per thread count."""

import numpy as np
import pytest
import torch
from _native_helpers import make_qkv, max_err, run_backward, run_forward, torch_backward, torch_forward, torch_naive
from _native_reference import backward as ref_backward
from _native_reference import forward as ref_forward

SHAPES = [
    (1, 1, 1, 1, 1, 1, 1),
    (1, 2, 1, 37, 59, 3, 5),
    (2, 4, 2, 130, 200, 64, 48),
    (1, 3, 1, 9, 140, 80, 17),
    (1, 2, 2, 90, 30, 128, 128),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_float64_matches_reference(isa, rng, shape):
    b, h, hkv, nq, nk, dk, dv = shape
    q, k, v = make_qkv(rng, b, h, hkv, nq, nk, dk, dv)
    out, lse = run_forward(q, k, v)
    dout = rng.standard_normal(out.shape)
    dlse = rng.standard_normal(lse.shape)
    grads = run_backward(q, k, v, out, lse, dout, dlse=dlse, threads=2)
    _, _, *want = ref_backward(q, k, v, dout, dk**-0.5, dlse=dlse)
    for g, w in zip(grads, want, strict=True):
        assert g.dtype == np.float64 and max_err(g, w) < 1e-11


def test_finite_differences(isa, rng):
    b, h, hkv, nq, nk, d = 1, 2, 1, 5, 7, 3
    q, k, v = make_qkv(rng, b, h, hkv, nq, nk, d, d)
    rows = np.array([[[[0, 7], [2, 6], [0, 3], [4, 7], [1, 2]]]], np.int32)
    mods = (("softcap", 1.5), ("alibi", np.array([0.3, 0.1])))
    dout = rng.standard_normal((b, h, nq, d))
    dlse = rng.standard_normal((b, h, nq))

    def loss(q_, k_, v_):
        o, lse = run_forward(q_, k_, v_, rows=rows, mods=mods)
        return float((o * dout).sum() + (lse * dlse).sum())

    out, lse = run_forward(q, k, v, rows=rows, mods=mods)
    grads = run_backward(q, k, v, out, lse, dout, dlse=dlse, rows=rows, mods=mods)
    eps = 1e-6
    for x, g in zip((q, k, v), grads, strict=True):
        num = np.zeros_like(x)
        for idx in np.ndindex(*x.shape):
            old = x[idx]
            x[idx] = old + eps
            plus = loss(q, k, v)
            x[idx] = old - eps
            minus = loss(q, k, v)
            x[idx] = old
            num[idx] = (plus - minus) / (2 * eps)
        assert max_err(g, num) < 1e-7


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_dtypes_within_three_times_the_naive_error(isa, rng, dtype):
    b, h, hkv, nq, nk, dk, dv = 1, 4, 2, 80, 130, 64, 32
    tdt = getattr(torch, dtype)
    q, k, v = (torch.from_numpy(x).to(tdt) for x in make_qkv(rng, b, h, hkv, nq, nk, dk, dv))
    dout = torch.from_numpy(rng.standard_normal((b, h, nq, dv))).to(tdt)
    scale = dk**-0.5
    out, lse = torch_forward(q, k, v, scale=scale)
    grads = torch_backward(q, k, v, out, lse, dout, scale=scale, threads=2)
    assert all(g.dtype == torch.float32 for g in grads)
    _, _, *gold = ref_backward(*(t.double().numpy() for t in (q, k, v, dout)), scale)
    _, *naive = torch_naive(q, k, v, scale, dout=dout)
    for g, n, w in zip(grads, naive, gold, strict=True):
        base = max_err(n.double().numpy(), w)
        assert max_err(g.double().numpy(), w) <= 3 * base + 1e-6


def test_threads_deterministic_and_agree(isa, rng):
    q, k, v = make_qkv(rng, 2, 4, 2, 150, 300, 32, 32, np.float32)
    out, lse = run_forward(q, k, v)
    dout = rng.standard_normal(out.shape).astype(np.float32)
    g1 = run_backward(q, k, v, out, lse, dout, threads=1)
    g2 = run_backward(q, k, v, out, lse, dout, threads=2)
    g2b = run_backward(q, k, v, out, lse, dout, threads=2)
    for a, b_, c in zip(g1, g2, g2b, strict=True):
        assert np.array_equal(b_, c)
        assert max_err(a, b_) < 1e-4


def test_one_hot_rows_float32(isa, rng):
    # nearly one-hot rows with large |q|: dS = P (dP - D) must not be swamped by rounding residue
    nq, nk, d = 32, 64, 32
    q, k, v = make_qkv(rng, 1, 1, 1, nq, nk, d, d, np.float32, scale=4.0)
    out, lse = run_forward(q, k, v)
    dout = rng.standard_normal(out.shape).astype(np.float32)
    grads = run_backward(q, k, v, out, lse, dout)
    _, _, *gold = ref_backward(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), dout, d**-0.5)
    _, *naive = torch_naive(*(torch.from_numpy(x) for x in (q, k, v)), d**-0.5, dout=torch.from_numpy(dout))
    for g, n, w in zip(grads, naive, gold, strict=True):
        assert max_err(g, w) <= 3 * max_err(n.numpy(), w) + 1e-6


def test_lse_minus_inf_rows_contribute_nothing(isa, rng):
    q, k, v = make_qkv(rng, 1, 1, 1, 20, 40, 8, 8)
    rows = np.broadcast_to(np.array([0, 40], np.int32), (1, 1, 20, 2)).copy()
    rows[0, 0, 3:7] = (10, 10)
    out, lse = run_forward(q, k, v, rows=rows)
    assert np.isneginf(lse[0, 0, 3:7]).all()
    dout = rng.standard_normal(out.shape)
    dq, dk, dv = run_backward(q, k, v, out, lse, dout, rows=rows)
    assert not dq[0, 0, 3:7].any() and np.isfinite(dk).all() and np.isfinite(dv).all()
    allowed = np.ones((20, 40), bool)
    allowed[3:7] = False
    _, _, *want = ref_backward(q, k, v, dout, 8**-0.5, allowed=allowed)
    for g, w in zip((dq, dk, dv), want, strict=True):
        assert max_err(g, w) < 1e-12


def test_strided_out_dout_lse(rng):
    q, k, v = make_qkv(rng, 1, 2, 1, 30, 50, 16, 8)
    out, lse = run_forward(q, k, v)
    big = np.zeros((1, 4, 30, 8))
    big[:, ::2] = out
    dout = rng.standard_normal((1, 2, 30, 8))
    lse_big = np.zeros((1, 2, 60))
    lse_big[..., ::2] = lse
    a = run_backward(q, k, v, big[:, ::2], lse_big[..., ::2], dout)
    b = run_backward(q, k, v, out, lse, dout)
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x, y)
    _ = ref_forward
