"""Causality of every causal module: perturbing the input at position t leaves every output before t unchanged
(and does change the outputs from t on, so the check can fail)."""

import pytest

torch = pytest.importorskip("torch")

from qkv.nn import MultiHeadAttention, TinyGPT, TransformerBlock, TransformerDecoder, TransformerEncoder  # noqa: E402

T = 4  # the perturbed position; sequences have 7


def _check(f, x, perturbed):
    with torch.no_grad():
        a, b = f(x), f(perturbed)
    assert torch.equal(a[:, :T], b[:, :T]) or torch.allclose(a[:, :T], b[:, :T], rtol=0, atol=1e-6), (
        f"outputs before t={T} changed by {float((a[:, :T] - b[:, :T]).abs().max()):.3g}"
    )
    assert (a[:, T:] - b[:, T:]).abs().max() > 1e-4, "the perturbation changed nothing: the check is vacuous"


def _perturb(x):
    y = x.clone()
    y[:, T] = y[:, T] + torch.randn_like(y[:, T])
    return y


@pytest.mark.parametrize("pos", [None, "rope", "alibi"])
def test_mha(pos):
    torch.manual_seed(0)
    m = MultiHeadAttention(16, 4, n_kv_heads=2, pos=pos)
    x = torch.randn(2, 7, 16)
    _check(lambda t: m(t, causal=True), x, _perturb(x))


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_block_encoder_and_decoder(norm):
    torch.manual_seed(0)
    x, memory = torch.randn(2, 7, 16), torch.randn(2, 5, 16)
    block = TransformerBlock(16, 4, 32, norm=norm, pos="rope")
    _check(lambda t: block(t, causal=True), x, _perturb(x))
    enc = TransformerEncoder(16, 4, 32, n_layers=2, norm=norm, pos="alibi")
    _check(lambda t: enc(t, causal=True), x, _perturb(x))
    dec = TransformerDecoder(16, 4, 32, n_layers=2, norm=norm)
    _check(lambda t: dec(t, memory), x, _perturb(x))


@pytest.mark.parametrize("pos", ["rope", "alibi", "sinusoidal", "learned"])
def test_tinygpt(pos):
    torch.manual_seed(0)
    model = TinyGPT(11, d_model=16, n_heads=4, n_layers=2, max_len=8, pos=pos)
    idx = torch.randint(0, 11, (2, 7))
    other = idx.clone()
    other[:, T] = (other[:, T] + 1) % 11
    _check(model, idx, other)
