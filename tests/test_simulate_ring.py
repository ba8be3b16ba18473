"""simulate_ring: the ring on virtual ranks in one process assembles exact attention, step by step;
and qkv.complexity.communication predicts the bytes the ring and Ulysses send."""

import json

import numpy as np
import pytest

import oracle as O
from helpers import HAS_TORCH, assert_close, assert_close_to_golden
from qkv import complexity
from qkv.errors import ArgumentError, DTypeError, ShapeError

pytestmark = pytest.mark.skipif(not HAS_TORCH, reason="qkv.distributed needs torch")

CASES = [  # h, hkv, nq, nk, world, causal, layout
    pytest.param(2, 2, 8, 8, 1, True, "contiguous", id="w1-causal"),
    pytest.param(2, 2, 8, 8, 2, False, "contiguous", id="w2-dense"),
    pytest.param(4, 2, 12, 12, 3, True, "contiguous", id="w3-gqa-causal"),
    pytest.param(4, 1, 12, 12, 3, True, "zigzag", id="w3-mqa-causal-zigzag"),
    pytest.param(2, 2, 16, 16, 4, True, "zigzag", id="w4-causal-zigzag"),
    pytest.param(4, 2, 16, 16, 4, False, "zigzag", id="w4-gqa-dense-zigzag"),
    pytest.param(2, 1, 8, 16, 4, True, "contiguous", id="w4-causal-nq<nk"),
    pytest.param(2, 2, 8, 16, 2, True, "zigzag", id="w2-causal-nq<nk-zigzag"),
]


def make(rng, h, hkv, nq, nk, dv=3):
    return (
        rng.standard_normal((2, h, nq, 5)),
        rng.standard_normal((2, hkv, nk, 5)),
        rng.standard_normal((2, hkv, nk, dv)),
    )


def positions(segs):
    return np.concatenate([np.arange(s, s + n) for s, n in segs])


@pytest.mark.parametrize("h,hkv,nq,nk,world,causal,layout", CASES)
def test_simulated_ring_is_exact_attention(rng, h, hkv, nq, nk, world, causal, layout):
    from qkv.distributed import simulate_ring

    q, k, v = make(rng, h, hkv, nq, nk)
    allowed = O.causal_allowed(nq, nk) if causal else None
    golden, _, golden_lse = O.attention_oracle(q, k, v, allowed)
    sim = simulate_ring(q, k, v, world, causal, layout=layout)
    assert_close(sim.out, golden, tol=1e-12, name="out")
    assert_close(sim.lse, golden_lse, tol=1e-12, name="lse")
    assert len(sim.steps) == world * world


@pytest.mark.parametrize("h,hkv,nq,nk,world,causal,layout", CASES[2:6])
def test_each_step_holds_attention_over_the_blocks_seen_so_far(rng, h, hkv, nq, nk, world, causal, layout):
    """Step t of rank r: partial = attention over block (r - t) mod W; merged = over the blocks seen so far."""
    from qkv.distributed import simulate_ring

    q, k, v = make(rng, h, hkv, nq, nk)
    allowed = O.causal_allowed(nq, nk) if causal else np.ones((nq, nk), dtype=bool)
    sim = simulate_ring(q, k, v, world, causal, layout=layout)
    for s in sim.steps:
        assert s.kv_rank == (s.rank - s.step) % world
        qi, kj = positions(s.q_segments), positions(s.kv_segments)
        seen = np.concatenate([positions(t.kv_segments) for t in sim.steps if t.rank == s.rank and t.step <= s.step])
        part, _, part_lse = O.attention_oracle(q[..., qi, :], k[..., kj, :], v[..., kj, :], allowed[np.ix_(qi, kj)])
        assert_close(s.out, part, tol=1e-12, name=f"rank {s.rank} step {s.step} out")
        assert_close(s.lse, part_lse, tol=1e-12, name=f"rank {s.rank} step {s.step} lse")
        merged, _, merged_lse = O.attention_oracle(
            q[..., qi, :], k[..., seen, :], v[..., seen, :], allowed[np.ix_(qi, seen)]
        )
        assert_close(s.merged_out, merged, tol=1e-12, name=f"rank {s.rank} step {s.step} merged")
        assert_close(s.merged_lse, merged_lse, tol=1e-12, name=f"rank {s.rank} step {s.step} merged lse")
        assert s.skipped == (not allowed[np.ix_(qi, kj)].any())
        assert s.pairs == int(allowed[np.ix_(qi, kj)].sum())


def test_causal_contiguous_skips_exactly_the_blocks_of_later_ranks(rng):
    from qkv.distributed import simulate_ring

    sim = simulate_ring(*make(rng, 2, 2, 16, 16), 4, True)
    assert [(s.kv_rank, s.skipped) for s in sim.steps if s.rank == 1] == [(1, False), (0, False), (3, True), (2, True)]
    later = {(r, s) for r in range(4) for s in range(4) if s > r}
    assert {(s.rank, s.kv_rank) for s in sim.steps if s.skipped} == later
    skipped = [s for s in sim.steps if s.skipped]
    assert all((s.out == 0).all() and np.isneginf(s.lse).all() for s in skipped)


def test_zigzag_balances_causal_work_and_skips_nothing(rng):
    from qkv.distributed import simulate_ring

    sim = simulate_ring(*make(rng, 2, 2, 16, 16), 4, True, layout="zigzag")
    work = [sum(s.pairs for s in sim.steps if s.rank == r) for r in range(4)]
    assert work == [16 * 17 // 2 // 4] * 4 and not any(s.skipped for s in sim.steps)
    contiguous = simulate_ring(*make(rng, 2, 2, 16, 16), 4, True)
    assert [sum(s.pairs for s in contiguous.steps if s.rank == r) for r in range(4)] == [10, 26, 42, 58]


def test_torch_in_torch_out():
    import torch

    from qkv.distributed import simulate_ring

    rng = np.random.default_rng(0)
    q, k, v = make(rng, 4, 2, 8, 8)
    tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    sim = simulate_ring(tq, tk, tv, 2, True, layout="zigzag")
    assert isinstance(sim.out, torch.Tensor) and sim.out.dtype == torch.float64 and not sim.out.requires_grad
    assert_close(sim.out, O.attention_oracle(q, k, v, O.causal_allowed(8, 8))[0], tol=1e-12)
    f32 = simulate_ring(*(x.float() for x in (tq, tk, tv)), 2, True)
    assert f32.out.dtype == torch.float32
    assert_close(f32.out, sim.out.detach(), tol=1e-5)


def test_bfloat16_ring_accumulates_in_float32_and_returns_bfloat16(rng):
    """Within 2x the error of qkv's reference impl in bfloat16 (which computes in float32 and rounds once)."""
    import torch

    import qkv
    from qkv.distributed import simulate_ring

    t = [torch.tensor(x, dtype=torch.bfloat16) for x in make(rng, 4, 2, 16, 16, dv=8)]
    sim = simulate_ring(*t, 4, True, layout="zigzag")
    assert sim.out.dtype == torch.bfloat16 and sim.lse.dtype == torch.float32
    golden = O.attention_oracle(*(x.double().numpy() for x in t), O.causal_allowed(16, 16))[0]
    baseline = qkv.attention(*t, causal=True, impl="reference")
    assert_close_to_golden(sim.out, golden, baseline, factor=2.0)


def test_record_is_json_safe(rng):
    from qkv.distributed import simulate_ring

    d = simulate_ring(*make(rng, 1, 1, 4, 4), 2, True).to_dict()
    text = json.dumps(d, allow_nan=False)  # -inf lse of skipped steps becomes null
    back = json.loads(text)
    assert len(back["steps"]) == 4 and back["steps"][3]["skipped"] is False
    assert back["steps"][1] == {**back["steps"][1], "rank": 0, "step": 1, "kv_rank": 1, "skipped": True}
    assert back["steps"][1]["lse"][0][0] == [None, None]


@pytest.mark.parametrize(
    "world,layout,causal", [(2, "contiguous", False), (4, "zigzag", True), (3, "contiguous", True)]
)
def test_communication_predicts_the_simulated_ring_bytes(rng, world, layout, causal):
    from qkv.distributed import simulate_ring

    q, k, v = make(rng, 4, 2, 24, 24)
    for dtype in (np.float64, np.float32):
        sim = simulate_ring(*(x.astype(dtype) for x in (q, k, v)), world, causal, layout=layout)
        pred = complexity.communication(
            24,
            d_k=5,
            d_v=3,
            heads=4,
            kv_heads=2,
            batch=2,
            dtype=np.dtype(dtype).name,
            world_size=world,
            layout=layout,
            causal=causal,
        )
        for r in range(world):
            sent = [s.bytes_sent for s in sim.steps if s.rank == r and s.bytes_sent]
            assert tuple(sent) == pred.bytes_per_step and sum(sent) == pred.bytes_per_rank
            assert sum(s.pairs for s in sim.steps if s.rank == r) * 2 * 4 == pred.work_per_rank[r]


def test_communication_model_numbers():
    ring = complexity.communication(4096, d_k=64, heads=8, kv_heads=2, world_size=4, dtype="bfloat16", backward=True)
    kv = 1 * 2 * 1024 * 128  # B · Hkv · N/W · (Dk + Dv)
    assert ring.bytes_per_step == (kv * 2,) * 3 + (kv * (2 + 4),) * 3 + (kv * 4,)  # gradients travel in float32
    assert ring.steps == 7 and ring.total_bytes == 4 * ring.bytes_per_rank
    uly = complexity.communication(4096, d_k=64, heads=8, kv_heads=4, world_size=4, scheme="ulysses")
    q_bytes = 8 * 1024 * 64 * 4 * 3 // 4
    assert uly.bytes_per_step == (q_bytes, q_bytes // 2, q_bytes // 2, q_bytes)
    assert uly.to_dict()["bytes_per_step"] == list(uly.bytes_per_step)
    json.dumps(uly.to_dict(), allow_nan=False)
    zz = complexity.communication(64, world_size=4, causal=True, layout="zigzag").work_per_rank
    assert len(set(zz)) == 1 and sum(zz) == 64 * 65 // 2
    assert complexity.communication(64, world_size=1).bytes_per_rank == 0


@pytest.mark.parametrize(
    "kwargs,error,words",
    [
        ({"world_size": 0}, ArgumentError, "world_size must be an integer >= 1"),
        ({"world_size": 3}, ShapeError, "n=64 does not divide into 3"),
        ({"world_size": 4, "layout": "zigzag", "n": 36}, ShapeError, "n=36 does not divide into 8"),
        ({"scheme": "tree"}, ArgumentError, "scheme must be one of"),
        ({"scheme": "ulysses", "layout": "zigzag"}, ArgumentError, "layout must be one of"),
        ({"scheme": "ulysses", "heads": 6, "world_size": 4}, ShapeError, "heads=6 does not divide by world_size=4"),
        ({"scheme": "ulysses", "heads": 8, "kv_heads": 2, "world_size": 4}, ShapeError, "kv_heads=2"),
        ({"dtype": "int8"}, DTypeError, "dtype must be one of"),
    ],
)
def test_communication_rejects_bad_configurations(kwargs, error, words):
    kwargs = {"n": 64, **kwargs}
    with pytest.raises(error, match=words):
        complexity.communication(**kwargs)


@pytest.mark.parametrize(
    "kwargs,error,words",
    [
        ({"world_size": 0}, ArgumentError, "world_size must be an integer >= 1"),
        ({"world_size": 3}, ShapeError, r"q has N=8 positions on axis -2, which does not divide into world size 3"),
        ({"world_size": 4, "layout": "zigzag"}, ShapeError, r"2 · world size = 8 chunks \(zigzag layout\)"),
        ({"world_size": 2, "layout": "ring"}, ArgumentError, "layout must be one of"),
        ({"world_size": 2, "causal": "yes"}, ArgumentError, "causal must be True or False"),
    ],
)
def test_simulate_ring_rejects_bad_arguments(kwargs, error, words):
    from qkv.distributed import simulate_ring

    q = np.zeros((1, 8, 4))
    k = np.zeros((1, 12, 4))
    with pytest.raises(error, match=words):
        simulate_ring(q, k, k, **kwargs)
