"""Gradients: qkv.attention_backward against central finite differences of the float64 oracle,
and torch autograd through qkv.attention against attention_backward and an independent torch
computation."""

import numpy as np
import pytest

import oracle as O
import qkv
from helpers import (
    HAS_TORCH,
    MASK_CASES,
    SCORE_CASES,
    assert_close,
    documented_refusal,
    make_qkv,
    tiled_attention,
    tiled_backward,
)

FD_TOL = 1e-7  # central differences with eps=1e-6 on O(1) values


def fd_and_backward(
    rng,
    q_shape,
    k_shape,
    v_shape=None,
    *,
    impl="reference",
    allowed=None,
    bias=None,
    score_fn=None,
    scale=None,
    **qkv_kw,
):
    """(numerical grads of the oracle, qkv.attention_backward grads) for one random problem."""
    q, k, v = make_qkv(rng, q_shape, k_shape, v_shape)
    kw = {"allowed": allowed, "bias": bias, "score_fn": score_fn, "scale": scale}
    out, _, lse = O.attention_oracle(q, k, v, **kw)
    dout = rng.standard_normal(out.shape)
    fd = O.numerical_gradients(lambda a, b, c: O.attention_oracle(a, b, c, **kw)[0], (q, k, v), dout)
    if bias is not None:
        qkv_kw["mask"] = bias
    tiles = (2, 3) if impl == "flash" else None  # tiny tiles: the tile loops really run
    got = tiled_backward(dout, q, k, v, out, lse, tiles=tiles, scale=scale, impl=impl, **qkv_kw)
    return fd, got, (q, k, v)


def check_grads(fd, got, arrays):
    assert len(got) == 3
    for name, g, want, a in zip(("dq", "dk", "dv"), got, fd, arrays, strict=True):
        assert isinstance(g, np.ndarray) and g.shape == a.shape, f"{name}: {type(g)} {np.shape(g)} vs {a.shape}"
        assert_close(g, want, tol=FD_TOL, name=name)


@pytest.mark.parametrize("impl", ["reference", "flash", "auto"])
@pytest.mark.parametrize("case", [c.param() for c in MASK_CASES])
def test_backward_matches_finite_differences_for_every_mask(case, impl, rng):
    mask = case.build(qkv.masks)
    allowed = case.oracle(case.nq, case.nk, qkv.masks)
    fd, got, arrays = fd_and_backward(
        rng, (2, 2, case.nq, 2), (2, 1, case.nk, 2), impl=impl, allowed=allowed, mask=mask
    )
    check_grads(fd, got, arrays)


@pytest.mark.parametrize("impl", ["reference", "flash", "auto"])
@pytest.mark.parametrize("case", [c.param() for c in SCORE_CASES])
def test_backward_matches_finite_differences_for_every_score_mod(case, impl, rng):
    fd, got, arrays = fd_and_backward(
        rng,
        (1, case.h, 4, 3),
        (1, case.hkv, 6, 3),
        impl=impl,
        score_fn=case.oracle(),
        scale=case.scale,
        score_mod=case.build(qkv.scores),
    )
    check_grads(fd, got, arrays)


@pytest.mark.parametrize(
    "case", [c.param() for c in SCORE_CASES if c.id in ("alibi-n-heads-4", "softcap", "relative-bias-then-alibi")]
)
def test_backward_score_mod_with_causal_nq_gt_nk(case, rng):
    fd, got, arrays = fd_and_backward(
        rng,
        (1, case.h, 6, 2),
        (1, case.hkv, 4, 2),
        score_fn=case.oracle(),
        scale=case.scale,
        allowed=O.causal_allowed(6, 4),
        score_mod=case.build(qkv.scores),
        causal=True,
    )
    check_grads(fd, got, arrays)


SHAPES = [
    pytest.param((2, 4, 3, 3), (2, 2, 5, 3), (2, 2, 5, 2), id="gqa-dv<dk"),
    pytest.param((2, 3, 3, 2), (1, 1, 4, 2), (1, 1, 4, 2), id="mqa-broadcast-batch"),
    pytest.param((2, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 4), id="broadcast-batch"),
    pytest.param((1, 2, 6, 3), (1, 2, 2, 3), (1, 2, 2, 4), id="nq>nk"),
    pytest.param((1, 2, 1, 3), (1, 2, 7, 3), (1, 2, 7, 3), id="decode-nq1"),
    pytest.param((4, 3), (5, 3), (5, 1), id="two-dims-dv1"),
]


@pytest.mark.parametrize("impl", ["reference", "flash"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("q_shape,k_shape,v_shape", SHAPES)
def test_backward_matches_finite_differences_on_awkward_shapes(q_shape, k_shape, v_shape, causal, impl, rng):
    allowed = O.causal_allowed(q_shape[-2], k_shape[-2]) if causal else None
    fd, got, arrays = fd_and_backward(rng, q_shape, k_shape, v_shape, impl=impl, allowed=allowed, causal=causal)
    check_grads(fd, got, arrays)


def test_backward_with_float_bias_and_scale(rng):
    bias = rng.standard_normal((1, 2, 4, 5))
    bias[0, 1, 2, :] = -np.inf  # an empty row
    bias[0, 0, 1, 3] = -np.inf
    fd, got, arrays = fd_and_backward(rng, (1, 2, 4, 3), (1, 2, 5, 3), bias=bias, scale=0.7)
    check_grads(fd, got, arrays)


def test_backward_with_bool_mask_array(rng):
    allowed = rng.random((3, 5)) < 0.5
    allowed[0] = False
    fd, got, arrays = fd_and_backward(rng, (2, 1, 3, 3), (2, 1, 5, 3), allowed=allowed, mask=allowed)
    check_grads(fd, got, arrays)


def test_backward_empty_rows_give_zero_gradients_and_no_nan(rng):
    fd, got, arrays = fd_and_backward(
        rng, (1, 2, 5, 3), (1, 2, 5, 3), allowed=O.causal_allowed(5, 5, -2), mask=qkv.masks.causal(offset=-2)
    )
    check_grads(fd, got, arrays)
    assert (got[0][..., :2, :] == 0).all()
    zero = np.zeros((4, 3))
    out = np.zeros((4, 3))
    dq, dk, dv = qkv.attention_backward(
        np.ones((4, 3)), zero + 1, zero, zero, out, np.full(4, -np.inf), mask=np.zeros((4, 4), dtype=bool)
    )
    for g in (dq, dk, dv):
        assert (g == 0).all()


# --------------------------------------------------------------------------- torch autograd

torch_cases = [
    pytest.param((2, 4, 3, 3), (1, 2, 5, 3), None, None, id="gqa-broadcast"),
    pytest.param((1, 2, 4, 3), (1, 2, 6, 3), "causal-nq<nk-bottom-right", None, id="causal-nq<nk"),
    pytest.param((2, 2, 5, 3), (2, 2, 7, 3), "padding-q-lengths", None, id="padding-empty-rows"),
    pytest.param((1, 2, 8, 3), (1, 2, 8, 3), "longformer", None, id="longformer"),
    pytest.param((1, 2, 6, 3), (1, 2, 6, 3), "document-and-causal", None, id="document-causal"),
    pytest.param((1, 4, 5, 3), (1, 2, 7, 3), None, "alibi-n-heads-4", id="alibi"),
    pytest.param((1, 4, 5, 3), (1, 2, 7, 3), None, "relative-bias-per-head", id="relative-bias"),
    pytest.param((1, 2, 5, 3), (1, 2, 7, 3), None, "softcap", id="softcap"),
    pytest.param((1, 2, 5, 3), (1, 1, 7, 3), None, "temperature", id="temperature"),
    pytest.param((1, 4, 5, 3), (1, 2, 7, 3), None, "alibi-then-softcap", id="alibi-then-softcap"),
]


def torch_reference(q, k, v, allowed, scale, score_fn):
    """Independent torch attention (repeat_interleave, masked_fill, explicit softmax)."""
    import torch

    h, hkv = q.shape[-3], k.shape[-3]
    k = k.repeat_interleave(h // hkv, dim=-3)
    v = v.repeat_interleave(h // hkv, dim=-3)
    nq, nk = q.shape[-2], k.shape[-2]
    s = (q @ k.transpose(-1, -2)) * scale
    if score_fn is not None:
        s = score_fn(s, np.arange(h)[:, None, None], np.arange(nq)[:, None], np.arange(nk)[None, :], nq, nk, xp=torch)
    ok = torch.ones(s.shape, dtype=torch.bool) if allowed is None else torch.from_numpy(np.asarray(allowed))
    ok = ok.expand(s.shape)
    s = s.masked_fill(~ok, float("-inf"))
    m = s.amax(dim=-1, keepdim=True).detach()
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m) * ok
    z = e.sum(dim=-1, keepdim=True)
    return (e / torch.where(z > 0, z, torch.ones_like(z))) @ v


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
@pytest.mark.parametrize("impl", ["reference", "torch", "flash", "auto"])
@pytest.mark.parametrize("q_shape,kv_shape,mask_id,score_id", torch_cases)
def test_torch_autograd_through_attention(q_shape, kv_shape, mask_id, score_id, impl, rng):
    import torch

    q, k, v = make_qkv(rng, q_shape, kv_shape)
    kw, allowed, score_fn, nonadditive = {}, None, None, False
    scale = 1 / np.sqrt(q.shape[-1])
    if mask_id is not None:
        case = next(c for c in MASK_CASES if c.id == mask_id)
        kw["mask"] = case.build(qkv.masks)
        allowed = case.oracle(q.shape[-2], k.shape[-2], qkv.masks)
    if score_id is not None:
        case = next(c for c in SCORE_CASES if c.id == score_id)
        kw["score_mod"] = case.build(qkv.scores)
        score_fn, nonadditive = case.oracle(), not case.additive
        if case.scale is not None:
            kw["scale"] = scale = case.scale
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    try:
        out = tiled_attention(tq, tk, tv, tiles=(3, 2) if impl == "flash" else None, impl=impl, **kw)
        dout = rng.standard_normal(out.shape)
        (out * torch.from_numpy(dout)).sum().backward()  # flash's backward runs with the same tiles (saved Call)
    except ValueError as e:
        if impl == "torch" and nonadditive and documented_refusal(e):
            pytest.skip("impl='torch' refuses non-additive score mods (documented)")
        raise
    grads = [t.grad.numpy() for t in (tq, tk, tv)]
    for g in grads:
        assert np.isfinite(g).all()

    # against an independent torch computation, differentiated by autograd
    rq, rk, rv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    ref_out = torch_reference(rq, rk, rv, allowed, scale, score_fn)
    assert_close(out.detach().numpy(), ref_out.detach().numpy(), name="out")
    (ref_out * torch.from_numpy(dout)).sum().backward()
    for name, g, r in zip(("dq", "dk", "dv"), grads, (rq, rk, rv), strict=True):
        assert_close(g, r.grad.numpy(), tol=1e-10, name=name)

    # and against qkv.attention_backward on NumPy, given the oracle's out and lse
    g_out, _, g_lse = O.attention_oracle(q, k, v, allowed=allowed, scale=scale, score_fn=score_fn)
    back = qkv.attention_backward(dout, q, k, v, g_out, g_lse, **kw)
    for name, g, b in zip(("dq", "dk", "dv"), grads, back, strict=True):
        assert_close(g, b, tol=1e-10, name=name)


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("nq", [1, 63, 64, 130])
def test_rows_apart_give_the_bits_of_dense_rows(nq, dtype, monkeypatch):
    """q, k, v, dO as transformers hands them over ((B, N, H, D) projections seen as (B, H, N, D),
    a head's rows D * H apart) give the outputs and gradients of the same values laid out dense, to
    the bit; a call of at least BLOCK_Q query rows hands the kernel dense rows (a copy), a smaller
    one (a decode step) the caller's strided K and V as they are."""
    import torch

    from qkv import _native as native

    if not native.available():
        pytest.skip("compiled kernel not built")
    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(nq)
    b, h, hkv, nk, d = 2, 4, 2, 150, 32
    apart = [
        torch.randn(b, n, heads, d, generator=g).to(dt).transpose(1, 2) for n, heads in ((nq, h), (nk, hkv), (nk, hkv))
    ]
    dense = [x.contiguous() for x in apart]
    dout = torch.randn(b, nq, h, d, generator=g).to(dt).transpose(1, 2)
    seen = []
    forward = native.forward

    def spy(q, k, *rest, **kw):
        seen.append((q.stride(-2), k.stride(-2)))
        return forward(q, k, *rest, **kw)

    monkeypatch.setattr(native, "forward", spy)
    results = []
    for xs, do in ((apart, dout), (dense, dout.contiguous())):
        xs = [x.detach().requires_grad_() for x in xs]
        out = qkv.attention(*xs, causal=nq > 1, impl="flash")
        out.backward(do)
        results.append([out.detach(), *(x.grad for x in xs)])
    for got, want in zip(*results, strict=True):
        assert torch.equal(got, want)
    # the kernel's q and k rows (a single query row's stride means nothing)
    copied = nq >= native.BLOCK_Q
    assert seen[0][1] == (d if copied else hkv * d)
    assert nq == 1 or seen[0][0] == (d if copied else h * d)
    assert seen[1][1] == d
