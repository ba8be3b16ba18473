"""Decode (Nq <= 16): split-K across threads merged by lse vs one pass, grouped heads sharing one
pass over K/V, the thin (few rows) and wide layouts, masks and mods on that path."""

import numpy as np
import pytest
import torch
from _native_helpers import make_qkv, max_err, run_forward
from _native_reference import forward as ref_forward


@pytest.mark.parametrize("h,hkv,nq", [(1, 1, 1), (8, 2, 1), (8, 8, 1), (4, 1, 3), (2, 1, 16), (32, 2, 5)])
def test_split_vs_unsplit_vs_reference(isa, rng, h, hkv, nq):
    nk = 1000
    q, k, v = make_qkv(rng, 1, h, hkv, nq, nk, 64, 48, np.float32)
    o1, l1 = run_forward(q, k, v, threads=1)  # one pass
    o2, l2 = run_forward(q, k, v, threads=2)  # split-K when there are fewer row sets than 4 x threads
    o2b, l2b = run_forward(q, k, v, threads=2)
    assert np.array_equal(o2, o2b) and np.array_equal(l2, l2b)
    ro, rl, *_ = ref_forward(q, k, v, 64**-0.5)
    for o, lse in ((o1, l1), (o2, l2)):
        assert max_err(o, ro) < 2e-6 and max_err(lse, rl) < 2e-6


def test_decode_float64_masks_mods(isa, rng):
    nk = 700
    q, k, v = make_qkv(rng, 2, 4, 2, 2, nk, 24, 24)
    rows = np.stack([np.array([[100, 650], [0, 0]])] * 4)[None].repeat(2, 0).astype(np.int32)  # (2, 4, 2, 2)
    rows[1, 2] = [[0, 700], [690, 700]]
    slopes = rng.uniform(0.0, 0.1, 4)
    allowed = np.zeros((2, 4, 2, nk), bool)
    for b in range(2):
        for h in range(4):
            for i in range(2):
                allowed[b, h, i, rows[b, h, i, 0] : rows[b, h, i, 1]] = True
    for threads in (1, 2):
        out, lse = run_forward(q, k, v, rows=rows, mods=(("alibi", slopes),), threads=threads)
        ro, rl, *_ = ref_forward(q, k, v, 24**-0.5, allowed=allowed, mods=[("alibi", slopes)])
        assert max_err(out, ro) < 1e-12 and max_err(lse, rl) < 1e-11


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_decode_half(isa, rng, dtype):
    from _native_helpers import torch_forward, torch_naive

    tdt = getattr(torch, dtype)
    q, k, v = (torch.from_numpy(x).to(tdt) for x in make_qkv(rng, 1, 8, 2, 1, 2000, 64, 64))
    out, _ = torch_forward(q, k, v, threads=2)
    gold, *_ = ref_forward(q.double().numpy(), k.double().numpy(), v.double().numpy(), 0.125)
    base = max_err(torch_naive(q, k, v, 0.125).double().numpy(), gold)
    assert max_err(out.double().numpy(), gold) <= 2 * base + 1e-7
