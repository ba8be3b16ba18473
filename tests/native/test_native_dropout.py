"""Dropout inside the kernel: the Philox mask philox_keep() exposes is the one the forward and the
backward use; inverted scaling; lse is the pre-dropout one."""

import numpy as np
import pytest
from _native_helpers import make_qkv, max_err, run_backward, run_forward
from _native_reference import backward as ref_backward
from _native_reference import forward as ref_forward
from _native_reference import keep_mask

from qkv import _native as native


@pytest.mark.parametrize("nq,nk", [(70, 150), (3, 300)])
def test_dropout_matches_reference_with_philox_mask(isa, rng, nq, nk):
    b, h, hkv, d, p, seed = 2, 2, 1, 16, 0.3, 0xDEADBEEF12345
    q, k, v = make_qkv(rng, b, h, hkv, nq, nk, d, d)
    keep = keep_mask(native.philox_keep, seed, b, h, nq, nk, p)
    scale = d**-0.5
    rows = np.broadcast_to(np.stack([np.zeros(nq), np.arange(nq) + nk - nq + 1], -1).astype(np.int32), (1, 1, nq, 2))
    allowed = np.arange(nk)[None, :] < (np.arange(nq) + nk - nq + 1)[:, None]
    out, lse = run_forward(q, k, v, dropout_p=p, seed=seed, rows=rows, threads=2)
    ro, rl, *_ = ref_forward(q, k, v, scale, allowed=allowed, keep=keep, p=p)
    assert max_err(out, ro) < 1e-12
    assert max_err(lse, rl) < 1e-11  # pre-dropout lse
    _, lse0 = run_forward(q, k, v, rows=rows)
    assert np.array_equal(lse, lse0)
    dout = rng.standard_normal(out.shape)
    grads = run_backward(q, k, v, out, lse, dout, dropout_p=p, seed=seed, rows=rows, threads=2)
    _, _, *want = ref_backward(q, k, v, dout, scale, allowed=allowed, keep=keep, p=p)
    for g, w in zip(grads, want, strict=True):
        assert max_err(g, w) < 1e-10


def test_same_seed_same_bits_other_seed_other_bits(rng):
    q, k, v = make_qkv(rng, 1, 2, 2, 40, 80, 16, 16, np.float32)
    a = run_forward(q, k, v, dropout_p=0.5, seed=1)
    b = run_forward(q, k, v, dropout_p=0.5, seed=1, threads=2)
    c = run_forward(q, k, v, dropout_p=0.5, seed=2)
    assert np.array_equal(a[0], b[0])
    assert not np.array_equal(a[0], c[0])


def test_keep_fraction_through_the_kernel(rng):
    # with v = one-hot key index and uniform scores, out[i, j] = keep[i, j] / ((1 - p) Nk)
    nq, nk, p = 64, 256, 0.25
    q = np.zeros((1, 1, nq, 4))
    k = np.zeros((1, 1, nk, 4))
    v = np.eye(nk)[None, None]
    out, _ = run_forward(q, k, v, dropout_p=p, seed=99)
    keep = out[0, 0] * (1 - p) * nk
    assert np.allclose(keep, np.round(keep)) and set(np.unique(np.round(keep))) <= {0.0, 1.0}
    assert np.array_equal(keep > 0.5, native.philox_keep(99, 0, 0, 0, nq, 0, nk, p))
    n = keep.size
    assert abs(keep.mean() - (1 - p)) < 5 * np.sqrt(p * (1 - p) / n)


def test_dropout_zero_is_no_dropout(rng):
    q, k, v = make_qkv(rng, 1, 1, 1, 20, 30, 8, 8)
    a = run_forward(q, k, v, dropout_p=0.0, seed=5)
    b = run_forward(q, k, v)
    assert np.array_equal(a[0], b[0])
