"""Calls with an empty axis (``B``, ``H``, ``Dk`` or ``Dv`` of 0) get SDPA's answer on every impl.

``torch.nn.functional.scaled_dot_product_attention`` returns the empty result for ``B = 0``,
``H = 0`` and ``Dv = 0``, and for ``Dk = 0`` the result of zero scores: each row's uniform
weights over the keys it may attend (the mean of their values). qkv gives the same for every
impl, engine and array library, with ``lse`` (``log`` of the attended keys' count for ``Dk = 0``)
and gradients; the compiled kernel takes no zero-size axis, so the reference's steps answer.
"""

import itertools

import numpy as np
import pytest

import oracle as O
import qkv
from helpers import HAS_TORCH, assert_close, engine_params, to_numpy64
from qkv import masks, scores
from qkv._impls import build_call

SHAPES = {  # q, k, v
    "B=0": ((0, 2, 3, 4), (0, 2, 5, 4), (0, 2, 5, 4)),
    "H=0": ((1, 0, 3, 4), (1, 0, 5, 4), (1, 0, 5, 4)),
    "Dk=0": ((2, 4, 3, 0), (2, 2, 5, 0), (2, 2, 5, 4)),
    "Dv=0": ((2, 4, 3, 4), (2, 2, 5, 4), (2, 2, 5, 0)),
    "Dk=Dv=0": ((1, 2, 3, 0), (1, 2, 5, 0), (1, 2, 5, 0)),
}
MASKS = {
    "none": (None, lambda nq, nk: np.ones((nq, nk), bool)),
    "causal": (masks.causal(), O.causal_allowed),
    "padding": (masks.padding([3, 0]), None),  # batch 1 attends nothing (B = 2 shapes only)
    "bool-array": (np.array([[1, 0, 1, 1, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]], bool), None),
}
MODS = {"none": None, "alibi": scores.alibi(), "softcap": scores.softcap(2.0)}


def _oracle_mod(name, h):
    return {"none": None, "alibi": O.alibi_score(O.alibi_slopes(h)), "softcap": O.softcap_score(2.0)}[name]


def _cases():
    for shape, mask, mod in itertools.product(SHAPES, MASKS, MODS):
        if mask == "padding" and (SHAPES[shape][0][0] != 2 or mod == "alibi"):
            continue  # padding: B = 2 shapes; alibi measures within each sequence there (test_scores_hardening)
        yield pytest.param(shape, mask, mod, id=f"{shape}-{mask}-{mod}")


def _allowed(mask_name, q_shape, nk):
    mask, dense = MASKS[mask_name]
    nq = q_shape[-2]
    if isinstance(mask, np.ndarray):
        return mask
    if mask_name == "padding":
        return O.padding_allowed(nq, nk, [3, 0])
    return dense(nq, nk)


def _expected(q, k, v, mask_name, mod_name):
    """The float64 loop oracle, or the empty arrays of the right shapes where there is nothing to
    compute."""
    b, h, nq, _ = q.shape
    nk, dv = v.shape[-2:]
    if b * h == 0:
        return np.zeros((b, h, nq, dv)), np.zeros((b, h, nq))
    fn = _oracle_mod(mod_name, h)
    scale = 1.0 if q.shape[-1] == 0 else None  # qkv's default for Dk = 0 (1/sqrt(0) would be inf)
    out, _, lse = O.attention_oracle(q, k, v, allowed=_allowed(mask_name, q.shape, nk), scale=scale, score_fn=fn)
    return out, lse


@pytest.mark.parametrize("impl,engine", engine_params("torch", "auto"))
@pytest.mark.parametrize("library", ["numpy", "torch"])
@pytest.mark.parametrize("shape,mask_name,mod_name", list(_cases()))
def test_an_empty_axis_gives_sdpas_answer_on_every_impl(impl, engine, library, shape, mask_name, mod_name, rng):
    if library == "torch" and not HAS_TORCH:
        pytest.skip("torch not installed")
    q, k, v = (rng.standard_normal(s) for s in SHAPES[shape])
    want_out, want_lse = _expected(q, k, v, mask_name, mod_name)
    args = (q, k, v)
    if library == "torch":
        import torch

        args = tuple(torch.tensor(x, requires_grad=True) for x in args)
    mask = MASKS[mask_name][0]
    if library == "torch" and isinstance(mask, np.ndarray):
        import torch

        mask = torch.tensor(mask)
    kw = {"mask": mask, "score_mod": MODS[mod_name]}
    extra = {} if engine is None else {"engine": engine}
    if impl == "torch" and library == "numpy":
        with pytest.raises(qkv.errors.ArgumentError, match="torch tensors"):
            qkv._core.run(build_call(*args, **kw, **extra), impl)
        return
    c = build_call(*args, want_lse=impl != "torch", **kw, **extra)
    try:
        res = qkv._core.run(c, impl)
    except qkv.errors.ArgumentError as e:  # SDPA's documented refusals (lse, a non-additive mod)
        assert impl == "torch" and "torch" in str(e).lower(), e
        return
    assert tuple(res.out.shape) == want_out.shape
    assert_close(res.out, want_out, tol=1e-12)
    if res.lse is not None:
        assert_close(res.lse, want_lse, tol=1e-12, name="lse")
    if library == "torch":
        w = rng.standard_normal(want_out.shape)
        (res.out * args[0].new_tensor(w)).sum().backward()
        for x, s in zip(args, SHAPES[shape], strict=True):
            assert tuple(x.grad.shape) == s and np.isfinite(to_numpy64(x.grad)).all()
        # Dk = 0: no gradient reaches q or k (their axis is empty); v gets the weights' transpose times w
        assert_close(args[2].grad, _dv(q, k, v, w, mask_name, mod_name), tol=1e-12)


def _dv(q, k, v, w, mask_name, mod_name):
    b, h, nq, _ = q.shape
    hkv, nk, dv = v.shape[-3:]
    if b * h * dv == 0:
        return np.zeros(v.shape)
    fn = _oracle_mod(mod_name, h)
    scale = 1.0 if q.shape[-1] == 0 else None
    a = O.attention_oracle(q, k, v, allowed=_allowed(mask_name, q.shape, nk), scale=scale, score_fn=fn)[1]
    return np.einsum("bgrij,bgrid->bgjd", a.reshape(b, hkv, h // hkv, nq, nk), w.reshape(b, hkv, h // hkv, nq, dv))


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_answer_is_sdpas_own(shape, rng):
    import torch
    import torch.nn.functional as F

    q, k, v = (torch.tensor(rng.standard_normal(s)) for s in SHAPES[shape])
    allowed = torch.tensor(MASKS["bool-array"][0])
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=True)
    got = qkv.attention(q, k, v, mask=allowed)
    assert got.shape == want.shape
    assert_close(got, to_numpy64(want).copy(), tol=1e-12)


def test_an_empty_axis_is_reported_by_dispatch(rng):
    q, k, v = (rng.standard_normal(s) for s in SHAPES["Dk=0"])
    d = qkv.dispatch(q, k, v, impl="flash")
    assert d.impl == "reference" and "Dk = 0" in d.reason


def test_a_gqa_call_with_kv_heads_but_no_query_heads_is_empty_and_the_reverse_an_error(rng):
    out = qkv.attention(np.ones((1, 0, 3, 4)), np.ones((1, 2, 5, 4)), np.ones((1, 2, 5, 4)))
    assert out.shape == (1, 0, 3, 4)
    with pytest.raises(qkv.errors.ShapeError, match="Hkv=0"):
        qkv.attention(np.ones((1, 2, 3, 4)), np.ones((1, 0, 5, 4)), np.ones((1, 0, 5, 4)))
