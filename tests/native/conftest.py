"""Shared fixtures of the native-kernel tests: skip all when the kernel is unavailable, run each
ISA-sensitive test on every path this CPU can run."""

from __future__ import annotations

import os

import numpy as np
import pytest

from qkv import _native as native

if not native.available():  # pragma: no cover - a pure-Python install
    if os.environ.get("QKV_REQUIRE_NATIVE") == "1":  # CI: the kernel must be there
        raise RuntimeError(f"QKV_REQUIRE_NATIVE=1 but qkv._native is unavailable: {native.reason()}")
    if "scripts/stubs" in native.reason():  # built, but refused for stale facts: a failure, never a skip
        raise RuntimeError(native.reason())
    pytest.skip(f"qkv._native unavailable: {native.reason()}", allow_module_level=True)

ISAS = native.isas()


@pytest.fixture(params=ISAS)
def isa(request):
    """Runs the test once per ISA path (forced with use_isa)."""
    with native.use_isa(request.param):
        yield request.param


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
