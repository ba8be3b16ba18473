"""The small API of qkv._native: paths, tile shapes, the Philox generator, the fallback."""

import os
import subprocess
import sys

import numpy as np
import pytest

from qkv import _native as native


def test_available_and_paths():
    assert native.available() and native.reason() == ""
    assert native.isas()[-1] == "portable"
    assert native.isa() == native.isas()[0]  # the best path is the default
    assert set(native.isas()) <= {"avx512bf16", "avx512", "avx2", "neon", "portable"}
    flags = ""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    if " avx2 " in flags and " fma " in flags and " f16c " in flags:
        assert "avx2" in native.isas()
    if " avx512f " not in flags:
        assert "avx512" not in native.isas()
    if " avx512_bf16 " not in flags:
        assert "avx512bf16" not in native.isas()


def test_use_isa_forces_and_restores():
    best = native.isa()
    with native.use_isa("portable"):
        assert native.isa() == "portable"
    assert native.isa() == best


def test_use_isa_refuses_a_path_the_cpu_cannot_run():
    missing = [p for p in ("avx512", "avx2") if p not in native.isas()] + ["sve"]
    with pytest.raises(ValueError, match="cannot run"), native.use_isa(missing[0]):
        pass


def test_tile_shape():
    assert native.tile_shape(4096, 4096, 64, 64, "float32") == (64, 128)
    assert native.tile_shape(1, 32768, 128, 128, "bfloat16") == (16, 128)
    with pytest.raises(ValueError, match="dtype"):
        native.tile_shape(8, 8, 8, 8, "int8")


def test_philox_known_answers():
    # Random123's published known-answer vectors for philox4x32-10
    assert native._ext.philox4x32(0, 0, 0, 0, 0, 0) == (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)
    ff = 0xFFFFFFFF
    assert native._ext.philox4x32(ff, ff, ff, ff, ff, ff) == (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)
    assert native._ext.philox4x32(0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344, 0xA4093822, 0x299F31D0) == (
        0xD16CFE09,
        0x94FDCCEB,
        0x5001E420,
        0x24126EA1,
    )


def test_philox_keep_layout_and_threshold():
    seed = 0x0123456789ABCDEF
    p = 0.3
    keep = native.philox_keep(seed, 2, 5, 3, 7, 1, 11, p)
    assert keep.shape == (4, 10) and keep.dtype == bool
    thr = int(min(p * 2.0**32, 2.0**32 - 1))
    for r, i in enumerate(range(3, 7)):
        for c, j in enumerate(range(1, 11)):
            words = native._ext.philox4x32(j >> 2, i, 5, 2, seed & 0xFFFFFFFF, seed >> 32)
            assert keep[r, c] == (words[j & 3] >= thr)
    # sub-tiles agree with the whole
    whole = native.philox_keep(seed, 0, 1, 0, 40, 0, 70, p)
    assert np.array_equal(whole[5:9, 13:29], native.philox_keep(seed, 0, 1, 5, 9, 13, 29, p))


def test_philox_keep_fraction_and_seeds():
    p = 0.2
    keep = native.philox_keep(7, 0, 0, 0, 256, 0, 256, p)
    n = keep.size
    frac = keep.mean()
    sd = np.sqrt(p * (1 - p) / n)
    assert abs(frac - (1 - p)) < 5 * sd
    assert np.array_equal(keep, native.philox_keep(7, 0, 0, 0, 256, 0, 256, p))
    assert not np.array_equal(keep, native.philox_keep(8, 0, 0, 0, 256, 0, 256, p))
    assert native.philox_keep(7, 0, 0, 0, 8, 0, 8, 0.0).all()


FALLBACK = """
import qkv._native as n
assert not n.available(), "should be unavailable"
assert n.reason(), "a reason"
print(n.reason())
try:
    n.isa()
except RuntimeError as e:
    print("raised", e)
"""


@pytest.mark.parametrize("lib", ["/nonexistent/_ext.so", "garbage"])
def test_unloadable_module_means_unavailable_not_import_error(lib, tmp_path):
    if lib == "garbage":  # a file that is not a shared object
        lib = tmp_path / "_ext.cpython-311-x86_64-linux-gnu.so"
        lib.write_bytes(b"not an ELF file")
    env = {**os.environ, "QKV_NATIVE_LIB": str(lib)}
    r = subprocess.run([sys.executable, "-c", FALLBACK], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "qkv._native._ext" in r.stdout and "raised" in r.stdout


FORK = """
import os, numpy as np
from qkv import _native as native
q = np.ones((1, 2, 40, 8), np.float32); out = np.empty_like(q); lse = np.empty((1, 2, 40), np.float32)
native.forward(q, q, q, out, lse, scale=1.0, threads=2)      # the pool exists in the parent
pid = os.fork()
if pid == 0:
    native.forward(q, q, q, out, lse, scale=1.0, threads=2)  # and works in the child
    os._exit(0 if np.allclose(out, 1.0) else 3)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_thread_pool_survives_fork():
    r = subprocess.run([sys.executable, "-c", FORK], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "child 0" in r.stdout, r.stdout + r.stderr
