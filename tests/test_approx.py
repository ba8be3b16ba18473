"""qkv.approx against formulas written out here in float64 loops, and the sparse recipes
(Longformer, BigBird) through the flash kernel against the reference with the dense mask.

References are independent: explicit sums over prefixes, softmax written with ``np.exp``,
``oracle.attention_oracle``; never qkv against itself.
"""

import math

import numpy as np
import pytest

import oracle as O
import qkv
from helpers import HAS_TORCH, assert_close, make_qkv, tiled_attention, tiled_backward, to_numpy64, to_torch
from qkv import approx, masks
from qkv.errors import ArgumentError, DTypeError, ShapeError

needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")


# --------------------------------------------------------------------------- formulas


def elu1(x):
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def relu(x):
    return np.maximum(x, 0.0)


def linear_oracle(q, k, v, phi, causal=False):
    """``Σ_j φ(q_i)·φ(k_j) v_j / Σ_j φ(q_i)·φ(k_j)`` one query row at a time; q (H, Nq, D), k/v (Hkv, Nk, D).

    Causal: keys ``j <= i + Nk - Nq`` (bottom-right); a zero normaliser gives a zero row.
    """
    h, nq, _ = q.shape
    hkv, nk, dv = v.shape
    out = np.zeros((h, nq, dv))
    for head in range(h):
        g = head // (h // hkv)
        for i in range(nq):
            last = i + nk - nq if causal else nk - 1
            num, den = np.zeros(dv), 0.0
            for j in range(last + 1):
                w = float(phi(q[head, i]) @ phi(k[g, j]))
                num += w * v[g, j]
                den += w
            out[head, i] = num / den if den > 0 else 0.0
    return out


def softmax_attention(q, k, v, causal=False):
    """Exact softmax attention with scale 1/sqrt(Dk), written with np.exp (float64)."""
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if causal:
        nq, nk = s.shape[-2:]
        s = np.where(np.arange(nk)[None, :] <= np.arange(nq)[:, None] + nk - nq, s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


def rel_err(a, b):
    return float(np.linalg.norm(to_numpy64(a) - b) / np.linalg.norm(b))


LINEAR_CASES = [
    pytest.param(2, 2, 7, 7, 5, 3, id="square"),
    pytest.param(4, 2, 5, 9, 4, 6, id="gqa-nq<nk"),
    pytest.param(3, 1, 9, 4, 3, 2, id="mqa-nq>nk"),
    pytest.param(2, 2, 1, 13, 4, 4, id="decode"),
]


# --------------------------------------------------------------------------- linear attention


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("fmap", ["elu", "relu"])
@pytest.mark.parametrize("h,hkv,nq,nk,dk,dv", LINEAR_CASES)
@pytest.mark.parametrize("chunk", [None, 3], ids=["chunk-default", "chunk-3"])
def test_linear_attention_equals_its_formula(h, hkv, nq, nk, dk, dv, fmap, causal, chunk, rng, monkeypatch):
    from qkv.approx import _sums as _approx_linear

    if chunk is not None:
        monkeypatch.setattr(_approx_linear, "CHUNK", chunk)  # many chunks, ragged last one
    q, k, v = make_qkv(rng, (h, nq, dk), (hkv, nk, dk), (hkv, nk, dv))
    out = approx.linear_attention(q, k, v, feature_map=fmap, causal=causal)
    assert isinstance(out, np.ndarray) and out.dtype == np.float64 and out.shape == (h, nq, dv)
    assert_close(out, linear_oracle(q, k, v, elu1 if fmap == "elu" else relu, causal), tol=1e-12)


def test_causal_linear_attention_spans_many_chunks(rng):
    q, k, v = make_qkv(rng, (2, 150, 8), (2, 150, 8))  # > 2 default chunks of 64
    assert_close(approx.linear_attention(q, k, v, causal=True), linear_oracle(q, k, v, elu1, True), tol=1e-12)


def test_linear_attention_with_a_callable_feature_map_and_batch_axes(rng):
    def square(x):
        return np.concatenate([x * x, np.ones_like(x[..., :1])], axis=-1)  # F = Dk + 1

    q, k, v = make_qkv(rng, (2, 3, 6, 4), (2, 3, 8, 4), (2, 3, 8, 5))
    out = approx.linear_attention(q, k, v, feature_map=square, causal=True)
    for b in range(2):
        assert_close(out[b], linear_oracle(q[b], k[b], v[b], square, True), tol=1e-12)


def test_elu_plus_one_features_are_positive():
    from qkv.approx._features import elu_plus_one

    x = np.linspace(-30.0, 30.0, 601)
    f = elu_plus_one(np, x)
    assert (f > 0).all()
    assert_close(f, elu1(x))


def test_a_row_with_a_zero_normaliser_gives_zeros(rng):
    q, k, v = make_qkv(rng, (1, 3, 4), (1, 5, 4))
    q[0, 1] = -np.abs(q[0, 1])  # relu(q) = 0: nothing to weigh with
    out = approx.linear_attention(q, k, v, feature_map="relu", causal=True)
    assert np.isfinite(out).all() and (out[0, 1] == 0).all()


def test_causal_queries_before_every_key_give_zeros(rng):
    q, k, v = make_qkv(rng, (1, 6, 4), (1, 2, 4))  # Nq > Nk: the first 4 rows see no key
    out = approx.linear_attention(q, k, v, causal=True)
    assert (out[0, :4] == 0).all() and np.abs(out[0, 4:]).min() > 0


def test_no_keys_gives_zeros(rng):
    q, k, v = make_qkv(rng, (2, 3, 4), (2, 0, 4))
    for fn in (approx.linear_attention, approx.performer):
        out = fn(q, k, v)
        assert out.shape == (2, 3, 4) and (out == 0).all()


def test_half_and_single_precision_keep_their_dtype(rng):
    q, k, v = make_qkv(rng, (2, 9, 4), (2, 9, 4), dtype=np.float32)
    for fn in (approx.linear_attention, approx.performer):
        assert fn(q, k, v, causal=True).dtype == np.float32
    out16 = approx.linear_attention(q.astype(np.float16), k.astype(np.float16), v.astype(np.float16))
    assert out16.dtype == np.float16
    assert_close(out16, linear_oracle(q.astype(np.float64), k, v, elu1), tol=2e-3)


# --------------------------------------------------------------------------- performer


def _performer_error(q, k, v, n_features, seeds, causal=False):
    exact = softmax_attention(q, k, v, causal)
    return float(np.mean([rel_err(approx.performer(q, k, v, n_features, s, causal), exact) for s in seeds]))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_performer_error_shrinks_as_features_grow(causal, rng):
    # error ~ 1/sqrt(m): 64x more features should cut it ~8x; asserting 2x cannot flake
    q, k, v = make_qkv(rng, (2, 40, 8), (2, 48, 8))
    q, k = 0.5 * q, 0.5 * k
    seeds = range(5)
    few, many = _performer_error(q, k, v, 16, seeds, causal), _performer_error(q, k, v, 1024, seeds, causal)
    assert many < 0.5 * few, (few, many)
    assert many < 0.15


def test_random_features_are_unbiased_for_the_softmax_kernel(rng):
    """Each seed gives one independent 8-feature estimate; their mean must sit within 5 standard
    errors of exp(q·k/√d) (the inputs are small, so the estimates are not heavy-tailed)."""
    from qkv.approx._features import orthogonal_gaussian

    def softmax_kernel_estimate(q, k, n_features, seed):
        """The unstabilised FAVOR+ estimate φ(q)·φ(k) of exp(q·k/√d), φ(x) = exp(ω·x' − |x'|²/2) / √m, x' = x/d^¼."""
        w = orthogonal_gaussian(n_features, q.shape[-1], seed)

        def phi(x):
            x = x / q.shape[-1] ** 0.25
            return np.exp(x @ w.T - (x * x).sum(-1, keepdims=True) / 2) / math.sqrt(n_features)

        return phi(q) @ phi(k).T

    q, k = 0.3 * rng.standard_normal((3, 4)), 0.3 * rng.standard_normal((5, 4))
    exact = np.exp(q @ k.T / math.sqrt(4))
    draws = np.stack([softmax_kernel_estimate(q, k, 8, seed) for seed in range(3000)])
    mean, se = draws.mean(0), draws.std(0, ddof=1) / math.sqrt(len(draws))
    assert (se < 0.01 * exact).all()  # precise enough to mean something
    assert (np.abs(mean - exact) < 5 * se).all(), np.abs(mean - exact) / se
    assert np.abs(draws[0] / exact - 1).max() > 0.05  # one draw alone is far less precise


def test_orthogonal_features_come_in_orthogonal_blocks():
    from qkv.approx._features import orthogonal_gaussian

    w = orthogonal_gaussian(10, 4, seed=3)
    assert w.shape == (10, 4)
    for block in (w[0:4], w[4:8]):
        gram = block @ block.T
        assert_close(gram - np.diag(np.diag(gram)), np.zeros((4, 4)), tol=1e-12)


def test_performer_is_the_normalised_random_feature_formula(rng):
    """The max shifts that stabilise the features cancel: same result as the plain estimator."""
    from qkv.approx._features import orthogonal_gaussian

    q, k, v = make_qkv(rng, (2, 6, 4), (2, 7, 4), (2, 7, 3))
    w = orthogonal_gaussian(32, 4, seed=5)

    def phi(x):
        x = x / 4**0.25
        return np.exp(x @ w.T - (x * x).sum(-1, keepdims=True) / 2)

    for causal in (False, True):
        assert_close(approx.performer(q, k, v, 32, 5, causal), linear_oracle(q, k, v, phi, causal), tol=1e-10)


def test_performer_stays_finite_on_large_scores(rng):
    q, k, v = make_qkv(rng, (2, 20, 16), (2, 20, 16), dtype=np.float32)
    for causal in (False, True):
        out = approx.performer(30 * q, 30 * k, v, 64, 0, causal)  # exponents in the hundreds
        assert np.isfinite(out).all()


# --------------------------------------------------------------------------- linformer


@pytest.mark.parametrize("proj_shape", [(5, 11), (2, 5, 11)], ids=["shared", "per-kv-head"])
def test_linformer_is_exact_attention_over_projected_keys_and_values(proj_shape, rng):
    q, k, v = make_qkv(rng, (2, 4, 6, 8), (2, 2, 11, 8), (2, 2, 11, 3))
    pk, pv = rng.standard_normal(proj_shape), rng.standard_normal(proj_shape)
    out = approx.linformer(q, k, v, pk, pv)
    if len(proj_shape) == 2:
        kp, vp = np.einsum("rn,bgnd->bgrd", pk, k), np.einsum("rn,bgnd->bgrd", pv, v)
    else:  # a projection per kv head
        kp, vp = np.einsum("grn,bgnd->bgrd", pk, k), np.einsum("grn,bgnd->bgrd", pv, v)
    golden = np.stack([O.attention_oracle(q[b], kp[b], vp[b])[0] for b in range(2)])
    assert_close(out, golden, tol=1e-12)


# --------------------------------------------------------------------------- errors


def test_bad_arguments_raise_typed_errors(rng):
    q, k, v = make_qkv(rng, (2, 5, 4), (2, 6, 4))
    with pytest.raises(ArgumentError, match="feature_map must be one of"):
        approx.linear_attention(q, k, v, feature_map="softplus")
    with pytest.raises(ShapeError, match=r"feature_map\(q\) must map q \(2, 5, 4\)"):
        approx.linear_attention(q, k, v, feature_map=lambda x: x.sum(-2))
    with pytest.raises(ArgumentError, match="negative features"):
        approx.linear_attention(q, k, v, feature_map=lambda x: x)
    with pytest.raises(ArgumentError, match="causal must be True or False"):
        approx.linear_attention(q, k, v, causal="yes")
    with pytest.raises(ArgumentError, match="n_features must be an integer >= 1, got 0"):
        approx.performer(q, k, v, n_features=0)
    with pytest.raises(ShapeError, match="d_k=3 on its last axis"):
        approx.performer(q, k[..., :3], v)
    with pytest.raises(ShapeError, match=r"proj_k must have shape \(r, Nk\) = \(r, 6\)"):
        approx.linformer(q, k, v, np.ones((3, 5)), np.ones((3, 6)))
    with pytest.raises(ShapeError, match=r"proj_v has leading axes \(3,\), which do not broadcast with k.s \(2,\)"):
        approx.linformer(q, k, v, np.ones((2, 3, 6)), np.ones((3, 3, 6)))
    with pytest.raises(ShapeError, match="proj_k has r=3 .* proj_v has r=2"):
        approx.linformer(q, k, v, np.ones((3, 6)), np.ones((2, 6)))
    with pytest.raises(DTypeError, match="proj_v has dtype float32 but k has float64"):
        approx.linformer(q, k, v, np.ones((3, 6)), np.ones((3, 6), np.float32))


@needs_torch
def test_mixed_kinds_raise_type_error(rng):
    q, k, v = make_qkv(rng, (2, 5, 4), (2, 6, 4))
    with pytest.raises(TypeError, match="mixed kinds"):
        approx.performer(to_torch(q), k, v)
    with pytest.raises(TypeError, match="mixed kinds"):
        approx.linformer(q, k, v, to_torch(np.ones((3, 6))), np.ones((3, 6)))


# --------------------------------------------------------------------------- torch and gradients


@needs_torch
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_torch_in_torch_out_with_gradients(causal, rng, monkeypatch):
    import torch

    from qkv.approx import _sums as _approx_linear

    monkeypatch.setattr(_approx_linear, "CHUNK", 3)
    q, k, v = make_qkv(rng, (4, 5, 3), (2, 7, 3), (2, 7, 2))
    t = [to_torch(x).requires_grad_() for x in (q, k, v)]
    out = approx.linear_attention(*t, causal=causal)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float64
    assert_close(out, linear_oracle(q, k, v, elu1, causal), tol=1e-12)
    torch.autograd.gradcheck(lambda a, b, c: approx.linear_attention(a, b, c, causal=causal), t)
    torch.autograd.gradcheck(lambda a, b, c: approx.performer(a, b, c, 8, 1, causal), t, fast_mode=True)
    pk = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda a, b, c, p: approx.linformer(a, b, c, p, p), (*t, pk), fast_mode=True)


@needs_torch
def test_torch_performer_matches_numpy_with_the_same_seed(rng):
    import torch

    q, k, v = make_qkv(rng, (2, 9, 4), (2, 9, 4), dtype=np.float32)
    ours = approx.performer(to_torch(q), to_torch(k), to_torch(v), 16, 7, True)
    assert ours.dtype == torch.float32
    assert_close(ours, approx.performer(q, k, v, 16, 7, True), tol=1e-5)
    half = approx.performer(*(to_torch(x).to(torch.bfloat16) for x in (q, k, v)), 16, 7)
    assert half.dtype == torch.bfloat16 and torch.isfinite(half).all()


# --------------------------------------------------------------------------- sparse recipes through flash


def random_blocks_allowed(nq, nk, mask):
    """BigBird's random part as drawn by qkv (the draw is qkv's own choice), checked to be block-aligned."""
    return mask.dense(nq, nk)


SPARSE = [
    pytest.param("longformer", id="longformer"),
    pytest.param("bigbird", id="bigbird"),
]


def _sparse(name, n):
    longformer = masks.sliding_window(4, causal=False) | masks.global_tokens([0, 9])
    want = O.sliding_window_allowed(n, n, 4, causal=False) | O.global_tokens_allowed(n, n, [0, 9])
    if name == "longformer":
        return longformer, want
    rnd = masks.random_blocks(5, per_row=2, seed=1)
    drawn = rnd.dense(n, n)
    # the random part: whole 5 x 5 blocks, exactly 2 key blocks per query block
    blocks = drawn.reshape(n // 5, 5, n // 5, 5)
    assert (blocks.all(axis=(1, 3)) == blocks.any(axis=(1, 3))).all()
    assert (blocks.any(axis=(1, 3)).sum(1) == 2).all()
    return longformer | rnd, want | drawn


@pytest.mark.parametrize("name", SPARSE)
def test_sparse_recipes_through_flash_equal_the_reference_forward_and_backward(name, rng):
    n = 35
    mask, allowed = _sparse(name, n)
    assert_close(mask.dense(n, n), allowed)  # the one-liner builds the intended pattern
    q, k, v = make_qkv(rng, (1, 2, n, 8), (1, 2, n, 8))
    dout = rng.standard_normal((1, 2, n, 8))
    tiles = (8, 6)  # many tiles: EMPTY ones skipped, FULL and PARTIAL ones computed
    assert (mask.blocks(n, n, *tiles) == masks.EMPTY).any()
    out, lse = tiled_attention(q, k, v, tiles=tiles, mask=mask, impl="flash", return_lse=True)
    grads = tiled_backward(dout, q, k, v, out, lse, tiles=tiles, mask=mask, impl="flash")
    ref, ref_lse = qkv.attention(q, k, v, mask=allowed, impl="reference", return_lse=True)
    ref_grads = qkv.attention_backward(dout, q, k, v, ref, ref_lse, mask=allowed, impl="reference")
    assert_close(out, O.attention_oracle(q, k, v, allowed=allowed)[0])
    assert_close(out, ref)
    for name_, g, want in zip(("dq", "dk", "dv"), grads, ref_grads, strict=True):
        assert_close(g, want, tol=1e-11, name=name_)


@needs_torch
@pytest.mark.parametrize("name", SPARSE)
def test_sparse_recipes_through_flash_with_torch_autograd(name, rng):
    import torch

    n = 35
    mask, allowed = _sparse(name, n)
    q, k, v = make_qkv(rng, (2, n, 4), (2, n, 4))
    grads = {}
    for impl, m in (("flash", mask), ("reference", torch.from_numpy(allowed))):
        t = [to_torch(x).requires_grad_() for x in (q, k, v)]
        out = tiled_attention(*t, tiles=(8, 6), mask=m, impl=impl)
        (out * torch.arange(n * 4, dtype=out.dtype).reshape(n, 4)).sum().backward()
        grads[impl] = [out, *(x.grad for x in t)]
    for a, b in zip(grads["flash"], grads["reference"], strict=True):
        assert_close(a, to_numpy64(b), tol=1e-11)
