"""``masks.chunked``: causal attention within chunks (Llama 4, FlashAttention-3's
``attention_chunk``), across the compiled kernel's tile edges, on every engine, forward and
backward, against the float64 loop oracle; its tile classes and row intervals against the
definition; and the transformers backend hands Llama 4's chunked layers to it."""

import numpy as np
import pytest

import oracle as O
import qkv
from helpers import HAS_TORCH, assert_close, engine_params, make_qkv
from qkv import masks
from qkv._impls import build_call


def definition(nq: int, nk: int, size: int) -> np.ndarray:
    p = np.arange(nq)[:, None] + (nk - nq)  # bottom-right
    j = np.arange(nk)[None, :]
    return (j <= p) & (j // size == p // size)


SIZES = [(300, 300), (129, 257), (1, 700), (70, 33)]
CHUNKS = [1, 7, 64, 128, 200]


@pytest.mark.parametrize("chunk", CHUNKS)
def test_tiles_and_rows_match_the_definition(chunk):
    for nq, nk in SIZES:
        want = definition(nq, nk, chunk)
        mask = masks.chunked(chunk)
        assert np.array_equal(mask.dense(nq, nk), want)
        lo, hi = mask.intervals(nq, nk)
        j = np.arange(nk)
        assert np.array_equal((lo[:, None] <= j) & (j < hi[:, None]), want)
        for bq, bk in ((16, 128), (64, 128), (5, 3)):
            assert np.array_equal(mask.blocks(nq, nk, bq, bk), O.tile_classes(want, bq, bk)), (nq, nk, bq, bk)


ENGINES = engine_params()


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
@pytest.mark.parametrize("impl,engine", ENGINES)
@pytest.mark.parametrize("chunk", [7, 128])
def test_attention_forward_and_backward_on_every_engine(impl, engine, chunk, rng):
    import torch

    for nq, nk in SIZES:
        q, k, v = make_qkv(rng, (2, nq, 8), (2, nk, 8))
        dout = rng.standard_normal((2, nq, 8))
        allowed = definition(nq, nk, chunk)
        out, weights, _ = O.attention_oracle(q, k, v, allowed=allowed, scale=0.5)
        ds = weights * (dout @ np.swapaxes(v, -1, -2) - (dout * out).sum(-1, keepdims=True))
        grads = (ds @ k * 0.5, np.swapaxes(ds, -1, -2) @ q * 0.5, np.swapaxes(weights, -1, -2) @ dout)
        t = [torch.tensor(x, requires_grad=True) for x in (q, k, v)]
        kw = {} if engine is None else {"engine": engine}
        res = qkv._core.run(build_call(*t, mask=masks.chunked(chunk), scale=0.5, **kw), impl)
        assert_close(res.out, out, tol=1e-11, name=f"{impl}/{engine} {nq}x{nk} out")
        (res.out * torch.tensor(dout)).sum().backward()
        for name, x, g in zip(("dq", "dk", "dv"), t, grads, strict=True):
            assert_close(x.grad, g, tol=1e-10, name=f"{impl}/{engine} {nq}x{nk} {name}")


def test_errors_name_the_argument():
    with pytest.raises(qkv.errors.MaskError, match="chunked size"):
        masks.chunked(0)
    with pytest.raises(qkv.errors.MaskError, match="chunked offset"):
        masks.chunked(4, offset=1.5)


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
def test_llama4s_chunked_layers_reach_qkv_as_masks_chunked(monkeypatch):
    """Llama 4's chunked layers (transformers' chunked causal mask) arrive as ``masks.chunked``
    (they took the dense path); with left padding (chunks shifted per sequence) the dense mask.
    Logits and greedy tokens equal eager's either way."""
    import copy
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    import torch

    from qkv.integrations import transformers as qt
    from qkv.integrations._hf_masks import structure_of

    qt.register()
    config = transformers.Llama4TextConfig(
        vocab_size=100, hidden_size=32, intermediate_size=48, intermediate_size_mlp=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, attention_chunk_size=4, num_local_experts=2,
        max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2, no_rope_layers=[1, 0],
    )  # fmt: skip
    torch.manual_seed(0)
    eager = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="eager").eval()
    model = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="qkv").eval()
    model.load_state_dict(eager.state_dict())
    seen = []
    real = qt.forward

    def spy(module, query, key, value, attention_mask, **kw):
        seen.append(structure_of(attention_mask))
        return real(module, query, key, value, attention_mask, **kw)

    monkeypatch.setattr(qt, "forward", spy)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 100, (2, 10), generator=g)
    for padded in (False, True):
        am = torch.ones_like(ids)
        if padded:
            am[1, :3] = 0
        seen.clear()
        with torch.no_grad():
            want, got = eager(ids, attention_mask=am).logits, model(ids, attention_mask=am).logits
        keep = am.bool()
        torch.testing.assert_close(got[keep], want[keep], atol=2e-5, rtol=1e-5)
        chunked = [s for s in seen if s is not None and s.chunk is not None]
        assert bool(chunked) != padded, seen  # unpadded: masks.chunked(4); padded: the dense mask
        assert all(s.mask.name == "chunked(4)" for s in chunked)
        gen = dict(attention_mask=am, max_new_tokens=5, do_sample=False, pad_token_id=0)
        assert torch.equal(model.generate(ids, **gen), eager.generate(ids, **gen))
