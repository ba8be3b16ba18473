"""``KVCache(dtype=...)`` and ``TinyGPT.generate(cache_dtype=...)``: the cache stored in 8 bits.

Decoding over a quantized cache must equal the full causal pass of a model whose keys and values
are replaced by their stored values, ``dequantize(quantize(k))`` (the reference runs the float
path with those, never the quantized cache); appending step by step must store what quantizing
the whole sequence stores (tokens are quantized one by one); memory halves against bfloat16.
"""

import pytest

torch = pytest.importorskip("torch")

import qkv  # noqa: E402
from qkv.errors import ArgumentError  # noqa: E402
from qkv.nn import KVCache, MultiHeadAttention, TinyGPT, TransformerDecoder  # noqa: E402

FORMATS = ["int8", "float8_e4m3fn", "float8_e5m2"]
SPLITS = [3, 1, 2, 1]


def _rounded(module, fmt):
    """``module.kv`` with its keys and values replaced by their stored (dequantized) values, and the
    keys rounded after RoPE as the cache stores them: the float model the quantized cache runs."""

    def forward(x, context=None, mask=None, causal=False, cache=None, need_weights=False):
        from qkv.nn.attention import merge_heads, split_heads
        from qkv.positional import rope

        q = split_heads(module.q_proj(x), module.h)
        k, v = module.kv(x if context is None else context)
        if module.pos == "rope":
            import numpy as np

            pos = np.arange(x.shape[1])
            q, k = rope(q, pos), rope(k, pos)
        k, v = (qkv.dequantize(qkv.quantize(t, fmt), t.dtype) for t in (k, v))
        out = qkv.attention(q, k, v, mask=mask, causal=causal, score_mod=module._alibi, impl="reference")
        return module.out_proj(merge_heads(out))

    return forward


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("pos", [None, "rope", "alibi"])
def test_cached_decoding_equals_the_full_pass_over_the_stored_values(fmt, pos):
    torch.manual_seed(0)
    m = MultiHeadAttention(32, 4, n_kv_heads=2, pos=pos).double()
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    cache, outs, at = KVCache(dtype=fmt), [], 0
    for n in SPLITS:
        outs.append(m(x[:, at : at + n], causal=True, cache=cache))
        at += n
    got = torch.cat(outs, dim=1)
    want = _rounded(m, fmt)(x, causal=True)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    k, v = cache.get(m)
    assert isinstance(k, qkv.Quantized) and k.format == fmt and k.shape == (2, 2, 7, 8)


@pytest.mark.parametrize("fmt", FORMATS)
def test_appending_step_by_step_stores_what_quantizing_everything_stores(fmt):
    layer = torch.nn.Identity()  # any module keys a cache entry
    k, v = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    steps, whole = KVCache(dtype=fmt), KVCache(dtype=fmt)
    for i in range(6):
        steps.append(layer, k[..., i : i + 1, :], v[..., i : i + 1, :])
    whole.append(layer, k, v)
    for a, b in zip(steps.get(layer), whole.get(layer), strict=True):
        assert torch.equal(a.values.view(torch.uint8), b.values.view(torch.uint8))
        assert torch.equal(a.scales, b.scales)
    assert steps.length == 6 and steps.layer_length(layer) == 6


def test_cross_attention_context_is_stored_quantized_too():
    torch.manual_seed(0)
    dec = TransformerDecoder(32, 4, 64, n_layers=1, n_kv_heads=2).double()
    x, memory = torch.randn(2, 3, 32, dtype=torch.float64), torch.randn(2, 5, 32, dtype=torch.float64)
    cache = KVCache(dtype="int8")
    dec(x, memory, cache=cache)
    (_, (k, v)), *_ = cache._cross.values()
    assert isinstance(k, qkv.Quantized) and isinstance(v, qkv.Quantized)


def test_a_quantized_cache_holds_about_half_a_bfloat16_cache():
    torch.manual_seed(0)
    model = TinyGPT(50, d_model=128, n_heads=4, n_kv_heads=2).to(torch.bfloat16)
    prompt = torch.randint(0, 50, (2, 40))
    full, small = KVCache(), KVCache(dtype="int8")
    model(prompt, cache=full)
    model(prompt, cache=small)
    d = 128 // 4
    assert small.nbytes / full.nbytes == pytest.approx((d + 4) / (2 * d))
    assert "dtype='int8'" in repr(small)


@pytest.mark.parametrize("fmt", FORMATS)
def test_generate_with_a_quantized_cache_decodes_as_the_cache_does(fmt):
    """generate(cache_dtype=...) is the manual loop over KVCache(dtype=...), token for token."""
    torch.manual_seed(0)
    model = TinyGPT(30, d_model=32, n_heads=4, n_kv_heads=2).eval()
    prompt = torch.randint(0, 30, (2, 5))
    out = model.generate(prompt, 6, cache_dtype=fmt)
    cache, idx = KVCache(dtype=fmt), prompt
    logits = model(prompt, cache=cache)
    for _ in range(6):
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        idx = torch.cat([idx, nxt], dim=1)
        logits = model(nxt, cache=cache)
    assert torch.equal(out, idx)


def test_cache_dtype_errors():
    model = TinyGPT(30, d_model=32, n_heads=4)
    with pytest.raises(ArgumentError, match="use_cache=False"):
        model.generate(torch.zeros(1, 2, dtype=torch.long), 2, use_cache=False, cache_dtype="int8")
    with pytest.raises(ArgumentError, match="dtype"):
        KVCache(dtype="int4")
