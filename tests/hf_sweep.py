"""Every architecture the installed transformers registers, built tiny and checked under qkv.

For each model type, each text head it has (causal LM, seq2seq LM, masked LM), else its base
model: the tiny config keeps every layer kind of the full config (``hf_shrink``), the inputs are
the ones its forward takes (``hf_inputs``: token ids with padding, pixels, audio, boxes, both
sides of encoder-decoder and vision-text models). The model is built twice with the same weights,
under eager and under ``attn_implementation="qkv"``, and compared in float32 as users run it:

- every floating output, with right and with left padding (real tokens only: a query that may
  attend no key is zeros under qkv, garbage under eager), to ``TOL`` of the output's scale. The
  two differ by float32 rounding (~1e-6 of the scale); the bugs this finds are off by 1e-3 to 1.
  (Not float64: eager's softmax runs in float32 even then, turns float64's "minus infinity" mask
  into -inf, and a fully padded row's NaN reaches every token through the next layer's keys.)
- the weights ``output_attentions=True`` returns: every layer, self and cross, every sequence
  (its real query rows);
- every parameter's gradient of a fixed random weighting of the outputs, each to ``GRAD_TOL`` of
  that parameter's own largest gradient (plus a floor of ``1e-6`` of the largest of all);
- greedy ``generate`` with a dynamic and a static cache (causal and seq2seq LMs);
- in bfloat16 for the families of ``BF16``: qkv's error against eager's float32 answer at most
  ``BF16_FACTOR`` times eager's own bfloat16 error (plus ``1e-3`` of the scale), and greedy tokens
  equal to eager's bfloat16 tokens wherever those agree with eager's float32 ones.

A check eager itself cannot run is reported (``notes``), never skipped silently. While the model
runs, every read of qkv's mask tensor by a module that is not an attention layer is recorded: a
model whose own code reads the mask's values (NLLB-MoE's router) must get eager's mask
(``_hf_models.EAGER_MASKS``) or be refused, so such a read is a difference.

``sweep()`` gives one ``Outcome`` per class: ``matches`` (and qkv ran), ``weights`` (matches but
for the weights ``output_attentions`` returns, by a convention of the model's own eager code:
``SINK_SCALED``), ``refused`` (qkv raised ``ArgumentError``: the reason), ``unbuildable`` (eager
does not build or run the tiny model: transformers' reason where its default config fails too, a
package is missing or its forward fails in its own code (``OWN``); else the sweep's, marked ``tiny
config:``, ``eager forward:`` or over the budget), ``unused`` (it ran, no layer called qkv), or
``differs`` (a bug). Where eager alone disagrees with sdpa and qkv gives sdpa's answer, the row
matches and says so (``_eager_alone``). Shared by ``tests/test_transformers_sweep.py`` and
``scripts/transformers_table.py``.
"""

import copy
import os
import re
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from hf_inputs import candidates, fresh, prepare  # noqa: E402
from hf_shrink import MAX_PARAMETERS, named_kinds, tiny  # noqa: E402

NEW = 4
TOL = 1e-4
GRAD_TOL = 1e-3  # of each parameter's own largest gradient: float32 sums of many terms, bugs are off by O(1)
BF16_FACTOR = 2.0
GOLDEN_FACTOR = 4.0

BF16 = frozenset(
    {
        "llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "gemma2", "gemma3_text", "phi3", "gpt_oss",
        "deepseek_v3", "smollm3", "granite",
        "bert", "roberta", "modernbert", "vit", "clip", "siglip",
    }
)  # fmt: skip
"""The model types also compared in bfloat16: the main decoder families and encoders."""

SINK_SCALED = {
    name: "`output_attentions`: qkv returns the weights applied to V (normalised with the sink, as "
    "gpt-oss's eager does); this model's eager returns its softmax before the sink scales the output"
    for name in ("granite_swa", "granitemoe_swa")
}
"""Models whose eager attention returns, with a sink, weights other than those it applies to V."""


OWN = {
    name: f"{cls} has no `vision_start_token_id`, which its forward reads (the composite config has it): "
    "it runs only inside the full model"
    for name, cls in (
        ("qwen2_5_omni_thinker", "Qwen2_5OmniThinkerConfig"),
        ("qwen3_omni_moe_thinker", "Qwen3OmniMoeThinkerConfig"),
    )
} | {
    "pp_ocrv6_small_det": "its neck reads four feature maps of `layer_list_out_channels` (12, 18, 42, 360: "
    "PP-LCNet v3's at scale 0.75, the backbone its `sub_configs_defaults` names), but its default config "
    "builds PP-LCNet v4, which gives one of 384 channels: the default config fails so at full size too",
}
"""Model types whose eager forward fails for a reason of transformers' own, read in its source:
any input fails the same way."""


class Outcome(NamedTuple):
    model_type: str
    auto: str
    cls: str  # the class transformers' mapping names for this head
    status: str  # "matches" | "weights" | "refused" | "unbuildable" | "unused" | "differs"
    why: str
    inputs: str = ""  # what the model was fed
    kinds: str = ""  # the layer kinds built
    dtypes: str = ""  # "float32" or "float32, bfloat16"
    notes: str = ""  # checks eager itself cannot run here


def _classes() -> list[tuple[str, str, str, str]]:
    """``(model_type, auto class, kind, class name)`` for every model type transformers registers:
    each head it has of causal LM, seq2seq LM, speech seq2seq and masked LM, else its base model."""
    from transformers.models.auto import modeling_auto as m

    heads = (
        (m.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, "AutoModelForCausalLM", "causal"),
        (m.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES, "AutoModelForSeq2SeqLM", "seq2seq"),
        (m.MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES, "AutoModelForSpeechSeq2Seq", "seq2seq"),
        (m.MODEL_FOR_MASKED_LM_MAPPING_NAMES, "AutoModelForMaskedLM", "encoder"),
        (m.MODEL_MAPPING_NAMES, "AutoModel", "base"),
    )
    found = []
    for model_type in sorted({t for mapping, _, _ in heads for t in mapping}):
        mine: list[tuple[str, str, str, str]] = []
        for mapping, auto, kind in heads[:-1]:  # one row per class: a class two heads map to, once
            if model_type in mapping and all(_name(mapping[model_type]) != row[3] for row in mine):
                mine.append((model_type, auto, kind, _name(mapping[model_type])))
        found += mine or [(model_type, "AutoModel", "base", _name(m.MODEL_MAPPING_NAMES[model_type]))]
    return found


def _name(entry: Any) -> str:
    return entry[0] if isinstance(entry, (list, tuple)) else str(entry)


def run(m: Any, kw: dict[str, Any], **extra: Any) -> Any:
    """``m(**kw)`` from the same random state every time: a model that draws in its forward (ViT-MAE's
    patch masking) draws the same under eager and under qkv."""
    import torch

    torch.manual_seed(5)
    return m(**fresh(kw, m), **extra)


def _tensors(out: Any) -> dict[str, Any]:
    """Every floating tensor of a model's output, by its path (caches and attentions left out)."""
    import torch

    found: dict[str, Any] = {}

    def walk(value: Any, path: str) -> None:
        if isinstance(value, torch.Tensor):
            if value.is_floating_point():
                found[path] = value
        elif hasattr(value, "items") and not hasattr(value, "get_seq_length"):
            for key, item in value.items():
                if not str(key).endswith(("attentions", "past_key_values", "cache")):
                    walk(item, f"{path}.{key}" if path else str(key))
        elif isinstance(value, (tuple, list)):
            for i, item in enumerate(value):
                walk(item, f"{path}[{i}]")

    walk(out, "")
    return found


def _rows(kw: dict[str, Any], t: Any) -> Any:
    """The rows of ``t`` compared: real tokens where ``t`` is per token of the padded text (a query
    that may attend no key is zeros under qkv, garbage under eager)."""
    import torch

    am = kw.get("attention_mask")
    if am is None or t.ndim < 2 or t.shape[0] % am.shape[0]:
        return slice(None)
    if t.shape[0] != am.shape[0] and t.shape[0] % am.shape[0] == 0 and t.shape[1] == am.shape[1]:
        return am.bool().repeat_interleave(t.shape[0] // am.shape[0], 0)  # a row per codebook (MusicGen)
    if t.shape[0] != am.shape[0]:
        return slice(None)
    if "returns_to_go" in kw and t.shape[1] == 3 * am.shape[1]:  # Decision Transformer: 3 tokens per step
        return am.bool().repeat_interleave(3, 1)
    extra = t.shape[1] - am.shape[1]
    if extra == 0:
        return am.bool()
    if 0 < extra <= 4:  # a class token joined to the text (VideoPrism's, appended): real under either side
        ones = torch.ones(am.shape[0], extra, dtype=torch.bool)
        return torch.cat([ones, am.bool()], 1) & torch.cat([am.bool(), ones], 1)
    return slice(None)


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


READERS = {
    "LasrEncoderConvolutionModule": "masks its convolution's padded rows, reading a boolean mask as one",
    "ParakeetEncoderConvolutionModule": "masks its convolution's padded rows, reading a boolean mask as one",
    "NemotronAsrStreamingEncoder": "masks its convolution's padded rows, reading a boolean mask as one",
    "FastSpeech2ConformerConvolutionModule": "masks its convolution's padded rows, reading a boolean mask as one",
    "T5Gemma2Decoder": "joins its self- and cross-attention masks (merged attention): two boolean masks, one boolean",
    "LightGlueTransformerLayer": "swaps the image pair's masks for cross-attention (reshape and flip: no arithmetic)",
    "Gemma4UnifiedAssistantForCausalLM": "flips its sliding-window mask along the keys, to read its main model's "
    "cache from the end (flip: no arithmetic)",
    "Gemma4UnifiedTextModel": "slices its masks to the query rows it keeps before its kv-shared layers (a view: "
    "no arithmetic)",
}
"""Modules, not attention layers, that read qkv's mask tensor and read it right: each branches on
``mask.dtype == torch.bool`` or only moves its entries (reshape, flip, slice), read in the modeling
source, and the comparison with eager still decides. Any other reader is a difference until
it is listed here (with the reason) or its model gets eager's mask (``_hf_models.EAGER_MASKS``)."""

READS: list[str] = []
"""The reads of qkv's mask tensor by modules that are not attention layers, since the last reset."""


def _watch_reads() -> None:
    """Record every torch operation on qkv's lazy mask by a module that is not an attention layer
    (installed once): such a module reads the mask's values in its own code."""
    import torch

    from qkv.integrations import _hf_masks

    if getattr(_hf_masks._refuse_sum, "_sweep", False):
        return
    real = _hf_masks._refuse_sum

    def watching(func: Any, args: Any) -> None:
        frame: Any = sys._getframe(1)
        while frame is not None:
            owner = frame.f_locals.get("self")
            if isinstance(owner, torch.nn.Module):
                name = type(owner).__name__
                if "Attention" not in name and "Attn" not in name and name not in READERS:
                    READS.append(f"{name} reads qkv's mask ({func.overloadpacket.__name__})")
                break
            frame = frame.f_back
        real(func, args)

    watching._sweep = True  # type: ignore[attr-defined]
    _hf_masks._refuse_sum = watching


def _first_line(e: BaseException) -> str:
    """The exception's type and first line, without this machine's paths (the table is the same
    on every machine: ``<module ... from '/.../site-packages/...'>`` becomes ``<module ...>``)."""
    lines = [x.strip() for x in str(e).splitlines() if x.strip()]
    line = re.sub(r" from '[^']*'", "", " ".join(lines[:2]) if "validation error" in str(e) else (lines or [""])[0])
    line = re.sub(r"0x[0-9a-f]+", "0x…", line)
    return f"{type(e).__name__}: {line}"[:200]


def _crash(e: BaseException) -> str:
    """A crash in a few words that read the same on every machine: the exception's first line and
    the innermost frame as ``file.py:line in function`` (a traceback's tail names this checkout's
    paths, so the generated table would differ between machines)."""
    tb = traceback.extract_tb(e.__traceback__)
    where = f" (at {Path(tb[-1].filename).name}:{tb[-1].lineno} in {tb[-1].name})" if tb else ""
    return _first_line(e) + where


def _close(got: dict[str, Any], want: dict[str, Any], kw: dict[str, Any], tol: float) -> str:
    """Why two output sets differ ("" if every tensor agrees to ``tol`` of its scale)."""
    if set(got) != set(want):
        return f"outputs {sorted(set(got) ^ set(want))[:3]} from one model only"
    for name, w in want.items():
        g = got[name]
        if g.shape != w.shape:
            return f"{name}: shape {tuple(g.shape)} != {tuple(w.shape)}"
        rows = _rows(kw, w)
        a, b = g[rows].float(), w[rows].float()
        if not a.numel() or not bool(b.isfinite().all()) or not a.is_floating_point():
            continue
        err = float((a - b).abs().max())
        if not err <= tol * max(1.0, float(b.abs().max())):
            return f"{name} off by {err:.3g}"
    return ""


def _attentions_differ(eager: Any, model: Any, kw: dict[str, Any]) -> tuple[str, str]:
    """``(why, note)``: why the ``output_attentions=True`` weights differ ("" if they agree: every
    layer, self and cross, every sequence's real query rows, to ``TOL``), and a note when eager
    itself cannot return them."""
    import torch

    with torch.no_grad():
        try:
            want = run(eager, kw, output_attentions=True)
        except Exception as e:  # noqa: BLE001 - eager cannot return weights here: reported as such
            return "", f"output_attentions: eager cannot ({_first_line(e)[:80]})"
        got = run(model, kw, output_attentions=True)
    am = kw.get("attention_mask")
    want_all, got_all = _attention_sets(want), _attention_sets(got)
    for name, b in want_all.items():
        a = got_all.get(name)
        if a is None or len(a) != len(b):
            return f"output_attentions: {name} missing under qkv", ""
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x.shape != y.shape:
                return f"output_attentions: {name}[{i}] shape {tuple(x.shape)} != {tuple(y.shape)}", ""
            finite = y.isfinite()  # a row eager makes NaN (every key hidden) is zeros under qkv: not compared
            x, y = x.masked_fill(~finite, 0), y.masked_fill(~finite, 0)
            if y.ndim != 4 or am is None or y.shape[0] != am.shape[0]:  # not per sequence (packed vision windows)
                if not float((x - y).abs().max()) <= TOL:
                    return f"output_attentions: {name}[{i}] differs", ""
                continue
            for s in range(y.shape[0]):
                rows = am[s].bool() if "cross" not in name and y.shape[-2] == am.shape[-1] else slice(None)
                if not float((x[s][:, rows] - y[s][:, rows]).abs().max()) <= TOL:
                    return f"output_attentions: {name}[{i}] sequence {s} differs", ""
    return "", "" if want_all else "output_attentions: eager returns no weights"


def _attention_sets(out: Any) -> dict[str, tuple[Any, ...]]:
    """Every tuple of attention weights in a model's output, by its path (nested outputs too:
    CLIP's ``text_model_output.attentions``)."""
    import torch

    found: dict[str, tuple[Any, ...]] = {}

    def walk(value: Any, path: str, level: int) -> None:
        if not hasattr(value, "items") or level > 3:
            return
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if str(key).endswith("attentions"):
                if isinstance(item, tuple) and item and all(isinstance(x, torch.Tensor) for x in item):
                    found[where] = item
            else:
                walk(item, where, level + 1)

    walk(out, "", 0)
    return found


def _grads(m: Any, kw: dict[str, Any]) -> dict[str, Any] | None:
    """Every parameter's gradient of a fixed random weighting of ``m``'s outputs (real rows); None
    when the forward builds no graph."""
    import torch

    m.zero_grad(set_to_none=True)
    total = 0
    g = torch.Generator().manual_seed(3)
    for _, t in sorted(_tensors(run(m, kw)).items()):
        rows = _rows(kw, t)
        total = total + (t[rows] * torch.randn(t[rows].shape, generator=g).to(t.dtype)).sum()
    if not getattr(total, "requires_grad", False):  # the forward runs without autograd (SAM 2 video's)
        return None
    total.backward()
    return {n: p.grad for n, p in m.named_parameters() if p.grad is not None}


def _double(value: Any) -> Any:
    if isinstance(value, dict):  # another model's keys and values by layer type (a draft model's input)
        return {k: _double(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_double(v) for v in value)
    return value.double() if hasattr(value, "is_floating_point") and value.is_floating_point() else value


def golden(eager: Any) -> Any:
    """The eager model in float64: a reference both float32 runs are measured from."""
    gold = copy.deepcopy(eager).double()
    if getattr(gold.config, "_experts_implementation", None) not in (None, "eager"):
        gold.set_experts_implementation("eager")  # grouped_mm has no float64
    return gold


def _gradients_differ(eager: Any, model: Any, kw: dict[str, Any], notes: list[str]) -> str:
    """Why the gradients of every parameter differ ("" if they agree), for a fixed random weighting
    of the outputs: each to ``GRAD_TOL`` of that parameter's own largest gradient, or, where the
    model's float32 rounding is larger than that (deep products, large scores), qkv's distance
    from the float64 gradient at most ``GOLDEN_FACTOR`` times eager's own."""
    want, got = _grads(eager, kw), _grads(model, kw)
    if want is None and got is None:
        notes.append("gradients: eager's forward builds no graph (inference only): not compared")
        return ""
    if want is None or got is None:
        return "gradients: one model's forward builds no graph"
    if set(want) != set(got):
        return f"gradients: parameters {sorted(set(want) ^ set(got))[:3]} reached by one model only"
    want = {n: g for n, g in want.items() if g.numel()}
    floor = 1e-6 * max((float(g.abs().max()) for g in want.values() if bool(g.isfinite().all())), default=0.0)

    exact: dict[str, Any] | None = None
    broken = [n for n, g in want.items() if not bool(g.isfinite().all())]
    if broken:  # a row with every key hidden makes eager's softmax NaN, and its backward with it
        notes.append(f"gradients: eager's are not finite ({broken[0]}, {len(broken)} in all): not compared")
        return ""
    for name, g in want.items():
        own = float(g.abs().max())
        if float((got[name] - g).abs().max()) <= GRAD_TOL * own + floor:
            continue
        if exact is None:
            try:
                exact = _grads(golden(eager), {k: _double(v) for k, v in kw.items()}) or {}
            except Exception:  # noqa: BLE001 - no float64 run of this model: the direct comparison stands
                exact = {}
        if name not in exact or not bool(exact[name].isfinite().all()):
            return f"gradients: {name} differs"
        ours, theirs = (float((x.double() - exact[name]).abs().max()) for x in (got[name], g))
        if not ours <= GOLDEN_FACTOR * theirs + floor:
            return f"gradients: {name} differs ({ours:.3g} from float64, eager {theirs:.3g})"
    return ""


@contextmanager
def _trusting(model_type: str) -> Any:
    """qkv's eager-only refusal lifted for ``model_type`` (to learn what it would do)."""
    from qkv.integrations import _hf_models

    before = _hf_models.EAGER_ONLY_PROVEN
    _hf_models.EAGER_ONLY_PROVEN = before | {model_type}
    _hf_models._reason.cache_clear()
    _hf_models._BY_MODEL_TYPE.clear()
    try:
        yield
    finally:
        _hf_models.EAGER_ONLY_PROVEN = before
        _hf_models._reason.cache_clear()
        _hf_models._BY_MODEL_TYPE.clear()


def check(model_type: str, auto: str, kind: str, cls: str = "") -> Outcome:
    """Build ``model_type`` tiny, once under eager and once under ``"qkv"`` (the same weights),
    and compare them; see the module docstring. ``matches`` only where qkv ran.

    Warnings are ignored here: the outcome must not depend on whether they are errors (pytest's
    ``filterwarnings = error`` vs the table script), and tiny configs make transformers warn
    (zero-element layers, out-of-vocabulary special tokens)."""
    import logging
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            try:
                found = _check(model_type, auto, kind, cls)
            except Exception as e:  # noqa: BLE001 - the sweep's own failure: shown, and the test fails on it
                return Outcome(model_type, auto, cls, "differs", "sweep: " + _crash(e))
            if found.status == "refused" and "eager-only" in found.why:
                with _trusting(model_type):
                    anyway = _check(model_type, auto, kind, cls)
                said = anyway.status + (f": {anyway.why}" if anyway.why else "")
                found = found._replace(why=f"{found.why} (run anyway: {said})")
            return found
        finally:
            logging.disable(logging.NOTSET)


def _head(model_type: str, auto: str, cls: str) -> Any:
    """What builds the row's class: the auto class, or the class itself where the auto class
    cannot map the config it takes (MusicGen's causal LM takes its decoder's sub-config, which
    ``AutoModelForCausalLM`` does not register)."""
    import transformers

    head = getattr(transformers, auto)
    try:
        own = getattr(transformers, cls, None)
        config = getattr(own, "config_class", None)
    except ImportError:  # the class needs a package this machine lacks: the auto class says which
        return head
    if config is None or config.model_type == model_type:
        return head
    try:
        head._model_mapping[config]
    except KeyError:
        return _Direct(own)
    return head


class _Direct:
    """A model class built from a config as an auto class builds it (``from_config``)."""

    def __init__(self, cls: Any) -> None:
        self.cls, self.config_class = cls, cls.config_class

    def from_config(self, config: Any, **kwargs: Any) -> Any:
        return self.cls._from_config(config, **kwargs)


def _check(model_type: str, auto: str, kind: str, cls: str = "") -> Outcome:
    import torch

    from qkv.errors import ArgumentError

    made: dict[str, str] = {}

    def outcome(status: str, why: str = "", notes: list[str] | None = None) -> Outcome:
        return Outcome(
            model_type,
            auto,
            cls,
            status,
            why.replace("\n", " "),
            made.get("inputs", ""),
            made.get("kinds", ""),
            made.get("dtypes", ""),
            "; ".join(notes or []),
        )

    head = _head(model_type, auto, cls)
    try:
        built = tiny(model_type, head)
        made["kinds"] = ", ".join(named_kinds(built.kinds)) + f" ({built.depth} layers)"
        if built.parameters > MAX_PARAMETERS:
            return outcome("unbuildable", f"{built.parameters:,} parameters: a size hf_shrink.SIZES misses")
        config = built.config
        config.use_cache = True
        torch.manual_seed(0)
        eager = head.from_config(copy.deepcopy(config), attn_implementation="eager").eval()
    except Exception as e:  # noqa: BLE001 - eager cannot build the tiny model: the reason
        return outcome("unbuildable", _default_fails(model_type, head) or f"tiny config: {_first_line(e)}")
    try:  # built under "qkv" (models that pick attention classes at __init__ do it now)
        model = head.from_config(copy.deepcopy(config), attn_implementation="qkv").eval()
    except ArgumentError as e:
        return outcome("refused", str(e).splitlines()[0])
    except Exception as e:  # noqa: BLE001 - eager builds, qkv does not: a bug (never a KeyError)
        return outcome("differs", f"load under qkv: {_first_line(e)}")
    with torch.no_grad():  # random init is small: scale weights up so attention is far from uniform
        for p in eager.parameters():
            p.mul_(2.0)
    for m in (eager, model):
        prepare(m)
    missing = model.load_state_dict(eager.state_dict(), strict=False)
    if missing.missing_keys or missing.unexpected_keys:
        return outcome("differs", f"the qkv model's parameters differ from eager's: {missing}"[:200])
    _watch_reads()
    READS.clear()
    calls = _calls()
    ran = calls[0]
    notes: list[str] = []
    chosen: str | None = None
    first: dict[str, Any] = {}
    first_error = ""
    for padded in ("right", "left"):
        g = torch.Generator().manual_seed(1)
        for what, kw in _uncached_too(candidates(eager, config, padded, g)):
            if chosen is not None and what != chosen:
                continue
            try:
                with torch.no_grad():
                    want = _tensors(run(eager, kw))
            except Exception as e:  # noqa: BLE001 - eager does not take this input: try the next
                first_error = first_error or _first_line(e)
                continue
            chosen = what
            made["inputs"] = what + (", padded" if "attention_mask" in kw else "")
            break
        else:
            why = f"eager forward: {first_error or _no_inputs(eager)}"
            return outcome("unbuildable", f"transformers: {OWN[model_type]} ({why})" if model_type in OWN else why)
        try:
            with torch.no_grad():
                got = _tensors(run(model, kw))
        except ArgumentError as e:
            return outcome("refused", str(e).splitlines()[0])
        except Exception as e:  # noqa: BLE001 - a crash under qkv is a bug: report it
            return outcome("differs", f"{padded} padding: " + _crash(e))
        if READS:
            return outcome("differs", f"{READS[0]} outside attention: give it eager's mask or refuse it")
        why = _close(got, want, kw, TOL)
        if why and _eager_alone(head, config, eager, kw, got):
            notes.append(f"{padded} padding: eager alone differs ({why}); qkv matches sdpa")
        elif why:
            return outcome("differs", f"{padded} padding: {why}")
        first = first or kw
        if "attention_mask" not in kw:
            break
    kw = first  # right padding: no query row without a key in float64's golden run
    if calls[0] == ran:
        return outcome("unused", "no layer called qkv")
    weights, note = _attentions_differ(eager, model, kw)
    notes += [note] if note else []
    if weights and model_type not in SINK_SCALED:
        return outcome("differs", weights, notes)
    why = _gradients_differ(eager, model, kw, notes)
    if why:
        return outcome("differs", why, notes)
    if kind in ("causal", "seq2seq") and "input_ids" in kw:
        why = _generate_differs(eager, model, config, chosen or "text", notes)
        if why:
            return outcome("differs", why, notes)
    made["dtypes"] = "float32"
    if model_type in BF16:
        why = _bf16_differs(eager, model, kw, kind, notes)
        if why:
            return outcome("differs", why, notes)
        made["dtypes"] = "float32, bfloat16"
    return outcome("weights", SINK_SCALED[model_type], notes) if weights else outcome("matches", "", notes)


def _default_fails(model_type: str, head: Any) -> str:
    """transformers' own reason a class cannot be built: its default config does not build it
    either (on the meta device: no memory), or it needs a package this machine lacks ("": it builds)."""
    import torch
    from transformers import AutoConfig

    try:
        with torch.device("meta"):
            head.from_config(AutoConfig.for_model(model_type))
    except ImportError as e:
        return _first_line(e)
    except Exception as e:  # noqa: BLE001 - transformers' default fails: its words
        return f"transformers' default config does not build it: {_first_line(e)}"
    return ""


def _eager_alone(head: Any, config: Any, eager: Any, kw: dict[str, Any], got: dict[str, Any]) -> bool:
    """Whether transformers' own two implementations disagree here and qkv's answer is sdpa's: a
    query that may attend no key is eager's average of every value but no row of sdpa's or qkv's,
    and where a model lets such a row reach real tokens (BLT's padded patches, read by its global
    transformer), eager's answer is its own. Then eager is no reference, and sdpa (torch's) is."""
    import torch

    try:
        sdpa = head.from_config(copy.deepcopy(config), attn_implementation="sdpa").eval()
    except Exception:  # noqa: BLE001 - no sdpa for this model: eager stands as the reference
        return False
    prepare(sdpa)
    sdpa.load_state_dict(eager.state_dict(), strict=False)
    with torch.no_grad():
        want, theirs = _tensors(run(eager, kw)), _tensors(run(sdpa, kw))
    return bool(_close(theirs, want, kw, TOL)) and not _close(got, theirs, kw, TOL)


def _uncached_too(sets: Any) -> Any:
    """Every input set, then each again without a cache (``use_cache=False``): BLT's forward makes
    its cache from a config that lacks what transformers' cache reads, so it runs only uncached."""
    sets = list(sets)
    yield from sets
    for what, kw in sets:
        yield (f"{what}, use_cache=False", {**kw, "use_cache": False})


def _no_inputs(model: Any) -> str:
    """Why no input set was tried: the class has no forward, or one taking what ``hf_inputs`` cannot make."""
    import inspect

    import torch

    if type(model).forward is torch.nn.Module.forward:
        return f"{type(model).__name__} defines no forward"
    params = [p for p in inspect.signature(model.forward).parameters if p not in ("self", "kwargs")]
    return f"forward({', '.join(params)}): no such inputs made here"


def _generation(config: Any) -> dict[str, Any]:
    """Greedy generation's arguments; an encoder-decoder's first decoder token as a checkpoint's
    generation config gives it (T5's config has none of its own)."""
    gen: dict[str, Any] = dict(max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    if getattr(config, "is_encoder_decoder", False):
        start = getattr(config, "decoder_start_token_id", None)
        gen["decoder_start_token_id"] = start if isinstance(start, int) else 0
    return gen


def _generate_differs(eager: Any, model: Any, config: Any, chosen: str, notes: list[str]) -> str:
    """Greedy tokens of ``model`` and ``eager`` from the text of the inputs the forward took
    (``chosen``: text ids, or MusicGen's ids per codebook), left padded, with either cache."""
    import torch

    from qkv.errors import ArgumentError

    g = torch.Generator().manual_seed(2)
    sets = [(what, kw) for what, kw in candidates(eager, config, "left", g) if what in ("text", "codebook ids")]
    kw = next((kw for what, kw in sets if what == chosen), sets[0][1])
    kw.pop("decoder_input_ids", None)
    for cache in ("dynamic", "static"):
        gen = dict(_generation(config), cache_implementation=cache)
        try:
            want = eager.generate(**kw, **gen)
        except Exception as e:  # noqa: BLE001 - eager cannot generate this way here: reported
            notes.append(f"generate ({cache}): eager cannot ({_first_line(e)[:80]})")
            continue
        try:
            got = model.generate(**kw, **gen)
        except ArgumentError as e:
            return f"generate ({cache}): refused: {str(e).splitlines()[0]}"
        except Exception as e:  # noqa: BLE001 - a crash under qkv is a bug: report it
            return f"generate ({cache}): " + _crash(e)
        if not torch.equal(got, want):
            return f"generate ({cache} cache): tokens differ"
    return ""


def _bf16_differs(eager: Any, model: Any, kw: dict[str, Any], kind: str, notes: list[str]) -> str:
    """qkv in bfloat16 against eager in bfloat16, both measured from eager's float32 answer: qkv's
    error at most ``BF16_FACTOR`` times eager's own (plus ``1e-3`` of the scale). Greedy tokens
    equal to eager's bfloat16 ones along the prefix where eager's bfloat16 tokens are its float32
    ones and float32's margin (top logit minus the next) exceeds twice eager's bfloat16 logit error
    (a closer call is a coin toss for any bfloat16 rounding)."""
    import torch

    with torch.no_grad():
        exact = _tensors(run(eager, kw))
        eager16, model16 = copy.deepcopy(eager).to(torch.bfloat16), copy.deepcopy(model).to(torch.bfloat16)
        base, got = _tensors(run(eager16, kw)), _tensors(run(model16, kw))
    noise = 0.0
    for name, want in exact.items():
        rows = _rows(kw, want)
        w = want[rows].double()
        own = float((base[name][rows].double() - w).abs().max())
        err = float((got[name][rows].double() - w).abs().max())
        noise = max(noise, own)
        if not err <= BF16_FACTOR * own + 1e-3 * max(1.0, float(w.abs().max())):
            return f"bfloat16: {name} off by {err:.3g} from float32 (eager's bfloat16: {own:.3g})"
    if kind in ("causal", "seq2seq") and "input_ids" in kw:
        g = torch.Generator().manual_seed(2)
        text = next(k for what, k in candidates(eager, eager.config, "left", g) if what == "text")
        text.pop("decoder_input_ids", None)
        gen = dict(_generation(eager.config), output_scores=True, return_dict_in_generate=True)
        exact_run, base_run, got_run = (m.generate(**text, **gen) for m in (eager, eager16, model16))
        new = slice(-len(exact_run.scores), None)
        top = torch.stack([s.topk(2, -1).values for s in exact_run.scores], 1)  # (B, steps, 2)
        decisive = (top[..., 0] - top[..., 1]) > 2 * noise
        kept = ((base_run.sequences[:, new] == exact_run.sequences[:, new]) & decisive).long().cumprod(-1).bool()
        if not torch.equal(got_run.sequences[:, new][kept], base_run.sequences[:, new][kept]):
            return "bfloat16 generate: tokens differ from eager's bfloat16 where it agrees with float32"
        if not bool(kept.any()):
            notes.append("bfloat16 generate: no decisive step to compare")
    return ""


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
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(1)
    register_once()
    wanted = set(sys.argv[1:])
    for entry in _classes():
        if wanted and entry[0] not in wanted:
            continue
        o = check(*entry)
        print(f"{o.status:12} {o.model_type:28} {o.auto:22} [{o.inputs}] [{o.kinds}] {o.why} {o.notes}", flush=True)
