"""qkv as a Hugging Face transformers attention backend, against transformers' own eager and SDPA.

Tiny models are built from configs in code (nothing is downloaded: ``HF_HUB_OFFLINE=1``);
transformers' ``eager`` attention (plain matmul + softmax) and ``sdpa`` are the oracles.
"""

import inspect
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: never touch the network

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM, Gemma2Config, GPT2Config, LlamaConfig, MistralConfig  # noqa: E402

import qkv  # noqa: E402
from qkv.errors import ArgumentError  # noqa: E402
from qkv.integrations import transformers as qt  # noqa: E402

VOCAB, SEQ, PAD = 100, 12, 4  # sequence longer than Mistral's window below; row 1 has PAD left pads
ATOL = 2e-5  # float32, logits of O(1)
CACHE_KW = (
    "cache" if "cache" in inspect.signature(transformers.LlamaForCausalLM.forward).parameters else "past_key_values"
)
"""The forward's cache argument: ``cache`` from transformers 5.24 (``past_key_values`` is deprecated there)."""

CONFIGS = {
    # GQA (4 query heads over 2 kv heads) and RoPE
    "llama": lambda: LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=0,
    ),
    "gpt2": lambda: GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=1, pad_token_id=0
    ),
    # sliding window 5 < SEQ: the window cuts into every long row
    "mistral": lambda: MistralConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        sliding_window=5,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=0,
    ),
}


@pytest.fixture(scope="module", autouse=True)
def registered():
    assert qt.register() == "qkv"
    yield


def build(name, attn="eager"):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CONFIGS[name](), attn_implementation=attn).eval()
    with torch.no_grad():  # random init is small: scale weights up so attention is far from uniform
        for p in model.parameters():
            p.mul_(3.0)
    return model


def inputs(padded):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, VOCAB, (2, SEQ), generator=g)
    am = torch.ones(2, SEQ, dtype=torch.long)
    if padded:
        am[1, :PAD] = 0
        ids[1, :PAD] = 0
    return ids, am


def run(model, attn, ids, am, **kw):
    model.set_attn_implementation(attn)
    assert model.config._attn_implementation == attn
    with torch.no_grad():
        return model(ids, attention_mask=am, **kw)


@pytest.fixture
def calls(monkeypatch):
    """Counts the attention layers qkv computed (so a silent fallback to another backend fails)."""
    n = {"calls": 0}
    real = qt.forward

    def counting(*a, **kw):
        n["calls"] += 1
        return real(*a, **kw)

    monkeypatch.setattr(qt, "forward", counting)
    return n


@pytest.mark.parametrize("padded", [False, True], ids=["no-padding", "left-padding"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_equal_eager_and_sdpa(name, padded, calls):
    model = build(name)
    ids, am = inputs(padded)
    keep = am.bool()  # compare real tokens only: a pad query attends nothing (qkv: zeros)
    ref = {attn: run(model, attn, ids, am).logits for attn in ("eager", "sdpa")}
    for impl in ("auto", "reference", "flash", "torch"):
        qt.register("qkv", impl=impl)
        got = run(model, "qkv", ids, am).logits
        assert torch.isfinite(got).all()
        for attn, want in ref.items():
            torch.testing.assert_close(got[keep], want[keep], atol=ATOL, rtol=1e-5, msg=f"{impl} vs {attn}")
    qt.register()
    assert calls["calls"] == 4 * 2  # four impls, two layers each


@pytest.mark.parametrize("name", list(CONFIGS))
def test_generate_matches_eager(name, calls):
    model = build(name)
    ids, am = inputs(padded=True)
    outs = {}
    for attn in ("eager", "qkv"):
        model.set_attn_implementation(attn)
        outs[attn] = model.generate(ids, attention_mask=am, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert outs["eager"].shape == (2, SEQ + 8)
    assert torch.equal(outs["qkv"], outs["eager"])
    assert calls["calls"] >= 2 * 8  # prefill and decode steps (Lq = 1 against the cache) went through qkv


@pytest.mark.parametrize("impl", ["auto", "flash"])
def test_training_gradients_equal_eager(impl):
    """Autograd through the backend: the loss gradients of every parameter match eager's."""
    qt.register("qkv", impl=impl)
    model = build("llama").train()  # attention_dropout is 0 in this config: deterministic
    ids, am = inputs(padded=True)
    grads = {}
    for attn in ("eager", "qkv"):
        model.set_attn_implementation(attn)
        model.zero_grad()
        logits = model(ids, attention_mask=am).logits[am.bool()]  # real positions only (pad rows differ)
        torch.nn.functional.cross_entropy(logits, ids.roll(-1, dims=1)[am.bool()]).backward()
        grads[attn] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    qt.register()
    assert grads["qkv"].keys() == grads["eager"].keys() and len(grads["qkv"]) > 10
    for n, g in grads["qkv"].items():
        torch.testing.assert_close(g, grads["eager"][n], atol=1e-5, rtol=1e-4, msg=n)


def test_static_cache_prefill_and_generate_match_eager():
    """A prefill into an empty static cache has Lq < Lk with empty future slots: qkv gets a mask
    (transformers' SDPA mask would be None there, meaning top-left causal)."""
    from transformers import StaticCache

    ids, am = inputs(padded=False)
    logits, tokens = {}, {}
    for attn in ("qkv", "eager"):
        model = build("llama", attn=attn)  # a fresh model each: no static cache left over from the other run
        cache = StaticCache(config=model.config, max_cache_len=SEQ + 8)
        with torch.no_grad():
            logits[attn] = model(ids, attention_mask=am, use_cache=True, **{CACHE_KW: cache}).logits
        tokens[attn] = model.generate(
            ids, attention_mask=am, max_new_tokens=5, do_sample=False, pad_token_id=0, cache_implementation="static"
        )
    torch.testing.assert_close(logits["qkv"], logits["eager"], atol=ATOL, rtol=1e-5)
    assert torch.equal(tokens["qkv"], tokens["eager"])


@pytest.mark.parametrize("name", list(CONFIGS))
def test_output_attentions_equal_eager(name):
    model = build(name)
    ids, am = inputs(padded=True)
    want = run(model, "eager", ids, am, output_attentions=True).attentions
    for impl in ("auto", "flash"):
        qt.register("qkv", impl=impl)
        got = run(model, "qkv", ids, am, output_attentions=True).attentions
        assert len(got) == len(want) == 2
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape == (2, 4, SEQ, SEQ)
            torch.testing.assert_close(g[0], w[0], atol=1e-6, rtol=1e-5)
            torch.testing.assert_close(g[1, :, PAD:], w[1, :, PAD:], atol=1e-6, rtol=1e-5)  # real query rows
            assert (g[1, :, :PAD] == 0).all()  # a pad query attends nothing: zeros, not eager's uniform row
    qt.register()
    assert run(model, "qkv", ids, am).attentions is None  # not asked for: not built


def test_sliding_window_is_applied():
    """Mistral's window matters here (a model without it gives other logits), and qkv honours it."""
    model = build("mistral")
    ids, am = inputs(padded=False)
    windowed = run(model, "qkv", ids, am).logits
    model.config.sliding_window = None
    full = run(model, "qkv", ids, am).logits
    assert (windowed - full).abs().max() > 1e-3
    torch.testing.assert_close(full, run(model, "eager", ids, am).logits, atol=ATOL, rtol=1e-5)


def test_softcap_model_matches_eager():
    cfg = Gemma2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        sliding_window=6,
        attn_logit_softcapping=2.0,
        final_logit_softcapping=None,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    ids, am = inputs(padded=True)
    keep = am.bool()
    want = run(model, "eager", ids, am).logits
    got = run(model, "qkv", ids, am).logits
    torch.testing.assert_close(got[keep], want[keep], atol=ATOL, rtol=1e-5)


def test_set_attn_implementation_and_register_idempotent():
    assert qt.register() == qt.register() == "qkv"
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    assert ALL_ATTENTION_FUNCTIONS["qkv"] is qt.attention_function("auto")
    assert ALL_MASK_ATTENTION_FUNCTIONS["qkv"] is qt.mask_function
    model = build("llama", attn="qkv")
    assert model.config._attn_implementation == "qkv"
    model.set_attn_implementation("sdpa")
    model.set_attn_implementation("qkv")
    assert model.config._attn_implementation == "qkv"


def test_direct_call_gqa_causal_bottom_right_and_mask_kinds():
    """The attention function alone: GQA, no mask (bottom-right causal), bool and float masks."""
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, 3, 8, generator=g)
    k, v = torch.randn(2, 2, 5, 8, generator=g), torch.randn(2, 2, 5, 8, generator=g)
    module = torch.nn.Module().eval()
    fn = qt.attention_function("auto")

    def expected(bias):
        kk, vv = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
        w = torch.softmax(q @ kk.transpose(-1, -2) * 0.5 + bias, dim=-1)
        return (w @ vv).transpose(1, 2)

    causal = torch.arange(5)[None, :] <= torch.arange(3)[:, None] + 2  # Lq=3 are the last 3 of Lk=5
    out, w = fn(module, q, k, v, None, scaling=0.5)
    assert w is None and out.shape == (2, 3, 4, 8) and out.is_contiguous()
    torch.testing.assert_close(out, expected(torch.where(causal, 0.0, -torch.inf)))
    module.is_causal = False  # an encoder: no mask means full attention
    torch.testing.assert_close(fn(module, q, k, v, None, scaling=0.5)[0], expected(torch.zeros(3, 5)))
    allowed = torch.rand(2, 1, 3, 5, generator=g) > 0.3
    allowed[..., 0] = True
    bias = torch.where(allowed, torch.randn(2, 1, 3, 5, generator=g), torch.finfo(torch.float32).min)
    want = expected(torch.where(allowed, bias, -torch.inf))
    torch.testing.assert_close(fn(module, q, k, v, bias, scaling=0.5)[0], want)  # float: bias + hidden keys
    want = expected(torch.where(allowed, 0.0, -torch.inf))
    torch.testing.assert_close(fn(module, q, k, v, allowed, scaling=0.5)[0], want)


def test_unsupported_kwargs_raise_and_dropout_in_training():
    q = k = v = torch.randn(1, 2, 4, 8)
    module = torch.nn.Module().eval()
    fn = qt.attention_function("auto")
    with pytest.raises(ArgumentError, match="alibi_slopes"):  # a keyword qkv does not know: refused, not ignored
        fn(module, q, k, v, None, alibi_slopes=torch.zeros(2))
    fn(module, q, k, v, None, alibi_slopes=None, sliding_window=None, position_ids=torch.arange(4))  # None: nothing
    fn(module, q, k, v, None, deterministic=True)  # ModernBERT's flash-attn switch: harmless, ignored
    sinks = torch.tensor([0.5, -1.0])  # gpt-oss's s_aux: qkv's sinks
    torch.testing.assert_close(
        fn(module, q, k, v, None, s_aux=sinks)[0], qkv.attention(q, k, v, causal=True, sinks=sinks).transpose(1, 2)
    )
    bias = torch.randn(1, 2, 4, 4)  # T5's position_bias: qkv's bias
    torch.testing.assert_close(
        fn(module, q, k, v, None, position_bias=bias)[0],
        qkv.attention(q, k, v, causal=True, bias=bias).transpose(1, 2),
    )
    with pytest.raises(ArgumentError, match="impl"):
        qt.register(impl="fast")
    base = fn(module, q, k, v, None, dropout=0.5)[0]
    torch.testing.assert_close(base, qkv.attention(q, k, v, causal=True).transpose(1, 2))  # eval: no dropout
    module.train()
    torch.manual_seed(3)
    a = fn(module, q, k, v, None, dropout=0.5)[0]
    torch.manual_seed(3)
    b = fn(module, q, k, v, None, dropout=0.5)[0]
    assert torch.equal(a, b) and not torch.allclose(a, base)  # the global generator, seeded
    torch.manual_seed(4)  # the flash kernel draws its counter-based seed from the same generator
    c = qt.attention_function("flash")(module, q, k, v, None, dropout=0.5)[0]
    torch.manual_seed(4)
    assert torch.equal(c, qt.attention_function("flash")(module, q, k, v, None, dropout=0.5)[0])
    assert not torch.allclose(c, base)


def test_import_qkv_integrations_is_light():
    import subprocess
    import sys

    code = "import sys, qkv.integrations; print(any(m in sys.modules for m in ('torch', 'transformers', 'jax')))"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "False"


@pytest.mark.parametrize("padded", [False, True], ids=["no-padding", "left-padding"])
def test_sliding_window_and_padding_reach_qkv_as_structured_masks(padded, monkeypatch):
    """Mistral's window and left padding arrive as qkv Masks (no dense Lq x Lk tensor), and a decode
    step takes the lean path; logits and greedy tokens still equal eager's."""
    from qkv.integrations._hf_masks import StructuredMask

    seen = []
    real = qt.forward

    def spy(module, query, key, value, attention_mask, **kw):
        seen.append((query.shape[-2], attention_mask))
        return real(module, query, key, value, attention_mask, **kw)

    monkeypatch.setattr(qt, "forward", spy)
    model = build("mistral")
    ids, am = inputs(padded)
    want = run(model, "eager", ids, am).logits
    got = run(model, "qkv", ids, am).logits
    keep = am.bool()
    torch.testing.assert_close(got[keep], want[keep], atol=ATOL, rtol=1e-5)
    assert seen and all(isinstance(m, StructuredMask) for _, m in seen)
    assert seen[0][1].mask.name.startswith("padding" if padded else "sliding_window(5)")
    decode = []
    monkeypatch.setattr(qt, "_decode", lambda *a: decode.append(1) or _real_decode(*a))
    tokens = model.generate(ids, attention_mask=am, max_new_tokens=4, do_sample=False, pad_token_id=0)
    model.set_attn_implementation("eager")
    assert torch.equal(
        tokens, model.generate(ids, attention_mask=am, max_new_tokens=4, do_sample=False, pad_token_id=0)
    )
    assert padded or decode  # unpadded decode steps (no mask) took the lean path


def _real_decode(*a):
    from qkv._impls import decode

    return decode(*a)
