"""The decode loop's prefetch target (``dispatch.cpp``, ``decode_prefetch``): where the K/V lines
it reads ahead go (L1 or L2 only) is a per-CPU choice of speed, never of value. Both targets give
bit-identical results on every ISA path, for float caches in the four dtypes and quantized caches
in the three formats, on the thin path (1-8 rows read in place) and the wide one, 1-3 threads, and
the float64 oracle's answer; the CPU's default follows the rule written in ``dispatch.cpp``, read
here from ``/proc/cpuinfo``; ``QKV_DECODE_PREFETCH`` forces a target; ``qkv.dispatch`` names it
for decode calls only."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import numpy as np
import pytest
import test_native_quant as Q
import torch
from _native_helpers import make_qkv, max_err
from _native_reference import forward as ref_forward

import qkv
from qkv import _native as native

TARGETS = ("l1", "l2")
# (H, Hkv, Nq): one row, grouped rows up to the thin maximum of 8, the wide path
SHAPES = ((8, 8, 1), (8, 2, 1), (32, 8, 1), (8, 1, 1), (4, 1, 4), (16, 1, 1))


def _both(fn, *args):
    """fn(*args) under each prefetch target: the two results."""
    got = []
    for target in TARGETS:
        with native.use_decode_prefetch(target):
            assert native.decode_prefetch() == target
            got.append(fn(*args))
    return got


def _call(tq, tk, tv, threads):
    out = torch.empty(*tq.shape[:3], tv.shape[3], dtype=tq.dtype)
    lse = torch.empty(*tq.shape[:3], dtype=torch.float64 if tq.dtype == torch.float64 else torch.float32)
    scale = tq.shape[3] ** -0.5
    assert tuple(native.forward(tq, tk, tv, out, lse, scale=scale, threads=threads)) == (0, 0)
    return out, lse


@pytest.mark.parametrize("dtype", [np.float32, np.float64, "bfloat16", "float16"])
def test_both_targets_give_the_same_bits_and_the_oracle(isa, rng, dtype):
    for n, (h, hkv, nq) in enumerate(SHAPES):
        nk, d = (4099, 64) if n % 2 else (1031, 128)
        q, k, v = make_qkv(rng, 1, h, hkv, nq, nk, d, d, np.float64)
        if isinstance(dtype, str):  # half caches read in place, widened in registers
            tq, tk, tv = (torch.from_numpy(x).to(getattr(torch, dtype)) for x in (q, k, v))
            q, k, v = (x.double().numpy() for x in (tq, tk, tv))
        else:
            tq, tk, tv = (torch.from_numpy(x.astype(dtype)) for x in (q, k, v))
        ro, rl, *_ = ref_forward(q, k, v, d**-0.5)
        for threads in (1, 2, 3):
            (o1, l1), (o2, l2) = _both(_call, tq, tk, tv, threads)
            assert torch.equal(o1, o2) and torch.equal(l1, l2), (h, hkv, nq, nk, threads)
            tol = 1e-12 if dtype == np.float64 else 3e-6 if dtype == np.float32 else 1e-2
            assert max_err(o1.double().numpy(), ro) < tol and max_err(l1.double().numpy(), rl) < max(tol, 3e-6)


@pytest.mark.parametrize("fmt", Q.FORMATS)
@pytest.mark.parametrize("qdtype", ["float32", "bfloat16"])
def test_both_targets_read_a_quantized_cache_alike(isa, fmt, qdtype):
    for n, (h, hkv, nq) in enumerate(SHAPES):
        q, kc, vc, ks, vs = Q.make(n, 1, h, hkv, nq, 3001, 64, 64, fmt, qdtype)
        for threads in (1, 2):
            (o1, l1, _), (o2, l2, _) = _both(Q.run, q, kc, vc, ks, vs, fmt, threads)
            assert np.array_equal(o1, o2) and np.array_equal(l1, l2), (fmt, h, hkv, nq, threads)
        with native.use_decode_prefetch("l2"):
            Q.check(q, kc, vc, ks, vs, fmt, qdtype, threads=2)


def _cpu_rule() -> str:
    """dispatch.cpp's rule, read from /proc/cpuinfo: AMD family 25 (19h) prefetches into L2."""
    if platform.machine() not in ("x86_64", "AMD64", "i686") or not os.path.exists("/proc/cpuinfo"):
        return "l1"
    fields = {}
    with open("/proc/cpuinfo") as f:
        first = f.read().split("\n\n")[0]
    for line in first.splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    amd = fields.get("vendor_id") == "AuthenticAMD"
    return "l2" if amd and fields.get("cpu family") == "25" else "l1"


def _fresh(env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "QKV_DECODE_PREFETCH"}
    if env_value is not None:
        env["QKV_DECODE_PREFETCH"] = env_value
    code = "from qkv import _native; print(_native.decode_prefetch())"
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the rule is read from /proc/cpuinfo")
def test_the_default_follows_the_cpu_and_the_environment_forces_one():
    assert _fresh(None) == _cpu_rule()
    assert _fresh("l1") == "l1" and _fresh("l2") == "l2"
    assert _fresh("l3") == _cpu_rule()  # an unknown name: the CPU's choice
    with pytest.raises(ValueError, match="'l1' or 'l2'"):
        with native.use_decode_prefetch("l0"):
            pass


def test_dispatch_names_the_target_for_decode_calls_only(rng):
    k = rng.standard_normal((1, 2, 300, 16)).astype(np.float32)
    for target in TARGETS:
        with native.use_decode_prefetch(target):
            decode = qkv.dispatch(k[:, :, :1], k, k)
            assert decode.engine == "native" and f"K/V prefetched into {target.upper()}" in decode.reason
            assert "prefetched" not in qkv.dispatch(k, k, k).reason  # prefill: 300 query rows
