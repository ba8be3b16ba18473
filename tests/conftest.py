"""Shared fixtures: a seeded ``rng`` per test and the ``impl`` runners (see helpers.Runner)."""

import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # oracle.py, helpers.py (any import mode)

from helpers import runner_params  # noqa: E402

try:
    import torch
except ImportError:  # torch is optional: torch-only tests skip themselves
    torch = None
else:
    torch.set_num_threads(2)


@pytest.fixture
def rng(request):
    """A NumPy Generator seeded from the test's id: reproducible, different per test."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(params=runner_params())
def impl(request):
    """qkv.attention called with impl reference / torch / auto, on NumPy or torch arrays."""
    return request.param


def pytest_addoption(parser):
    parser.addoption(
        "--transformers-full",
        action="store_true",
        default=False,
        help="also run the full transformers architecture matrix (tests marked transformers_full)",
    )


def pytest_collection_modifyitems(config, items):
    """The full architecture matrix is opt-in: without --transformers-full its tests are skipped."""
    if config.getoption("--transformers-full"):
        return
    opt_in = pytest.mark.skip(reason="the full transformers matrix runs with --transformers-full")
    for item in items:
        if "transformers_full" in item.keywords:
            item.add_marker(opt_in)
