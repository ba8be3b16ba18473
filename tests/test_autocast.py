"""``qkv.attention`` under ``torch.autocast``: computed in the autocast dtype, as SDPA is.

CPU autocast computes SDPA in its lower-precision dtype: float32/float16/bfloat16 inputs are cast
to it (float64 left alone), so a model whose q and k leave RoPE in float32 while v leaves a
linear layer in bfloat16 still gets one dtype. qkv does the same; SDPA under autocast and qkv on
inputs cast by hand are the references. A transformers model trains under autocast with
``attn_implementation="qkv"`` like with ``"sdpa"``.
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: never touch the network

import pytest

torch = pytest.importorskip("torch")

import qkv  # noqa: E402
from qkv import _native, masks  # noqa: E402

BF16 = torch.bfloat16


def _inputs(dtypes=(torch.float32, torch.float32, BF16), seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = ((2, 4, 9, 16), (2, 2, 11, 16), (2, 2, 11, 16))
    return tuple(torch.randn(s, generator=g).to(dt).requires_grad_(True) for s, dt in zip(shapes, dtypes, strict=True))


CALLS = {
    "dense": {},
    "causal": {"causal": True},
    "window": {"mask": masks.sliding_window(4)},
    "bias": {"bias": torch.randn(1, 4, 9, 11, generator=torch.Generator().manual_seed(3))},
}


@pytest.mark.parametrize("impl", ["auto", "reference", "flash"])
@pytest.mark.parametrize("call", list(CALLS))
def test_under_autocast_attention_computes_in_its_dtype(call, impl):
    """Mixed float32/bfloat16 inputs (refused outside autocast) give exactly qkv's result on the
    inputs cast by hand; the output has autocast's dtype, SDPA's under autocast is close, and the
    gradients reach the float32 inputs in float32, equal to those through the cast."""
    if impl == "flash" and not _native.available():
        pytest.skip("compiled engine unavailable")
    kw = CALLS[call]
    q, k, v = _inputs()
    with torch.autocast("cpu", dtype=BF16):
        out = qkv.attention(q, k, v, impl=impl, **kw)
        mask = kw.get("bias") if call == "bias" else None
        if call == "window":
            mask = torch.tensor(masks.sliding_window(4).dense(9, 11))
        causal = kw.get("causal", False)
        want_sdpa = torch.nn.functional.scaled_dot_product_attention(
            q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=mask, is_causal=False
        ) if not causal else None  # fmt: skip
    assert out.dtype == BF16
    qc, kc, vc = (x.detach().to(BF16).requires_grad_(True) for x in (q, k, v))
    want = qkv.attention(qc, kc, vc, impl=impl, **kw)
    assert torch.equal(out, want)
    if want_sdpa is not None:
        assert want_sdpa.dtype == BF16
        torch.testing.assert_close(out.float(), want_sdpa.float(), atol=3e-2, rtol=3e-2)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(BF16)
    out.backward(dout)
    want.backward(dout)
    for x, xc in zip((q, k, v), (qc, kc, vc), strict=True):
        assert x.grad.dtype == x.dtype
        assert torch.equal(x.grad, xc.grad.to(x.dtype))


def test_autocast_leaves_float64_and_other_devices_kinds_and_disabled_regions_alone():
    q, k, v = _inputs((torch.float64,) * 3)
    with torch.autocast("cpu", dtype=BF16):
        assert qkv.attention(q, k, v).dtype == torch.float64  # autocast leaves float64 alone, as for SDPA
        with torch.autocast("cpu", enabled=False):
            assert qkv.attention(*_inputs((torch.float32,) * 3)).dtype == torch.float32
    with pytest.raises(qkv.errors.DTypeError, match="different dtypes"):
        qkv.attention(*_inputs())  # outside autocast, mixed dtypes are still refused


@pytest.mark.skipif(not _native.available(), reason="compiled engine unavailable")
def test_autocast_inside_a_compiled_function_is_one_graph():
    def f(q, k, v):
        with torch.autocast("cpu", dtype=BF16):
            return qkv.attention(q, k, v, causal=True)

    q, k, v = _inputs()
    explained = torch._dynamo.explain(f)(q, k, v)
    assert explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v)
    assert got.dtype == BF16
    torch.testing.assert_close(got.float(), f(q, k, v).float(), atol=0, rtol=0)


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_a_transformers_model_trains_under_autocast_as_with_sdpa():
    """A Llama (RoPE leaves q and k in float32 under autocast, v in bfloat16): the loss and the
    gradients of a training step under autocast agree with sdpa's under autocast."""
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM, LlamaConfig

    from qkv.integrations import transformers as qt

    qt.register()
    cfg = LlamaConfig(
        vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, bos_token_id=0, eos_token_id=1, pad_token_id=0,
    )  # fmt: skip
    ids = torch.randint(2, 100, (2, 24), generator=torch.Generator().manual_seed(1))
    losses, grads = {}, {}
    for attn in ("qkv", "sdpa"):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn)
        with torch.autocast("cpu", dtype=BF16):
            loss = model(ids, labels=ids).loss
        loss.backward()
        losses[attn] = float(loss.detach())
        grads[attn] = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert losses["qkv"] == pytest.approx(losses["sdpa"], abs=2e-2)
    assert grads["qkv"].keys() == grads["sdpa"].keys() and len(grads["qkv"]) > 10
    for n, g in grads["qkv"].items():
        assert g.dtype == torch.float32
        want = grads["sdpa"][n]
        assert float((g - want).norm()) <= 0.05 * float(want.norm()) + 1e-6, n  # bf16 rounding, not a wrong gradient


@pytest.mark.skipif(not _native.available(), reason="compiled engine unavailable")
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_decode_steps_under_autocast_take_the_lean_road(monkeypatch):
    """Under autocast a decode step's q (float32 after RoPE) and cached k, v (bfloat16) are cast as
    SDPA casts them, so the step reaches the kernel by the lean road, and its logits are those of
    the full path (the lean road switched off)."""
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig

    from qkv.integrations import transformers as qt

    qt.register()
    cfg = LlamaConfig(
        vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, bos_token_id=0, eos_token_id=1, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="qkv").eval()
    ids = torch.randint(2, 100, (1, 12), generator=torch.Generator().manual_seed(1))
    real, hits = qt.lean_attention, []

    def counting(*a, **kw):
        res = real(*a, **kw)
        hits.append(res is not None)
        return res

    logits = {}
    for lean in (True, False):
        monkeypatch.setattr(qt, "lean_attention", counting if lean else lambda *a, **kw: None)
        cache = DynamicCache(config=model.config)
        with torch.no_grad(), torch.autocast("cpu", dtype=BF16):
            model(ids[:, :-1], cache=cache, use_cache=True)
            logits[lean] = model(ids[:, -1:], cache=cache, use_cache=True).logits
    assert hits == [True, True]  # both layers of the decode step
    assert torch.equal(logits[True], logits[False])


def test_a_quantized_cache_under_autocast_keeps_its_8_bit_values():
    """q is cast; a ``qkv.Quantized`` k and v are read as they are (8-bit values, float32 scales)."""
    q, k, v = (x.detach() for x in _inputs((torch.float32,) * 3))
    qk, qv = qkv.quantize(k, "int8"), qkv.quantize(v, "int8")
    with torch.autocast("cpu", dtype=BF16):
        out = qkv.attention(q, qk, qv, causal=True)
    assert out.dtype == BF16 and torch.equal(out, qkv.attention(q.to(BF16), qk, qv, causal=True))
