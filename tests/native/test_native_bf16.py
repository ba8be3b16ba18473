"""bfloat16 inputs on every ISA path, above all the ``avx512bf16`` path (vdpbf16ps: pairs of bf16
along Dk for S = K Q^T, P rounded to bf16 and pairs of keys for O += P V; kernels_avx512bf16.cpp).

The bound each output is held to, from the contract ("half precision accumulating in float32"):
products of bf16 are exact in float32 and summed in float32, P is rounded once to bf16 (relative
error <= u = 2^-8), the output once to bf16. So against the float64 oracle on the same bf16
inputs, |out - gold| <= u max|v| + u |gold| (+ float32 sums), and lse (float32, untouched by the P
rounding) to float32 accuracy. Cross-path agreement follows: two such results differ by at most
u max|v| plus one bf16 ulp (2u |out|).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from _native_helpers import kernel_mods
from _native_reference import dense_allowed, keep_mask
from _native_reference import forward as ref_forward

from qkv import _native as native

U = 2.0**-8  # bf16 unit roundoff (8 significant bits)
BF16_PATH = "avx512bf16"


def cpu_has_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " avx512_bf16" in line for line in f)
    except OSError:
        return False


def bf16(rng, shape, scale=1.0):
    return torch.from_numpy(rng.standard_normal(shape) * scale).to(torch.bfloat16)


def forward(q, k, v, scale=None, threads=2, **kw):
    out = torch.empty((*q.shape[:3], v.shape[3]), dtype=torch.bfloat16)
    lse = torch.empty(q.shape[:3], dtype=torch.float32)
    counts = native.forward(
        q, k, v, out, lse, scale=q.shape[3] ** -0.5 if scale is None else scale, threads=threads, **kw
    )
    return out.double().numpy(), lse.double().numpy(), counts


def oracle(q, k, v, scale=None, **kw):
    gold, gl, *_ = ref_forward(
        q.double().numpy(), k.double().numpy(), v.double().numpy(), scale or q.shape[3] ** -0.5, **kw
    )
    return gold, gl


def assert_within_contract(out, lse, gold, gl, v):
    vmax = float(v.double().abs().max()) if v.numel() else 0.0
    fin = np.isfinite(gold)
    assert np.array_equal(np.isneginf(lse), np.isneginf(gl)), "-inf lse pattern differs"
    err = np.abs(out - gold)[fin]
    bound = (U * vmax + U * np.abs(gold) + 1e-6)[fin]
    assert (err <= bound).all(), f"max excess {float((err - bound).max())}"
    ok = np.isfinite(gl)
    assert (np.abs(lse[ok] - gl[ok]) <= 1e-5 * (1 + np.abs(gl[ok]))).all()


def assert_paths_agree(a, b, v):
    vmax = float(v.double().abs().max()) if v.numel() else 0.0
    assert np.array_equal(np.isnan(a), np.isnan(b))
    fin = ~np.isnan(a)
    assert (np.abs(a - b)[fin] <= U * vmax + 2 * U * np.maximum(np.abs(a), np.abs(b))[fin] + 1e-6).all()


needs_bf16 = pytest.mark.skipif(BF16_PATH not in native.isas(), reason="this CPU has no AVX512-BF16 path")


# ------------------------------------------------------------------ which path runs


def test_offered_exactly_when_the_cpu_has_avx512_bf16():
    assert (BF16_PATH in native.isas()) == cpu_has_bf16()
    if cpu_has_bf16():
        assert native.isas()[0] == BF16_PATH  # best first: chosen by default
        with native.use_isa(BF16_PATH):
            assert native.isa() == BF16_PATH


def _isas_in_subprocess(env_extra):
    code = "from qkv import _native as n; print(n.isa(), ','.join(n.isas()))"
    env = {**os.environ, **env_extra}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    current, isas = r.stdout.split()
    return current, isas.split(",")


def test_not_offered_without_the_cpu_flag():
    # QKV_NATIVE_HIDE makes dispatch.cpp treat the CPU as lacking a feature: the path is then not
    # offered, a QKV_NATIVE_ISA naming it falls back to the best remaining path, and hiding
    # avx512 hides avx512bf16 with it (it needs both)
    full = native.isas()
    cur, isas = _isas_in_subprocess({"QKV_NATIVE_HIDE": BF16_PATH, "QKV_NATIVE_ISA": BF16_PATH})
    assert BF16_PATH not in isas and isas == [x for x in full if x != BF16_PATH] and cur == isas[0]
    cur, isas = _isas_in_subprocess({"QKV_NATIVE_HIDE": "avx512"})
    assert BF16_PATH not in isas and "avx512" not in isas and cur == isas[0]


@needs_bf16
def test_bf16_path_runs_its_own_code_and_float32_is_the_avx512_code(rng):
    q, k, v = bf16(rng, (1, 2, 100, 64)), bf16(rng, (1, 2, 300, 64)), bf16(rng, (1, 2, 300, 64))
    with native.use_isa(BF16_PATH):
        a, la, _ = forward(q, k, v)
    with native.use_isa("avx512"):
        b, lb, _ = forward(q, k, v)
    assert not np.array_equal(a, b)  # P rounded to bf16 on one path only
    assert_paths_agree(a, b, v)
    q32, k32, v32 = (x.float() for x in (q, k, v))
    outs = []
    for isa in (BF16_PATH, "avx512"):
        out, lse = torch.empty(1, 2, 100, 64), torch.empty(1, 2, 100)
        with native.use_isa(isa):
            native.forward(q32, k32, v32, out, lse, scale=0.125, threads=2)
        outs.append((out, lse))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


# ------------------------------------------------------------------ accuracy, every path

SHAPES = [  # B, H, Hkv, Nq, Nk, Dk, Dv: odd Dk (a half pair), odd Nk (a half key pair), tile edges
    (1, 1, 1, 1, 1, 1, 1),
    (1, 2, 1, 37, 59, 3, 5),
    (1, 2, 2, 15, 17, 65, 64),
    (2, 4, 2, 130, 200, 64, 64),
    (1, 3, 3, 65, 129, 59, 80),
    (1, 2, 1, 17, 255, 96, 33),
    (1, 4, 1, 63, 127, 128, 128),  # MQA
    (1, 1, 1, 129, 257, 2, 16),
    (1, 8, 2, 1, 385, 64, 64),  # decode, 4 query heads per kv head
    (1, 32, 1, 2, 130, 32, 16),  # decode, 64 stacked rows: the wide tile loop
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_bf16_within_the_contract_on_every_path(isa, rng, shape):
    b, h, hkv, nq, nk, dk, dv = shape
    q, k, v = bf16(rng, (b, h, nq, dk), 1.5), bf16(rng, (b, hkv, nk, dk), 1.5), bf16(rng, (b, hkv, nk, dv))
    out, lse, counts = forward(q, k, v)
    assert counts == (0, 0)
    assert_within_contract(out, lse, *oracle(q, k, v), v)


@needs_bf16
@pytest.mark.parametrize("nk", [1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 255, 256, 257])
def test_cross_path_agreement_at_tile_edges(rng, nk):
    q, k, v = bf16(rng, (1, 4, 70, 33)), bf16(rng, (1, 2, nk, 33)), bf16(rng, (1, 2, nk, 31), 4.0)
    res = {}
    for isa in native.isas():
        with native.use_isa(isa):
            res[isa] = forward(q, k, v)
    gold, gl = oracle(q, k, v)
    for out, lse, _ in res.values():
        assert_within_contract(out, lse, gold, gl, v)
        assert_paths_agree(out, res["avx512"][0], v)


def _intervals(nq, nk, kind):
    p = np.arange(nq) + (nk - nq)
    lo = {"causal": np.zeros(nq), "window": p - 40, "docs": np.where(p < nk // 2, 0, nk // 2)}[kind]
    return np.broadcast_to(np.stack([lo, p + 1], -1).astype(np.int32), (1, 2, nq, 2)).copy()


@pytest.mark.parametrize("kind", ["causal", "window", "docs"])
@pytest.mark.parametrize("nq,nk", [(150, 150), (9, 260), (70, 700)])
def test_masks(isa, rng, kind, nq, nk):
    q, k, v = bf16(rng, (1, 2, nq, 24)), bf16(rng, (1, 1, nk, 24)), bf16(rng, (1, 1, nk, 17))
    rows = _intervals(nq, nk, kind)
    bq, bk = native.tile_shape(nq, nk, 24, 17, "bfloat16")
    out, lse, _ = forward(q, k, v, rows=rows)
    assert_within_contract(out, lse, *oracle(q, k, v, allowed=dense_allowed(1, 2, nq, nk, bq, bk, rows=rows)), v)


def test_classes_bitmaps_bias_and_mods(isa, rng):
    nq, nk, d = 140, 290, 21
    q, k, v = bf16(rng, (2, 2, nq, d), 2.0), bf16(rng, (2, 2, nk, d), 2.0), bf16(rng, (2, 2, nk, d))
    bq, bk = native.tile_shape(nq, nk, d, d, "bfloat16")
    nbq, nbk = -(-nq // bq), -(-nk // bk)
    tc = rng.choice(np.array([0, 1, 2], np.int8), size=(1, 2, nbq, nbk), p=(0.2, 0.5, 0.3))
    bitmaps = rng.integers(0, 2**63, size=(3, bq, -(-bk // 64)), dtype=np.uint64)
    bi = rng.integers(-1, 3, size=(2, 2, nbq, nbk)).astype(np.int32)
    allowed = dense_allowed(2, 2, nq, nk, bq, bk, tile_class=tc, bitmap_index=bi, bitmaps=bitmaps)
    bias = rng.standard_normal((1, 2, nq, nk)).astype(np.float32)
    mods = [("softcap", 5.0), ("alibi", np.array([0.1, 0.3]))]
    kw = dict(tile_class=tc, bitmap_index=bi, bitmaps=bitmaps, bias=bias, mods=kernel_mods(mods))
    out, lse, _ = forward(q, k, v, **kw)
    gold, gl = oracle(q, k, v, allowed=allowed, bias=bias.astype(np.float64), mods=mods)
    assert_within_contract(out, lse, gold, gl, v)


# ------------------------------------------------------------------ non-finite inputs


@needs_bf16
@pytest.mark.parametrize("dk", [16, 7])
def test_non_finite_rows_and_counts_match_the_other_paths(rng, dk):
    nq, nk = 90, 300
    q, k, v = bf16(rng, (1, 2, nq, dk)), bf16(rng, (1, 1, nk, dk)), bf16(rng, (1, 1, nk, 8))
    q[0, 0, 5, 1] = float("nan")
    q[0, 1, 40, dk - 1] = float("inf")  # the last (half) pair of an odd Dk
    k[0, 0, 3, dk - 1] = float("-inf")
    k[0, 0, 260, 0] = float("nan")  # hidden from rows < 50 by the causal mask
    v[0, 0, 230, 4] = float("inf")  # hidden from rows < 20
    rows = _intervals(nq, nk, "causal")
    rows[0, :, :, 0] = 4  # k row 3 hidden from every row: its -inf changes nothing
    res = {isa: None for isa in native.isas()}
    for isa in res:
        with native.use_isa(isa):
            res[isa] = forward(q, k, v, rows=rows)
    ref_out, ref_lse, ref_counts = res["avx512"]
    assert ref_counts[0] > 0 and np.isnan(ref_out).any() and not np.isnan(ref_out).all()
    for out, lse, counts in res.values():
        assert counts == ref_counts
        assert np.array_equal(np.isnan(lse), np.isnan(ref_lse))
        assert_paths_agree(out, ref_out, torch.nan_to_num(v.float(), posinf=0))


# ------------------------------------------------------------------ exact spans, paired lane groups
# The avx512bf16 forward runs attention_fwd.hpp's tile loop (fwd_tiles) over its vdpbf16ps dot
# products: each pair of 16-row lane groups loops over the union of its rows' intervals, started
# at an even key of the range read (keys are paired for P V), and shares each K / V broadcast.
# Held against the oracle and against the avx512 path (same loop, float32 dot products).

SPAN_EDGES = [(1, 1), (15, 17), (16, 16), (17, 15), (63, 65), (64, 64), (65, 63), (127, 129), (128, 128), (129, 127)]
HEADS = [(2, 2), (4, 2), (8, 1)]  # MHA (pairs: 32 positions), 2 and 8 stacked GQA heads per kv head


def _spans_rows(rng, h, nq, nk, kind):
    p = np.arange(nq) + (nk - nq)
    if kind == "causal":
        lo, hi = np.zeros(nq), p + 1
    elif kind == "window":  # odd width: span starts move by one key per row
        lo, hi = p - 36, p + 1
    else:  # random intervals per head and row: spans start and end anywhere, odd or even
        lo = rng.integers(-3, nk, size=(h, nq))
        hi = lo + rng.integers(0, nk // 2 + 2, size=(h, nq))
        return np.stack([lo, hi], -1).astype(np.int32)[None]
    return np.broadcast_to(np.stack([lo, hi], -1).astype(np.int32), (1, h, nq, 2)).copy()


def _both_paths(q, k, v, **kw):
    res = {}
    for isa in (BF16_PATH, "avx512"):
        with native.use_isa(isa):
            res[isa] = forward(q, k, v, **kw)
    return res


def _rows_match_oracle_on_both_paths(q, k, v, rows):
    """Both paths within the contract of the float64 oracle under these row intervals, nothing
    reported non-finite, and agreeing with each other."""
    (_, h, nq, _), nk = q.shape, k.shape[2]
    res = _both_paths(q, k, v, rows=rows)
    gold, gl = oracle(q, k, v, allowed=dense_allowed(1, h, nq, nk, 1, 1, rows=rows))
    for out, lse, counts in res.values():
        assert counts == (0, 0)
        assert_within_contract(out, lse, gold, gl, v)
    assert_paths_agree(res[BF16_PATH][0], res["avx512"][0], v)


@needs_bf16
@pytest.mark.parametrize("kind", ["causal", "window", "random"])
@pytest.mark.parametrize("h,hkv", HEADS, ids=lambda x: str(x))
@pytest.mark.parametrize("nq,nk", SPAN_EDGES, ids=lambda x: str(x))
def test_spans_at_tile_edges_match_the_oracle_and_avx512(rng, nq, nk, h, hkv, kind):
    q, k, v = bf16(rng, (1, h, nq, 19), 1.5), bf16(rng, (1, hkv, nk, 19), 1.5), bf16(rng, (1, hkv, nk, 23))
    rows = _spans_rows(rng, h, nq, nk, kind)
    _rows_match_oracle_on_both_paths(q, k, v, rows)


@needs_bf16
@pytest.mark.parametrize("dk,dv", [(64, 64), (128, 128), (1, 3), (33, 17)])
def test_gqa_causal_long_rows(rng, dk, dv):
    # 4 query heads per kv head stacked in one item, causal over several 128-key tiles, Nq < Nk
    h, hkv, nq, nk = 8, 2, 200, 333
    q, k, v = bf16(rng, (1, h, nq, dk)), bf16(rng, (1, hkv, nk, dk)), bf16(rng, (1, hkv, nk, dv), 2.0)
    rows = _spans_rows(rng, h, nq, nk, "causal")
    _rows_match_oracle_on_both_paths(q, k, v, rows)


@needs_bf16
@pytest.mark.parametrize("nq", [2, 16])  # decode calls with > 8 stacked rows: the wide loop from any key
def test_decode_rows_with_windows(rng, nq):
    h, hkv, nk = 32, 2, 1000
    q, k, v = bf16(rng, (1, h, nq, 32)), bf16(rng, (1, hkv, nk, 32)), bf16(rng, (1, hkv, nk, 24))
    p = np.arange(nq) + nk - nq
    rows = np.broadcast_to(np.stack([p - 300, p + 1], -1).astype(np.int32), (1, h, nq, 2)).copy()
    rows[0, 1::3, :, 0] += 7  # odd starts on some heads
    _rows_match_oracle_on_both_paths(q, k, v, rows)


@needs_bf16
def test_spans_with_bias_mods_and_dropout(rng):
    h, hkv, nq, nk, d, p, seed = 4, 2, 90, 170, 24, 0.2, 77
    q, k, v = bf16(rng, (1, h, nq, d), 2.0), bf16(rng, (1, hkv, nk, d), 2.0), bf16(rng, (1, hkv, nk, d))
    rows = _spans_rows(rng, h, nq, nk, "random")
    bias = rng.standard_normal((1, h, nq, nk)).astype(np.float32)
    mods = [("softcap", 4.0), ("alibi", np.array([0.1, 0.2, 0.05, 0.3]))]
    kw = dict(rows=rows, bias=bias, mods=kernel_mods(mods), dropout_p=p, seed=seed)
    res = _both_paths(q, k, v, **kw)
    keep = keep_mask(native.philox_keep, seed, 1, h, nq, nk, p)
    allowed = dense_allowed(1, h, nq, nk, 1, 1, rows=rows)
    gold, gl, *_ = ref_forward(
        *(x.double().numpy() for x in (q, k, v)), d**-0.5, allowed=allowed, bias=bias, mods=mods, keep=keep, p=p
    )
    v_kept = v / (1 - p)  # the kept weights sum to at most 1 / (1 - p): the bound scales with it
    for out, lse, counts in res.values():
        assert counts == (0, 0)
        assert_within_contract(out, lse, gold, gl, v_kept)
    assert_paths_agree(res[BF16_PATH][0], res["avx512"][0], v_kept)


@needs_bf16
def test_non_finite_rows_at_the_edges_of_odd_spans(rng):
    # H=2 heads of one kv head: an item is 2 pairs of lane groups, positions 0-15 and 16-31 of both
    # heads. Pair 0 attends keys [101, 230), pair 1 [100, 231): the bf16 loop starts pair 0 at
    # key 100 too (keys paired from the range's start) and packs V up to key 230; neither key may
    # reach pair 0's rows, and keys 99 and 231 (outside every span) reach no row
    nq, nk, d = 32, 300, 16
    q, k, v = bf16(rng, (1, 2, nq, d)), bf16(rng, (1, 1, nk, d)), bf16(rng, (1, 1, nk, 8))
    lo = np.where(np.arange(nq) < 16, 101, 100)
    rows = np.broadcast_to(np.stack([lo, lo + 129 + (lo == 100)], -1).astype(np.int32), (1, 2, nq, 2)).copy()
    allowed = dense_allowed(1, 2, nq, nk, 1, 1, rows=rows)
    k[0, 0, 99, 3] = float("nan")
    v[0, 0, 231, 1] = float("inf")
    res = _both_paths(q, k, v, rows=rows)
    gold, gl = oracle(q, k, v, allowed=allowed)
    for out, lse, counts in res.values():
        assert counts == (0, 0) and np.isfinite(out).all()
        assert_within_contract(out, lse, gold, gl, v[:, :, 100:231])
    k[0, 0, 100, 0] = float("inf")
    v[0, 0, 230, 2] = float("nan")
    res = _both_paths(q, k, v, rows=rows)
    good = slice(0, 16)
    gold, gl = oracle(q[:, :, good], k, v, allowed=allowed[:, :, good])
    for out, lse, counts in res.values():
        assert counts == (2 * 16, 0)
        assert np.isnan(out[:, :, 16:]).all() and np.isnan(lse[:, :, 16:]).all()
        assert_within_contract(out[:, :, good], lse[:, :, good], gold, gl, v[:, :, 101:230])
