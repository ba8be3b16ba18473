"""qkv.nn.MultiHeadAttention: equal to torch.nn.MultiheadAttention (outputs and gradients, masks,
batch_first both ways), and grouped-query heads, RoPE and ALiBi against ``reference_mha``: attention
written out with plain torch ops from the module's parameters (RoPE as complex rotations, ALiBi from
the paper's slopes), using nothing from qkv but the parameters it reads."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

import qkv  # noqa: E402
from qkv.errors import ArgumentError, MaskError, ShapeError  # noqa: E402
from qkv.nn import MultiHeadAttention, mask_from_torch  # noqa: E402

F32 = dict(rtol=1e-5, atol=2e-6)  # float32 against float32: a few ulps of the O(1) outputs


def rope_ref(x, positions, base=10000.0):
    """z_c = x_c + i x_{c+D/2} rotated by e^{i pos base^(-2c/D)}."""
    half = x.shape[-1] // 2
    z = torch.complex(x[..., :half].double(), x[..., half:].double())
    theta = base ** (-2.0 * torch.arange(half, dtype=torch.float64) / x.shape[-1])
    z = z * torch.exp(1j * torch.as_tensor(positions, dtype=torch.float64)[:, None] * theta)
    return torch.cat([z.real, z.imag], dim=-1).to(x.dtype)


def alibi_slopes_ref(h):
    """Powers of two only: head k = 1..H gets 2^(-8k/H)."""
    assert h & (h - 1) == 0
    return torch.tensor([2.0 ** (-8.0 * k / h) for k in range(1, h + 1)], dtype=torch.float64)


def reference_mha(m, x, context=None, allowed=None, causal=False, start=0, past_kv=None):
    """softmax(q kᵀ / √d + bias, masked) v with heads repeated (repeat_interleave), then out_proj.

    ``allowed`` (True = may attend) broadcasts to (B, H, Nq, Nk); ``start`` is the position of x's first
    token (for RoPE). Returns out (B, Nq, d_model) and weights (B, H, Nq, Nk).
    """
    b, nq, _ = x.shape
    src = x if context is None else context
    nk = src.shape[1]
    q = F.linear(x, m.q_proj.weight, m.q_proj.bias).view(b, nq, m.h, m.d_k).transpose(1, 2)
    k = F.linear(src, m.k_proj.weight, m.k_proj.bias).view(b, nk, m.hkv, m.d_k).transpose(1, 2)
    v = F.linear(src, m.v_proj.weight, m.v_proj.bias).view(b, nk, m.hkv, m.d_k).transpose(1, 2)
    if m.pos == "rope":
        q = rope_ref(q, torch.arange(start, start + nq))
        k = rope_ref(k, torch.arange(start + nq - nk, start + nq))
    k, v = k.repeat_interleave(m.h // m.hkv, dim=1), v.repeat_interleave(m.h // m.hkv, dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(m.d_k)
    i = torch.arange(nq)[:, None] + (nk - nq)  # bottom-right aligned query positions
    j = torch.arange(nk)[None, :]
    if m.pos == "alibi":
        s = s - (alibi_slopes_ref(m.h)[:, None, None] * (i - j).abs()).to(s.dtype)
    ok = torch.ones(nq, nk, dtype=torch.bool)
    if causal:
        ok = ok & (j <= i)
    if allowed is not None:
        ok = ok & allowed
    s = s.masked_fill(~ok, -math.inf)
    row_ok = ok.any(-1, keepdim=True)
    a = torch.softmax(s.masked_fill(~row_ok, 0.0), dim=-1) * row_ok
    out = (a @ v).transpose(1, 2).reshape(b, nq, m.h * m.d_k)
    return F.linear(out, m.out_proj.weight, m.out_proj.bias), a


def _torch_mha(e=16, h=4, batch_first=True, bias=True, kdim=None, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    m = torch.nn.MultiheadAttention(e, h, batch_first=batch_first, bias=bias, kdim=kdim, vdim=kdim, dtype=dtype)
    with torch.no_grad():  # torch zeros its biases at init; random ones test that they are copied
        for p in (m.in_proj_bias, m.out_proj.bias):
            if p is not None:
                p.uniform_(-0.5, 0.5)
    return m


def _hide_some(b, nq, nk, seed):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.rand(nq, nk, generator=g) < 0.4
    hidden[:, 0] = False  # every row keeps a key (torch gives NaN for an empty row)
    return hidden


CASES = [  # id, batch_first, which masks
    pytest.param(True, "none", id="batch-first-no-mask"),
    pytest.param(False, "none", id="seq-first-no-mask"),
    pytest.param(True, "bool", id="bool-attn-mask"),
    pytest.param(False, "bool", id="seq-first-bool-attn-mask"),
    pytest.param(True, "float", id="float-attn-mask"),
    pytest.param(True, "padding", id="key-padding-mask"),
    pytest.param(False, "padding+bool", id="seq-first-padding-and-bool"),
    pytest.param(True, "causal", id="causal"),
    pytest.param(True, "causal+padding", id="causal-and-padding"),
]


def _case_masks(kind, b, n):
    """(torch kwargs, qkv kwargs) for the same masking; the qkv side inverts torch's 'True = masked out'."""
    tk, qk = {}, {}
    hidden = _hide_some(b, n, n, 1)
    pad = torch.zeros(b, n, dtype=torch.bool)
    pad[0, -2:] = True  # batch 0 has two padding keys
    if "bool" in kind:
        tk["attn_mask"], qk["mask"] = hidden, ~hidden
    if kind == "float":
        bias = torch.randn(n, n)
        tk["attn_mask"], qk["mask"] = bias, bias
    if "padding" in kind:
        tk["key_padding_mask"] = pad
        allowed = ~pad[:, None, None, :]
        qk["mask"] = allowed if "mask" not in qk else qk["mask"] & allowed
    if "causal" in kind:
        tk["attn_mask"] = torch.triu(torch.ones(n, n, dtype=torch.bool), 1)
        tk["is_causal"] = True
        qk["causal"] = True
    return tk, qk


@pytest.mark.parametrize("batch_first,kind", CASES)
def test_from_torch_matches_outputs_weights_and_gradients(batch_first, kind):
    b, n, e = 3, 6, 16
    m = _torch_mha(e, 4, batch_first=batch_first).train()
    ours = MultiHeadAttention.from_torch(m)
    x = torch.randn(b, n, e)
    tk, qk = _case_masks(kind, b, n)
    xt = (x if batch_first else x.transpose(0, 1)).clone().requires_grad_(True)
    xq = x.clone().requires_grad_(True)
    out_t, w_t = m(xt, xt, xt, need_weights=True, average_attn_weights=False, **tk)
    out_q, w_q = ours(xq, need_weights=True, **qk)
    out_t_bf = out_t if batch_first else out_t.transpose(0, 1)
    torch.testing.assert_close(out_q, out_t_bf, **F32)
    torch.testing.assert_close(w_q, w_t, **F32)
    dout = torch.randn_like(out_q)
    out_q2 = ours(xq, **qk)  # need_weights=False: the fast path of impl="auto"
    torch.testing.assert_close(out_q2, out_t_bf, **F32)
    (out_t_bf * dout).sum().backward()
    (out_q2 * dout).sum().backward()
    gx_t = xt.grad if batch_first else xt.grad.transpose(0, 1)
    torch.testing.assert_close(xq.grad, gx_t, **F32)
    wq, wk, wv = m.in_proj_weight.grad.chunk(3)
    bq, bk, bv = m.in_proj_bias.grad.chunk(3)
    for lin, gw, gb in (
        (ours.q_proj, wq, bq),
        (ours.k_proj, wk, bk),
        (ours.v_proj, wv, bv),
        (ours.out_proj, m.out_proj.weight.grad, m.out_proj.bias.grad),
    ):
        torch.testing.assert_close(lin.weight.grad, gw, **F32)
        torch.testing.assert_close(lin.bias.grad, gb, **F32)


def test_mask_from_torch_converts_at_the_boundary():
    b, n, h, e = 2, 5, 4, 16
    m = _torch_mha(e, h).eval()
    ours = MultiHeadAttention.from_torch(m)
    x = torch.randn(b, n, e)
    hidden = _hide_some(b, n, n, 3)
    pad = torch.tensor([[False] * 4 + [True], [False] * 5])
    per_head = (torch.rand(b * h, n, n) < 0.3) & ~torch.eye(n, dtype=torch.bool)
    bias = torch.randn(n, n)
    for tk in (
        dict(attn_mask=hidden),
        dict(key_padding_mask=pad),
        dict(attn_mask=hidden, key_padding_mask=pad),
        dict(attn_mask=per_head),
        dict(attn_mask=bias),
        dict(attn_mask=bias, key_padding_mask=pad.float().masked_fill(pad, -math.inf)),
    ):
        with torch.no_grad():
            want, _ = m(x, x, x, **tk)
            got = ours(x, mask=mask_from_torch(**tk, n_heads=h))
        torch.testing.assert_close(got, want, **F32)
    converted = mask_from_torch(attn_mask=hidden, key_padding_mask=pad)
    assert converted.dtype == torch.bool and converted.shape == (b, 1, n, n)
    assert not converted[0, 0, :, 4].any() and (converted[1, 0] == ~hidden).all()
    assert mask_from_torch() is None
    with pytest.raises(MaskError, match="n_heads"):
        mask_from_torch(attn_mask=per_head)


def test_from_torch_cross_attention_with_kdim_and_no_bias():
    m = _torch_mha(16, 2, bias=False, kdim=10).eval()
    ours = MultiHeadAttention.from_torch(m)
    x, ctx = torch.randn(2, 3, 16), torch.randn(2, 7, 10)
    with torch.no_grad():
        torch.testing.assert_close(ours(x, context=ctx), m(x, ctx, ctx)[0], **F32)
    assert ours.q_proj.bias is None


def test_from_torch_float64_is_exact_to_float64_precision():
    m = _torch_mha(dtype=torch.float64).eval()
    ours = MultiHeadAttention.from_torch(m)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(
            ours(x, causal=True),
            m(x, x, x, attn_mask=torch.triu(torch.ones(5, 5, dtype=torch.bool), 1))[0],
            rtol=1e-12,
            atol=1e-12,
        )


def test_from_torch_refuses_what_it_cannot_copy():
    with pytest.raises(ArgumentError, match="add_bias_kv"):
        MultiHeadAttention.from_torch(torch.nn.MultiheadAttention(8, 2, add_bias_kv=True))
    with pytest.raises(ArgumentError, match="kdim == vdim"):
        MultiHeadAttention.from_torch(torch.nn.MultiheadAttention(8, 2, kdim=4, vdim=6))
    with pytest.raises(ArgumentError, match="MultiheadAttention"):
        MultiHeadAttention.from_torch(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("h,hkv", [(8, 8), (8, 4), (8, 2), (8, 1)])
@pytest.mark.parametrize("pos", [None, "rope", "alibi"])
def test_grouped_heads_match_the_repeated_reference(h, hkv, pos):
    torch.manual_seed(0)
    m = MultiHeadAttention(32, h, n_kv_heads=hkv, pos=pos).double()
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    allowed = torch.rand(2, 1, 7, 7) < 0.7
    for kw in (dict(causal=True), dict(mask=allowed), dict()):
        out, w = m(x, need_weights=True, **kw)
        want, want_w = reference_mha(m, x, allowed=kw.get("mask"), causal=kw.get("causal", False))
        torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(w, want_w, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(m(x, **kw), want, rtol=1e-10, atol=1e-12)


def test_gqa_parameter_counts_shrink_with_fewer_kv_heads():
    d, h, dk = 64, 8, 8
    counts = []
    for hkv in (8, 4, 2, 1):
        n = sum(p.numel() for p in MultiHeadAttention(d, h, n_kv_heads=hkv).parameters())
        assert n == 2 * (d * h * dk + h * dk) + 2 * (d * hkv * dk + hkv * dk) - h * dk + d  # q, out; k, v
        counts.append(n)
    assert counts == sorted(counts, reverse=True) and len(set(counts)) == 4
    plain = MultiHeadAttention(d, h)
    assert sum(p.numel() for p in plain.parameters()) == counts[0]


def test_n_kv_heads_equal_to_n_heads_is_plain_mha():
    """With Hkv = H the module is torch's MultiheadAttention (copied weights, same outputs)."""
    m = _torch_mha(16, 4).eval()
    gqa = MultiHeadAttention(16, 4, n_kv_heads=4)
    gqa.load_state_dict(MultiHeadAttention.from_torch(m).state_dict())
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(gqa(x), m(x, x, x)[0], **F32)


def test_cross_attention_nq_differs_from_nk():
    torch.manual_seed(1)
    m = MultiHeadAttention(16, 4, n_kv_heads=2).double()
    x, ctx = torch.randn(2, 3, 16, dtype=torch.float64), torch.randn(2, 9, 16, dtype=torch.float64)
    out, w = m(x, context=ctx, need_weights=True)
    assert out.shape == (2, 3, 16) and w.shape == (2, 4, 3, 9)
    torch.testing.assert_close(out, reference_mha(m, x, context=ctx)[0], rtol=1e-10, atol=1e-12)


def test_dropout_only_in_training():
    torch.manual_seed(0)
    m = MultiHeadAttention(16, 4, dropout=0.5)
    x = torch.randn(2, 6, 16)
    m.eval()
    with torch.no_grad():
        torch.testing.assert_close(m(x), reference_mha(m, x)[0], **F32)
        m.train()
        _, w = m(x, need_weights=True)
    assert (w == 0).float().mean() > 0.2  # dropped weights
    kept = w[w > 0]
    assert kept.max() > 1.0 / 6  # kept ones are scaled by 1 / (1 - p)


def test_empty_rows_give_zero_attention_not_nan():
    m = MultiHeadAttention(8, 2)
    x = torch.randn(1, 3, 8, requires_grad=True)
    allowed = torch.ones(3, 3, dtype=torch.bool)
    allowed[1] = False
    out, w = m(x, mask=allowed, need_weights=True)
    assert (w[:, :, 1] == 0).all()
    torch.testing.assert_close(out[0, 1], m.out_proj.bias)  # nothing attended: only the output bias
    out.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_errors_name_the_problem():
    with pytest.raises(ShapeError, match=r"H=8 heads .* Hkv=3"):
        MultiHeadAttention(64, 8, n_kv_heads=3)
    with pytest.raises(ShapeError, match="d_model=30 is not a multiple of n_heads=4"):
        MultiHeadAttention(30, 4)
    assert MultiHeadAttention(30, 4, d_k=6).q_proj.out_features == 24
    with pytest.raises(ArgumentError, match="pos must be one of"):
        MultiHeadAttention(16, 4, pos="learned")
    with pytest.raises(ArgumentError, match="even d_k"):
        MultiHeadAttention(12, 4, pos="rope")
    with pytest.raises(ArgumentError, match="dropout"):
        MultiHeadAttention(16, 4, dropout=1.0)
    m = MultiHeadAttention(16, 4, pos="rope")
    with pytest.raises(ShapeError, match=r"x must have shape \(B, N, 16\)"):
        m(torch.randn(2, 3, 8))
    with pytest.raises(ArgumentError, match="cross-attention"):
        m(torch.randn(2, 3, 16), context=torch.randn(2, 4, 16))
    with pytest.raises(MaskError):
        MultiHeadAttention(16, 4)(torch.randn(2, 3, 16), mask=torch.ones(5, 3, 3, dtype=torch.bool))


def test_masks_module_objects_work_in_modules():
    torch.manual_seed(0)
    m = MultiHeadAttention(16, 4).double()
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    lengths = np.array([6, 3])
    got = m(x, mask=qkv.masks.padding(lengths) & qkv.masks.causal())
    allowed = torch.arange(6)[None, None, None, :] < torch.from_numpy(lengths)[:, None, None, None]
    torch.testing.assert_close(got, reference_mha(m, x, allowed=allowed, causal=True)[0], rtol=1e-10, atol=1e-12)
