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
    """The attention function alone: GQA; no mask is every key, as in eager attention, whatever
    ``module.is_causal`` says (qkv never guesses), and bottom-right causal only when the model
    passes ``is_causal=True``; bool and float masks."""
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
    out, w = fn(module, q, k, v, None, scaling=0.5, is_causal=True)
    assert w is None and out.shape == (2, 3, 4, 8) and out.is_contiguous()
    torch.testing.assert_close(out, expected(torch.where(causal, 0.0, -torch.inf)))
    for says in (None, True, False):  # the attribute is not the interface: eager ignores it, so does qkv
        if says is not None:
            module.is_causal = says
        torch.testing.assert_close(fn(module, q, k, v, None, scaling=0.5)[0], expected(torch.zeros(3, 5)))
    allowed = torch.rand(2, 1, 3, 5, generator=g) > 0.3
    allowed[..., 0] = True
    bias = torch.where(allowed, torch.randn(2, 1, 3, 5, generator=g), torch.finfo(torch.float32).min)
    want = expected(torch.where(allowed, bias, -torch.inf))
    torch.testing.assert_close(fn(module, q, k, v, bias, scaling=0.5)[0], want)  # float: bias + hidden keys
    want = expected(torch.where(allowed, 0.0, -torch.inf))
    torch.testing.assert_close(fn(module, q, k, v, allowed, scaling=0.5)[0], want)


@pytest.mark.parametrize("hidden", [False, True], ids=["bias-only", "bias-and-hidden-keys"])
def test_a_learned_float_mask_gets_its_gradient_even_while_all_zero(hidden):
    """A float mask that is a learned bias (Swin's relative position bias, handed to the attention
    function as ``attention_mask``) gets eager's gradient, also while its values are all zero:
    Swin's bias table starts at zero, and a mask read as "every key may attend" (a boolean) lost
    the gradient, so the table never learned."""
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 2, 6, 8, generator=g) for _ in range(3))
    table = torch.zeros(1, 2, 6, 6, requires_grad=True)  # a parameter at its initial value
    allowed = torch.ones(6, 6, dtype=torch.bool).triu(1).logical_not() if hidden else torch.ones(6, 6, dtype=torch.bool)
    hide = torch.where(allowed, 0.0, torch.finfo(torch.float32).min)
    weights = torch.randn(2, 6, 2, 8, generator=g)

    out, _ = qt.attention_function("auto")(torch.nn.Module().eval(), q, k, v, table + hide, scaling=0.5)
    assert out.requires_grad, "the bias was read as a boolean mask: no gradient reaches it"
    (out * weights).sum().backward()
    got, table.grad = table.grad, None
    eager = torch.softmax(q @ k.transpose(-1, -2) * 0.5 + table + hide, dim=-1) @ v
    (eager.transpose(1, 2) * weights).sum().backward()
    torch.testing.assert_close(got, table.grad)
    assert float(table.grad.abs().max()) > 1e-3


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
        fn(module, q, k, v, None, s_aux=sinks)[0], qkv.attention(q, k, v, sinks=sinks).transpose(1, 2)
    )
    bias = torch.randn(1, 2, 4, 4)  # T5's position_bias: qkv's bias
    torch.testing.assert_close(
        fn(module, q, k, v, None, position_bias=bias)[0],
        qkv.attention(q, k, v, bias=bias).transpose(1, 2),
    )
    with pytest.raises(ArgumentError, match="impl"):
        qt.register(impl="fast")
    base = fn(module, q, k, v, None, dropout=0.5)[0]
    torch.testing.assert_close(base, qkv.attention(q, k, v).transpose(1, 2))  # eval: no dropout
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
    from qkv.integrations._hf_masks import structure_of

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
    assert seen and all(structure_of(m) is not None for _, m in seen)
    assert all(m._dense is None for _, m in seen)  # carried, never evaluated: no dense Lq x Lk mask
    assert structure_of(seen[0][1]).mask.name.startswith("padding" if padded else "sliding_window(5)")
    decode = []
    monkeypatch.setattr(qt, "lean_attention", lambda *a: decode.append(1) or _real_lean(*a))
    tokens = model.generate(ids, attention_mask=am, max_new_tokens=4, do_sample=False, pad_token_id=0)
    model.set_attn_implementation("eager")
    assert torch.equal(
        tokens, model.generate(ids, attention_mask=am, max_new_tokens=4, do_sample=False, pad_token_id=0)
    )
    assert padded or decode  # unpadded decode steps (no mask) took the lean path


def _real_lean(*a):
    from qkv._impls import lean_attention

    return lean_attention(*a)


SLIDING = ["MistralConfig", "MixtralConfig", "Phi3Config", "Starcoder2Config", "Qwen3MoeConfig"]
"""Every architecture the issue found building one sliding-window mask (whose structured mask
`generate` fed back into transformers' own mask code)."""


@pytest.mark.parametrize("window", [4, 4096], ids=["window-4", "window-4096"])
@pytest.mark.parametrize("config", SLIDING)
def test_static_cache_generate_with_a_sliding_window_matches_eager(config, window):
    """`generate(cache_implementation="static")` builds the masks itself and feeds them back as
    `attention_mask`: what qkv's mask function returns must be a real tensor to transformers'
    code (it was a qkv object: `TypeError: not subscriptable`), with eager's tokens."""
    import transformers

    cfg = getattr(transformers, config)(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=1,
    )  # fmt: skip
    cfg.sliding_window = window
    if hasattr(cfg, "use_sliding_window"):
        cfg.use_sliding_window = True
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="qkv").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    for padded in (False, True):
        ids, am = inputs(padded)
        kw = dict(attention_mask=am, max_new_tokens=6, do_sample=False, pad_token_id=0, cache_implementation="static")
        model.set_attn_implementation("qkv")
        got = model.generate(ids, **kw)
        model.set_attn_implementation("eager")
        assert torch.equal(got, model.generate(ids, **kw)), (config, window, padded)


def test_the_lazy_mask_reads_as_the_dense_mask_it_stands_for():
    """Whatever code other than qkv reads from the mask (dtype, shape, indexing, arithmetic, a
    comparison) sees transformers' own `sdpa_mask` values; qkv reads the structure without them."""
    from transformers.masking_utils import and_masks, causal_mask_function, sdpa_mask, sliding_window_overlay

    from qkv.integrations._hf_masks import structure_of

    am = torch.ones(2, 9, dtype=torch.bool)  # transformers hands the mask function a boolean 2-D mask
    am[1, :3] = False
    window = and_masks(sliding_window_overlay(3), causal_mask_function)
    for fn, attention_mask in ((causal_mask_function, None), (window, None), (window, am), (causal_mask_function, am)):
        got = qt.mask_function(2, 9, 9, 0, 0, mask_function=fn, attention_mask=attention_mask)
        want = sdpa_mask(2, 9, 9, 0, 0, mask_function=fn, attention_mask=attention_mask, allow_is_causal_skip=False)
        s = structure_of(got)
        assert s is not None and got._dense is None  # nothing evaluated yet
        assert isinstance(got, torch.Tensor) and got.dtype == torch.bool and got.shape == want.shape == (2, 1, 9, 9)
        dense = torch.tensor(s.mask.dense(9, 9)).reshape(-1, 1, 9, 9).expand(2, 1, 9, 9)
        assert torch.equal(dense, want)  # the structure qkv uses is the mask transformers means
        assert torch.equal(got[:, :, :, :5], want[..., :5]) and structure_of(got[..., :5]) is None
        assert torch.equal(got.clone(), want) and torch.equal(~got, ~want) and torch.equal(got & want, want)
        assert torch.equal(torch.where(got, 0.0, -1.0), torch.where(want, 0.0, -1.0))


def test_a_missing_mask_never_becomes_causal_by_guess():
    """Where transformers' mask would be skipped (no padding; sdpa then reads `module.is_causal`),
    qkv's mask function still says what the mask is: a bidirectional mask gives every key, a
    causal one the causal mask, whatever the module's attribute."""
    from transformers.masking_utils import bidirectional_mask_function, causal_mask_function

    from qkv.integrations._hf_masks import structure_of

    full = qt.mask_function(1, 6, 6, 0, 0, mask_function=bidirectional_mask_function, allow_is_bidirectional_skip=True)
    assert full is not None and structure_of(full).mask is None and bool(full.all())
    causal = qt.mask_function(1, 6, 6, 0, 0, mask_function=causal_mask_function, allow_is_causal_skip=True)
    assert causal is not None and torch.equal(causal[0, 0], torch.ones(6, 6, dtype=torch.bool).tril())
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=g) for _ in range(3))
    module = torch.nn.Module().eval()
    module.is_causal = True  # an attribute that contradicts the mask: the mask wins
    out = qt.attention_function("auto")(module, q, k, v, full)[0]
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2))
    module.is_causal = False
    out = qt.attention_function("auto")(module, q, k, v, causal)[0]
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
    torch.testing.assert_close(out, want)


def test_check_model_has_no_side_effects():
    """transformers caches `_can_set_attn_implementation` on the class asked, and every model reads
    it back with `getattr`: asked about the base class, it switched the refusal off everywhere."""
    from transformers import BloomForCausalLM, PreTrainedModel

    from qkv.integrations import _hf_models

    attr = "_can_set_attn_implementation_cached_value"
    before = {c: c.__dict__.get(attr, "absent") for c in (PreTrainedModel, BloomForCausalLM)}
    assert "not a model" in qt.check_model(PreTrainedModel)
    assert "Bloom" in qt.check_model(BloomForCausalLM)
    assert {c: c.__dict__.get(attr, "absent") for c in before} == before
    PreTrainedModel._can_set_attn_implementation_cached_value = True  # someone else cached it on the base
    try:
        _hf_models._reason.cache_clear()
        assert "Bloom" in qt.check_model(BloomForCausalLM)  # the class's own source still decides
        with pytest.raises(ArgumentError, match="Bloom"):
            _hf_models.refuse(BloomForCausalLM)
    finally:
        del PreTrainedModel._can_set_attn_implementation_cached_value
        _hf_models._reason.cache_clear()


def test_the_mask_does_not_change_when_its_inputs_change_later():
    """A static cache hands the mask function a tensor ``q_offset`` (and generate a padding mask)
    that later steps change in place; the mask handed back must keep the values of its call
    (a lazy build that read them late put mt5's static-cache generate off by 50 in the logits)."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    am = torch.ones(2, 6, dtype=torch.bool)
    am[0, :2] = False
    for q_offset, q_length, kv_length in ((torch.tensor(2), 1, 6), (3, 3, 6)):  # dense (static cache) and structured
        got = qt.mask_function(
            2, q_length, kv_length, q_offset, 0, mask_function=causal_mask_function, attention_mask=am
        )
        want = sdpa_mask(2, q_length, kv_length, q_offset, 0, attention_mask=am, allow_is_causal_skip=False)
        if isinstance(q_offset, torch.Tensor):
            q_offset += 3
        am[1, :4] = False  # the caller reuses its buffers
        assert torch.equal(got.clone(), want)
        am[1, :4] = True


_REGISTRATION = r"""
import os, sys, warnings
os.environ["HF_HUB_OFFLINE"] = "1"
warnings.simplefilter("ignore")
import torch, transformers
from transformers import BloomConfig, BloomForCausalLM, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface
from transformers.modeling_utils import AttentionInterface

def state():
    return (dict(AttentionInterface._global_mapping), dict(AttentionMaskInterface._global_mapping),
            {m: vars(PreTrainedModel)[m] for m in ("get_correct_attn_implementation", "set_attn_implementation")})

def bloom_by_hand():
    # a model whose config says "qkv" by hand, past transformers' validation
    torch.manual_seed(0)
    model = BloomForCausalLM(BloomConfig(vocab_size=100, hidden_size=32, n_layer=2, n_head=4)).eval()
    model.config._attn_implementation = "qkv"
    ids = torch.arange(2, 14).view(2, 6)
    with torch.no_grad():
        return model(ids, attention_mask=torch.ones_like(ids)).logits

untouched, unimported = state(), bloom_by_hand()
from qkv.integrations import transformers as qt
from qkv.errors import ArgumentError
assert state() == untouched, "importing the integration registered something"
assert torch.equal(bloom_by_hand(), unimported), "importing the integration changed a model"

def fail(*args, **kwargs):
    raise RuntimeError("mask registry refused")

real = AttentionMaskInterface.register
AttentionMaskInterface.register = classmethod(fail)
try:
    qt.register()
except RuntimeError:
    pass
else:
    raise AssertionError("register() hid the failure")
AttentionMaskInterface.register = real
assert state() == untouched, "a failed register() left part of it registered"
from qkv.integrations import _hf_models
assert not _hf_models.QKV_NAMES

assert qt.register() == "qkv"
after = state()
assert after[0]["qkv"] is qt.attention_function("auto") and after[1]["qkv"] is qt.mask_function
assert all(getattr(m, "_qkv_guard", False) for m in after[2].values())
try:
    bloom_by_hand()
except ArgumentError as e:
    assert "(model_type 'bloom')" in str(e)
else:
    raise AssertionError("a model qkv cannot run got a qkv mask")
print("ok")
"""


def test_importing_registers_nothing_and_register_registers_all_or_nothing():
    """In a fresh process: importing the integration leaves transformers' registries and
    ``PreTrainedModel`` as they were, and a model whose config names "qkv" by hand computes what
    it computes without qkv imported (transformers builds no mask for a name nobody registered:
    its own behaviour); a ``register()`` that fails part-way leaves nothing registered; a whole one
    registers the attention function, the mask function and the guard (the same model is refused)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _REGISTRATION], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
