"""``qkv.integrations.transformers.QuantizedCache``: a transformers cache stored in 8 bits, read by qkv.

The exact reference is the same model with a plain ``DynamicCache`` whose layers store each key and
value rounded to what the quantized cache holds (``dequantize(quantize(x))``, in float32): the
quantized cache must give its logits, token for token, through ``generate`` with a dynamic cache,
a static one, a compiled static one and a left-padded batch. The slow test trains a small Llama
to copy its prompt and measures what each format changes against the model's own bfloat16 cache
(``DRIFT``): the same greedy tokens, logits within the documented drift.
"""

import copy
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import qkv  # noqa: E402
from qkv import _native  # noqa: E402
from qkv.errors import ArgumentError, ShapeError  # noqa: E402
from qkv.integrations import transformers as qt  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning", "ignore::UserWarning")
FORMATS = ["int8", "float8_e4m3fn", "float8_e5m2"]
DRIFT = {"int8": (0.005, 1e-5), "float8_e4m3fn": (0.01, 1e-4), "float8_e5m2": (0.02, 3e-4)}
"""What a quantized cache may change against the bfloat16 cache on the trained copy model, per
format: the largest |Δ log-probability| of a generated token, and the mean KL divergence per step
(docs/quantized-cache.md shows the values the benchmark measured: a sixth to a fifteenth of these)."""


def _llama(seed=0, vocab=100, config="LlamaConfig", **extra):
    qt.register()
    cfg = getattr(transformers, config)(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=0,
        **extra,
    )
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="qkv").eval()


def _rounded_cache(model, fmt):
    """A DynamicCache whose layers store keys and values as the quantized cache holds them, in float32."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    class Rounded(DynamicLayer):
        def update(self, key_states, value_states, *args, **kwargs):
            def r(x):
                return qkv.dequantize(qkv.quantize(x, fmt), x.dtype)

            return super().update(r(key_states), r(value_states), *args, **kwargs)

    cache = DynamicCache(config=model.config)
    cache.layers = [Rounded() for _ in cache.layers]
    return cache


def _generate(model, ids, cache, mask=None, n=8):
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=mask,
            cache=cache,
            max_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
            output_scores=True,
            return_dict_in_generate=True,
        )
    return out.sequences, torch.stack(out.scores, 1)


def _batch(padded):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, 100, (3, 11), generator=g)
    mask = torch.ones(3, 11, dtype=torch.long)
    if padded:
        mask[1, :4], ids[1, :4] = 0, 0
        mask[2, :1], ids[2, :1] = 0, 0
    return ids, mask


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
@pytest.mark.parametrize("padded", [False, True], ids=["full", "left-padded"])
def test_generate_equals_the_model_over_the_stored_values(fmt, static, padded):
    model = _llama()
    ids, mask = _batch(padded)
    want_tokens, want_scores = _generate(model, ids, _rounded_cache(model, fmt), mask)
    cache = qt.QuantizedCache(model.config, dtype=fmt, max_cache_len=32 if static else None)
    tokens, scores = _generate(model, ids, cache, mask)
    assert torch.equal(tokens, want_tokens)
    torch.testing.assert_close(scores, want_scores, atol=2e-4, rtol=0)
    layer = cache.layers[0]
    assert layer.keys.dtype == torch.uint8 and layer.keys.shape[-1] == 16 + 4
    k, v = cache.quantized(0)
    assert isinstance(k, qkv.Quantized) and k.format == fmt and k.shape[-2] == (32 if static else 18)
    assert cache.get_seq_length() == 18


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_a_sliding_window_model_keeps_every_token_and_its_mask_hides_them(static):
    """Mistral's sliding-window layers: the cache keeps every token (transformers' mask hides the
    ones outside the window), and generate equals the model over the stored values."""
    model = _llama(config="MistralConfig", sliding_window=5)
    ids, mask = _batch(True)
    want_tokens, want_scores = _generate(model, ids, _rounded_cache(model, "int8"), mask)
    tokens, scores = _generate(model, ids, qt.QuantizedCache(model.config, max_cache_len=32 if static else None), mask)
    assert torch.equal(tokens, want_tokens)
    torch.testing.assert_close(scores, want_scores, atol=2e-4, rtol=0)


@pytest.mark.skipif(not _native.available(), reason="compiled engine unavailable")
@pytest.mark.parametrize("config", ["LlamaConfig", "MistralConfig"])
@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_a_decode_step_reads_the_layers_by_the_lean_road(config, static, monkeypatch):
    """An unpadded decode step hands each layer's codes and scales to the kernel by the lean road
    (as ``qkv.Quantized`` views; a sliding window's last keys sliced with their scales), and
    generate still equals the model over the stored values."""
    model = _llama(config=config, **({"sliding_window": 5} if config == "MistralConfig" else {}))
    ids, mask = _batch(False)
    want_tokens, want_scores = _generate(model, ids, _rounded_cache(model, "int8"), mask)
    seen = []

    def lean(q, k, v, *a):
        from qkv._impls import lean_attention

        res = lean_attention(q, k, v, *a)
        seen.append((type(k), k.shape[-2], res is not None))
        return res

    monkeypatch.setattr(qt, "lean_attention", lean)
    tokens, scores = _generate(model, ids, qt.QuantizedCache(model.config, max_cache_len=32 if static else None), mask)
    assert torch.equal(tokens, want_tokens)
    torch.testing.assert_close(scores, want_scores, atol=2e-4, rtol=0)
    assert len(seen) == 2 * 7  # two layers, the seven steps after the prompt's
    assert all(kind is qkv.Quantized and taken for kind, _, taken in seen)
    if config == "MistralConfig":
        assert {n for _, n, _ in seen} == {5}


@pytest.mark.skipif(not _native.available(), reason="compiled engine unavailable")
@pytest.mark.parametrize("fmt", ["int8", pytest.param("float8_e4m3fn", marks=pytest.mark.slow)])
@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic"])
def test_a_compiled_static_cache_generates_the_uncompiled_tokens(fmt, dynamic):
    """``dynamic=True`` is also what the default becomes once the same forward was compiled for
    other sizes (automatic dynamic shapes, shared by every model of the class): CI met it that way."""
    model = _llama()
    ids, mask = _batch(True)
    want = _generate(model, ids, qt.QuantizedCache(model.config, dtype=fmt, max_cache_len=32), mask)
    torch._dynamo.reset()
    step = torch.compile(model.forward, fullgraph=True, backend="aot_eager", dynamic=dynamic)
    model.forward = step
    got = _generate(model, ids, qt.QuantizedCache(model.config, dtype=fmt, max_cache_len=32), mask)
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], atol=1e-4, rtol=0)


@pytest.mark.skipif(not _native.available(), reason="compiled engine unavailable")
@pytest.mark.parametrize("fmt", FORMATS)
def test_the_kernel_reads_the_layers_never_a_python_dequantization(fmt, monkeypatch):
    """Dynamic, static and compiled static caches: with qkv's dequantization unusable inside the
    attention path, generate still equals the model over the stored values."""
    model = _llama()
    ids, mask = _batch(True)
    want_tokens, want_scores = _generate(model, ids, _rounded_cache(model, fmt), mask)

    def refused(*args, **kwargs):
        raise AssertionError("the cache was dequantized in Python")

    from qkv._impls import _call, _compiled

    monkeypatch.setattr(_call, "dequantize", refused)
    monkeypatch.setattr(_compiled, "dequantize", refused)
    for static in (None, 32):
        tokens, scores = _generate(model, ids, qt.QuantizedCache(model.config, dtype=fmt, max_cache_len=static), mask)
        assert torch.equal(tokens, want_tokens)
        torch.testing.assert_close(scores, want_scores, atol=2e-4, rtol=0)
    torch._dynamo.reset()
    model.forward = torch.compile(model.forward, fullgraph=True, backend="aot_eager")
    tokens, scores = _generate(model, ids, qt.QuantizedCache(model.config, dtype=fmt, max_cache_len=32), mask)
    assert torch.equal(tokens, want_tokens)
    torch.testing.assert_close(scores, want_scores, atol=2e-4, rtol=0)


def test_the_cache_moves_scales_with_their_tokens_for_beam_search():
    model = _llama()
    ids, mask = _batch(False)
    cache = qt.QuantizedCache(model.config, dtype="int8")
    with torch.no_grad():
        model(ids, attention_mask=mask, cache=cache)
    k0, _ = cache.quantized(0)
    before = (k0.values.clone(), k0.scales.clone())
    cache.reorder_cache(torch.tensor([2, 0, 1]))
    k1, _ = cache.quantized(0)
    assert torch.equal(k1.values, before[0][[2, 0, 1]]) and torch.equal(k1.scales, before[1][[2, 0, 1]])
    cache.crop(-3)
    assert cache.get_seq_length() == 8 and cache.quantized(0)[0].shape[-2] == 8


def test_the_cache_is_half_a_bfloat16_cache():
    model = _llama().to(torch.bfloat16)
    ids, _ = _batch(False)
    from transformers.cache_utils import DynamicCache

    full, small = DynamicCache(config=model.config), qt.QuantizedCache(model.config, dtype="int8")
    with torch.no_grad():
        model(ids, cache=full)
        model(ids, cache=small)
    dense = sum(t.numel() * t.element_size() for layer in full.layers for t in (layer.keys, layer.values))
    assert small.nbytes / dense == pytest.approx((16 + 4) / (2 * 16))


def test_refusals_name_the_fix():
    model = _llama()
    with pytest.raises(ArgumentError, match="attn_implementation='qkv'"):
        qt.QuantizedCache(_sdpa_config(model))
    with pytest.raises(ArgumentError, match="max_cache_len"):
        qt.QuantizedCache(model.config, max_cache_len=0)
    with pytest.raises(qkv.errors.DTypeError, match="int8"):
        qt.QuantizedCache(model.config, dtype="int4")
    odd = _llama(head_dim=6)
    with pytest.raises(ShapeError, match="multiple of 4"):
        with torch.no_grad():
            odd(torch.ones(1, 3, dtype=torch.long), cache=qt.QuantizedCache(odd.config))


def _sdpa_config(model):
    config = copy.deepcopy(model.config)
    config._attn_implementation = "sdpa"
    return config


# --------------------------------------------------------------------------- a trained model


VOCAB, N, SEP = 40, 8, 2


def _copy_batch(b, g):
    x = torch.randint(3, VOCAB, (b, N), generator=g)
    return torch.cat([x, torch.full((b, 1), SEP), x], 1)


@pytest.fixture(scope="module")
def copier():
    """A small Llama taught to repeat its prompt after a separator (trained with SDPA, ~100 steps)."""
    model = _llama(vocab=VOCAB)
    model.set_attn_implementation("sdpa")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(120):
        x = _copy_batch(32, g)
        logits = model(x).logits[:, N:-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), x[:, N + 1 :].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval().set_attn_implementation("qkv")
    return model.to(torch.bfloat16)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_trained_model_generates_the_bfloat16_caches_tokens(copier, fmt):
    from transformers.cache_utils import DynamicCache

    prompt = _copy_batch(16, torch.Generator().manual_seed(7))[:, : N + 1]
    want, want_scores = _generate(copier, prompt, DynamicCache(config=copier.config), n=N)
    assert torch.equal(want[:, N + 1 :], prompt[:, :N])  # it learned to copy
    got, scores = _generate(copier, prompt, qt.QuantizedCache(copier.config, dtype=fmt), n=N)
    assert torch.equal(got, want)
    a, b = want_scores.float().log_softmax(-1), scores.float().log_softmax(-1)
    moved = (a - b).gather(-1, want[:, N + 1 :, None]).abs().max()
    kl = (a.exp() * (a - b)).sum(-1).mean()
    bound, kl_bound = DRIFT[fmt]
    assert moved <= bound, f"{fmt}: a generated token's log-probability moved by {float(moved):.3g}"
    assert kl <= kl_bound, f"{fmt}: mean KL divergence {float(kl):.3g} per step"
