"""Shared fixtures: a seeded ``rng`` per test and the ``impl`` runners (see helpers.Runner)."""

import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # oracle.py, helpers.py (any import mode)

from helpers import runner_params  # noqa: E402
from requirements import missing  # noqa: E402

try:
    import torch
except ImportError:  # torch is optional: torch-only tests skip themselves
    torch = None
else:
    torch.set_num_threads(2)


def pytest_sessionstart(session):
    """The ``QKV_REQUIRE_*`` pieces (tests/requirements.py): a run that lacks one stops here, failed,
    instead of skipping the tests that would have used it."""
    gaps = missing()
    if gaps:
        raise pytest.UsageError("required by QKV_REQUIRE_* but missing: " + "; ".join(gaps))


@pytest.fixture
def rng(request):
    """A NumPy Generator seeded from the test's id: reproducible, different per test."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(params=runner_params())
def impl(request):
    """qkv.attention called with impl reference / torch / auto, on NumPy or torch arrays."""
    return request.param
