"""qkv.scores.general (Luong) and qkv.scores.additive (Bahdanau) and their analytic backward passes,
against formulas written here, central differences (float64) and torch autograd."""

import numpy as np
import pytest

import oracle as O
import qkv
from qkv.errors import DTypeError, ShapeError

S = qkv.scores


def general_loops(q, k, w):
    """s[..., i, j] = sum_ab q[..., i, a] w[a, b] k[..., j, b]."""
    return np.einsum("...ia,ab,...jb->...ij", q, w, k)


def additive_loops(q, k, w_q, w_k, v):
    """s[..., i, j] = v · tanh(W_q q_i + W_k k_j), one (i, j) at a time."""
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    q, k = np.broadcast_to(q, batch + q.shape[-2:]), np.broadcast_to(k, batch + k.shape[-2:])
    out = np.zeros(batch + (q.shape[-2], k.shape[-2]))
    for b in np.ndindex(*batch):
        for i in range(q.shape[-2]):
            for j in range(k.shape[-2]):
                out[b + (i, j)] = v @ np.tanh(w_q @ q[b + (i,)] + w_k @ k[b + (j,)])
    return out


CASES = [  # q shape, k shape, Da
    pytest.param((3, 4), (5, 6), 7, id="2d"),
    pytest.param((2, 3, 4), (1, 5, 6), 3, id="broadcast-batch"),
    pytest.param((2, 1, 1, 4), (3, 4, 2), 5, id="broadcast-both-nq1"),
]


def _inputs(rng, qs, ks, da):
    q, k = rng.standard_normal(qs), rng.standard_normal(ks)
    return (
        q,
        k,
        rng.standard_normal((qs[-1], ks[-1])),
        rng.standard_normal((da, qs[-1])),
        rng.standard_normal((da, ks[-1])),
        rng.standard_normal(da),
    )


@pytest.mark.parametrize("qs,ks,da", CASES)
def test_forward_matches_the_formulas(rng, qs, ks, da):
    q, k, w, w_q, w_k, v = _inputs(rng, qs, ks, da)
    O_general = general_loops(q, k, w)
    np.testing.assert_allclose(S.general(q, k, w), O_general, atol=1e-12)
    np.testing.assert_allclose(S.additive(q, k, w_q, w_k, v), additive_loops(q, k, w_q, w_k, v), atol=1e-12)


def test_general_with_identity_is_the_dot_product(rng):
    q, k = rng.standard_normal((3, 4)), rng.standard_normal((5, 4))
    np.testing.assert_allclose(S.general(q, k, np.eye(4)), q @ k.T, atol=1e-14)


@pytest.mark.parametrize("qs,ks,da", CASES)
def test_backward_matches_central_differences(rng, qs, ks, da):
    q, k, w, w_q, w_k, v = _inputs(rng, qs, ks, da)
    ds = rng.standard_normal(general_loops(q, k, w).shape)
    got = S.general_backward(ds, q, k, w)
    want = O.numerical_gradients(general_loops, [q, k, w], ds)
    for name, g, fd in zip(("dq", "dk", "dw"), got, want, strict=True):
        assert g.shape == fd.shape, name
        np.testing.assert_allclose(g, fd, atol=1e-7, err_msg=name)
    got = S.additive_backward(ds, q, k, w_q, w_k, v)
    want = O.numerical_gradients(additive_loops, [q, k, w_q, w_k, v], ds)
    for name, g, fd in zip(("dq", "dk", "dw_q", "dw_k", "dv"), got, want, strict=True):
        assert g.shape == fd.shape, name
        np.testing.assert_allclose(g, fd, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("qs,ks,da", CASES)
def test_torch_matches_numpy_and_autograd_of_the_formula(rng, qs, ks, da):
    torch = pytest.importorskip("torch")
    arrays = _inputs(rng, qs, ks, da)
    q, k, w, w_q, w_k, v = (torch.tensor(a, requires_grad=True) for a in arrays)
    ds = torch.randn(torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]) + (qs[-2], ks[-2]), dtype=torch.float64)

    # the formulas in plain torch: autograd of these is the independent reference
    ref_general = torch.einsum("...ia,ab,...jb->...ij", q, w, k)
    t = torch.tanh((q @ w_q.T)[..., :, None, :] + (k @ w_k.T)[..., None, :, :])
    ref_additive = t @ v
    ref_g = torch.autograd.grad(ref_general, (q, k, w), ds)
    ref_a = torch.autograd.grad(ref_additive, (q, k, w_q, w_k, v), ds)

    sg = S.general(q, k, w)
    sa = S.additive(q, k, w_q, w_k, v)
    assert isinstance(sg, torch.Tensor) and sg.dtype == torch.float64
    np.testing.assert_allclose(sg.detach().numpy(), ref_general.detach().numpy(), atol=1e-12)
    np.testing.assert_allclose(sa.detach().numpy(), ref_additive.detach().numpy(), atol=1e-12)
    for got, want in (
        (torch.autograd.grad(sg, (q, k, w), ds), ref_g),
        (torch.autograd.grad(sa, (q, k, w_q, w_k, v), ds), ref_a),
        (S.general_backward(ds, q.detach(), k.detach(), w.detach()), ref_g),
        (S.additive_backward(ds, *(x.detach() for x in (q, k, w_q, w_k, v))), ref_a),
    ):
        for g, r in zip(got, want, strict=True):
            np.testing.assert_allclose(g.detach().numpy(), r.numpy(), atol=1e-12)


def test_additive_chunks_give_the_same_scores_and_gradients(rng, monkeypatch):
    import qkv.scores._functions

    q, k, _, w_q, w_k, v = _inputs(rng, (2, 9, 4), (2, 6, 3), 5)
    ds = rng.standard_normal((2, 9, 6))
    whole = S.additive(q, k, w_q, w_k, v), S.additive_backward(ds, q, k, w_q, w_k, v)
    monkeypatch.setattr(qkv.scores._functions, "CHUNK", 2 * 6 * 5 * 2)  # two query rows per chunk: 5 chunks
    np.testing.assert_allclose(S.additive(q, k, w_q, w_k, v), whole[0], atol=1e-13)
    for g, h in zip(S.additive_backward(ds, q, k, w_q, w_k, v), whole[1], strict=True):
        np.testing.assert_allclose(g, h, atol=1e-13)


def test_half_precision_returns_the_input_dtype(rng):
    torch = pytest.importorskip("torch")
    q, k, w, w_q, w_k, v = (torch.tensor(a) for a in _inputs(rng, (3, 4), (5, 6), 7))
    want = additive_loops(*(a.numpy() for a in (q, k, w_q, w_k, v)))
    got = S.additive(*(a.to(torch.bfloat16) for a in (q, k, w_q, w_k, v)))
    assert got.dtype == torch.bfloat16
    np.testing.assert_allclose(got.float().numpy(), want, atol=0.1)
    assert S.general(q.half(), k.half(), w.half()).dtype == torch.float16


def test_empty_queries_give_empty_scores(rng):
    q, k, w, w_q, w_k, v = _inputs(rng, (0, 4), (5, 6), 3)
    assert S.general(q, k, w).shape == (0, 5)
    assert S.additive(q, k, w_q, w_k, v).shape == (0, 5)


def test_errors_name_the_argument_and_sizes(rng):
    q, k, w, w_q, w_k, v = _inputs(rng, (3, 4), (5, 6), 7)
    with pytest.raises(ShapeError, match=r"w must have shape \(Dq, Dk\) = \(4, 6\).*got \(6, 4\)"):
        S.general(q, k, w.T)
    with pytest.raises(ShapeError, match=r"w_k must have shape \(Da, Dk\) = \(7, 6\)"):
        S.additive(q, k, w_q, w_k[:, :5], v)
    with pytest.raises(ShapeError, match=r"v must be a vector"):
        S.additive(q, k, w_q, w_k, v[:, None])
    with pytest.raises(ShapeError, match="do not broadcast"):
        S.general(rng.standard_normal((2, 3, 4)), rng.standard_normal((3, 5, 6)), w)
    with pytest.raises(ShapeError, match=r"dscores has shape \(5, 3\)"):
        S.general_backward(np.ones((5, 3)), q, k, w)
    with pytest.raises(DTypeError, match="different dtypes"):
        S.general(q.astype(np.float32), k, w)
    with pytest.raises(DTypeError, match="floating-point"):
        S.general(np.ones((3, 4), dtype=int), np.ones((5, 6), dtype=int), np.ones((4, 6), dtype=int))
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="mixed kinds"):
        S.general(torch.tensor(q), k, w)
