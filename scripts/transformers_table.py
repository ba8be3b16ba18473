"""Generate the architecture table of docs/transformers.md from what qkv does on each architecture.

It runs the architecture sweep (``tests/hf_sweep.py``): every model type the installed
transformers registers, each head it has of causal LM, seq2seq LM, speech seq2seq and masked LM
(else the base model), built tiny with every layer kind of its full config and fed the inputs its
forward takes, under ``attn_implementation="qkv"`` against eager attention (every output with
right and left padding, ``output_attentions`` for every sequence, every parameter's gradient,
``generate`` with a dynamic and a static cache; bfloat16 too for the main families). One row per
class: its inputs, the layer kinds built, the dtypes compared and what happened: *matches* eager
(or all but ``output_attentions``, by the model's own convention), *refused* (qkv raised
``ArgumentError``: the reason), *never calls qkv*, *not built here* (the reason, summed by kind:
transformers' own, the sweep's), or *differs* (a bug: the sweep's test fails).
``tests/test_transformers_sweep.py`` (slow) checks that the table says what the sweep finds.

    .venv/bin/python scripts/transformers_table.py            # rewrite the table in the docs
    .venv/bin/python scripts/transformers_table.py --check    # exit 1 if the docs are stale
"""

import os
import sys
from collections import Counter
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "transformers.md"
START, END = "<!-- architectures:start -->", "<!-- architectures:end -->"


STATUS = {
    "matches": "matches eager",
    "weights": "matches eager but for `output_attentions`",
    "refused": "refused",
    "unbuildable": "not built here",
    "unused": "never calls qkv",
    "differs": "**differs**",
}


_MARKDOWN = str.maketrans({c: "\\" + c for c in "\\`*_[]<>"})


def _cell(text: str, limit: int = 220) -> str:
    """One table cell of transformers' own words: shortened, then shown as written (an error's
    ``['partial_rotary_factor']`` is not a cross-reference, ``<class>`` not HTML, ``*`` not emphasis)."""
    return text.replace("|", "/").replace("\n", " ")[:limit].translate(_MARKDOWN)


def rows(outcomes: list | None = None) -> list[tuple[str, ...]]:
    """``(model_type, class, inputs, kinds, dtypes, status, why)`` for every class, from the sweep."""
    sys.path.insert(0, str(ROOT / "tests"))
    from hf_sweep import sweep

    def why(o) -> str:
        text = o.why
        # a refusal's sentence names the class (already in the row) before what it would do: keep that
        if "cannot run there: " in text:
            head, tail = text.split("cannot run there: ", 1)
            anyway = tail.split(" (run anyway: ", 1)
            text = anyway[0].split(". It supports", 1)[0]
            if "eager-only" in head:
                text = "transformers marks it eager-only; " + text
            if len(anyway) > 1:
                text += " (run anyway: " + anyway[1]
        return _cell("; ".join(x for x in (text, o.notes) if x))

    return [
        (o.model_type, o.cls, _cell(o.inputs, 60), _cell(o.kinds, 100), o.dtypes, STATUS[o.status], why(o))
        for o in (outcomes or sweep())
    ]


UNBUILT = (
    ("ImportError", "a package transformers asks for is not installed here (timm, natten, detectron2, torchaudio)"),
    ("transformers' default config does not build it", "transformers' default config does not build the class"),
    ("defines no forward", "the class has no forward"),
    ("transformers: ", "its forward fails in transformers' own code for any input"),
)
"""Why a class is not built, by the words its row gives: transformers' own reasons; any other row
is the sweep's own shortfall (its tiny config or inputs)."""


def unbuilt(found: list[tuple[str, ...]]) -> str:
    """One sentence: the not-built classes by why."""
    whys = [r[6].replace("\\", "") for r in found if r[5] == STATUS["unbuildable"]]
    parts, left = [], len(whys)
    for words, said in UNBUILT:
        n = sum(words in w for w in whys)
        left -= n
        if n:
            parts.append(f"{n}: {said}")
    parts.append(f"{left}: the sweep cannot yet build it or make inputs its forward takes (its tiny config or inputs)")
    return f"Not built here, {len(whys)} classes; " + "; ".join(parts) + "."


def totals(found: list[tuple[str, ...]]) -> str:
    """One line: how many classes (and model types) end in each outcome."""
    by_status = Counter(r[5] for r in found)
    types = {r[0] for r in found}
    compared = {r[0] for r in found if r[5] in (STATUS["matches"], STATUS["weights"], STATUS["unused"])}
    parts = [f"{by_status[s]} {s}" for s in STATUS.values() if by_status[s]]
    bf16 = sum("bfloat16" in r[4] for r in found)
    return (
        f"{len(found)} classes of {len(types)} model types: " + ", ".join(parts) + f"; {bf16} compared in "
        f"bfloat16 too. Model types built and compared (at least one class): {len(compared)} of {len(types)} "
        f"({100 * len(compared) / max(len(types), 1):.0f}%)."
    )


def table(outcomes: list | None = None) -> str:
    import transformers

    found = rows(outcomes)
    body = [
        f"Generated by `scripts/transformers_table.py` from transformers {transformers.__version__}: each model "
        "type's heads built tiny with every layer kind of its default config (`tests/hf_shrink.py`) and fed the "
        'inputs their forward takes (`tests/hf_inputs.py`), under eager and under `attn_implementation="qkv"` '
        "with the same weights, compared on every output with right and left padding, `output_attentions` "
        "(every sequence), each parameter's gradient (to its own scale) and greedy `generate` with a dynamic and "
        "a static cache, in float32 and, for the main families, bfloat16. *matches eager*; *matches eager but "
        "for `output_attentions`* = the model's own eager code returns other weights than those it applies; "
        "*refused* = qkv raises `ArgumentError` (the reason; for a class transformers marks eager-only, what "
        "it does when run anyway); *never calls qkv* = it runs, but no layer called qkv; *not built here* = "
        "eager does not build or run the tiny model (the reason: transformers' own, the backbone kept at full "
        "size, or the sweep's, which cannot yet build it or make the inputs it takes; the line below the "
        "totals sums them). Checks eager cannot run are named in the last column.",
        "",
        totals(found),
        "",
        unbuilt(found),
        "",
        '| model_type | class | inputs | layer kinds built | dtypes | under `"qkv"` | why |',
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    body += [f"| `{t}` | `{c}` | {i} | {k} | {d} | {s} | {w} |" for t, c, i, k, d, s, w in found]
    return "\n".join(body)


def rewritten(text: str, outcomes: list | None = None) -> str:
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table(outcomes)}\n{END}{tail}"


def main() -> int:
    text = DOC.read_text()
    new = rewritten(text)
    if "--check" in sys.argv:
        if new != text:
            print("docs/transformers.md: the architecture table is stale; run scripts/transformers_table.py")
            return 1
        return 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
