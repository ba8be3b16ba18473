"""The architecture matrix: every transformers architecture that dispatches through
``AttentionInterface`` matches eager under ``attn_implementation="qkv"``; every one that does
not is refused with a clear error and never returns a result.

A default selection runs in the quick suite; the rest of ``hf_tiny.configs()`` is marked
``slow`` and runs with ``pytest -m slow`` (``.ci/run`` runs it after the main suite).
Models are built with ``from_config`` on a deep copy of the config: transformers writes the
attention choice into the config object itself, so two models built from one config share it.
"""

import copy
import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: never touch the network

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_tiny import VOCAB, configs, refused_configs  # noqa: E402
from qkv.errors import ArgumentError  # noqa: E402
from qkv.integrations import transformers as qt  # noqa: E402

SEQ, PAD = 10, 3
DEFAULT = {"llama", "mistral", "gpt_oss", "t5", "modernbert", "gemma2"}
"""The quick suite's selection: GQA + RoPE, a sliding window, sinks, T5's learnt bias, an
encoder with local attention and deterministic=, softcap."""

CONFIGS = configs()
REFUSED = refused_configs()


def _param(name):
    marks = () if name in DEFAULT else (pytest.mark.slow,)
    return pytest.param(name, id=name, marks=marks)


ARCHS = [_param(n) for n in CONFIGS]
GENERATIVE = [_param(n) for n, (_, kind, _) in CONFIGS.items() if kind != "encoder"]


@pytest.fixture(scope="module", autouse=True)
def registered():
    qt.register()
    yield


def build(name, attn="eager"):
    auto, _, make = CONFIGS[name]
    config = make()
    torch.manual_seed(0)
    model = getattr(transformers, auto).from_config(copy.deepcopy(config), attn_implementation=attn).eval()
    assert config._attn_implementation != "qkv" or attn == "qkv"  # the copy took the choice, not the original
    with torch.no_grad():  # random init is small: scale weights up so attention is far from uniform
        for p in model.parameters():
            p.mul_(2.0)
    return model


def batch(name, padded):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, VOCAB, (2, SEQ), generator=g)
    am = torch.ones(2, SEQ, dtype=torch.long)
    if padded:
        am[1, :PAD] = 0
        ids[1, :PAD] = 0
    kw = {"input_ids": ids, "attention_mask": am}
    if CONFIGS[name][1] == "seq2seq":
        kw["decoder_input_ids"] = torch.randint(2, VOCAB, (2, 6), generator=g)
    return kw


def kept(name, kw):
    """The output rows to compare: real tokens (a pad query attends nothing: qkv gives zeros)."""
    return slice(None) if CONFIGS[name][1] == "seq2seq" else kw["attention_mask"].bool()


def assert_close_to_golden(got, baseline, golden, *, factor=4.0, name="logits"):
    """qkv's float32 error against eager's float64 golden is at most ``factor`` times eager's own
    float32 error (plus a floor of 1e-6 of the golden's range): T5's unscaled scores make both
    errors large, Llama's small."""
    if golden is None or not bool(golden.isfinite().all()):  # no float64 golden for this model: eager itself
        torch.testing.assert_close(got, baseline, atol=5e-5, rtol=1e-4, msg=name)
        return
    golden = golden.double()
    err = float((got.double() - golden).abs().max())
    base = float((baseline.double() - golden).abs().max())
    floor = 1e-6 * float(golden.abs().max()) + 1e-7
    assert err <= factor * base + floor, f"{name}: max err {err:.3g} > {factor} x eager's {base:.3g} + {floor:.3g}"


def golden_model(model, attn=None):
    """The same model in float64: the golden. On SDPA where the model supports it (unless ``attn``
    says otherwise): eager in float64 turns a fully padded row into NaN (``finfo.min`` added to a
    negative score is ``-inf``), which then reaches every row through the NaN keys of the padded
    positions."""
    gold = copy.deepcopy(model).double()
    gold.set_attn_implementation(attn or ("sdpa" if type(model)._supports_sdpa else "eager"))
    if getattr(gold.config, "_experts_implementation", None) not in (None, "eager"):
        gold.set_experts_implementation("eager")  # grouped_mm has no float64
    return gold


def outputs(model, attn, kw, **extra):
    model.set_attn_implementation(attn)
    assert model.config._attn_implementation == attn
    return model(**kw, **extra)


@pytest.mark.parametrize("padded", [False, True], ids=["no-padding", "left-padding"])
@pytest.mark.parametrize("name", ARCHS)
def test_logits_match_eager(name, padded):
    model = build(name)
    kw = batch(name, padded)
    keep = kept(name, kw)
    with torch.no_grad():
        golden = golden_model(model)(**kw).logits[keep]
        want = outputs(model, "eager", kw).logits[keep]
        got = outputs(model, "qkv", kw).logits[keep]
    assert_close_to_golden(got, want, golden)


@pytest.mark.parametrize("name", GENERATIVE)
def test_greedy_generate_matches_eager(name):
    model = build(name)
    kw = batch(name, padded=True)
    kw.pop("decoder_input_ids", None)
    tokens = {}
    for attn in ("eager", "qkv"):
        model.set_attn_implementation(attn)
        tokens[attn] = model.generate(**kw, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(tokens["qkv"], tokens["eager"])


@pytest.mark.parametrize("name", ARCHS)
def test_output_attentions_match_eager(name):
    model = build(name)
    kw = batch(name, padded=False)
    with torch.no_grad():
        want, got = (outputs(model, attn, kw, output_attentions=True) for attn in ("eager", "qkv"))
        golden = outputs(
            golden_model(model, "eager"), "eager", kw, output_attentions=True
        )  # no padding: eager is finite
    names = [k for k in want if k.endswith("attentions") and want[k] is not None]
    assert names
    for key in names:
        assert len(got[key]) == len(want[key]) == len(golden[key])
        for layer, (g, w, gold) in enumerate(zip(got[key], want[key], golden[key], strict=True)):
            assert_close_to_golden(g, w, gold, name=f"{key}[{layer}]")


@pytest.mark.parametrize("name", ARCHS)
def test_gradients_match_eager(name):
    """Every parameter's gradient, T5's relative-attention bias and gpt-oss's sinks included."""
    model = build(name)
    kw = batch(name, padded=True)
    keep = kept(name, kw)
    grads = {}
    for attn, m in (("eager", model), ("qkv", model), ("golden", golden_model(model))):
        if attn != "golden":
            m.set_attn_implementation(attn)
        m.zero_grad()
        m(**kw).logits[keep].pow(2).mean().backward()
        grads[attn] = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    assert grads["qkv"].keys() == grads["eager"].keys()
    special = [n for n in grads["eager"] if "relative_attention_bias" in n or n.endswith("sinks")]
    if name in ("t5", "mt5", "gpt_oss"):
        assert special and all(grads["qkv"][n].abs().max() > 0 for n in special)
    for n, g in grads["qkv"].items():
        assert_close_to_golden(g, grads["eager"][n], grads["golden"][n], name=n)


@pytest.mark.parametrize("name", list(REFUSED))
def test_non_dispatching_architecture_is_refused(name):
    auto, make = REFUSED[name]
    cls = getattr(transformers, auto)
    with pytest.raises(ArgumentError, match=r"computes attention in its own code.*supports attn_implementation in"):
        cls.from_config(copy.deepcopy(make()), attn_implementation="qkv")
    model = cls.from_config(copy.deepcopy(make()), attn_implementation="eager").eval()
    why = qt.check_model(model)
    assert why is not None and type(model).__name__ in why and "'eager'" in why
    with pytest.raises(ArgumentError, match=type(model).__name__):
        model.set_attn_implementation("qkv")
    assert model.config._attn_implementation == "eager"


@pytest.mark.parametrize("name", ["bloom", "mpnet"])
def test_non_dispatching_model_never_gets_a_qkv_mask(name):
    """Bypassing the validation (writing the config by hand) still gives an error, not a result."""
    auto, make = REFUSED[name]
    model = getattr(transformers, auto).from_config(copy.deepcopy(make()), attn_implementation="eager").eval()
    model.config._attn_implementation = "qkv"
    ids = torch.randint(2, VOCAB, (1, 6))
    with pytest.raises(ArgumentError, match="own code"), torch.no_grad():
        model(ids, attention_mask=torch.ones_like(ids))


def test_check_model_says_none_for_dispatching_classes():
    for name in DEFAULT:
        auto, _, make = CONFIGS[name]
        model_cls = transformers.AutoModel.from_config(make()).__class__
        assert qt.check_model(model_cls) is None, name
    assert "not a transformers PreTrainedModel" in qt.check_model(int)


def test_the_docs_table_agrees_with_the_matrix():
    """docs/transformers.md's generated table (written from the architecture sweep) says what the
    matrix finds for its architectures: matches eager where they dispatch, refused where not."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "transformers.md").read_text()
    rows = re.findall(r"^\| `([^`]+)` \| `([^`]+)` \|(?:[^|]*\|){3} ([^|]+) \|", text, re.MULTILINE)
    assert len(rows) > 300  # every architecture of the installed transformers, not a hand-picked few
    status: dict[str, set[str]] = {}
    for model_type, _, said in rows:
        status.setdefault(model_type, set()).add(said.strip())
    for name in CONFIGS:
        assert status[CONFIGS[name][2]().model_type] == {"matches eager"}, name
    for name in REFUSED:
        assert status[REFUSED[name][1]().model_type] == {"refused"}, name


def test_a_model_reading_its_mask_values_gets_eager_s_mask():
    """NLLB-MoE's expert router reads padding from the 4-D mask's values (``~padding_mask.bool()``
    on eager's additive mask). With expert layers present (a sparse step of 2 in 2 layers) and qkv's
    boolean mask, its logits were off by 0.02 (1.7 with padding), with no error: the router sent
    real tokens to no expert. Its mask function now gives it eager's float mask, which qkv's
    attention reads too."""
    from transformers import NllbMoeConfig, NllbMoeForConditionalGeneration

    config = NllbMoeConfig(
        vocab_size=VOCAB,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=48,
        decoder_ffn_dim=48,
        num_experts=4,
        expert_capacity=64,
        encoder_sparse_step=2,
        decoder_sparse_step=2,
        max_position_embeddings=64,
        decoder_start_token_id=0,
        **{k: v for k, v in {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 0}.items()},
    )
    torch.manual_seed(0)
    eager = NllbMoeForConditionalGeneration(copy.deepcopy(config)).eval()
    with torch.no_grad():
        for p in eager.parameters():
            p.mul_(2.0)
    assert any("SparseMLP" in type(m).__name__ for m in eager.modules())  # expert layers were built
    ours = copy.deepcopy(eager)
    ours.set_attn_implementation("qkv")
    kw = batch("bart", padded=True)  # encoder-decoder ids, the second sequence left-padded
    with torch.no_grad():
        want, got = eager(**kw).logits, ours(**kw).logits
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
