"""qkv.nn building blocks against independent references: Bahdanau / Luong layers against their formulas,
positional encodings against the sinusoidal formula, Transformer blocks against torch's own layers."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import qkv  # noqa: E402
from qkv.errors import ArgumentError, MaskError, ShapeError  # noqa: E402
from qkv.nn import (  # noqa: E402
    AdditiveAttention,
    GeneralAttention,
    LearnedPositionalEncoding,
    MultiHeadAttention,
    SinusoidalPositionalEncoding,
    TinyGPT,
    TransformerBlock,
    TransformerDecoder,
    TransformerEncoder,
)

F32 = dict(rtol=1e-5, atol=2e-6)


def _softmax_rows(s, allowed):
    """exp / sum over allowed keys, written with a loop; rows with no key give zeros."""
    out = torch.zeros_like(s)
    for idx in np.ndindex(*s.shape[:-1]):
        keep = allowed[idx]
        if keep.any():
            e = torch.exp(s[idx][keep] - s[idx][keep].max())
            out[idx][keep] = e / e.sum()
    return out


def test_additive_attention_matches_bahdanau():
    torch.manual_seed(0)
    layer = AdditiveAttention(d_query=5, d_key=6, d_attn=7).double()
    q, k, v = torch.randn(2, 3, 5).double(), torch.randn(2, 4, 6).double(), torch.randn(2, 4, 3).double()
    allowed = torch.rand(2, 3, 4) < 0.6
    allowed[0, 1] = False  # a query with nothing to attend
    s = torch.zeros(2, 3, 4, dtype=torch.float64)
    for b in range(2):
        for i in range(3):
            for j in range(4):
                s[b, i, j] = layer.v @ torch.tanh(layer.w_q @ q[b, i] + layer.w_k @ k[b, j])
    want_w = _softmax_rows(s, allowed)
    out, w = layer(q, k, v, mask=allowed, need_weights=True)
    torch.testing.assert_close(w, want_w.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out, (want_w @ v).detach(), rtol=1e-12, atol=1e-12)
    assert (w[~allowed] == 0).all() and (out[0, 1] == 0).all()  # masked keys: exactly zero weight
    out.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters())


def test_general_attention_matches_luong():
    torch.manual_seed(0)
    layer = GeneralAttention(d_query=5, d_key=6).double()
    q, k, v = torch.randn(3, 5).double(), torch.randn(4, 6).double(), torch.randn(4, 2).double()
    s = q @ layer.w @ k.T
    out, w = layer(q, k, v, need_weights=True)
    torch.testing.assert_close(w, torch.softmax(s, -1).detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out, (torch.softmax(s, -1) @ v).detach(), rtol=1e-12, atol=1e-12)
    bias = torch.tensor([0.0, -math.inf, 1.0, 0.0], dtype=torch.float64)
    _, wb = layer(q, k, v, mask=bias, need_weights=True)
    torch.testing.assert_close(wb, torch.softmax(s + bias, -1).detach(), rtol=1e-12, atol=1e-12)
    _, wm = layer(q, k, v, mask=qkv.masks.causal(), need_weights=True)
    assert (wm[0, 2:] == 0).all() and (wm[2, 4:] == 0).all()


def test_scoring_layers_errors():
    layer = GeneralAttention(4, 4)
    q, k = torch.randn(3, 4), torch.randn(5, 4)
    with pytest.raises(ShapeError, match="Nk=5"):
        layer(q, k, torch.randn(4, 2))
    with pytest.raises(MaskError, match="does not broadcast"):
        layer(q, k, torch.randn(5, 2), mask=torch.ones(2, 3, 5, dtype=torch.bool))
    with pytest.raises(MaskError, match="dtype"):
        layer(q, k, torch.randn(5, 2), mask=torch.ones(3, 5, dtype=torch.int64))


def test_positional_encodings():
    x = torch.randn(2, 5, 6)
    pe = SinusoidalPositionalEncoding(6, max_len=10)
    pos, c = torch.arange(3, 8, dtype=torch.float64)[:, None], torch.arange(6)
    angle = pos / 10000.0 ** ((c - c % 2) / 6.0)
    table = torch.where(c % 2 == 0, torch.sin(angle), torch.cos(angle)).float()
    torch.testing.assert_close(pe(x, offset=3), x + table, **F32)
    assert "pe" not in pe.state_dict()  # a function of the sizes, not a weight
    learned = LearnedPositionalEncoding(6, max_len=10)
    torch.testing.assert_close(learned(x, offset=2), x + learned.weight[2:7], **F32)
    for layer in (pe, learned):
        with pytest.raises(ArgumentError, match=r"max_len - 1 = 9.* 6 \.\. 10"):
            layer(x, offset=6)


def _copy_block(ours, layer, cross=False):
    """Load a torch Transformer{Encoder,Decoder}Layer's weights into a qkv TransformerBlock."""
    ours.attn.load_state_dict(MultiHeadAttention.from_torch(layer.self_attn).state_dict())
    ours.ff[0].load_state_dict(layer.linear1.state_dict())
    ours.ff[2].load_state_dict(layer.linear2.state_dict())
    ours.norm_attn.load_state_dict(layer.norm1.state_dict())
    if cross:
        ours.cross_attn.load_state_dict(MultiHeadAttention.from_torch(layer.multihead_attn).state_dict())
        ours.norm_cross.load_state_dict(layer.norm2.state_dict())
        ours.norm_ff.load_state_dict(layer.norm3.state_dict())
    else:
        ours.norm_ff.load_state_dict(layer.norm2.state_dict())


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_blocks_match_torch_layers(norm):
    torch.manual_seed(0)
    kw = dict(dim_feedforward=32, dropout=0.0, activation="gelu", batch_first=True, norm_first=norm == "pre")
    x, memory = torch.randn(2, 6, 16), torch.randn(2, 4, 16)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(6)

    enc_layer = torch.nn.TransformerEncoderLayer(16, 4, **kw)
    block = TransformerBlock(16, 4, 32, norm=norm)
    _copy_block(block, enc_layer)
    torch.testing.assert_close(block(x, causal=True), enc_layer(x, src_mask=causal, is_causal=True), **F32)

    dec_layer = torch.nn.TransformerDecoderLayer(16, 4, **kw)
    dblock = TransformerBlock(16, 4, 32, norm=norm, cross=True)
    _copy_block(dblock, dec_layer, cross=True)
    want = dec_layer(x, memory, tgt_mask=causal, tgt_is_causal=True)
    torch.testing.assert_close(dblock(x, context=memory, causal=True), want, **F32)

    final = torch.nn.LayerNorm(16) if norm == "pre" else None
    enc = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(16, 4, **kw), 2, norm=final, enable_nested_tensor=False
    )
    ours = TransformerEncoder(16, 4, 32, n_layers=2, norm=norm)
    for o, t in zip(ours.layers, enc.layers, strict=True):
        _copy_block(o, t)
    if final is not None:
        ours.norm.load_state_dict(final.state_dict())
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    out, weights = ours(x, mask=~pad[:, None, None, :], need_weights=True)
    torch.testing.assert_close(out, enc(x, src_key_padding_mask=pad), **F32)
    assert len(weights) == 2 and weights[0].shape == (2, 4, 6, 6)


def test_decoder_with_encoder_output_and_context_mask():
    torch.manual_seed(0)
    dec = TransformerDecoder(16, 4, 32, n_layers=2)
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 4, 16)
    keep = torch.tensor([[True] * 4, [True, True, False, False]])[:, None, None, :]
    out = dec(x, memory, context_mask=keep)
    memory2 = memory.clone()
    memory2[1, 2:] += 5.0  # hidden context positions do not matter
    torch.testing.assert_close(dec(x, memory2, context_mask=keep)[1], out[1], **F32)
    assert not torch.allclose(dec(x, memory2)[1], out[1])


def test_block_arguments_are_checked():
    with pytest.raises(ArgumentError, match="norm must be one of"):
        TransformerBlock(16, 4, 32, norm="sandwich")
    with pytest.raises(ArgumentError, match="needs context"):
        TransformerBlock(16, 4, 32, cross=True)(torch.randn(1, 2, 16))
    with pytest.raises(ArgumentError, match="cross=True"):
        TransformerBlock(16, 4, 32)(torch.randn(1, 2, 16), context=torch.randn(1, 2, 16))


def test_tinygpt_returns_every_layers_causal_weights():
    torch.manual_seed(0)
    model = TinyGPT(11, d_model=32, n_heads=4, n_layers=3)
    idx = torch.randint(0, 11, (2, 6))
    logits, weights = model(idx, need_weights=True)
    assert logits.shape == (2, 6, 11) and len(weights) == 3
    for w in weights:
        assert w.shape == (2, 4, 6, 6)
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 6))
        assert (w.triu(1) == 0).all()
    torch.testing.assert_close(logits, model(idx), **F32)


def test_tinygpt_checks_its_inputs():
    model = TinyGPT(11, d_model=16, n_heads=2, n_layers=1)
    with pytest.raises(ArgumentError, match=r"\[0, vocab_size=11\)"):
        model(torch.tensor([[1, 11]]))
    with pytest.raises(qkv.errors.DTypeError, match="integer"):
        model(torch.zeros(1, 3))
    with pytest.raises(ShapeError, match=r"\(B, N\)"):
        model(torch.tensor([1, 2]))
    with pytest.raises(ArgumentError, match="pos must be one of"):
        TinyGPT(11, pos="relative")
    with pytest.raises(ArgumentError, match="temperature"):
        model.generate(torch.tensor([[1]]), 2, temperature=-1.0)
