"""Every text architecture the installed transformers registers, shrunk and checked under qkv.

The generator walks transformers' own model mappings (causal LM, seq2seq LM, masked LM, then
the base model of every other ``model_type``), builds each config class with its defaults,
shrinks every size it knows the name of (hidden ≤ 64, 2 layers, 4 heads with 2 kv heads where
the config has them, a 128-token vocabulary), and checks the model under
``attn_implementation="qkv"`` against eager attention in float32, as users run them: the logits
with right and with left padding. The two differ by float32 rounding (~1e-6 of the logits'
scale here); the bugs this finds are off by 1e-3 to 1 (a mask misread, causality guessed), so
the tolerance is ``1e-4`` of the logits' scale. (Not float64: eager's softmax runs in float32
even then, turns float64's "minus infinity" mask into -inf, and a fully padded row's NaN
reaches every token through the next layer's keys.) Then the weights ``output_attentions=True``
returns (every layer, self and cross) and every parameter's gradient of a random weighting of
the outputs (to ``1e-3`` of the largest gradient). Causal and seq2seq LMs also generate with a
dynamic and a static cache (greedy tokens equal to eager's).

Each model is built twice from the same config, under eager and under ``"qkv"`` (models that
pick their attention classes at ``__init__`` do it then), with the same weights. ``sweep()``
gives one ``Outcome`` per model type and head: ``matches`` (and qkv ran), ``weights`` (matches
but for the weights ``output_attentions`` returns, by a convention of the model's own eager code:
``SINK_SCALED``), ``refused`` (qkv
raised ``ArgumentError`` at load or at the first forward: the reason), ``unbuildable`` (no
text model can be built here from a shrunk default config: the reason), ``unused`` (it ran, but
no layer called qkv on a text input), or ``differs`` (the check that differed, or a crash under
qkv where eager runs: a bug). Shared by ``tests/test_transformers_sweep.py`` and
``scripts/transformers_table.py``.
"""

import copy
import os
import re
import traceback
from typing import Any, NamedTuple

os.environ.setdefault("HF_HUB_OFFLINE", "1")

VOCAB, SEQ, PAD, NEW = 128, 9, 3, 4
TOL = 1e-4
MAX_PARAMETERS = 8_000_000
GRAD_TOL = 1e-3  # of the largest gradient entry: float32 sums of many terms, bugs are off by O(1)

SIZES = {
    # name -> shrunk value, applied wherever a config (or a sub-config) has the attribute
    "hidden_size": 32, "d_model": 32, "n_embd": 32, "embed_dim": 32, "dim": 32, "word_embed_proj_dim": 32,
    "intermediate_size": 48, "d_ff": 48, "ffn_dim": 48, "encoder_ffn_dim": 48, "decoder_ffn_dim": 48,
    "n_inner": 48, "hidden_dim": 48, "moe_intermediate_size": 16, "shared_expert_intermediate_size": 16,
    "num_hidden_layers": 2, "num_layers": 2, "n_layer": 2, "n_layers": 2, "encoder_layers": 2, "decoder_layers": 2,
    "num_decoder_layers": 2,
    "num_attention_heads": 4, "num_heads": 4, "n_head": 4, "n_heads": 4, "encoder_attention_heads": 4,
    "decoder_attention_heads": 4, "attention_heads": 4,
    "num_key_value_heads": 2, "encoder_kv_heads": 2, "decoder_kv_heads": 2,
    "head_dim": 8, "d_kv": 8, "kv_channels": 8, "rotary_dim": 4,
    "vocab_size": VOCAB,
    "max_position_embeddings": 64, "n_positions": 64, "n_ctx": 64, "max_seq_len": 64,
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "first_k_dense_replace": 1, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
    # multi-head latent attention (DeepSeek V2/V3, Kimi, GLM-4 MoE lite, LongCat)
    "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8,
    "entity_vocab_size": 64, "entity_emb_size": 32,
}  # fmt: skip

TOKENS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 1}


SINK_SCALED = {
    name: "`output_attentions`: qkv returns the weights applied to V (normalised with the sink, as "
    "gpt-oss's eager does); this model's eager returns its softmax before the sink scales the output"
    for name in ("granite_swa", "granitemoe_swa")
}
"""Models whose eager attention returns, with a sink, weights other than those it applies to V."""


class Outcome(NamedTuple):
    model_type: str
    auto: str
    cls: str  # the class transformers' mapping names for this head
    status: str  # "matches" | "weights" | "refused" | "unbuildable" | "unused" | "differs"
    why: str


def _shrink(config: Any, depth: int = 0) -> None:
    """Shrink ``config`` and every sub-config it holds (text, vision, audio, encoder, decoder...)."""
    for name, value in SIZES.items():
        if isinstance(getattr(config, name, None), int) and not isinstance(getattr(config, name), bool):
            try:
                setattr(config, name, value)
            except AttributeError:  # a property derived from the others (Falcon's head_dim)
                pass
    for name, value in TOKENS.items():
        if hasattr(config, name) and getattr(config, name) is not None:
            setattr(config, name, value)
    if isinstance(getattr(config, "kv_lora_rank", None), int) and hasattr(config, "num_key_value_heads"):
        config.num_key_value_heads = config.num_attention_heads  # latent attention: every head has its keys
    types = getattr(config, "layer_types", None)
    if isinstance(types, list) and types:
        config.layer_types = (types * 2)[: getattr(config, "num_hidden_layers", 2)]
    if depth < 3:
        for sub in list(vars(config).values()):
            if hasattr(sub, "to_dict") and hasattr(sub, "model_type"):
                _shrink(sub, depth + 1)


def _classes() -> list[tuple[str, str, str, str]]:
    """``(model_type, auto class, kind, class name)`` for every model type transformers registers:
    each text head it has (causal LM, seq2seq LM, masked LM), else its base model."""
    from transformers.models.auto import modeling_auto as m

    heads = (
        (m.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, "AutoModelForCausalLM", "causal"),
        (m.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES, "AutoModelForSeq2SeqLM", "seq2seq"),
        (m.MODEL_FOR_MASKED_LM_MAPPING_NAMES, "AutoModelForMaskedLM", "encoder"),
        (m.MODEL_MAPPING_NAMES, "AutoModel", "base"),
    )
    found = []
    for model_type in sorted({t for mapping, _, _ in heads for t in mapping}):
        mine = [
            (model_type, auto, kind, _name(mapping[model_type]))
            for mapping, auto, kind in heads[:3]
            if model_type in mapping
        ]
        found += mine or [(model_type, "AutoModel", "base", _name(m.MODEL_MAPPING_NAMES[model_type]))]
    return found


def _name(entry: Any) -> str:
    return entry[0] if isinstance(entry, (list, tuple)) else str(entry)


def _batch(kind: str, padded: str, g: Any) -> dict[str, Any]:
    import torch

    ids = torch.randint(3, VOCAB, (2, SEQ), generator=g)
    am = torch.ones(2, SEQ, dtype=torch.long)
    if padded == "left":
        am[1, :PAD], ids[1, :PAD] = 0, 0
    elif padded == "right":
        am[1, -PAD:], ids[1, -PAD:] = 0, 0
    kw: dict[str, Any] = {"input_ids": ids, "attention_mask": am}
    if kind == "seq2seq":
        kw["decoder_input_ids"] = torch.randint(3, VOCAB, (2, 5), generator=g)
    return kw


def _output(out: Any) -> Any:
    for name in ("logits", "last_hidden_state"):
        value = getattr(out, name, None)
        if value is not None:
            return value
    return out[0]


def _rows(kw: dict[str, Any], kind: str) -> Any:
    """The rows whose output is compared: real tokens (a query that may attend no key is zeros
    under qkv, garbage or NaN under eager)."""
    return slice(None) if kind == "seq2seq" else kw["attention_mask"].bool()


def _calls() -> list[int]:
    """A counter of the calls into qkv's transformers backend (its ``forward``), installed once."""
    from qkv.integrations import transformers as qt

    if not hasattr(qt.forward, "_sweep_calls"):
        real, calls = qt.forward, [0]

        def counted(*args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            return real(*args, **kwargs)

        counted._sweep_calls = calls  # type: ignore[attr-defined]
        qt.forward = counted
    return qt.forward._sweep_calls  # type: ignore[attr-defined]


def _first_line(e: BaseException) -> str:
    """The exception's type and first line, without this machine's paths (the table is the same
    on every machine: ``<module ... from '/.../site-packages/...'>`` becomes ``<module ...>``)."""
    line = re.sub(r" from '[^']*'", "", (str(e).splitlines() or [""])[0])
    return f"{type(e).__name__}: {line}"[:200]


def _attentions_differ(eager: Any, model: Any, kw: dict[str, Any]) -> str:
    """Why ``output_attentions=True`` weights differ between the models ("" if they agree): every
    layer's weights (self, cross), first sequence (unpadded), to ``TOL``."""
    import torch

    with torch.no_grad():
        try:
            want = eager(**kw, output_attentions=True)
        except Exception:  # noqa: BLE001 - eager cannot return weights here: nothing to compare
            return ""
        got = model(**kw, output_attentions=True)
    for name in ("attentions", "encoder_attentions", "decoder_attentions", "cross_attentions"):
        a, b = getattr(got, name, None), getattr(want, name, None)
        if b is None or not isinstance(b, tuple) or not all(isinstance(x, torch.Tensor) for x in b):
            continue
        if a is None or len(a) != len(b):
            return f"output_attentions: {name} missing under qkv"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x.shape != y.shape or not float((x[0] - y[0]).abs().max()) <= TOL:
                return f"output_attentions: {name}[{i}] differs"
    return ""


def _gradients_differ(eager: Any, model: Any, kw: dict[str, Any], kind: str) -> str:
    """Why the gradients of every parameter differ between the models ("" if they agree), for a
    fixed random weighting of the real tokens' outputs; to ``GRAD_TOL`` of the largest."""
    import torch

    grads = []
    for m in (eager, model):
        m.zero_grad(set_to_none=True)
        out = _output(m(**kw))
        rows = _rows(kw, kind) if tuple(out.shape[:2]) == (2, SEQ) else slice(None)
        w = torch.randn(out[rows].shape, generator=torch.Generator().manual_seed(3))
        (out[rows] * w).sum().backward()
        grads.append({n: p.grad for n, p in m.named_parameters() if p.grad is not None})
    want, got = grads
    if set(want) != set(got):
        return f"gradients: parameters {sorted(set(want) ^ set(got))[:3]} reached by one model only"
    scale = max((float(g.abs().max()) for g in want.values()), default=0.0)
    for name, g in want.items():
        if not float((got[name] - g).abs().max()) <= GRAD_TOL * max(scale, 1e-6):
            return f"gradients: {name} differs"
    return ""


def check(model_type: str, auto: str, kind: str, cls: str = "") -> Outcome:
    """Build ``model_type`` shrunk, once under eager and once under ``"qkv"`` (the same weights),
    and compare them (float32); see the module docstring. ``matches`` only where qkv ran.

    Warnings are ignored here: the outcome must not depend on whether they are errors (pytest's
    ``filterwarnings = error`` vs the table script), and tiny configs make transformers warn
    (zero-element layers, out-of-vocabulary special tokens)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _check(model_type, auto, kind, cls)


def _check(model_type: str, auto: str, kind: str, cls: str = "") -> Outcome:
    import torch
    import transformers
    from transformers import AutoConfig

    from qkv.errors import ArgumentError

    def outcome(status: str, why: str = "") -> Outcome:
        return Outcome(model_type, auto, cls, status, why.replace("\n", " "))

    head = getattr(transformers, auto)
    try:
        config = AutoConfig.for_model(model_type)
        _shrink(config)
        config.use_cache = True
        with torch.device("meta"):  # count first: a size the shrink missed must not fill the machine's memory
            size = sum(p.numel() for p in head.from_config(copy.deepcopy(config)).parameters())
        if size > MAX_PARAMETERS:
            return outcome("unbuildable", f"{size:,} parameters after shrinking (a size it missed)")
        torch.manual_seed(0)
        eager = head.from_config(copy.deepcopy(config), attn_implementation="eager").eval()
    except Exception as e:  # noqa: BLE001 - any failure to build is the reason this one is not checked
        return outcome("unbuildable", _first_line(e))
    try:  # built under "qkv" (models that pick attention classes at __init__ do it now)
        model = head.from_config(copy.deepcopy(config), attn_implementation="qkv").eval()
    except ArgumentError as e:
        return outcome("refused", str(e).splitlines()[0])
    except Exception as e:  # noqa: BLE001 - eager builds, qkv does not: a bug (never a KeyError)
        return outcome("differs", f"load under qkv: {_first_line(e)}")
    with torch.no_grad():  # random init is small: scale weights up so attention is far from uniform
        for p in eager.parameters():
            p.mul_(2.0)
    missing = model.load_state_dict(eager.state_dict(), strict=False)
    if missing.missing_keys or missing.unexpected_keys:
        return outcome("differs", f"the qkv model's parameters differ from eager's: {missing}"[:200])
    calls = _calls()
    ran = calls[0]
    g = torch.Generator().manual_seed(1)
    for padded in ("right", "left"):
        kw = _batch(kind, padded, g)
        try:
            with torch.no_grad():
                want = _output(eager(**kw))
        except Exception as e:  # noqa: BLE001 - eager itself cannot run this input
            return outcome("unbuildable", f"eager forward: {_first_line(e)}")
        try:
            with torch.no_grad():
                got = _output(model(**kw))
        except ArgumentError as e:
            return outcome("refused", str(e).splitlines()[0])
        except Exception:  # noqa: BLE001 - a crash under qkv is a bug: report it
            return outcome("differs", f"{padded} padding: " + traceback.format_exc(limit=-2)[-300:])
        rows = _rows(kw, kind) if tuple(got.shape[:2]) == (2, SEQ) else slice(None)
        if got.shape != want.shape:
            return outcome("differs", f"{padded} padding: shape {got.shape} != {want.shape}")
        err = float((got[rows] - want[rows]).abs().max()) if got[rows].numel() else 0.0
        if not err <= TOL * max(1.0, float(want[rows].abs().max())):
            return outcome("differs", f"{padded} padding: logits off by {err:.3g}")
    if calls[0] == ran:
        return outcome("unused", "no layer called qkv on a text input")
    kw = _batch(kind, "right", g)
    weights = _attentions_differ(eager, model, kw)
    if weights and model_type not in SINK_SCALED:
        return outcome("differs", weights)
    why = _gradients_differ(eager, model, kw, kind)
    if why:
        return outcome("differs", why)
    if kind in ("causal", "seq2seq"):
        for cache in ("dynamic", "static"):
            kw = _batch(kind, "left", g)
            kw.pop("decoder_input_ids", None)
            gen = dict(max_new_tokens=NEW, do_sample=False, pad_token_id=0, cache_implementation=cache)
            try:
                want = eager.generate(**kw, **gen)
            except Exception:  # noqa: BLE001 - eager cannot generate this way here: not a qkv check
                continue
            try:
                got = model.generate(**kw, **gen)
            except ArgumentError as e:
                return outcome("refused", str(e).splitlines()[0])
            except Exception:  # noqa: BLE001
                return outcome("differs", f"generate ({cache}): " + traceback.format_exc(limit=-2)[-300:])
            if not torch.equal(got, want):
                return outcome("differs", f"generate ({cache} cache): tokens differ")
    return outcome("weights", SINK_SCALED[model_type]) if weights else outcome("matches")


def register_once() -> None:
    """Register qkv with transformers as ``"qkv"`` (harmless when done already)."""
    from qkv.integrations.transformers import register

    register()


def sweep(only: Any = None) -> list[Outcome]:
    """One ``Outcome`` per model type and head (``only``: an iterable of model types to restrict to)."""
    register_once()
    chosen = set(only) if only is not None else None
    return [check(*entry) for entry in _classes() if chosen is None or entry[0] in chosen]


if __name__ == "__main__":
    import sys
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(1)
    for o in sweep(sys.argv[1:] or None):
        print(f"{o.status:12} {o.model_type:32} {o.auto:24} {o.why}", flush=True)
