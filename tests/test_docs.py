"""The documentation site: every code example on it runs, and ``mkdocs build --strict`` passes.

Each page of ``docs/`` runs on its own: its ```python blocks are executed in order in one fresh
namespace (later blocks see earlier ones' names), and its ```pycon blocks (``>>>`` prompts with
the printed output below them) run as doctests in that same namespace, so the output a page shows
(mask pictures, for instance) is checked, not just the code. A block is left out only when the
line right above its opening fence is exactly

    <!-- no-run -->

(meant for recipes that need a cluster or a network, never for the examples a page shows as
runnable). Pages run in a temporary working directory.
"""

import doctest
import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
NO_RUN = "<!-- no-run -->"
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[\w+-]*)(?P<info>[^\n]*)$")
RUNNABLE = ("python", "pycon")


# what superfences accepts after the language: key="value" options or a {...} attribute list; a bare word
# (```python no-run) silently breaks the block into a paragraph with no warning, even under --strict
INFO = re.compile(r"""^\s*(?:\{[^}]*\}|(?:[\w-]+=(?:"[^"]*"|'[^']*'|\S+)\s*)*)\s*$""")


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    line: int  # 1-based line of the first code line in the page
    skipped: bool
    info: str = ""


def blocks(text: str) -> list[Block]:
    """Every fenced code block of a Markdown page, in order (indented fences in lists and admonitions too)."""
    lines = text.splitlines()
    found, n = [], 0
    while n < len(lines):
        m = FENCE.match(lines[n])
        if not m:
            n += 1
            continue
        indent, fence = m["indent"], m["fence"]
        closing = re.compile(rf"^{re.escape(indent)}{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        end = next((e for e in range(n + 1, len(lines)) if closing.match(lines[e])), len(lines))
        code = textwrap.dedent("\n".join(lines[n + 1 : end])) + "\n"
        skipped = n > 0 and lines[n - 1].strip() == NO_RUN
        found.append(Block(m["lang"].lower(), code, n + 2, skipped, m["info"]))
        n = end + 1
    return found


def pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if any(b.lang in RUNNABLE for b in blocks(p.read_text("utf-8"))))


def run_page(path: Path) -> int:
    """Run the page's python / pycon blocks in order in one namespace; returns how many ran."""
    name = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name
    namespace: dict = {"__name__": "__docs__"}
    ran = 0
    for b in blocks(path.read_text("utf-8")):
        if b.lang not in RUNNABLE or b.skipped:
            continue
        if b.lang == "python":
            # padded so tracebacks point at the page's own line numbers
            exec(compile("\n" * (b.line - 1) + b.code, name, "exec"), namespace)
        else:
            test = doctest.DocTestParser().get_doctest(b.code, namespace, name, name, b.line - 1)
            runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
            out: list[str] = []
            runner.run(test, out=out.append, clear_globs=False)
            assert runner.failures == 0, f"{name}:{b.line}: the pycon block's output differs\n" + "".join(out)
        ran += 1
    return ran


def test_the_parser_finds_blocks_and_the_marker():
    text = (
        "a\n```python\nx = 1\n```\n\n<!-- no-run -->\n```python\nraise SystemExit\n```\n"
        "- item\n\n    ```pycon\n    >>> 1 + 1\n    2\n    ```\n```text\nnot code\n```\n"
    )
    got = blocks(text)
    assert [(b.lang, b.skipped, b.line) for b in got] == [
        ("python", False, 3),
        ("python", True, 8),
        ("pycon", False, 13),
        ("text", False, 17),
    ]
    assert got[2].code == ">>> 1 + 1\n2\n"


def test_a_wrong_pycon_output_fails_the_page(tmp_path):
    page = tmp_path / "probe.md"
    page.write_text("```python\nx = 2\n```\n```pycon\n>>> x + 1\n4\n```\n", encoding="utf-8")
    with pytest.raises(AssertionError, match="differs"):
        run_page(page)
    page.write_text("```python\nx = 2\n```\n```pycon\n>>> x + 1\n3\n```\n", encoding="utf-8")
    assert run_page(page) == 2


def test_code_fences_render_as_code_blocks():
    assert not INFO.match(" no-run") and INFO.match(' title="a.py" linenums="1"') and INFO.match(" {.python}")
    bad = [
        f"{p.relative_to(ROOT)}:{b.line - 1}: ```{b.lang}{b.info}"
        for p in sorted(DOCS.rglob("*.md"))
        for b in blocks(p.read_text("utf-8"))
        if not INFO.match(b.info)
    ]
    assert not bad, f"fences superfences would not render (use {NO_RUN} on the line above to skip a block): {bad}"


def test_the_getting_started_page_is_runnable_throughout():
    got = blocks((DOCS / "getting-started.md").read_text("utf-8"))
    assert sum(b.lang == "python" for b in got) >= 8 and not any(b.skipped for b in got)


@pytest.mark.parametrize("path", pages(), ids=lambda p: str(p.relative_to(DOCS)))
def test_page_examples_run(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert run_page(path) > 0


def test_the_two_commands_match_the_readme():
    def commands(text):
        return [b.code for b in blocks(text) if b.lang == "bash" and "scripts/explain" in b.code]

    readme = commands((ROOT / "README.md").read_text("utf-8"))
    assert readme and readme[0] in commands((DOCS / "getting-started.md").read_text("utf-8"))


def load_hooks():
    spec = importlib.util.spec_from_file_location("qkv_mkdocs_hooks", ROOT / "scripts" / "mkdocs_hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_include_hook_cuts_sections_by_heading():
    extract = load_hooks().extract
    text = "# Top\nintro\n## A\na\n```\n# not a heading\n```\n### A.1\na1\n## B\nb\n"
    assert extract(text, None, 1) == text.rstrip("\n")
    assert extract(text, "A", 2) == "## A\na\n```\n# not a heading\n```\n### A.1\na1"
    assert extract(text, "A", 3, only=True) == "### A\na\n```\n# not a heading\n```"
    assert extract(text, "B", 2) == "## B\nb"
    with pytest.raises(KeyError):
        extract(text, "C", 2)


def test_the_doctest_fencing_leaves_fenced_code_alone():
    fence = load_hooks()._FenceDoctests(None)
    lines = ["text", "", ">>> 1 + 1", "2", "", "```pycon", ">>> x", "```", "    >>> indented"]
    assert fence.run(lines) == [
        "text",
        "",
        "```pycon",
        ">>> 1 + 1",
        "2",
        "```",
        "",
        "```pycon",
        ">>> x",
        "```",
        "    >>> indented",
    ]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONWARNINGS": "ignore"}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, f"mkdocs build --strict failed:\n{r.stdout}\n{r.stderr}"
    return out


def test_mkdocs_build_strict_passes(site):
    assert (site / "index.html").is_file() and (site / "getting-started" / "index.html").is_file()


def test_benchmarks_and_changelog_are_included_at_build_time(site):
    html = (site / "benchmarks" / "index.html").read_text("utf-8")
    # a row of the current numbers (BENCHMARKS.md) and one of the dated log, whatever they say today
    row = next(
        line for line in (ROOT / "BENCHMARKS.md").read_text("utf-8").splitlines() if line.startswith("| W1 dense")
    )
    value = row.split("|")[2].strip().strip("*")
    assert value in html and "<h1" in html and "qkv:include" not in html
    log = (site / "benchmarks-log" / "index.html").read_text("utf-8")
    row = next(
        line
        for line in (ROOT / "benchmarks" / "LOG.md").read_text("utf-8").splitlines()
        if line.startswith("| dense fwd N=4096 | qkv-auto")
    )
    value = row.split("|")[4].strip().split(" ")[0]
    assert value in log and "<h1" in log and "qkv:include" not in log
    changelog = (site / "changelog" / "index.html").read_text("utf-8")
    assert "0.1.0" in changelog and "qkv:include" not in changelog
    approx = (site / "approximations" / "index.html").read_text("utf-8")
    assert "performer m=256" in approx  # the accuracy table, a section of BENCHMARKS.md


def test_api_pages_are_generated_from_docstrings(site):
    api = (site / "api" / "qkv" / "index.html").read_text("utf-8")
    for anchor in ("qkv.attention", "qkv.attention_backward", "qkv.explain", "qkv.Trace", "qkv.hopfield"):
        assert f'id="{anchor}"' in api, anchor
    masks = (site / "api" / "masks" / "index.html").read_text("utf-8")
    assert 'id="qkv.masks.sliding_window"' in masks and 'id="qkv.masks.Mask"' in masks
    nn = (site / "api" / "nn" / "index.html").read_text("utf-8")
    assert 'id="qkv.nn.TinyGPT"' in nn and 'id="qkv.nn.KVCache"' in nn


def test_the_site_loads_nothing_from_the_network(site):
    external = re.compile(r"""<(?:script|link|img)\b[^>]*(?:src|href)=["']?(?:https?:)?//""", re.I)
    for page in site.rglob("*.html"):
        text = page.read_text("utf-8")
        assert not external.search(text), f"{page.relative_to(site)} loads {external.search(text)[0]}"
        assert "fonts.googleapis" not in text and "fonts.gstatic" not in text
