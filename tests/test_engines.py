"""The flash kernel's two engines: the compiled one runs what it supports, the array one the rest;
both give the oracle's numbers; a missing extension degrades with one clear message.

``QKV_REQUIRE_NATIVE=1`` (set by ``.ci/run``) turns "the compiled engine is unavailable" from a
skip into a failure: CI proves it is the one running.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

import oracle as O
import qkv
from helpers import HAS_TORCH, assert_close, make_qkv
from qkv import _native, masks, scores
from qkv._impls import build_call
from qkv.errors import ArgumentError

REQUIRED = os.environ.get("QKV_REQUIRE_NATIVE") == "1"
needs_native = pytest.mark.skipif(
    not _native.available() and not REQUIRED, reason=f"compiled engine unavailable: {_native.reason()}"
)
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")


def test_the_compiled_engine_is_the_one_running_here():
    if not REQUIRED and not _native.available():
        pytest.skip(f"compiled engine unavailable: {_native.reason()}")
    assert _native.available(), _native.reason()
    q = np.zeros((1, 2, 512, 16), np.float32)
    said = qkv.dispatch(q, q, q, causal=True)
    assert (said.impl, said.engine) == ("flash", "native")
    assert said.tiles == (_native.BLOCK_Q, _native.BLOCK_K) and said.threads == qkv._impls.threads() >= 1
    assert qkv.dispatch(q, q, q, impl="flash").engine == "native"


TABLE = np.linspace(-1, 1, 4 * 7).reshape(4, 7)
ORACLE_MODS = {  # the oracle's own score functions for the mods below
    "alibi-softcap": O.chain_scores(O.alibi_score(O.alibi_slopes(4)), O.softcap_score(3.0)),
    "relative-temperature": O.chain_scores(O.relative_bias_score(TABLE, 3), O.temperature_score(2.0)),
}
CASES = [  # (name, attention keywords): each a different path of the kernel's arguments
    ("dense", {}),
    ("causal-rows", {"causal": True}),
    ("window-rows", {"mask": masks.sliding_window(9)}),
    ("packed-rows", {"mask": masks.packed([0, 10, 25, 40], [0, 20, 30, 50], causal=True)}),
    ("padding-per-batch", {"mask": masks.padding(np.array([50, 17]), np.array([40, 30]), causal=True)}),
    ("longformer-bitmaps", {"mask": masks.sliding_window(5, causal=False) | masks.global_tokens([0, 33])}),
    ("per-head-bitmaps", {"mask": masks.from_fn(lambda b, h, i, j: (i + 10 - j) % (h + 2) == 0)}),
    ("alibi-softcap", {"score_mod": scores.alibi() + scores.softcap(3.0), "causal": True}),
    (
        "relative-temperature",
        {"score_mod": scores.relative_bias(np.linspace(-1, 1, 4 * 7).reshape(4, 7), 3) + scores.temperature(2.0)},
    ),
    ("bias-beside-mask", {"mask": masks.sliding_window(12), "bias": np.linspace(-2, 2, 40 * 50).reshape(40, 50)}),
]


@needs_native
@pytest.mark.parametrize("name,kw", CASES, ids=[c[0] for c in CASES])
def test_both_engines_equal_the_oracle(name, kw, rng):
    q, k, v = make_qkv(rng, (2, 4, 40, 8), (2, 2, 50, 8), (2, 2, 50, 6))
    c = build_call(q, k, v, **kw)
    allowed = None if c.mask is None else c.mask.dense(40, 50)
    golden = O.attention_oracle(q, k, v, allowed=allowed, bias=c.bias, score_fn=ORACLE_MODS.get(name))
    for engine in ("native", "array"):
        assert qkv._impls.plan("flash", build_call(q, k, v, engine=engine, **kw)).engine == engine
        res = qkv._core.run(build_call(q, k, v, engine=engine, want_lse=True, **kw), "flash")
        assert_close(res.out, golden[0], tol=1e-11, name=f"{engine} out")
        assert_close(res.lse, golden[2], tol=1e-11, name=f"{engine} lse")


@needs_native
@needs_torch
def test_engines_give_the_same_gradients_under_autograd(rng):
    import torch

    q, k, v = make_qkv(rng, (2, 4, 33, 8), (2, 2, 47, 8))
    grads = {}
    for engine in ("native", "array"):
        t = [torch.tensor(x, requires_grad=True) for x in (q, k, v)]
        res = qkv._core.run(build_call(*t, causal=True, engine=engine), "flash")
        (res.out * torch.arange(8.0)).sum().backward()
        grads[engine] = [x.grad for x in t]
    for a, b in zip(grads["native"], grads["array"], strict=True):
        assert_close(a.numpy(), b.numpy(), tol=1e-11)


@needs_native
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_threads_one_and_two_agree_and_repeat_bit_for_bit(dtype, rng, monkeypatch):
    q, k, v = make_qkv(rng, (1, 4, 300, 32), (1, 4, 300, 32), dtype=dtype)
    outs = {}
    for n in ("1", "2"):
        monkeypatch.setenv("OMP_NUM_THREADS", n)
        monkeypatch.delitem(sys.modules, "torch", raising=False)  # the count follows OMP_NUM_THREADS
        first = qkv.attention(q, k, v, causal=True, impl="flash")
        assert np.array_equal(first, qkv.attention(q, k, v, causal=True, impl="flash"))  # the same bits again
        outs[n] = first.astype(np.float64)
    assert np.abs(outs["1"] - outs["2"]).max() < (1e-6 if dtype == np.float32 else 2e-3)


def test_forcing_an_engine_that_cannot_run_the_call_says_why(rng):
    q, k, v = make_qkv(rng, (1, 2, 8, 4), (1, 2, 8, 4))
    mod = scores.from_fn(lambda s, b, h, i, j: s * 2)
    with pytest.raises(ArgumentError, match="engine='native' cannot run this call: .*has no compiled form|unavailable"):
        qkv._core.run(build_call(q, k, v, score_mod=mod, engine="native"), "flash")
    d = qkv.dispatch(q, k, v, score_mod=mod, impl="flash")
    assert d.engine == "array" and "array engine:" in d.reason


def test_a_missing_extension_degrades_with_one_message(tmp_path):
    """A pure-Python install (no loadable kernel): import qkv works, flash runs the array engine
    and dispatch says why, once."""
    bogus = tmp_path / "_ext.so"
    bogus.write_bytes(b"not a shared object")
    code = (
        "import numpy as np, qkv\n"
        "from qkv import _native\n"
        "print(_native.available())\n"
        "q = np.ones((1, 2, 64, 8))\n"
        "d = qkv.dispatch(q, q, q, impl='flash')\n"
        "print(d.engine, '|', d.reason)\n"
        "print(float(abs(qkv.attention(q, q, q, impl='flash') - 1).max()))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "QKV_NATIVE_LIB": str(bogus)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    available, dispatch, err = r.stdout.strip().splitlines()
    assert available == "False" and dispatch.startswith("array | ") and "could not be loaded" in dispatch
    assert float(err) < 1e-12
    assert "Traceback" not in r.stderr and "warning" not in r.stderr.lower()
