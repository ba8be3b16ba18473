"""A quantized K/V cache read by the compiled kernel (``_native/quant.hpp``): int8 and float8
(E4M3, E5M2) codes with float32 scales per (batch, kv head, key) or per kv head, queries in
float32 / bfloat16 / float16 / float64 (the last through float64 copies), on every ISA path,
against the float64 oracle over the dequantised cache (code x scale): decode (1-8 rows read in
place, > 8 rows on the wide path), odd and even Dk / Dv, key counts ending mid-block, 1 and 2
threads; prefill chunks over a cache (causal, bottom-right) across tile edges; non-finite codes and
scales in hidden slots (nothing changes) and attended ones (NaN rows, counted). Every path this
CPU runs takes each test (the ``isa`` fixture); CI's ``QKV_REQUIRE_ISAS=cpu`` (tests/requirements.py)
fails the run when the build lost one.

The codes are made here by a small local quantizer (int8: round half to even of x / scale, clamped
to [-127, 127]; float8: torch's float8 dtypes), independent of the kernel."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import oracle as O
from qkv import _native as native

FORMATS = ("i8", "e4m3", "e5m2")
FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
QDTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
# the tolerance of a float cache in the compute type (float64 q: the dequantised values are exact
# products there), plus the output's own rounding (half an ulp) for half outputs
TOL = {"float32": 4e-6, "bfloat16": 4e-6, "float16": 4e-6, "float64": 1e-11}
OUT_EPS = {"float32": 0.0, "bfloat16": 2.0**-8, "float16": 2.0**-11, "float64": 0.0}


def kv_format(fmt):
    return native.KvFormat[fmt.upper()]


def quantize(x, fmt, per_head=False):
    """x (B, Hkv, N, D) float64 -> (codes int8 / uint8, scale float32 (B, Hkv, N) or (B, Hkv, 1))."""
    amax = x.abs().amax(dim=(-2, -1) if per_head else -1)
    if per_head:
        amax = amax[..., None]
    top = 127.0 if fmt == "i8" else FP8_MAX[fmt]
    scale = (amax / top).float()
    scale[scale == 0] = 1.0
    y = x / scale.double()[..., None]
    if fmt == "i8":
        return torch.round(y).clamp(-127, 127).to(torch.int8), scale  # round half to even
    return y.to(FP8[fmt]).view(torch.uint8), scale


def dequantize(codes, scale, fmt):
    """The stored cache's values in float64 (exact products of the codes and float32 scales)."""
    v = codes.double() if fmt == "i8" else codes.view(FP8[fmt]).double()
    return v * scale.double()[..., None]


def make(rng_seed, b, h, hkv, nq, nk, dk, dv, fmt, qdtype, per_head=False):
    g = torch.Generator().manual_seed(rng_seed)
    q = torch.randn(b, h, nq, dk, generator=g, dtype=torch.float64).to(QDTYPES[qdtype])
    kc, ks = quantize(torch.randn(b, hkv, nk, dk, generator=g, dtype=torch.float64), fmt, per_head)
    vc, vs = quantize(torch.randn(b, hkv, nk, dv, generator=g, dtype=torch.float64), fmt, per_head)
    return q, kc, vc, ks, vs


def run(q, kc, vc, ks, vs, fmt, threads=1, rows=None):
    b, h, nq, dk = q.shape
    out = torch.empty(b, h, nq, vc.shape[3], dtype=q.dtype)
    lse = torch.empty(b, h, nq, dtype=torch.float64 if q.dtype == torch.float64 else torch.float32)
    counts = native.forward(
        q,
        kc,
        vc,
        out,
        lse,
        scale=dk**-0.5,
        threads=threads,
        rows=rows,
        kv_format=kv_format(fmt),
        k_scale=ks,
        v_scale=vs,
    )
    return out.double().numpy(), lse.double().numpy(), counts


def check(q, kc, vc, ks, vs, fmt, qdtype, threads=1, rows=None, allowed=None):
    out, lse, counts = run(q, kc, vc, ks, vs, fmt, threads, rows)
    k, v = dequantize(kc, ks, fmt).numpy(), dequantize(vc, vs, fmt).numpy()
    ro, _, rl = O.attention_oracle(q.double().numpy(), k, v, allowed=allowed, scale=q.shape[3] ** -0.5)
    assert tuple(counts) == (0, 0)
    assert np.array_equal(np.isneginf(lse), np.isneginf(rl)) and not np.isnan(out).any()
    fin = np.isfinite(rl)
    tol = TOL[qdtype] + OUT_EPS[qdtype] * float(np.abs(ro).max(initial=0.0))
    assert float(np.abs(out - ro).max(initial=0.0)) <= tol, (fmt, qdtype, q.shape, kc.shape)
    assert float(np.abs(lse[fin] - rl[fin]).max(initial=0.0)) <= TOL[qdtype] * max(
        1.0, float(np.abs(rl[fin]).max(initial=0))
    )


# rows of one kv head's row set (H / Hkv x Nq): 1-8 read in place (the thin path), more on the wide path
ROW_SETS = [
    (1, 1, 1),
    (2, 1, 1),
    (6, 2, 1),
    (8, 2, 1),
    (5, 1, 1),
    (4, 2, 3),
    (7, 1, 1),
    (8, 1, 1),
    (16, 2, 1),
    (2, 1, 12),
]
# (Dk, Dv): read in place (multiples of 16) or through the dequantised copy (odd)
DIMS = [(64, 64), (128, 128), (33, 17), (48, 80), (16, 31)]
# key counts: 1, mid-fold, mid-tile, several tiles ending mid-block, split over threads
NKS = [1, 17, 130, 1031, 3001]


@pytest.mark.parametrize("qdtype", list(QDTYPES))
@pytest.mark.parametrize("fmt", FORMATS)
def test_decode_reads_the_quantized_cache(isa, fmt, qdtype):
    cases = zip(
        ROW_SETS, itertools.cycle(DIMS), itertools.cycle(NKS), itertools.cycle((1, 2)), itertools.cycle((0, 0, 1))
    )
    for n, ((h, hkv, nq), (dk, dv), nk, threads, per_head) in enumerate(cases):
        q, kc, vc, ks, vs = make(n, 1 + n % 2, h, hkv, nq, nk, dk, dv, fmt, qdtype, bool(per_head))
        check(q, kc, vc, ks, vs, fmt, qdtype, threads)


@pytest.mark.parametrize("qdtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dk,dv", [(64, 64), (128, 128), (96, 48)])
def test_decode_every_row_count_and_length(isa, fmt, dk, dv, qdtype):
    # one query row per kv head up to 8 stacked rows (blocks of 4, 2 and 1), against key counts
    # around the fold (16) and the tile (128), q in float32 and bfloat16, Dk / 16 even and odd
    for rows, nk in itertools.product(range(1, 9), (15, 16, 127, 129, 2049)):
        q, kc, vc, ks, vs = make(rows * 7 + nk, 1, rows, 1, 1, nk, dk, dv, fmt, qdtype)
        check(q, kc, vc, ks, vs, fmt, qdtype, threads=2)


def bottom_right_causal(nq, nk, b, h):
    p = np.arange(nq) + (nk - nq)
    r = np.stack([np.zeros(nq), p + 1], -1).astype(np.int32)
    return np.broadcast_to(r, (b, h, nq, 2)).copy()


@pytest.mark.parametrize("qdtype", list(QDTYPES))
@pytest.mark.parametrize("fmt", FORMATS)
def test_prefill_chunk_over_a_quantized_cache(isa, fmt, qdtype):
    # a chunk of new queries over cached keys, causal bottom-right, across the 64-row and 128-key tile edges
    for n, (h, hkv, nq, nk, dk, dv) in enumerate(
        [(4, 2, 40, 300, 32, 48), (2, 1, 130, 260, 64, 64), (3, 3, 65, 129, 17, 33)]
    ):
        q, kc, vc, ks, vs = make(100 + n, 1, h, hkv, nq, nk, dk, dv, fmt, qdtype, per_head=n == 1)
        rows = bottom_right_causal(nq, nk, 1, h)
        check(q, kc, vc, ks, vs, fmt, qdtype, threads=2, rows=rows, allowed=O.causal_allowed(nq, nk))


def bad_codes(fmt):
    """The non-finite code patterns of a format (none for int8: there only the scale can be)."""
    return {"i8": [], "e4m3": [0x7F, 0xFF], "e5m2": [0x7C, 0xFC, 0x7E]}[fmt]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dk,dv", [(64, 64), (24, 40)])
def test_non_finite_cache_slots(isa, fmt, dk, dv):
    # hidden slots (the interval [0, nk - 5) hides the last 5 keys) change nothing, bit for bit;
    # an attended non-finite code or scale makes exactly the rows of its kv head NaN, counted
    nk, h, hkv = 700, 4, 2
    q, kc, vc, ks, vs = make(7, 1, h, hkv, 1, nk, dk, dv, fmt, "float32")
    rows = np.broadcast_to(np.array([0, nk - 5], np.int32), (1, h, 1, 2)).copy()
    clean = run(q, kc, vc, ks, vs, fmt, threads=2, rows=rows)
    plants = [("k_scale", np.inf), ("v_scale", np.nan), ("k_scale", np.nan), ("v_scale", np.inf)]
    plants += [("k", c) for c in bad_codes(fmt)] + [("v", c) for c in bad_codes(fmt)]
    for where, what in plants:
        for key, hidden in ((nk - 2, True), (3, False), (300, False)):
            t = {"k": kc.clone(), "v": vc.clone(), "k_scale": ks.clone(), "v_scale": vs.clone()}
            if where in ("k", "v"):
                t[where].view(torch.uint8)[0, 1, key, 0] = what
            else:
                t[where][0, 1, key] = what
            out, lse, counts = run(q, t["k"], t["v"], t["k_scale"], t["v_scale"], fmt, threads=2, rows=rows)
            if hidden:
                assert np.array_equal(out, clean[0]) and np.array_equal(lse, clean[1]), (where, what)
                assert tuple(counts) == (0, 0)
                continue
            bad = np.zeros((1, h, 1), bool)
            bad[0, 2:4] = True  # query heads 2, 3 read kv head 1
            assert np.isnan(out[bad]).all() and np.isnan(lse[bad]).all(), (where, what, key)
            assert np.array_equal(out[~bad], clean[0][~bad]) and np.array_equal(lse[~bad], clean[1][~bad])
            assert tuple(counts) == (2, 0)
