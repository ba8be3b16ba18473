"""A static cache through qkv's transformers backend: the slots after the queries' positions.

A static cache (``StaticCache``, ``generate(cache_implementation="static")``) hands the mask
function ``kv_length = max_cache_len`` and the position of the first query as a tensor; every
causal mask hides the slots after the last query from every query. qkv's mask says so
(``Structure.keys``), so the backend reads only the written slots and a decode step takes the
lean road. transformers' own ``sdpa_mask`` and eager attention are the oracles.
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: never touch the network

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, StaticCache  # noqa: E402
from transformers.masking_utils import (  # noqa: E402
    and_masks,
    causal_mask_function,
    chunked_overlay,
    sdpa_mask,
    sliding_window_overlay,
)

from qkv.integrations import transformers as qt  # noqa: E402
from qkv.integrations._hf_masks import structure_of  # noqa: E402

LK = 12  # max_cache_len


@pytest.fixture(scope="module", autouse=True)
def registered():
    qt.register()


def _padding(kind):
    if kind is None:
        return None
    am = torch.ones(2, LK, dtype=torch.bool)
    am[1, :3] = False  # left padding
    if kind == "right":
        am[0, 7:] = False  # a hole inside the written keys for some positions: not left padding
    return am


def _function(name, am):
    if name == "causal":
        return causal_mask_function
    if name == "window-3":
        return and_masks(sliding_window_overlay(3), causal_mask_function)
    shifts = torch.zeros(2, dtype=torch.long) if am is None else (~am).cumprod(-1).sum(-1)  # left pads per row
    return and_masks(chunked_overlay(4, shifts), causal_mask_function)


@pytest.mark.parametrize("padding", [None, "left", "right"])
@pytest.mark.parametrize("fn", ["causal", "window-3", "chunked-4"])
def test_a_static_cache_mask_is_its_structure_over_the_written_keys(fn, padding):
    """For every position of the queries in the cache (a tensor, as StaticCache gives it), the mask
    reads as sdpa_mask's values; where qkv has its structure, that structure over the first
    ``q_offset + Lq`` keys followed by hidden slots is exactly those values."""
    am = _padding(padding)
    function = _function(fn, am)
    structured = 0
    for q_length in (1, 3):
        for start in range(LK - q_length + 1):
            q_offset = torch.tensor(start)
            got = qt.mask_function(2, q_length, LK, q_offset, 0, mask_function=function, attention_mask=am)
            want = sdpa_mask(
                2, q_length, LK, q_offset, 0, mask_function=function, attention_mask=am, allow_is_causal_skip=False
            )
            q_offset += 5  # the cache moves its position in place after the call
            s = structure_of(got)
            assert torch.equal(got.clone(), want), (fn, padding, q_length, start)
            if s is None:
                continue
            structured += 1
            keys = start + q_length
            assert s.keys == (None if keys == LK else keys)
            if s.mask is None:
                dense = torch.ones(2, 1, q_length, keys, dtype=torch.bool)
            else:
                dense = torch.tensor(s.mask.dense(q_length, keys)).reshape(-1, 1, q_length, keys).expand(2, 1, -1, -1)
            hidden = torch.zeros(2, 1, q_length, LK - keys, dtype=torch.bool)
            assert torch.equal(torch.cat([dense, hidden], -1), want), (fn, padding, q_length, start)
    chunked_padded = fn.startswith("chunked") and padding is not None  # qkv builds those densely
    holes = padding == "right"  # not left padding once the hole is among the written keys
    if not chunked_padded and not holes:
        assert structured == sum(LK - q + 1 for q in (1, 3))  # every position: none built densely
    else:
        assert structured < sum(LK - q + 1 for q in (1, 3))


def _model(name, dtype=torch.float32):
    common = dict(
        vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, bos_token_id=0, eos_token_id=1, pad_token_id=0,
    )  # fmt: skip
    cfg = MistralConfig(**common, sliding_window=5) if name == "mistral" else LlamaConfig(**common)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=dtype).eval()
    with torch.no_grad():  # random init is small: scale weights up so attention is far from uniform
        for p in model.parameters():
            p.mul_(3.0)
    return model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", ["llama", "mistral"])
def test_static_cache_steps_match_eager_and_take_the_lean_road(name, dtype, monkeypatch):
    """Prefill into a static cache, then decode steps one token at a time: the logits are eager's
    (which reads every slot under its mask), every decode step's layers reach the kernel by the
    lean road (no mask handling), and the weights asked for cover every slot, zero where unread.
    (Mistral's sliding layers keep a rolling cache of ``window`` slots, full after the prompt.)"""
    lean = {"calls": 0}
    real = qt.lean_attention

    def counting(*a, **kw):
        lean["calls"] += 1
        return real(*a, **kw)

    monkeypatch.setattr(qt, "lean_attention", counting)
    model = _model(name, dtype)
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(2, 100, (2, 7), generator=g)
    steps = torch.randint(2, 100, (2, 4), generator=g)
    logits, weights = {}, {}
    for attn in ("qkv", "eager"):
        model.set_attn_implementation(attn)
        cache = StaticCache(config=model.config, max_cache_len=16)
        with torch.no_grad():
            out = [model(prompt, cache=cache, use_cache=True).logits]
            for i in range(steps.shape[1]):
                out.append(model(steps[:, i : i + 1], cache=cache, use_cache=True).logits)
            last = model(steps[:, :1], cache=cache, use_cache=True, output_attentions=True)
        logits[attn], weights[attn] = torch.cat(out, 1), last.attentions
    atol = 2e-5 if dtype == torch.float32 else 0.1
    torch.testing.assert_close(logits["qkv"].float(), logits["eager"].float(), atol=atol, rtol=1e-3)
    assert lean["calls"] == steps.shape[1] * 2  # every decode step, both layers
    for got, want in zip(weights["qkv"], weights["eager"], strict=True):
        assert got.shape == want.shape == ((2, 4, 1, 5) if name == "mistral" else (2, 4, 1, 16))  # Mistral: 5 slots
        assert not got[..., 12:].any()  # Llama's unwritten slots: zero weight
        torch.testing.assert_close(got.float(), want.float(), atol=2e-6 if dtype == torch.float32 else 2e-2, rtol=0)
