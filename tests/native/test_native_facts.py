"""The facts the kernel and Python share are written once, in C++ (params.hpp, exported by
binding.cpp): ``_native/_facts.py`` and the stub ``_native/_ext.pyi`` are generated from the
built extension by ``scripts/stubs``, and these tests fail while either is stale. The Python side
(masks, the plan, the memory model) reads them from there, never restates them."""

from __future__ import annotations

import enum
import importlib
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import _native_reference as ref
import numpy as np
import pytest

from qkv import _native as native
from qkv import masks
from qkv._native import _facts

ROOT = Path(__file__).resolve().parents[2]
EXT = importlib.import_module("qkv._native._ext")


def test_the_generated_files_match_the_built_extension(tmp_path):
    pytest.importorskip("nanobind.stubgen")
    env = {**os.environ, "QKV_VENV": sys.prefix}
    r = subprocess.run([str(ROOT / "scripts" / "stubs"), str(tmp_path)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    for name in ("_ext.pyi", "_facts.py"):
        want = (tmp_path / name).read_text()
        assert (ROOT / "src" / "qkv" / "_native" / name).read_text() == want, f"{name} is stale: run scripts/stubs"


def test_the_python_side_has_the_kernels_values():
    assert native._stale_facts(EXT) == []
    assert (masks.EMPTY, masks.PARTIAL, masks.FULL) == (EXT.EMPTY, EXT.PARTIAL, EXT.FULL)
    assert {m.name: int(m) for m in native.ModKind} == {m.name: int(m.value) for m in EXT.ModKind}
    assert native.MAX_THREADS == EXT.MAX_THREADS and native.LANES == EXT.LANES


def test_the_facts_are_what_the_kernel_does():
    # tile sizes and the decode threshold, as the kernel's own tile_shape answers them
    assert native.tile_shape(native.DECODE_MAX_NQ, 999, 64, 64, "float32") == (native.DECODE_MAX_NQ, native.BLOCK_K)
    assert native.tile_shape(native.DECODE_MAX_NQ + 1, 999, 64, 64, "float32") == (native.BLOCK_Q, native.BLOCK_K)
    assert native.BLOCK_Q % native.LANES == 0
    # the thread cap, as the binding enforces it
    q = np.ones((1, 1, 3, 4), np.float32)
    out, lse = np.empty_like(q), np.empty((1, 1, 3), np.float32)
    native.forward(q, q, q, out, lse, scale=1.0, threads=native.MAX_THREADS)
    with pytest.raises(ValueError, match="threads"):
        native.forward(q, q, q, out, lse, scale=1.0, threads=native.MAX_THREADS + 1)
    # the tile classes, as the kernel reads them: EMPTY hides the tile's keys, FULL shows them all
    k = np.arange(20, dtype=np.float32).reshape(1, 1, 5, 4) / 20
    want = np.empty_like(out)
    native.forward(q, k, k, want, lse, scale=1.0)
    tc = np.full((1, 1, 1, 1), native.FULL, np.int8)
    native.forward(q, k, k, out, lse, scale=1.0, tile_class=tc)
    assert np.array_equal(out, want)
    native.forward(q, k, k, out, lse, scale=1.0, tile_class=tc * 0 + native.EMPTY)
    assert (out == 0).all() and np.isneginf(lse).all()
    # the native tests' independent reference uses the same numbering
    assert (ref.EMPTY, ref.PARTIAL, ref.FULL) == (native.EMPTY, native.PARTIAL, native.FULL)


def test_a_fact_that_differs_refuses_the_extension():
    fake = SimpleNamespace(**{n: getattr(EXT, n) for n in _facts.FACTS})
    assert native._stale_facts(fake) == []
    fake.BLOCK_K = 2 * EXT.BLOCK_K
    assert native._stale_facts(fake) == ["BLOCK_K"]
    fake.ModKind = enum.IntEnum("ModKind", {"MUL": 0, "SOFTCAP": 1, "ALIBI": 2})  # a kind missing
    assert native._stale_facts(fake) == ["BLOCK_K", "ModKind"]


NO_EXT = """
import numpy as np
import qkv
from qkv import _native as native, masks
assert not native.available()
assert (masks.EMPTY, masks.PARTIAL, masks.FULL) == (native.EMPTY, native.PARTIAL, native.FULL) == (0, 1, 2)
q = np.random.default_rng(0).standard_normal((1, 2, 70, 8)).astype(np.float32)
out = qkv.attention(q, q, q, mask=masks.causal(), impl="flash")
ref = qkv.attention(q, q, q, mask=masks.causal(), impl="reference")
assert np.allclose(out, ref, atol=1e-5)
print("ok")
"""


def test_without_the_extension_the_facts_and_the_array_engine_are_there():
    env = {**os.environ, "QKV_NATIVE_LIB": "/nonexistent/_ext.so"}
    r = subprocess.run([sys.executable, "-c", NO_EXT], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr
