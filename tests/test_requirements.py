"""The ``QKV_REQUIRE_*`` guard (tests/requirements.py) that turns a missing path into a failed CI run."""

import pytest

import requirements
from qkv import _native


def test_nothing_required_nothing_missing(monkeypatch):
    for name in ("NATIVE", "ISAS", "JAX_FFI", "TORCH_OP"):
        monkeypatch.delenv(f"QKV_REQUIRE_{name}", raising=False)
    assert requirements.missing() == []


@pytest.mark.skipif(not _native.available(), reason=f"compiled engine unavailable: {_native.reason()}")
def test_a_path_the_kernel_lacks_is_reported(monkeypatch):
    absent = "neon" if "neon" not in _native.isas() else "avx2"
    monkeypatch.setenv("QKV_REQUIRE_ISAS", f"portable,{absent}")
    (gap,) = requirements.missing()
    assert repr(absent) in gap and "portable" not in gap.split("offers")[0]


@pytest.mark.skipif(not _native.available(), reason=f"compiled engine unavailable: {_native.reason()}")
def test_the_cpus_paths_are_read_independently_of_the_kernels_detection(monkeypatch):
    # /proc/cpuinfo's flags against dispatch.cpp's __builtin_cpu_supports: the same paths
    assert set(requirements.cpu_paths()) == set(_native.isas())


def test_pytest_stops_before_any_test_when_something_required_is_missing():
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).parent
    env = {"QKV_REQUIRE_ISAS": "portable,no-such-path", "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests / "test_softmax.py")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tests.parent,
        timeout=600,
    )
    assert run.returncode != 0 and "'no-such-path' ISA path" in run.stdout + run.stderr, run.stdout[-2000:]
    assert " passed" not in run.stdout
