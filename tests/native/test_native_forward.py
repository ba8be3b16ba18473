"""Forward pass against the dense float64 reference: every ISA path, every dtype, odd sizes,
grouped heads, broadcast and strided inputs, NumPy / torch / JAX arrays, threads."""

import numpy as np
import pytest
import torch
from _native_helpers import make_qkv, max_err, run_forward, torch_forward, torch_naive
from _native_reference import forward as ref_forward

from qkv import _native as native

SHAPES = [  # B, H, Hkv, Nq, Nk, Dk, Dv
    (1, 1, 1, 1, 1, 1, 1),
    (1, 2, 1, 37, 59, 3, 5),
    (2, 4, 2, 130, 200, 64, 64),
    (1, 3, 3, 65, 129, 59, 80),
    (1, 2, 1, 17, 300, 96, 33),
    (1, 4, 1, 70, 40, 128, 128),  # MQA, Nq > Nk
    (1, 1, 1, 20, 260, 256, 16),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_float64_matches_reference(isa, rng, shape):
    b, h, hkv, nq, nk, dk, dv = shape
    q, k, v = make_qkv(rng, b, h, hkv, nq, nk, dk, dv)
    out, lse = run_forward(q, k, v, threads=2)
    ro, rl, *_ = ref_forward(q, k, v, 1 / np.sqrt(dk))
    assert max_err(out, ro) < 1e-12
    assert max_err(lse, rl) < 1e-12


TOL_DTYPES = ["float32", "float16", "bfloat16"]


@pytest.mark.parametrize("dtype", TOL_DTYPES)
@pytest.mark.parametrize("shape", [(1, 4, 2, 100, 150, 64, 48), (2, 2, 1, 8, 333, 80, 64)], ids=str)
def test_half_and_single_within_twice_the_naive_error(isa, rng, dtype, shape):
    b, h, hkv, nq, nk, dk, dv = shape
    tdt = getattr(torch, dtype)
    q, k, v = (torch.from_numpy(x).to(tdt) for x in make_qkv(rng, b, h, hkv, nq, nk, dk, dv, scale=1.5))
    scale = dk**-0.5
    out, lse = torch_forward(q, k, v, threads=2, scale=scale)
    assert out.dtype == tdt and lse.dtype == torch.float32
    gold, gl, *_ = ref_forward(q.double().numpy(), k.double().numpy(), v.double().numpy(), scale)
    naive = torch_naive(q, k, v, scale)
    base = max_err(naive.double().numpy(), gold)
    assert max_err(out.double().numpy(), gold) <= 2 * base + 1e-7
    assert max_err(lse.double().numpy(), gl) <= max(2 * base, 1e-5)


def test_float32_exp_is_accurate(isa, rng):
    # scores spread over a wide range: the vectorised exp2 must stay at float32 rounding
    q, k, v = make_qkv(rng, 1, 2, 2, 64, 300, 16, 16, np.float32, scale=3.0)
    out, lse = run_forward(q, k, v, scale=1.0)
    ro, rl, *_ = ref_forward(q, k, v, 1.0)
    assert max_err(lse, rl) < 2e-5 * max(1.0, np.abs(rl).max())
    assert max_err(out, ro) < 5e-5


def test_broadcast_strides_and_gqa_share_kv(isa, rng):
    # K/V broadcast over the batch with stride 0, q broadcast over heads
    q1 = rng.standard_normal((2, 1, 40, 32))
    k1 = rng.standard_normal((1, 2, 70, 32))
    v1 = rng.standard_normal((1, 2, 70, 24))
    q = np.broadcast_to(q1, (2, 4, 40, 32))
    k = np.broadcast_to(k1, (2, 2, 70, 32))
    v = np.broadcast_to(v1, (2, 2, 70, 24))
    assert k.strides[0] == 0 and q.strides[1] == 0
    out, lse = run_forward(q, k, v)
    ro, rl, *_ = ref_forward(np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v), 32**-0.5)
    assert max_err(out, ro) < 1e-12 and max_err(lse, rl) < 1e-12


def test_non_contiguous_inputs(isa, rng):
    big = rng.standard_normal((2, 6, 90, 48))
    q = big[:, ::3, 5:45, :20]  # strided heads and rows, last axis contiguous
    k = big.transpose(0, 1, 2, 3)[:, 1::3, 10:80, 20:40]
    v = np.swapaxes(rng.standard_normal((2, 70, 2, 16)), 1, 2)  # (B, Hkv, Nk, Dv) with Nk, Hkv swapped in memory
    out, lse = run_forward(q, k, v)
    ro, rl, *_ = ref_forward(q, k, v, 20**-0.5)
    assert max_err(out, ro) < 1e-12 and max_err(lse, rl) < 1e-12


def test_torch_and_numpy_give_identical_bits(rng):
    q, k, v = make_qkv(rng, 1, 2, 1, 50, 90, 32, 32, np.float32)
    out, lse = run_forward(q, k, v)
    t_out, t_lse = torch_forward(*(torch.from_numpy(x) for x in (q, k, v)))
    assert np.array_equal(out, t_out.numpy()) and np.array_equal(lse, t_lse.numpy())


def test_jax_arrays(rng):
    jnp = pytest.importorskip("jax.numpy")
    q, k, v = make_qkv(rng, 1, 2, 2, 30, 45, 16, 8, np.float32)
    out, lse = run_forward(q, k, v)
    j_out = np.empty_like(out)
    j_lse = np.empty_like(lse)
    native.forward(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), j_out, j_lse, scale=16**-0.5)
    assert np.array_equal(out, j_out) and np.array_equal(lse, j_lse)
    qb, kb, vb = (jnp.asarray(x, dtype=jnp.bfloat16) for x in (q, k, v))
    t_out, t_lse = torch_forward(*(torch.from_numpy(np.asarray(x, np.float32)).to(torch.bfloat16) for x in (q, k, v)))
    jb_out = torch.empty_like(t_out)
    jb_lse = torch.empty_like(t_lse)
    native.forward(qb, kb, vb, jb_out, jb_lse, scale=16**-0.5)
    assert torch.equal(jb_out, t_out) and torch.equal(jb_lse, t_lse)


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_threads_agree_and_runs_are_bit_reproducible(isa, rng, dtype):
    tdt = getattr(torch, dtype)
    q, k, v = (torch.from_numpy(x).to(tdt) for x in make_qkv(rng, 2, 3, 1, 150, 260, 40, 24))
    o1, l1 = torch_forward(q, k, v, threads=1)
    o2, l2 = torch_forward(q, k, v, threads=2)
    o2b, l2b = torch_forward(q, k, v, threads=2)
    assert torch.equal(o2, o2b) and torch.equal(l2, l2b)
    assert torch.allclose(o1.double(), o2.double(), atol=1e-2 if dtype == "bfloat16" else 1e-5, rtol=0)
    assert torch.allclose(l1.double(), l2.double(), atol=1e-5, rtol=0)


def test_isa_paths_agree(rng):
    q, k, v = make_qkv(rng, 1, 2, 1, 77, 130, 64, 64, np.float32)
    res = {}
    for p in native.isas():
        with native.use_isa(p):
            res[p] = run_forward(q, k, v)
    for p, (o, lse) in res.items():
        assert max_err(o, res["portable"][0]) < 1e-5, p
        assert max_err(lse, res["portable"][1]) < 1e-5, p


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("nq", [17, 33, 129])
def test_rows_that_overflow_at_the_write_are_counted_and_only_they(isa, rng, dtype, nq):
    """Finite scores, but one value column sums past the largest float: exactly the rows that
    attend two of its huge entries come out NaN and are counted as overflow; every other row
    matches the float64 oracle (the prefill path tells finite rows from the accumulator before
    storing them: attention_fwd.hpp rows_finite)."""
    q, k, v = make_qkv(rng, 1, 2, 1, nq, nq, 16, 24, dtype)
    q[:] = 0  # equal scores: every attended key weighs 1 until the division by l
    j = nq - 9  # under causal, rows > j attend both huge keys j and j + 1
    v[0, 0, [j, j + 1], 5] = np.finfo(dtype).max * 0.9
    i = np.arange(nq)
    rows = np.stack([np.zeros(nq), i + 1], -1).astype(np.int32)[None, None]
    out = np.empty((1, 2, nq, 24), dtype)
    lse = np.empty((1, 2, nq), dtype)
    bad, over = native.forward(q, k, v, out, lse, scale=0.25, rows=rows, threads=2)
    hit = i > j
    assert bad == 0 and over == 2 * hit.sum()
    assert np.isnan(out[:, :, hit]).all() and np.isnan(lse[:, :, hit]).all()
    allowed = i[None, :] <= i[:, None]
    ro, rl, *_ = ref_forward(q, k, v, 0.25, allowed=np.broadcast_to(allowed, (1, 2, nq, nq)))
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(out[:, :, ~hit], ro[:, :, ~hit], rtol=rtol, atol=rtol)
    np.testing.assert_allclose(lse[:, :, ~hit], rl[:, :, ~hit], rtol=rtol, atol=rtol)
