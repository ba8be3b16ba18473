"""Scores far from zero (large scales, large q and k): the backward against the forward it follows.

The compiled backward rebuilds each weight as ``P = exp(s - lse)`` from the forward's saved lse.
Rounded to float32, an lse of 1.45e10 (scale 2^28) is off by up to 512, so ``P`` came out 2^+-700:
infinite (read as an overflow of finite inputs: "the scores ... overflow float32 ... up to 1.45e+10
> 3.4e+38", numbers that show nothing overflowing) or zero (gradients ~1e-24 instead of ~1e9,
silently). The reference here is the forward's own weights: with ``v`` the identity (``Dv = Nk``)
the output *is* ``P``, whatever the forward's rounding made of ties at this size, and the
gradients follow from it in float64 (FlashAttention-2, arXiv:2307.08691, Alg. 2):

    dV = Pᵀ dO    dP = dO Vᵀ    dS = P ∘ (dP − rowsum(dO ∘ O))    dQ = dS K · scale    dK = dSᵀ Q · scale

Each error is measured against the gradient's own scale (its bound from ``sum_j P_ij = 1``),
in units of the dtype's rounding: nothing here depends on how large the gradients are.
"""

import itertools

import numpy as np
import pytest

import qkv
from qkv import _native, masks

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not _native.available(), reason=f"compiled engine unavailable: {_native.reason()}")

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
EPS = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}
B, H, HKV, NQ, NK, DK = 2, 4, 2, 20, 8, 6  # NQ > 16: the forward's wide path, whose scores the backward rebuilds


def _masks():
    return {
        "padding-empty-sequence": masks.padding([0, 2]),  # batch 0 has no keys: every row empty
        "causal-rows-without-keys": masks.causal(offset=-2),  # rows 0, 1 see nothing
        "none": None,
    }


def _cases():
    """(dtype, scale, mask, inputs) over the class: integer q, k (exact scores, ties) and normal
    ones; scales from where float32's lse starts losing log l (2^8) up to 2^28."""
    for dtype, scale, mask, kind in itertools.product(DTYPES, (2.0**8, 2.0**16, 2.0**28), _masks(), ("int", "normal")):
        if dtype == "float16" and scale > 2**8:
            continue  # float16 gradients of scale · |dS| · |k| ~ 1e6 would not fit its range (65504)
        yield pytest.param(dtype, scale, mask, kind, id=f"{dtype}-2^{int(np.log2(scale))}-{mask}-{kind}")


def _inputs(dtype, kind, seed=0):
    g = torch.Generator().manual_seed(seed)
    if kind == "int":
        q = torch.randint(-3, 4, (B, H, NQ, DK), generator=g).float()
        k = torch.randint(-3, 4, (B, HKV, NK, DK), generator=g).float()
    else:
        q, k = torch.randn(B, H, NQ, DK, generator=g), torch.randn(B, HKV, NK, DK, generator=g)
    dout = torch.randn(B, H, NQ, NK, generator=g)
    return q.to(DTYPES[dtype]), k.to(DTYPES[dtype]), dout


def _expected(p, dout, q, k, scale):
    """Float64 gradients of softmax(q kᵀ · scale) v at v = I, from the forward's weights ``p``."""
    p, do, q, k = (x.double() for x in (p, dout, q, k))
    kk = k.repeat_interleave(H // HKV, dim=1)
    ds = p * (do - (do * p).sum(-1, keepdim=True))  # dP = dO Vᵀ = dO, rowsum(dO ∘ O) with O = P
    dq = ds @ kk * scale
    dk = (ds.mT @ q * scale).unflatten(1, (HKV, H // HKV)).sum(2)
    dv = (p.mT @ do).unflatten(1, (HKV, H // HKV)).sum(2)
    bound_ds = 2 * do.abs().amax()
    share = NQ * H // HKV  # the rows of a key's gradient sums
    bounds = (scale * bound_ds * k.abs().amax(), scale * bound_ds * q.abs().amax() * share, do.abs().amax() * share)
    return (dq, dk, dv), bounds


@pytest.mark.parametrize("isa", _native.isas())
@pytest.mark.parametrize("dtype,scale,mask,kind", list(_cases()))
def test_the_backward_follows_the_forwards_weights_at_large_scales(isa, dtype, scale, mask, kind):
    mask = _masks()[mask]
    q, k, dout = _inputs(dtype, kind)
    eye = torch.eye(NK, dtype=q.dtype).expand(B, HKV, NK, NK)
    with _native.use_isa(isa):
        p = qkv.attention(q, k, eye, mask=mask, scale=scale, impl="flash")  # the forward's weights
        t = [x.clone().requires_grad_(True) for x in (q, k, eye)]
        out = qkv.attention(*t, mask=mask, scale=scale, impl="flash")
        out.backward(dout.to(q.dtype))
    assert torch.equal(out.detach(), p)
    want, bounds = _expected(p, dout.to(q.dtype), q, k, scale)
    for name, x, w, bound in zip(("dq", "dk", "dv"), t, want, bounds, strict=True):
        err = float((x.grad.double() - w).abs().max())
        assert err <= 64 * EPS[dtype] * float(bound), f"{name}: error {err:.3g} > 64 eps x its bound {float(bound):.3g}"


@pytest.mark.parametrize("isa", _native.isas())
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("seed", range(4))
def test_the_reported_case_runs_forward_and_backward_with_normalised_weights(isa, dtype, seed):
    """Issue 33's case: q, k integers in [-3, 3], scale 2^28, one sequence without keys, Nq = 4 (the
    forward's decode path, whose dot products sum in another order than the backward's: ties may
    break otherwise, so the weights are checked by what every softmax keeps): both passes run,
    the empty sequence gets zero gradients, and dV sums to dO over each attended row
    (sum_j dV_j = sum_i dO_i, as sum_j P_ij = 1) where P = 2^+-700 made it inf or 1e-24."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-3, 4, (B, H, 4, DK), generator=g).to(DTYPES[dtype]).requires_grad_(True)
    k = torch.randint(-3, 4, (B, HKV, NK, DK), generator=g).to(DTYPES[dtype]).requires_grad_(True)
    v = torch.randn(B, HKV, NK, 4, generator=g).to(DTYPES[dtype]).requires_grad_(True)
    dout = torch.randn(B, H, 4, 4, generator=g).to(DTYPES[dtype])
    scale = 2.0**28 if dtype != "float16" else 2.0**8  # float16 gradients must fit its range
    with _native.use_isa(isa):
        out = qkv.attention(q, k, v, scale=scale, mask=masks.padding([0, 2]), impl="flash")
        out.backward(dout)
    for x in (q, k, v):
        assert torch.isfinite(x.grad).all()
        assert (x.grad[0] == 0).all()  # batch 0 attends nothing: zero gradients
    want = dout[1].double().unflatten(0, (HKV, H // HKV)).sum((1, 2))  # (Hkv, Dv): every row attends keys 0, 1
    got = v.grad[1].double().sum(1)
    bound = float(dout.double().abs().amax()) * 4 * H // HKV
    assert float((got - want).abs().max()) <= 64 * EPS[dtype] * bound


def test_a_backward_overflow_names_the_gradient_that_overflows():
    """dO · v beyond float32 with modest scores: the error shows |dP| and |dQ|, not the scores."""
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 1, 8, 4, generator=g).requires_grad_(True) for _ in range(2))
    v = (torch.randn(1, 1, 8, 4, generator=g) * 1e30).requires_grad_(True)
    out = qkv.attention(q, k, v, impl="flash")
    with pytest.raises(qkv.errors.ArgumentError, match=r"the gradients overflow float32 .*\|dQ\| up to"):
        out.backward(torch.full_like(out, 1e30))
