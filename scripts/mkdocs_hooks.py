"""MkDocs hooks for the qkv site: pull repository files (BENCHMARKS.md, CHANGELOG.md) into pages.

A page line of the form

    <!-- qkv:include BENCHMARKS.md -->
    <!-- qkv:include BENCHMARKS.md "Accuracy versus speed of the approximations" 2 only -->

is replaced at build time by the whole file, or by the section under that heading (up to the
next heading of the same or a higher level; with ``only``, up to the next heading of any level,
leaving its subsections out), its headings shifted so the included top heading sits at
``level`` (default: the page title level 1 for whole files, 2 for sections). The files
are read from the repository root (the directory of mkdocs.yml), so the site never holds a copy
that could go stale; a missing file or heading fails the build.

Docstrings are prose (mkdocstrings renders them as Markdown, ``docstring_style: null``), and their
doctest examples start at the left margin, where Markdown would run ``>>>`` lines together into a
paragraph (and read a printed ``[...]`` as a link). ``DoctestBlocks`` fences every such block as
```pycon``, in docstrings and pages alike.
"""

import re
import shlex
from pathlib import Path
from typing import Any

from markdown import Extension, Markdown
from markdown.preprocessors import Preprocessor
from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority

DIRECTIVE = re.compile(r"^<!--\s*qkv:include\s+(?P<args>.*?)\s*-->\s*$", re.M)
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def _root(config: Any) -> Path:
    return Path(config["config_file_path"]).resolve().parent


def _headings(lines: list[str]) -> list[tuple[int, int, str]]:
    """``(line index, level, title)`` of every ATX heading outside fenced code blocks."""
    found, fenced = [], False
    for n, line in enumerate(lines):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (m := HEADING.match(line)):
            found.append((n, len(m.group(1)), m.group(2)))
    return found


def _shift(lines: list[str], by: int) -> list[str]:
    """Move every heading (outside code) ``by`` levels, clamped to 1..6."""
    out, fenced = [], False
    for line in lines:
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (m := HEADING.match(line)):
            level = min(6, max(1, len(m.group(1)) + by))
            line = f"{'#' * level} {m.group(2)}"
        out.append(line)
    return out


def extract(text: str, title: str | None, level: int, only: bool = False) -> str:
    """The whole ``text`` or the section under heading ``title``, its top heading moved to ``level``."""
    lines = text.splitlines()
    heads = _headings(lines)
    if title is None:
        top = min((h[1] for h in heads), default=level)
        return "\n".join(_shift(lines, level - top))
    for i, (start, lvl, name) in enumerate(heads):
        if name == title:
            end = next((n for n, lv, _ in heads[i + 1 :] if only or lv <= lvl), len(lines))
            return "\n".join(_shift(lines[start:end], level - lvl))
    raise KeyError(title)


class _FenceDoctests(Preprocessor):
    """Wrap each unfenced run of lines starting at ``>>>`` (up to a blank line) in a pycon fence."""

    def run(self, lines: list[str]) -> list[str]:
        out: list[str] = []
        fence: str | None = None
        n = 0
        while n < len(lines):
            line = lines[n]
            m = FENCE.match(line)
            if m and (fence is None or line.strip().startswith(fence)):
                fence = m.group(1) if fence is None else None
            elif fence is None and line.startswith(">>>") and (not out or not out[-1].strip()):
                end = next((e for e in range(n, len(lines)) if not lines[e].strip()), len(lines))
                out += ["```pycon", *lines[n:end], "```"]
                n = end
                continue
            out.append(line)
            n += 1
        return out


class DoctestBlocks(Extension):
    def extendMarkdown(self, md: Markdown) -> None:  # noqa: N802 - Python-Markdown's name
        md.preprocessors.register(_FenceDoctests(md), "qkv_doctest_blocks", 29)  # before fenced code (25)


@event_priority(100)  # before mkdocstrings reads the extensions for its docstring renderer
def on_config(config: Any) -> Any:
    config["markdown_extensions"].append(DoctestBlocks())
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    root = _root(config)

    def include(m: re.Match[str]) -> str:
        args = shlex.split(m.group("args"))
        only = bool(args) and args[-1] == "only"
        args = args[:-1] if only else args
        if not 1 <= len(args) <= 3:
            raise PluginError(f"{page.file.src_uri}: qkv:include takes FILE [HEADING [LEVEL]] [only], got {args}")
        path = root / args[0]
        title = args[1] if len(args) > 1 else None
        level = int(args[2]) if len(args) > 2 else (1 if title is None else 2)
        if not path.is_file():
            raise PluginError(f"{page.file.src_uri}: qkv:include cannot find {args[0]} (looked in {root})")
        try:
            return extract(path.read_text(encoding="utf-8"), title, level, only)
        except KeyError:
            raise PluginError(f"{page.file.src_uri}: {args[0]} has no heading {title!r}") from None

    return DIRECTIVE.sub(include, markdown)


def on_serve(server: Any, config: Any, builder: Any) -> Any:
    """``mkdocs serve`` rebuilds when an included file changes."""
    root = _root(config)
    for name in ("BENCHMARKS.md", "benchmarks/LOG.md", "CHANGELOG.md"):
        server.watch(str(root / name))
    return server
