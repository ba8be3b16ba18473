"""The repository says what it is: no build artefact committed, and ``docs/architecture.md`` names
every module and C++ source of the package and nothing that is gone."""

import importlib
import itertools
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "qkv"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

# What a build or an install leaves behind; none of it belongs in git (.gitignore keeps most out).
ARTEFACT_SUFFIXES = (".whl", ".so", ".pyd", ".dylib", ".dll", ".o", ".obj", ".a", ".lib", ".egg", ".pyc")
ARTEFACT_DIRS = ("build", "dist", "site", "__pycache__")


def _tracked() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the committed files cannot be listed (an sdist, a copied tree)")
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def test_no_build_artefact_is_committed():
    bad = [
        f
        for f in _tracked()
        if f.endswith(ARTEFACT_SUFFIXES) or ".egg-info/" in f or any(p in ARTEFACT_DIRS for p in f.split("/")[:-1])
    ]
    assert not bad, f"build artefacts committed (git rm them; .gitignore should keep them out): {bad}"


def _sources() -> list[Path]:
    """Every module (``__init__.py`` aside: a package is named by its folder) and C++ source of qkv."""
    return sorted(
        f
        for f in PACKAGE.rglob("*")
        if f.suffix in (".py", ".cpp", ".hpp") and f.name != "__init__.py" and "__pycache__" not in f.parts
    )


def _words(text: str) -> set[str]:
    """The path-like words of a text, with ``a_{x,y}.cpp`` spelled out as ``a_x.cpp``, ``a_y.cpp``."""
    words = set(re.findall(r"[\w./-]+", text))
    for m in re.finditer(r"[\w./]*\{[\w,]+\}[\w./]*", text):
        parts = re.split(r"\{([\w,]+)\}", m.group(0))
        pools = [p.split(",") if i % 2 else [p] for i, p in enumerate(parts)]
        words |= {"".join(x) for x in itertools.product(*pools)}
    return words


def test_the_architecture_page_names_every_module_and_cpp_file():
    words = _words(ARCHITECTURE.read_text())
    names = {w.rsplit("/", 1)[-1] for w in words}
    missing = []
    for f in _sources():
        dotted = ".".join(f.relative_to(PACKAGE).with_suffix("").parts)
        if f.name not in names and not any(w == dotted or w.endswith("." + dotted) for w in words):
            missing.append(str(f.relative_to(PACKAGE)))
    packages = [d for d in PACKAGE.rglob("*") if (d / "__init__.py").exists() and d != PACKAGE]
    for d in packages:
        rel = d.relative_to(PACKAGE)
        if (
            f"{rel.as_posix()}/" not in words
            and f"{d.name}/" not in words
            and "qkv." + ".".join(rel.parts) not in words
        ):
            missing.append(f"{rel.as_posix()}/")
    assert not missing, f"docs/architecture.md does not name {missing}: say in a line what each one holds"


def _exists(token: str) -> bool:
    """A backticked name of the page: a file of the repository (by its path or, inside the package,
    its name) or an importable module or attribute of qkv (``qkv.x.y``, ``_impls._plan.plan``)."""
    if token.endswith((".py", ".cpp", ".hpp", ".pyi", ".md", ".txt", ".toml")):
        return (
            (ROOT / token).exists()
            or (PACKAGE / token).exists()
            or any(PACKAGE.rglob(token.rsplit("/", 1)[-1]))
            or any(ROOT.glob(f"*/{token}"))
        )
    # a name may be written from qkv (qkv._impls._plan.plan) or from its package (_jax_ffi._operands)
    prefixes = ["qkv"] + ["qkv." + ".".join(d.relative_to(PACKAGE).parts) for d in PACKAGE.glob("*/") if d.is_dir()]
    return any(_resolves(f"{prefix}.{token.removeprefix('qkv.')}") for prefix in prefixes)


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 1, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for name in parts[cut:]:
                obj = getattr(obj, name)
        except AttributeError:
            return False
        return True
    return False


def test_the_architecture_page_names_nothing_that_is_gone():
    tokens = set()
    for code in re.findall(r"`([^`\n]+)`", ARCHITECTURE.read_text()):
        for t in _words(code):
            t = t.rstrip(".")
            is_file = re.fullmatch(r"[\w./-]+\.(py|cpp|hpp|pyi)", t) and "{" not in t
            is_name = re.fullmatch(r"(qkv\.|_)\w*(\.\w+)+", t)
            if is_file or is_name:
                tokens.add(t)
    gone = sorted(t for t in tokens if not _exists(t))
    assert tokens and not gone, f"docs/architecture.md names what does not exist: {gone}"
