"""The bfloat16 backward on every ISA path, above all the ``avx512bf16`` path: its five matmuls
(S^T = K Q^T, dP^T = V dO^T, dQ = dS K, dV += P^T dO, dK += dS^T Q) on vdpbf16ps, P and dS rounded
to bf16 where FlashAttention-2's bf16 backward rounds them, the sums, D, lse and the gradients in
float32 (kernels_avx512bf16.cpp, Bf16Bwd). The other paths widen bf16 to float32: the unchanged
reference, held to the same rule.

The rule (STYLE rule 13 with the backward's factor, the yardstick of the forward's half-precision
tests): against the float64 oracle on the same bf16 inputs, each gradient's largest error is at
most 3x the largest error of torch's own bf16 math backward on those inputs -- the textbook
softmax(Q K^T scale + mods + bias) V written in torch ops on the bf16 tensors (every intermediate
rounded to bf16 as torch computes it, the masks, mods, bias, dropout keep-mask and dlse the same)
and differentiated by autograd. Its gradients are bf16, so its error is never below half a bf16
ulp of the largest exact gradient (2^-9 of it) save by luck of rounding (a one-element gradient
can come out exact): that is the yardstick's floor.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _native_helpers import max_err, torch_backward, torch_forward
from _native_reference import backward as ref_backward
from _native_reference import dense_allowed, keep_mask
from test_native_backward_ranges import rows_of

import qkv
from qkv import _native as native

BF16_PATH = "avx512bf16"
FACTOR = 3.0  # STYLE rule 13, the backward's factor
# skips where the CPU lacks AVX512-BF16; CI's QKV_REQUIRE_ISAS=cpu (tests/requirements.py) fails the
# run instead when the CPU has it and the build does not offer the path
needs_bf16 = pytest.mark.skipif(BF16_PATH not in native.isas(), reason="this CPU has no AVX512-BF16 path")


def assert_within_rule(name, got, gold, base):
    """got's largest error against gold <= FACTOR x the yardstick (torch bf16's, or its floor)."""
    err = max_err(got, gold)
    yard = max(max_err(base, gold), 2.0**-9 * float(np.abs(gold).max(initial=0.0)))
    assert err <= FACTOR * yard + 1e-6, f"{name}: max err {err:.3g} > {FACTOR} x torch bf16's {yard:.3g}"


def bf16(rng, shape, scale=1.0):
    return torch.from_numpy(rng.standard_normal(shape) * scale).to(torch.bfloat16)


def math_bf16(q, k, v, dout, scale, allowed=None, mods=(), bias=None, keep=None, p=0.0, dlse=None):
    """torch's own bf16 math backward (the yardstick): (dq, dk, dv) as float64 NumPy."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    b, h, nq, _ = q.shape
    nk, g = k.shape[2], h // k.shape[1]
    kk, vv = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = (q @ kk.transpose(-1, -2)) * scale
    pos = (torch.arange(nq) + (nk - nq))[:, None]
    j = torch.arange(nk)[None, :]
    for m in mods:
        if m[0] == "mul":
            s = s * m[1]
        elif m[0] == "softcap":
            s = m[1] * torch.tanh(s / m[1])
        elif m[0] == "alibi":
            slopes = torch.as_tensor(np.broadcast_to(m[1], (b, h)).copy(), dtype=s.dtype)
            s = s - slopes[:, :, None, None] * (pos - j).abs().to(s.dtype)
        else:  # relbias: table (H, 2M + 1), index clip(j - p, -M, M) + M
            tab = torch.as_tensor(np.broadcast_to(m[1], (h, 2 * m[2] + 1)).copy(), dtype=s.dtype)
            s = s + tab[:, (j - pos).clamp(-m[2], m[2]) + m[2]][None]
    if bias is not None:
        s = s + torch.as_tensor(bias).to(s.dtype)
    ok = torch.ones(s.shape, dtype=torch.bool) if allowed is None else torch.as_tensor(allowed)
    ok = ok & (s > -torch.inf)
    live = ok.any(-1, keepdim=True)  # a row that sees no key: zeros (torch's softmax would give NaN)
    s = s.masked_fill(~ok, -torch.inf).masked_fill(~live, 0.0)
    lse = torch.logsumexp(s, -1)
    w = torch.softmax(s, -1) * live
    if keep is not None:
        w = w * torch.as_tensor(keep).to(w.dtype) / (1 - p)
    out = w @ vv
    loss = (out * dout).sum()
    if dlse is not None:
        loss = loss + (torch.where(live[..., 0], lse, 0) * torch.as_tensor(dlse).to(lse.dtype)).sum()
    loss.backward()
    return [x.grad.double().numpy() for x in (q, k, v)]


def check(
    q,
    k,
    v,
    *,
    threads=2,
    rows=None,
    tc=None,
    bi=None,
    bitmaps=None,
    mods=(),
    bias=None,
    p=0.0,
    seed=0,
    dlse=None,
    dout_scale=1.0,
):
    """The current path's bf16 forward, then its backward, within the rule; returns the gradients."""
    b, h, nq, d = q.shape
    nk = k.shape[2]
    scale = d**-0.5
    kw = dict(rows=rows, tile_class=tc, bitmap_index=bi, bitmaps=bitmaps, mods=mods, bias=bias, dropout_p=p, seed=seed)
    out, lse = torch_forward(q, k, v, threads=threads, **kw)
    dout = bf16(np.random.default_rng(5), out.shape, dout_scale)
    dl = None if dlse is None else torch.from_numpy(dlse.astype(np.float32))
    grads = torch_backward(q, k, v, out, lse, dout, threads=threads, dlse=dl, **kw)
    bq, bk = native.tile_shape(nq, nk, d, v.shape[3], "bfloat16")
    allowed = dense_allowed(b, h, nq, nk, bq, bk, tile_class=tc, rows=rows, bitmap_index=bi, bitmaps=bitmaps)
    keep = keep_mask(native.philox_keep, seed, b, h, nq, nk, p) if p else None
    x64 = [t.double().numpy() for t in (q, k, v, dout)]
    bias64 = None if bias is None else np.asarray(bias, np.float64)
    _, _, *gold = ref_backward(*x64, scale, allowed=allowed, mods=mods, bias=bias64, keep=keep, p=p, dlse=dlse)
    base = math_bf16(q, k, v, dout, scale, allowed=allowed, mods=mods, bias=bias, keep=keep, p=p, dlse=dlse)
    for name, gr, gd, bs in zip(("dq", "dk", "dv"), grads, gold, base, strict=True):
        assert gr.dtype == torch.float32
        assert_within_rule(name, gr.double().numpy(), gd, bs)
    return grads


# ------------------------------------------------------------------ the path that runs


@needs_bf16
def test_the_bf16_path_runs_its_own_backward_and_float32_stays_the_avx512_code(rng):
    # P and dS rounded to bf16 on one path only: different bits from the widening avx512 path, both
    # within the rule; float32 inputs take the avx512 code on both
    q, k, v = bf16(rng, (1, 4, 100, 64)), bf16(rng, (1, 2, 150, 64)), bf16(rng, (1, 2, 150, 64))
    res = {}
    for isa in (BF16_PATH, "avx512"):
        with native.use_isa(isa):
            res[isa] = check(q, k, v, rows=rows_of("causal", 100, 150))
    for a, b_ in zip(res[BF16_PATH], res["avx512"], strict=True):
        assert not torch.equal(a, b_)
    f32 = [x.float() for x in (q, k, v)]
    res32 = []
    for isa in (BF16_PATH, "avx512"):
        with native.use_isa(isa):
            out, lse = torch_forward(*f32, threads=2)
            res32.append(torch_backward(*f32, out, lse, torch.ones_like(out), threads=2))
    for a, b_ in zip(*res32, strict=True):
        assert torch.equal(a, b_)


# ------------------------------------------------------------------ shapes at tile edges, GQA

SHAPES = [  # B, H, Hkv, Nq, Nk, Dk, Dv: odd Dk / Dv (half pairs), odd Nk (a half key pair), tile edges
    (1, 1, 1, 1, 1, 1, 1),
    (1, 2, 1, 37, 59, 3, 5),
    (1, 2, 2, 15, 17, 65, 64),
    (2, 4, 2, 130, 200, 64, 64),
    (1, 3, 3, 65, 129, 59, 80),
    (1, 2, 1, 17, 255, 96, 33),
    (1, 4, 1, 63, 127, 128, 128),  # MQA
    (1, 1, 1, 129, 257, 2, 16),
    (1, 8, 2, 64, 128, 64, 64),
    (1, 2, 1, 200, 90, 16, 48),  # Nq > Nk
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_within_the_rule_on_every_path(isa, rng, shape):
    b, h, hkv, nq, nk, dk, dv = shape
    q, k, v = bf16(rng, (b, h, nq, dk), 1.5), bf16(rng, (b, hkv, nk, dk), 1.5), bf16(rng, (b, hkv, nk, dv))
    check(q, k, v, dlse=rng.standard_normal((b, h, nq)))


# ------------------------------------------------------------------ every mask kind x tile edges x GQA

KINDS = ["causal", "window1", "window5", "window37", "docs", "prefix", "padding", "backwards"]
EDGES = [(15, 17), (63, 65), (64, 128), (129, 257), (200, 200)]
HEADS = [(2, 2), (4, 2), (8, 1)]


@pytest.mark.parametrize("h,hkv", HEADS, ids=str)
@pytest.mark.parametrize("nq,nk", EDGES, ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_row_intervals_on_the_bf16_path(rng, kind, nq, nk, h, hkv):
    if BF16_PATH not in native.isas():
        pytest.skip("this CPU has no AVX512-BF16 path")
    q, k, v = bf16(rng, (1, h, nq, 24), 1.5), bf16(rng, (1, hkv, nk, 24), 1.5), bf16(rng, (1, hkv, nk, 18))
    with native.use_isa(BF16_PATH):
        check(q, k, v, rows=rows_of(kind, nq, nk, 1, h), threads=3)


@pytest.mark.parametrize("kind", ["causal", "window37", "docs", "backwards"])
def test_row_intervals_on_every_path(isa, rng, kind):
    nq, nk = 129, 257
    q, k, v = bf16(rng, (1, 4, nq, 33), 1.5), bf16(rng, (1, 2, nk, 33), 1.5), bf16(rng, (1, 2, nk, 31))
    check(q, k, v, rows=rows_of(kind, nq, nk, 1, 4), threads=3)


def test_random_intervals_per_head_and_row(isa, rng):
    # spans start and end anywhere, odd or even: the bf16 path pairs keys from even offsets
    h, hkv, nq, nk = 4, 2, 90, 300
    lo = rng.integers(-3, nk, size=(h, nq))
    rows = np.stack([lo, lo + rng.integers(0, nk // 2 + 2, size=(h, nq))], -1).astype(np.int32)[None]
    q, k, v = bf16(rng, (1, h, nq, 19), 1.5), bf16(rng, (1, hkv, nk, 19), 1.5), bf16(rng, (1, hkv, nk, 23))
    check(q, k, v, rows=rows)


def test_tile_classes_bitmaps_bias_and_mods(isa, rng):
    nq, nk, d = 140, 290, 21
    q, k, v = bf16(rng, (2, 4, nq, d), 2.0), bf16(rng, (2, 2, nk, d), 2.0), bf16(rng, (2, 2, nk, d))
    bq, bk = native.tile_shape(nq, nk, d, d, "bfloat16")
    nbq, nbk = -(-nq // bq), -(-nk // bk)
    tc = rng.choice(np.array([0, 1, 2], np.int8), size=(1, 4, nbq, nbk), p=(0.2, 0.5, 0.3))
    bitmaps = rng.integers(0, 2**63, size=(3, bq, -(-bk // 64)), dtype=np.uint64)
    bi = rng.integers(-1, 3, size=(2, 4, nbq, nbk)).astype(np.int32)
    bias = rng.standard_normal((1, 4, nq, nk)).astype(np.float32)
    mods = (("softcap", 5.0), ("alibi", np.array([0.1, 0.3, 0.05, 0.2])))
    check(q, k, v, tc=tc, bi=bi, bitmaps=bitmaps, bias=bias, mods=mods, dlse=rng.standard_normal((2, 4, nq)))


@pytest.mark.parametrize(
    "mods",
    [
        (("mul", 0.7),),
        (("softcap", 2.0),),
        (("alibi", np.array([0.2, 0.05])),),
        (("relbias", np.linspace(-1, 1, 2 * 6 + 1)[None].repeat(2, 0), 6),),
    ],
    ids=["mul", "softcap", "alibi", "relbias"],
)
def test_each_score_mod(isa, rng, mods):
    nq, nk = 70, 150
    q, k, v = bf16(rng, (1, 2, nq, 32), 2.0), bf16(rng, (1, 1, nk, 32), 2.0), bf16(rng, (1, 1, nk, 16))
    check(q, k, v, rows=rows_of("window37", nq, nk, 1, 2), mods=mods)


@pytest.mark.parametrize("kind", [None, "causal", "window5", "docs"])
@pytest.mark.parametrize("h,hkv", [(2, 2), (8, 2)], ids=str)
def test_dropout_with_dlse(isa, rng, kind, h, hkv):
    nq, nk = 130, 260
    q, k, v = bf16(rng, (2, h, nq, 16), 1.5), bf16(rng, (2, hkv, nk, 16), 1.5), bf16(rng, (2, hkv, nk, 32))
    rows = None if kind is None else rows_of(kind, nq, nk, 2, h)
    check(q, k, v, rows=rows, p=0.25, seed=7, dlse=rng.standard_normal((2, h, nq)))


def test_nearly_one_hot_rows(isa, rng):
    # large |q.k|: dS = P (dP - D) must not be swamped by the bf16 rounding of P
    q, k, v = bf16(rng, (1, 2, 64, 32), 4.0), bf16(rng, (1, 2, 128, 32), 4.0), bf16(rng, (1, 2, 128, 32))
    check(q, k, v, rows=rows_of("causal", 64, 128, 1, 2))


# ------------------------------------------------------------------ sinks and their gradient


def test_sinks_and_their_gradient_through_the_front_end(isa, rng):
    # qkv.attention merges the sinks into (out, lse) outside the kernel: their gradient reaches the
    # kernel as dlse. Oracle: a sink is an extra key with value 0 whose logit is the sink.
    h, hkv, nq, nk, d = 4, 2, 70, 150, 32
    q, k, v = bf16(rng, (1, h, nq, d), 1.5), bf16(rng, (1, hkv, nk, d), 1.5), bf16(rng, (1, hkv, nk, d))
    sinks = torch.from_numpy(rng.standard_normal(h) * 2).to(torch.bfloat16)
    dout = bf16(rng, (1, h, nq, d))
    assert qkv.dispatch(q, k, v, causal=True, impl="flash").engine == "native"

    def run(x, fn):
        t = [y.detach().clone().requires_grad_() for y in x]
        (fn(*t) * dout.to(t[0].dtype)).sum().backward()
        return [y.grad.double().numpy() for y in t]

    got = run((q, k, v, sinks), lambda *t: qkv.attention(*t[:3], causal=True, sinks=t[3], impl="flash"))

    def textbook(qq, kk, vv, ss):  # the sink as a zero key and value with its own logit, any dtype
        z = torch.zeros(1, hkv, 1, d, dtype=kk.dtype)
        g = h // hkv
        k2, v2 = torch.cat([kk, z], 2).repeat_interleave(g, 1), torch.cat([vv, z], 2).repeat_interleave(g, 1)
        s = qq @ k2.transpose(-1, -2) * d**-0.5
        j, p = torch.arange(nk + 1)[None, :], torch.arange(nq)[:, None] + nk - nq
        s = s.masked_fill((j > p) & (j < nk), -torch.inf)
        s = torch.where(j == nk, ss[None, :, None, None].to(s.dtype), s)
        return torch.softmax(s, -1) @ v2

    gold = run([x.double() for x in (q, k, v, sinks)], textbook)
    base = run((q, k, v, sinks), textbook)
    for name, gr, gd, bs in zip(("dq", "dk", "dv", "dsinks"), got, gold, base, strict=True):
        assert_within_rule(name, gr, gd, bs)


# ------------------------------------------------------------------ determinism, non-finite rows


@pytest.mark.parametrize("kind", [None, "causal", "window37", "backwards"])
def test_bit_identical_for_any_thread_count(isa, rng, kind):
    # dQ is summed in key-tile order whatever thread adds it: 1, 2, 3 or 5 threads give the same bits
    nq, nk = 300, 700
    q, k, v = bf16(rng, (2, 4, nq, 32)), bf16(rng, (2, 2, nk, 32)), bf16(rng, (2, 2, nk, 48))
    kw = {} if kind is None else {"rows": rows_of(kind, nq, nk)}
    out, lse = torch_forward(q, k, v, threads=2, **kw)
    dout = bf16(rng, out.shape)
    first = torch_backward(q, k, v, out, lse, dout, threads=1, **kw)
    for threads in (2, 3, 5):
        for a, b_ in zip(first, torch_backward(q, k, v, out, lse, dout, threads=threads, **kw), strict=True):
            assert torch.equal(a, b_), threads


@needs_bf16
@pytest.mark.parametrize("dk", [16, 7])
def test_non_finite_rows_match_the_widening_path(rng, dk):
    # a NaN q row, an inf in the last (half) pair of an odd Dk, NaN / inf K and V rows hidden from
    # some rows by the causal mask: the same NaN gradients and counts as the avx512 path, and the
    # finite ones within the rule of the rows that stay finite
    nq, nk = 90, 300
    q, k, v = bf16(rng, (1, 2, nq, dk)), bf16(rng, (1, 1, nk, dk)), bf16(rng, (1, 1, nk, 8))
    rows = rows_of("causal", nq, nk, 1, 2)
    rows[0, :, :, 0] = 4  # k row 3 hidden from every row: its -inf changes nothing
    q[0, 0, 5, 1] = float("nan")
    q[0, 1, 40, dk - 1] = float("inf")
    k[0, 0, 3, dk - 1] = float("-inf")
    k[0, 0, 260, 0] = float("nan")  # hidden from rows < 50
    v[0, 0, 230, 4] = float("inf")  # hidden from rows < 20
    res = {}
    for isa in (BF16_PATH, "avx512"):
        with native.use_isa(isa):
            out, lse = torch_forward(q, k, v, threads=2, rows=rows)
            dout = bf16(np.random.default_rng(3), out.shape)
            grads = [torch.empty(x.shape) for x in (q, k, v)]
            counts = native.backward(q, k, v, out, lse, dout, *grads, scale=dk**-0.5, rows=rows, threads=2)
            res[isa] = (grads, counts)
    (ga, ca), (gb, cb) = res[BF16_PATH], res["avx512"]
    assert ca == cb
    for a, b_ in zip(ga, gb, strict=True):
        nan = torch.isnan(a)
        assert torch.equal(nan, torch.isnan(b_)) and nan.any() and not nan.all()
        u = 2.0**-6 * float(b_[~nan].abs().max())  # a few bf16 ulps of the largest gradient
        assert float((a[~nan] - b_[~nan]).abs().max()) <= u
