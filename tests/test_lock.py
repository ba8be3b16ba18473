"""The locked environment: ``scripts/setup`` installs from ``constraints.txt`` (``PIP_CONSTRAINT``),
so a release made after the lock cannot change what the suite runs (``CONTRIBUTING.md``, "The
lock"). Where the lock applies — the CPython it is made for, ``QKV_LOCK`` not ``latest`` — every
installed locked package has its locked version, torch is the CPU build, and nothing the lock does
not name is installed.

Where it does not apply, the suite says so rather than skip in silence: ``QKV_LOCK=latest``
(``scripts/test-latest``) is off the lock on purpose and skips with that reason; another CPython
is an expected failure whose reason line (``-ra``) names both versions, so a contributor on
another Python still runs the suite, and sees in its summary that it did not run the lock's
environment. CI sets ``QKV_REQUIRE_LOCK=1`` (``.ci/run``): there the same finding fails.
"""

import os
import re
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "constraints.txt"
LOCK_PYTHON = re.match(r"# CPython (\d+\.\d+)", LOCK.read_text())[1]
HERE = f"{sys.version_info[0]}.{sys.version_info[1]}"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked() -> dict[str, str]:
    pins = re.findall(r"^([A-Za-z0-9_.-]+)==([^\s;#]+)", LOCK.read_text(), re.MULTILINE)
    return {canonical(name): version for name, version in pins}


def installed() -> dict[str, str]:
    """name -> version of each distribution installed in this environment's site-packages (not
    whatever ``sys.path`` holds at the time: setuptools, once imported by an earlier test, appends its
    vendored copies of jaraco, wheel, packaging and platformdirs, which nobody installed)."""
    out: dict[str, str] = {}
    site = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    for dist in metadata.distributions(path=site):
        out.setdefault(canonical(dist.metadata["Name"]), dist.version)
    return out


@pytest.fixture
def the_lock_applies():
    if os.environ.get("QKV_LOCK") == "latest":
        pytest.skip("QKV_LOCK=latest: installed from the newest releases on purpose (scripts/test-latest)")
    if HERE != LOCK_PYTHON:
        why = (
            f"the lock is made for CPython {LOCK_PYTHON}, this is CPython {HERE}: the environment came from "
            "pyproject.toml's ranges, not the versions CI tests"
        )
        if os.environ.get("QKV_REQUIRE_LOCK") == "1":
            pytest.fail(why)
        pytest.xfail(why)


def test_the_lock_names_its_interpreter_and_pins_torch_to_the_cpu_build():
    header = LOCK.read_text().splitlines()[0]
    assert re.match(r"# CPython \d+\.\d+ on \S+ Linux:", header), header  # what scripts/_lock.sh reads
    pins = locked()
    assert pins["torch"] == "2.13.0" and pins["transformers"] and pins["nanobind"] and pins["scikit-build-core"]


def test_every_installed_locked_package_has_the_locked_version(the_lock_applies):
    have = installed()
    wrong = {n: (v, locked()[n]) for n, v in have.items() if n in locked() and v.split("+")[0] != locked()[n]}
    assert not wrong, f"installed (got, locked): {wrong}"
    assert {"numpy", "array-api-compat"} <= have.keys()


def test_torch_is_the_locked_cpu_build(the_lock_applies):
    have = installed()
    if "torch" not in have:
        pytest.skip("torch is not installed here (scripts/explain's environment: qkv and its command line)")
    cuda = sorted(n for n in have if n.startswith("nvidia-"))
    assert have["torch"] == f"{locked()['torch']}+cpu" and not cuda, (
        f"torch {have['torch']} with {cuda or 'no nvidia-* packages'}: not the locked CPU build; README.md, "
        "'PyTorch without a GPU', says how to install it"
    )


def test_nothing_outside_the_lock_is_installed(the_lock_applies):
    extra = sorted(set(installed()) - set(locked()) - {"pip", "qkv"})
    assert not extra, f"installed but not in constraints.txt: {extra} (scripts/lock adds what the project needs)"


# ------------------------------------------------------------- what scripts/setup says about it


def lock_check(tmp_path, dists: dict[str, str]) -> list[str]:
    """scripts/lock_check.py's lines for this interpreter's packages plus made-up ``dists`` (found
    first on ``sys.path``, as an installed distribution of that name would be)."""
    fake = tmp_path / "site"
    for name, version in dists.items():
        info = fake / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    env = {**os.environ, "PYTHONPATH": str(fake)}
    args = [sys.executable, str(ROOT / "scripts/lock_check.py"), str(LOCK)]
    r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120, check=True)
    return r.stdout.splitlines()


def test_setup_names_a_torch_that_is_not_the_cpu_build_and_packages_outside_the_lock(tmp_path):
    lines = lock_check(tmp_path, {"torch": "2.13.0", "nvidia_cublas_cu12": "12.8.4.1", "left_pad": "1.0"})
    assert any(
        line.startswith("setup: torch 2.13.0 is not the locked CPU build")
        and "nvidia-* packages" in line
        and "--index-url https://download.pytorch.org/whl/cpu" in line
        for line in lines
    ), lines
    outside = [line for line in lines if "packages outside the lock" in line]
    assert len(outside) == 1 and "left-pad 1.0" in outside[0] and "nvidia-cublas-cu12 12.8.4.1" in outside[0]
    assert "torch" not in outside[0]  # torch is locked: its finding is the build, not the name


def test_setup_finds_nothing_to_say_about_this_environment(the_lock_applies):
    args = [sys.executable, str(ROOT / "scripts/lock_check.py"), str(LOCK)]
    r = subprocess.run(args, capture_output=True, text=True, timeout=120, check=True)
    assert r.stdout == "", r.stdout  # the environment is the lock's, as the tests above find on their own


def test_setup_says_in_one_line_when_the_interpreter_is_not_the_locks(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin/python"
    python.write_text("#!/bin/sh\necho 3.99\n")  # what lock_applies asks: the venv's major.minor
    python.chmod(0o755)
    r = subprocess.run(
        ["bash", "-c", f'. scripts/_lock.sh && lock_applies "{venv}"'], cwd=ROOT, capture_output=True, text=True
    )
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.splitlines() == [
        f"setup: the lock is made for CPython {LOCK_PYTHON}, this is 3.99: installing from pyproject.toml's ranges"
    ]
