"""KVCache: decoding position by position gives the full causal pass (MHA, blocks, decoder, TinyGPT, every
pos kind); generate gives the same tokens with and without the cache; GQA caches are smaller."""

import pytest

torch = pytest.importorskip("torch")

from qkv.errors import ArgumentError, ShapeError  # noqa: E402
from qkv.nn import KVCache, MultiHeadAttention, TinyGPT, TransformerBlock, TransformerDecoder  # noqa: E402

TIGHT = dict(rtol=1e-10, atol=1e-12)  # float64 modules: cached and full differ only by rounding
SPLITS = [3, 1, 2, 1]  # prefill 3 positions, then one, a chunk of two, one: 7 in all


def _decode(step, x):
    """Run ``step(chunk, cache)`` over x's positions in SPLITS chunks; concatenate the outputs."""
    cache, outs, at = KVCache(), [], 0
    for n in SPLITS:
        outs.append(step(x[:, at : at + n], cache))
        at += n
    return torch.cat(outs, dim=1), cache


@pytest.mark.parametrize("pos", [None, "rope", "alibi"])
@pytest.mark.parametrize("hkv", [4, 2, 1])
def test_mha_cached_decoding_equals_the_full_causal_pass(pos, hkv):
    torch.manual_seed(0)
    m = MultiHeadAttention(32, 4, n_kv_heads=hkv, pos=pos).double()
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    got, cache = _decode(lambda c, cache: m(c, causal=True, cache=cache), x)
    torch.testing.assert_close(got, m(x, causal=True), **TIGHT)
    assert cache.length == 7 and cache.get(m)[0].shape == (2, hkv, 7, 8)


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("pos", [None, "rope", "alibi"])
def test_block_cached_decoding_equals_the_full_causal_pass(norm, pos):
    torch.manual_seed(0)
    block = TransformerBlock(32, 4, 64, n_kv_heads=2, norm=norm, pos=pos).double()
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    got, _ = _decode(lambda c, cache: block(c, causal=True, cache=cache), x)
    torch.testing.assert_close(got, block(x, causal=True), **TIGHT)


def test_decoder_cached_decoding_projects_the_context_once():
    torch.manual_seed(0)
    dec = TransformerDecoder(32, 4, 64, n_layers=2, n_kv_heads=2, pos="rope").double()
    x, memory = torch.randn(2, 7, 32, dtype=torch.float64), torch.randn(2, 5, 32, dtype=torch.float64)
    calls = []
    hook = dec.layers[0].cross_attn.k_proj.register_forward_hook(lambda *a: calls.append(1))
    got, cache = _decode(lambda c, cache: dec(c, memory, cache=cache), x)
    hook.remove()
    assert len(calls) == 1  # the encoder output is projected once, then reused from the cache
    torch.testing.assert_close(got, dec(x, memory), **TIGHT)
    other = torch.randn(2, 5, 32, dtype=torch.float64)  # a new context is projected again, not mixed up
    torch.testing.assert_close(dec(x[:, :1], other, cache=KVCache()), dec(x[:, :1], other), **TIGHT)


@pytest.mark.parametrize("pos", ["rope", "alibi", "sinusoidal", "learned"])
def test_tinygpt_cached_logits_equal_the_full_pass(pos):
    torch.manual_seed(0)
    model = TinyGPT(11, d_model=32, n_heads=4, n_layers=2, max_len=16, n_kv_heads=2, pos=pos).double()
    idx = torch.randint(0, 11, (2, 7))
    got, cache = _decode(lambda c, cache: model(c, cache=cache), idx)
    torch.testing.assert_close(got, model(idx), **TIGHT)
    assert cache.length == 7


@pytest.mark.parametrize("pos", ["rope", "alibi", "sinusoidal", "learned"])
def test_generate_gives_the_same_tokens_with_and_without_the_cache(pos):
    torch.manual_seed(1)
    model = TinyGPT(13, d_model=32, n_heads=4, n_layers=2, max_len=32, pos=pos).eval()
    idx = torch.randint(0, 13, (3, 5))
    greedy = model.generate(idx, 12)
    assert greedy.shape == (3, 17) and (greedy[:, :5] == idx).all()
    assert torch.equal(greedy, model.generate(idx, 12, use_cache=False))
    # greedy = argmax of the full pass at every step, written out here
    seq = idx
    for _ in range(12):
        seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(greedy, seq)
    sampled = [
        model.generate(idx, 12, temperature=1.5, use_cache=c, generator=torch.Generator().manual_seed(7))
        for c in (True, False)
    ]
    assert torch.equal(sampled[0], sampled[1])
    assert not torch.equal(sampled[0], greedy)  # sampling at a high temperature does differ


def test_gqa_caches_shrink_with_fewer_kv_heads():
    sizes = []
    for hkv in (8, 4, 2, 1):
        torch.manual_seed(0)
        model = TinyGPT(11, d_model=64, n_heads=8, n_layers=3, n_kv_heads=hkv)
        cache = KVCache()
        with torch.no_grad():
            model(torch.randint(0, 11, (2, 10)), cache=cache)
        # keys and values, 3 layers, B = 2, Hkv heads, L = 10, Dk = 8, float32
        assert cache.nbytes == 2 * 3 * 2 * hkv * 10 * 8 * 4
        sizes.append(cache.nbytes)
    assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == 4


def test_cache_max_len_is_enforced_with_a_clear_error():
    m = MultiHeadAttention(16, 4)
    cache = KVCache(max_len=5)
    m(torch.randn(1, 4, 16), causal=True, cache=cache)
    with pytest.raises(ArgumentError, match=r"KVCache\(max_len=5\) holds 4 positions .* 6 > max_len=5"):
        m(torch.randn(1, 2, 16), causal=True, cache=cache)
    assert cache.length == 4  # the failed step stored nothing
    m(torch.randn(1, 1, 16), causal=True, cache=cache)
    assert cache.length == 5
    cache.reset()
    assert cache.length == 0 and cache.nbytes == 0
    with pytest.raises(ArgumentError, match="max_len"):
        KVCache(max_len=0)
    with pytest.raises(ShapeError, match="B, Hkv and D must match"):
        m(torch.randn(1, 1, 16), cache=cache), m(torch.randn(2, 1, 16), cache=cache)


def test_absolute_positions_stop_at_max_len_relative_ones_do_not():
    idx = torch.randint(0, 7, (1, 6))
    for pos in ("learned", "sinusoidal"):
        model = TinyGPT(7, d_model=16, n_heads=2, n_layers=1, max_len=8, pos=pos)
        with pytest.raises(ArgumentError, match=r"max_len=8"):
            model.generate(idx, 3)
        cache = KVCache()
        model(idx, cache=cache)
        model(idx[:, :2], cache=cache)
        with pytest.raises(ArgumentError, match=r"max_len=8.* needs positions 8 \.\. 8"):
            model(idx[:, :1], cache=cache)
        assert model.generate(idx, 2).shape == (1, 8)
    for pos in ("rope", "alibi"):
        model = TinyGPT(7, d_model=16, n_heads=2, n_layers=1, max_len=8, pos=pos)
        assert model.generate(idx, 5).shape == (1, 11)
