"""The locked environment: ``scripts/test`` installs from ``constraints.txt`` and exports it
as ``PIP_CONSTRAINT``; then every locked package that is installed has the locked version, so a
release made after the lock cannot change what the suite runs (``CONTRIBUTING.md``, "The lock")."""

import os
import re
import sys
from importlib import metadata
from pathlib import Path

import pytest

LOCK = Path(__file__).resolve().parents[1] / "constraints.txt"


def locked() -> dict[str, str]:
    pins = re.findall(r"^([A-Za-z0-9_.-]+)==([^\s;#]+)", LOCK.read_text(), re.MULTILINE)
    return {re.sub(r"[-_.]+", "-", name).lower(): version for name, version in pins}


def test_the_lock_names_its_interpreter_and_pins_torch_to_the_cpu_build():
    header = LOCK.read_text().splitlines()[0]
    assert re.match(r"# CPython \d+\.\d+ on \S+ Linux:", header), header  # what scripts/_lock.sh reads
    pins = locked()
    assert pins["torch"] == "2.13.0" and pins["transformers"] and pins["nanobind"] and pins["scikit-build-core"]


@pytest.mark.skipif(
    Path(os.environ.get("PIP_CONSTRAINT", "/nonexistent")).resolve() != LOCK,
    reason="not a run of scripts/test from the lock (PIP_CONSTRAINT is not constraints.txt)",
)
def test_every_installed_locked_package_has_the_locked_version():
    lock_python = re.match(r"# CPython (\d+\.\d+)", LOCK.read_text()).group(1)
    assert f"{sys.version_info[0]}.{sys.version_info[1]}" == lock_python
    # metadata.version: the distribution Python imports (setuptools, once imported, puts its own
    # vendored copies of packaging and platformdirs on sys.path after site-packages)
    installed = {}
    for name in locked():
        try:
            installed[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    wrong = {name: (got, locked()[name]) for name, got in installed.items() if got.split("+")[0] != locked()[name]}
    assert not wrong, f"installed (got, locked): {wrong}"
    assert {"transformers", "torch", "numpy", "pytest"} <= installed.keys()
