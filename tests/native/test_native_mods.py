"""Score mods (mul, softcap, alibi, relbias, chains) and bias (broadcast, -inf), forward and
backward (chain rule through the mods) against the dense reference."""

import numpy as np
import pytest
from _native_helpers import make_qkv, max_err, run_backward, run_forward
from _native_reference import backward as ref_backward
from _native_reference import forward as ref_forward

B, H, HKV, NQ, NK, D = 2, 4, 2, 70, 150, 16


def mods_cases(rng):
    slopes = rng.uniform(0.01, 0.5, size=H)
    table = rng.standard_normal((H, 2 * 7 + 1))
    return {
        "mul": [("mul", 1.7)],
        "softcap": [("softcap", 2.5)],
        "alibi": [("alibi", slopes)],
        "alibi_bh": [("alibi", rng.uniform(0.01, 0.5, size=(B, H)))],
        "relbias": [("relbias", table, 7)],
        "relbias_shared": [("relbias", table[:1], 7)],
        "chain": [("mul", 0.8), ("relbias", table, 7), ("softcap", 3.0), ("alibi", slopes), ("mul", 1.3)],
    }


@pytest.mark.parametrize("name", ["mul", "softcap", "alibi", "alibi_bh", "relbias", "relbias_shared", "chain"])
def test_mods_forward_backward(isa, rng, name):
    mods = mods_cases(rng)[name]
    q, k, v = make_qkv(rng, B, H, HKV, NQ, NK, D, D, scale=2.0)
    scale = D**-0.5
    out, lse = run_forward(q, k, v, mods=tuple(mods), threads=2)
    ro, rl, *_ = ref_forward(q, k, v, scale, mods=mods)
    assert max_err(out, ro) < 1e-12 and max_err(lse, rl) < 1e-11
    dout = rng.standard_normal(out.shape)
    grads = run_backward(q, k, v, out, lse, dout, mods=tuple(mods), threads=2)
    _, _, *want = ref_backward(q, k, v, dout, scale, mods=mods)
    for g, w in zip(grads, want, strict=True):
        assert max_err(g, w) < 1e-10


def test_mods_float32(isa, rng):
    mods = mods_cases(rng)["chain"]
    q, k, v = make_qkv(rng, B, H, HKV, NQ, NK, D, D, np.float32)
    out, lse = run_forward(q, k, v, mods=tuple(mods))
    ro, rl, *_ = ref_forward(q, k, v, D**-0.5, mods=mods)
    assert max_err(out, ro) < 1e-5 and max_err(lse, rl) < 1e-5


@pytest.mark.parametrize("shape", [(B, H, NQ, NK), (1, H, 1, NK), (B, 1, NQ, NK), (1, 1, 1, NK)], ids=str)
def test_bias_broadcast_with_minus_inf(isa, rng, shape):
    q, k, v = make_qkv(rng, B, H, HKV, NQ, NK, D, D)
    bias = rng.standard_normal(shape)
    bias[rng.random(shape) < 0.3] = -np.inf
    if shape[2] > 1:
        bias[..., 5, :] = -np.inf  # a whole row masked: zeros, lse -inf
    scale = D**-0.5
    out, lse = run_forward(q, k, v, bias=bias, mods=(("mul", 1.1),))
    ro, rl, *_ = ref_forward(q, k, v, scale, bias=bias, mods=[("mul", 1.1)])
    assert max_err(out, ro) < 1e-12 and max_err(lse, rl) < 1e-11
    dout = rng.standard_normal(out.shape)
    grads = run_backward(q, k, v, out, lse, dout, bias=bias, mods=(("mul", 1.1),))
    _, _, *want = ref_backward(q, k, v, dout, scale, bias=bias, mods=[("mul", 1.1)])
    for g, w in zip(grads, want, strict=True):
        assert max_err(g, w) < 1e-10


def test_bias_strided_and_half(isa, rng):
    import torch

    q, k, v = make_qkv(rng, 1, 2, 2, 40, 90, 16, 16, np.float32)
    big = rng.standard_normal((1, 2, 90, 200)).astype(np.float32)
    bias = big[:, :, 5:45, ::2][..., :90]  # non-unit last stride
    out, lse = run_forward(q, k, v, bias=bias)
    ro, rl, *_ = ref_forward(q, k, v, 0.25, bias=bias)
    assert max_err(out, ro) < 1e-5
    out2, _ = run_forward(q, k, v, bias=torch.from_numpy(np.ascontiguousarray(bias)).to(torch.bfloat16))
    ro2, *_ = ref_forward(q, k, v, 0.25, bias=torch.from_numpy(np.ascontiguousarray(bias)).to(torch.bfloat16).double())
    assert max_err(out2, ro2) < 1e-5
