"""The architecture sweep: every text architecture the installed transformers registers matches
eager under ``attn_implementation="qkv"`` or is refused with ``ArgumentError`` — never a different
answer — and ``docs/transformers.md``'s table says what the sweep finds (``tests/hf_sweep.py``;
``scripts/transformers_table.py`` writes the table). The full sweep is ``slow`` (~5 minutes on
2 cores); the quick suite runs the architectures whose bugs it found."""

import os
import re
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import hf_sweep  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: threads only add noise
    yield
    torch.set_num_threads(before)


def entry(model_type, auto):
    return next(e for e in hf_sweep._classes() if e[0] == model_type and e[1] == auto)


@pytest.mark.parametrize(
    ("model_type", "auto", "module"),
    [
        ("bigbird_pegasus", "AutoModelForSeq2SeqLM", "BigBirdPegasusSelfAttention"),  # encoder in its own code
        ("git", "AutoModelForCausalLM", "GitForCausalLM"),  # its own table of attention classes: KeyError at load
        ("sam", "AutoModel", "SamModel"),
    ],
)
def test_models_transformers_calls_dispatching_are_refused_by_name(model_type, auto, module):
    """transformers' class heuristic says these dispatch (one of their attention classes does).
    BigBird-Pegasus's encoder adds qkv's boolean mask to float scores as eager's additive mask: a
    silently wrong answer (off by 0.03) until the first forward raised ArgumentError naming the
    module. Git and SAM pick attention classes from their own tables by name: a KeyError at load
    until qkv refused them there, naming the class."""
    hf_sweep.register_once()
    outcome = hf_sweep.check(*entry(model_type, auto))
    assert outcome.status == "refused" and outcome.why.startswith(module), outcome


@pytest.mark.parametrize(
    ("model_type", "auto"),
    [
        ("mt5", "AutoModelForSeq2SeqLM"),  # static cache: a mask function input changed in place after the call
        ("bart", "AutoModelForSeq2SeqLM"),  # a seq2seq decoder whose module says is_causal = False
        ("marian", "AutoModelForSeq2SeqLM"),
        ("albert", "AutoModelForMaskedLM"),  # an encoder
        ("mistral", "AutoModelForCausalLM"),  # a sliding window, static cache
    ],
)
def test_architectures_the_sweep_found_bugs_in_match_eager(model_type, auto):
    hf_sweep.register_once()
    outcome = hf_sweep.check(*entry(model_type, auto))
    assert outcome.status == "matches", outcome


@pytest.fixture(scope="module")
def outcomes():
    hf_sweep.register_once()
    return hf_sweep.sweep()


@pytest.mark.slow
def test_every_buildable_architecture_matches_eager_or_is_refused(outcomes):
    differs = [o for o in outcomes if o.status == "differs"]
    assert not differs, "\n".join(f"{o.model_type} {o.auto}: {o.why}" for o in differs)
    assert sum(o.status == "matches" for o in outcomes) > 150  # the whole registry, not a hand-picked list


@pytest.mark.slow
def test_the_docs_table_says_what_the_sweep_finds(outcomes):
    sys.path.insert(0, str(ROOT / "scripts"))
    from transformers_table import DOC, rewritten

    text = DOC.read_text()
    assert rewritten(text, outcomes) == text, "docs/transformers.md is stale: run scripts/transformers_table.py"
    assert f"from transformers {transformers.__version__}:" in text
    table = text.split("<!-- architectures:start -->", 1)[1].split("<!-- architectures:end -->", 1)[0]
    assert len(re.findall(r"^\| `", table, re.MULTILINE)) == len(outcomes)
