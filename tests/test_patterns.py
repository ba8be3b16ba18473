"""The attention patterns of the peers: ragged sequences, masks over (b, h, i, j), plain-function
score mods, a bias beside a mask, sinks, offsets, rotary variants, dropout in the O(N) kernel.

Every pattern against an independent float64 reference written here (loops, or running each
sequence alone through the oracle), forward and gradients, on each impl that runs it.
"""

import math

import numpy as np
import pytest

import oracle as O
import qkv
from helpers import HAS_TORCH, assert_close, make_qkv, tiled_attention, tiled_backward
from qkv import masks, scores
from qkv.errors import ArgumentError, MaskError, ShapeError

needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
TILES = (3, 4)  # small odd tiles: EMPTY, PARTIAL and FULL ones in every case


def run(impl, *args, **kw):
    """qkv.attention, with small tiles for the flash kernel."""
    return tiled_attention(*args, impl=impl, tiles=TILES if impl == "flash" else None, **kw)


def band(nq, nk, causal, left, right):
    """Allowed (Nq, Nk) of one sequence: -right <= p - j <= left, p = i + Nk - Nq (right 0 if causal)."""
    right = 0 if causal else right
    return O._grid(nq, nk, lambda i, j: -right <= i + nk - nq - j <= left)


# --------------------------------------------------------------------------- packed (varlen) sequences

PACKED = [  # (query lengths, key lengths or None, causal, window)
    pytest.param([3, 5, 4], None, True, None, id="self-causal"),
    pytest.param([3, 5, 4], None, False, 2, id="self-window-2"),
    pytest.param([2, 1, 4], [5, 3, 6], True, None, id="decode-like-causal"),
    pytest.param([2, 0, 4], [3, 4, 2], True, (2, 0), id="empty-seq-window-pair"),
    pytest.param([4, 3], [2, 5], False, (1, 1), id="lq>lk-symmetric"),
]


@pytest.mark.parametrize("impl", ["reference", "flash"])
@pytest.mark.parametrize("lq,lk,causal,window", PACKED)
def test_packed_sequences_equal_each_sequence_alone(lq, lk, causal, window, impl, rng):
    lk_ = lq if lk is None else lk
    cq, ck = np.concatenate([[0], np.cumsum(lq)]), np.concatenate([[0], np.cumsum(lk_)])
    q, k, v = make_qkv(rng, (1, int(cq[-1]), 3), (1, int(ck[-1]), 3), (1, int(ck[-1]), 2))
    mask = masks.packed(cq, None if lk is None else ck, causal=causal, window=window)
    left, right = (
        (math.inf, math.inf) if window is None else (window if isinstance(window, tuple) else (window - 1,) * 2)
    )
    allowed = np.zeros((int(cq[-1]), int(ck[-1])), dtype=bool)
    for s in range(len(lq)):
        allowed[cq[s] : cq[s + 1], ck[s] : ck[s + 1]] = band(lq[s], lk_[s], causal, left, right)
    assert_close(mask.dense(int(cq[-1]), int(ck[-1])), allowed)
    out, lse = run(impl, q, k, v, mask=mask, return_lse=True)
    for s in range(len(lq)):  # the independent reference: the sequence alone
        qs, ks, vs = q[:, cq[s] : cq[s + 1]], k[:, ck[s] : ck[s + 1]], v[:, ck[s] : ck[s + 1]]
        golden = O.attention_oracle(qs, ks, vs, allowed=band(lq[s], lk_[s], causal, left, right))
        assert_close(out[:, cq[s] : cq[s + 1]], golden[0], tol=1e-11)
        assert_close(lse[:, cq[s] : cq[s + 1]], golden[2], tol=1e-11)
    dout = rng.standard_normal(out.shape)
    grads = tiled_backward(dout, q, k, v, out, lse, mask=mask, impl=impl, tiles=TILES if impl == "flash" else None)
    if impl == "reference":  # against finite differences of the oracle (once: flash is checked against this)
        want = O.numerical_gradients(lambda a, b, c: O.attention_oracle(a, b, c, allowed=allowed)[0], (q, k, v), dout)
    else:
        want = qkv.attention_backward(dout, q, k, v, out, lse, mask=allowed, impl="reference")
    for g, w in zip(grads, want, strict=True):
        assert_close(g, w, tol=1e-7 if impl == "reference" else 1e-11)


def test_packed_tiles_are_counted_from_intervals_exactly():
    mask = masks.packed([0, 5, 9, 17], causal=True)
    for bq, bk in ((2, 3), (4, 4), (17, 17)):
        assert_close(mask.blocks(17, 17, bq, bk), O.tile_classes(mask.dense(17, 17), bq, bk))


@pytest.mark.parametrize(
    "bad,words",
    [
        (lambda: masks.packed([1, 3]), "starting at 0"),
        (lambda: masks.packed([0, 3, 2]), "never decreasing"),
        (lambda: masks.packed([0, 3], [0, 2, 4]), "describes 2 sequences but cu_seqlens_q 1"),
        (lambda: masks.packed([0, 3], window=0), "window must be an integer >= 1"),
        (lambda: masks.packed([0, 3]).dense(4, 4), "cover Nq=3 queries and Nk=3 keys"),
    ],
)
def test_packed_errors(bad, words):
    with pytest.raises(MaskError) as e:
        bad()
    assert words in str(e.value)


# --------------------------------------------------------------------------- padding aligned per sequence


@pytest.mark.parametrize("left", [False, True], ids=["right", "left"])
@pytest.mark.parametrize("causal,window", [(True, None), (True, 2), (False, 2), (False, None)])
@pytest.mark.parametrize("impl", ["reference", "flash"])
def test_padding_aligns_causal_and_window_to_each_sequence(left, causal, window, impl, rng):
    nq, nk, kl, ql = 5, 7, [7, 4], [5, 3]
    q, k, v = make_qkv(rng, (2, 2, nq, 4), (2, 2, nk, 4))
    mask = masks.padding(np.array(kl), np.array(ql), causal=causal, window=window, left=left)
    w = (math.inf, math.inf) if window is None else (window - 1, window - 1)
    allowed = np.zeros((2, 1, nq, nk), dtype=bool)
    for b in range(2):
        q0, k0 = (nq - ql[b], nk - kl[b]) if left else (0, 0)
        allowed[b, 0, q0 : q0 + ql[b], k0 : k0 + kl[b]] = band(ql[b], kl[b], causal, *w)
    assert_close(mask.dense(nq, nk), allowed)
    assert_close(run(impl, q, k, v, mask=mask), O.attention_oracle(q, k, v, allowed=allowed)[0], tol=1e-11)


def test_padding_for_a_decode_step_against_caches_of_different_lengths(rng):
    """cache_seqlens: one new query per sequence sees exactly its own cache."""
    q, k, v = make_qkv(rng, (3, 2, 1, 4), (3, 2, 9, 4))
    mask = masks.padding(np.array([9, 4, 1]), causal=True)
    out = run("flash", q, k, v, mask=mask)
    for b, n in enumerate((9, 4, 1)):
        assert_close(out[b], O.attention_oracle(q[b], k[b, :, :n], v[b, :, :n])[0], tol=1e-11)


# --------------------------------------------------------------------------- masks over (b, h, i, j)


def per_head_window(b, h, i, j):
    return (i - j >= 0) & (i - j < 2 * (h + 1) + b)


def test_from_fn_with_batch_and_head_matches_its_loop(rng):
    m = masks.from_fn(per_head_window).bound((2, 3))
    want = np.zeros((2, 3, 9, 9), dtype=bool)
    for b, h, i, j in np.ndindex(2, 3, 9, 9):
        want[b, h, i, j] = per_head_window(b, h, i, j)
    assert_close(m.dense(9, 9), want)
    assert_close(m.blocks(9, 9, 2, 4), O.tile_classes(want, 2, 4))  # classified by evaluation, per (b, h)
    q, k, v = make_qkv(rng, (2, 3, 9, 4), (2, 3, 9, 4))
    for impl in ("reference", "flash"):
        assert_close(
            run(impl, q, k, v, mask=masks.from_fn(per_head_window)), O.attention_oracle(q, k, v, allowed=want)[0]
        )


def test_from_fn_forms_and_errors():
    with pytest.raises(MaskError, match="depends on the batch and head index"):
        masks.from_fn(per_head_window).dense(4, 4)
    with pytest.raises(MaskError, match="takes 3 positional arguments"):
        masks.from_fn(lambda a, b, c: a == b)
    both = masks.from_fn(per_head_window) & masks.causal()
    assert both.bound((1, 2)).dense(5, 5).shape == (1, 2, 5, 5)
    m = masks.from_fn(per_head_window)
    assert m.bound((2, 3)) is m.bound((2, 3))  # bound once per shape


# --------------------------------------------------------------------------- plain-function score mods


def _mod_np(s, b, h, i, j):
    return 8 * np.tanh(s / 8) - 0.25 * h * np.abs(i - j)


def _mod_grad_np(s, b, h, i, j):
    return 1 - np.tanh(s / 8) ** 2


def test_score_fn_forward_and_numpy_backward_with_its_derivative(rng):
    q, k, v = make_qkv(rng, (2, 3, 5, 4), (2, 3, 6, 4))
    mod = scores.from_fn(_mod_np, grad=_mod_grad_np)

    def fn(s, h, i, j, nq, nk):  # the oracle's row-by-row form
        return 8 * np.tanh(s / 8) - 0.25 * h * np.abs(i - j)

    golden = O.attention_oracle(q, k, v, score_fn=fn)
    dout = rng.standard_normal(golden[0].shape)
    fd = O.numerical_gradients(lambda a, b, c: O.attention_oracle(a, b, c, score_fn=fn)[0], (q, k, v), dout)
    for impl in ("reference", "flash"):
        out, lse = run(impl, q, k, v, score_mod=mod, return_lse=True)
        assert_close(out, golden[0], tol=1e-11)
        grads = tiled_backward(
            dout, q, k, v, out, lse, score_mod=mod, impl=impl, tiles=TILES if impl == "flash" else None
        )
        for g, want in zip(grads, fd, strict=True):
            assert_close(g, want, tol=1e-7)
    out, lse = qkv.attention(q, k, v, score_mod=scores.from_fn(_mod_np), return_lse=True)
    with pytest.raises(ArgumentError, match="no derivative on NumPy arrays: pass scores.from_fn"):
        qkv.attention_backward(dout, q, k, v, out, lse, score_mod=scores.from_fn(_mod_np))


@needs_torch
def test_score_fn_with_torch_autograd_and_closed_over_parameters(rng):
    import torch

    q, k, v = (torch.tensor(x, requires_grad=True) for x in make_qkv(rng, (2, 3, 5, 4), (2, 3, 6, 4)))
    w = torch.tensor(0.25, dtype=torch.float64, requires_grad=True)  # a learnable parameter inside fn
    mod = scores.from_fn(lambda s, b, h, i, j: 8 * torch.tanh(s / 8) - w * h * (i - j).abs())
    assert qkv.dispatch(q, k, v, score_mod=mod, impl="auto").impl == "reference"  # flash declines opaque mods
    out = qkv.attention(q, k, v, score_mod=mod)
    out.sum().backward()
    s = (q @ k.mT) / 2.0
    h = torch.arange(3.0, dtype=torch.float64)[:, None, None]
    i, j = torch.arange(5.0)[:, None], torch.arange(6.0)[None, :]
    want = torch.softmax(8 * torch.tanh(s / 8) - w * h * (i - j).abs(), -1) @ v
    grads = torch.autograd.grad(want.sum(), (q, k, v, w))
    assert_close(out.detach().numpy(), want.detach().numpy())
    for got, g in zip((q.grad, k.grad, v.grad, w.grad), grads, strict=True):
        assert_close(got.numpy(), g.numpy(), tol=1e-11)
    detached = [x.detach() for x in (q, k, v)]  # the analytic backward takes autograd's derivative of fn
    o, lse = qkv.attention(*detached, score_mod=mod, return_lse=True, impl="flash")
    for impl in ("reference", "flash"):
        got = qkv.attention_backward(torch.ones_like(o), *detached, o, lse, score_mod=mod, impl=impl)
        for a, b in zip(got, grads[:3], strict=True):
            assert_close(a.numpy(), b.numpy(), tol=1e-11)


# --------------------------------------------------------------------------- bias beside a mask, and sinks


@pytest.mark.parametrize("impl", ["reference", "flash", "auto"])
def test_bias_beside_a_structured_mask(impl, rng):
    q, k, v = make_qkv(rng, (2, 3, 7, 4), (2, 3, 9, 4))
    bias = rng.standard_normal((3, 7, 9))
    mask = masks.sliding_window(3)
    out = run(impl, q, k, v, mask=mask, bias=bias)
    assert_close(out, O.attention_oracle(q, k, v, allowed=mask.dense(7, 9), bias=bias)[0], tol=1e-11)
    assert_close(run(impl, q, k, v, bias=bias[0, 0]), O.attention_oracle(q, k, v, bias=bias[0, 0])[0])  # (Nk,)


def sink_oracle(q, k, v, sinks, allowed=None):
    """A sink is an extra key whose logit is the sink and whose value is zero."""
    h, nq = q.shape[-3], q.shape[-2]
    # the extra key is zero (score 0) and its bias is the sink: its logit is exactly the sink
    k2 = np.concatenate([k, np.zeros((*k.shape[:-2], 1, k.shape[-1]))], -2)
    v2 = np.concatenate([v, np.zeros((*v.shape[:-2], 1, v.shape[-1]))], -2)
    bias = np.zeros((h, nq, k2.shape[-2]))
    bias[:, :, -1] = np.asarray(sinks)[:, None]
    full = (
        np.ones((h, nq, k2.shape[-2]), dtype=bool)
        if allowed is None
        else np.concatenate([np.broadcast_to(allowed, (h, nq, k.shape[-2])), np.ones((h, nq, 1), dtype=bool)], -1)
    )
    return O.attention_oracle(q, k2, v2, allowed=full, bias=bias)


@pytest.mark.parametrize("impl", ["reference", "flash"])
def test_sinks_join_every_denominator(impl, rng):
    q, k, v = make_qkv(rng, (2, 3, 6, 4), (2, 3, 8, 4))
    sinks = rng.standard_normal(3)
    allowed = masks.causal().dense(6, 8)
    allowed_empty = allowed.copy()
    allowed_empty[0] = False  # a row with nothing to attend: lse = sink
    out, w, lse = run(impl, q, k, v, mask=allowed_empty, sinks=sinks, return_weights=True, return_lse=True)
    golden = sink_oracle(q, k, v, sinks, allowed_empty)
    assert_close(out, golden[0], tol=1e-11)
    assert_close(w, golden[1][..., :-1], tol=1e-11)
    assert_close(lse, golden[2], tol=1e-11)
    assert_close(lse[..., 0], np.broadcast_to(sinks, (2, 3)))


@needs_torch
def test_gradients_reach_bias_and_sinks(rng):
    import torch

    q, k, v = make_qkv(rng, (2, 3, 6, 4), (2, 3, 8, 4))
    bias, sinks = rng.standard_normal((3, 6, 8)), rng.standard_normal(3)
    dout = rng.standard_normal((2, 3, 6, 4))

    def f(b_, s_):  # oracle with bias and sinks
        k2 = np.concatenate([k, np.zeros((2, 3, 1, 4))], -2)
        v2 = np.concatenate([v, np.zeros((2, 3, 1, 4))], -2)
        full = np.concatenate([b_, np.broadcast_to(s_[:, None, None], (3, 6, 1))], -1)
        return float((O.attention_oracle(q, k2, v2, bias=full)[0] * dout).sum())

    eps = 1e-6
    fd_bias = np.zeros_like(bias)
    for idx in np.ndindex(*bias.shape):
        e = np.zeros_like(bias)
        e[idx] = eps
        fd_bias[idx] = (f(bias + e, sinks) - f(bias - e, sinks)) / (2 * eps)
    fd_sinks = np.array(
        [(f(bias, sinks + eps * np.eye(3)[h]) - f(bias, sinks - eps * np.eye(3)[h])) / (2 * eps) for h in range(3)]
    )
    for impl in ("reference", "flash"):
        t = [torch.tensor(x, requires_grad=True) for x in (q, k, v, bias, sinks)]
        out = tiled_attention(*t[:3], bias=t[3], sinks=t[4], impl=impl, tiles=TILES if impl == "flash" else None)
        (out * torch.from_numpy(dout)).sum().backward()
        assert_close(t[3].grad.numpy(), fd_bias, tol=1e-7, name=f"{impl} dbias")
        assert_close(t[4].grad.numpy(), fd_sinks, tol=1e-7, name=f"{impl} dsinks")


def test_sinks_shapes_are_checked():
    q = np.ones((2, 3, 4, 2))
    with pytest.raises(ShapeError, match=r"sinks has shape \(4,\)"):
        qkv.attention(q, q, q, sinks=np.ones(4))
    assert qkv.attention(q, q, q, sinks=np.zeros((2, 3))).shape == (2, 3, 4, 2)


# --------------------------------------------------------------------------- offsets, per-batch ALiBi, rotary variants


@pytest.mark.parametrize(
    "make,pred",
    [
        (lambda: masks.sliding_window(3, offset=0), lambda i, j: 0 <= i - j < 3),
        (lambda: masks.sliding_window(2, causal=False, offset=1), lambda i, j: abs(i + 1 - j) < 2),
        (lambda: masks.prefix_lm(2, offset=0), lambda i, j: j < 2 or j <= i),
        (lambda: masks.dilated(2, 2, offset=0), lambda i, j: abs(i - j) < 4 and (i - j) % 2 == 0),
        (
            lambda: masks.document(np.array([0, 0, 1, 1, 1, 2, 2]), offset=0),
            lambda i, j: [0, 0, 1, 1, 1, 2, 2][i] == [0, 0, 1, 1, 1, 2, 2][j],
        ),
    ],
    ids=["window", "window-symmetric", "prefix", "dilated", "document"],
)
def test_offsets_align_top_left(make, pred, rng):
    m = make()
    assert_close(m.dense(4, 7), O._grid(4, 7, pred))
    for bq, bk in ((2, 3), (1, 1)):
        got, want = m.blocks(4, 7, bq, bk), O.tile_classes(O._grid(4, 7, pred), bq, bk)
        assert ((got == want) | (got == masks.PARTIAL)).all()  # EMPTY and FULL exact, PARTIAL may be conservative
        assert (got[want == masks.PARTIAL] == masks.PARTIAL).all()


def test_alibi_slopes_per_batch_element(rng):
    q, k, v = make_qkv(rng, (2, 3, 5, 4), (2, 3, 5, 4))
    slopes = rng.random((2, 3))
    for impl in ("reference", "flash"):
        out = run(impl, q, k, v, score_mod=scores.alibi(slopes))
        for b in range(2):
            assert_close(out[b], O.attention_oracle(q[b], k[b], v[b], score_fn=O.alibi_score(slopes[b]))[0])


@pytest.mark.parametrize("rotary_dim", [None, 4])
def test_rope_interleaved_and_partial_match_gptj(rotary_dim, rng):
    x = rng.standard_normal((2, 6, 8))
    r = rotary_dim or 8
    pos = np.arange(6)[:, None]
    angle = pos * 10000.0 ** (-np.arange(0, r, 2) / r)
    want = x.copy()  # GPT-J: pairs (2c, 2c + 1) rotated by angle c; features past R untouched
    want[..., 0:r:2] = x[..., 0:r:2] * np.cos(angle) - x[..., 1:r:2] * np.sin(angle)
    want[..., 1:r:2] = x[..., 1:r:2] * np.cos(angle) + x[..., 0:r:2] * np.sin(angle)
    assert_close(qkv.positional.rope(x, interleaved=True, rotary_dim=rotary_dim), want)
    half = qkv.positional.rope(x, rotary_dim=4)
    assert_close(half[..., 4:], x[..., 4:])
    assert_close(half[..., :4], qkv.positional.rope(x[..., :4]))
    with pytest.raises(ShapeError, match="rotary_dim=3 to be even"):
        qkv.positional.rope(x, rotary_dim=3)


# --------------------------------------------------------------------------- dropout in the O(N) kernel


def test_dropout_masks_are_the_same_in_forward_and_backward_and_across_impls(rng):
    q, k, v = make_qkv(rng, (2, 3, 20, 4), (2, 3, 30, 4))
    kw = dict(dropout=0.3, rng=11, mask=masks.sliding_window(7))
    ref, wref, lse = qkv.attention(q, k, v, impl="reference", return_weights=True, return_lse=True, **kw)
    fl, wfl = run("flash", q, k, v, return_weights=True, **kw)
    assert_close(fl, ref, tol=1e-12)
    assert_close(wfl, wref, tol=1e-12)
    again = run("flash", q, k, v, **kw)
    assert np.array_equal(again, fl)  # the same seed gives the same bits
    assert not np.allclose(run("flash", q, k, v, **{**kw, "rng": 12}), fl)


def test_dropout_keeps_the_expected_fraction():
    p, n = 0.3, 200_000
    from qkv._philox import keep_mask

    keep = keep_mask(5, p, 0, 0, np.arange(400)[:, None], np.arange(n // 400)[None, :])
    sd = math.sqrt(n * p * (1 - p))
    assert abs((~keep).sum() - n * p) < 5 * sd


@needs_torch
def test_dropout_gradients_match_finite_differences_with_the_mask_fixed(rng):
    import torch

    q, k, v = make_qkv(rng, (1, 2, 6, 3), (1, 2, 7, 3))
    kw = dict(dropout=0.4, rng=3, causal=True)
    dout = rng.standard_normal((1, 2, 6, 3))
    fd = O.numerical_gradients(lambda a, b, c: qkv.attention(a, b, c, impl="reference", **kw), (q, k, v), dout)
    t = [torch.tensor(x, requires_grad=True) for x in (q, k, v)]
    out = tiled_attention(*t, impl="flash", tiles=(2, 3), **kw)
    (out * torch.from_numpy(dout)).sum().backward()
    for x, want in zip(t, fd, strict=True):
        assert_close(x.grad.numpy(), want, tol=1e-7)


def test_flash_declines_dropout_from_a_generator(rng):
    q = np.ones((1, 2, 8, 4))
    with pytest.raises(ArgumentError, match="int seed"):
        qkv.attention(q, q, q, dropout=0.1, rng=np.random.default_rng(0), impl="flash")
