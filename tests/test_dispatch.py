"""``qkv.dispatch``: what ``impl="auto"`` runs, and why; ``complexity.estimate(impl="auto")`` agrees.

The real choice is observed independently of ``dispatch`` itself: every impl's forward is
wrapped to record which one ran, then ``qkv.attention`` is called on the same arguments.
"""

import numpy as np
import pytest

import qkv
from helpers import HAS_TORCH
from qkv import masks
from qkv._impls import REGISTRY, flash
from qkv.errors import ArgumentError, ShapeError

needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")


@pytest.fixture
def ran(monkeypatch):
    """The names of the impls whose forward ran, in order, each flash call followed by its engine."""
    names: list[str] = []
    for name, impl in list(REGISTRY.items()):

        def forward(c, p, _impl=impl, _name=name):
            names.append(_name)
            return _impl.forward(c, p)

        monkeypatch.setitem(REGISTRY, name, impl._replace(forward=forward))
    import qkv._core

    def lean(*a, _lean=qkv._core.lean_attention):  # the lean road runs the compiled engine's flash
        res = _lean(*a)
        if res is not None:
            names.extend(["flash", "native"])
        return res

    monkeypatch.setattr(qkv._core, "lean_attention", lean)
    for engine in ("array", "native"):
        module = getattr(flash, f"{engine}_engine")

        def engine_forward(*a, _forward=module.forward, _engine=engine, **kw):
            names.append(_engine)
            return _forward(*a, **kw)

        monkeypatch.setattr(module, "forward", engine_forward)
    return names


def zeros(shape, lib="numpy"):
    x = np.zeros(shape, np.float32)
    if lib == "torch":
        import torch

        return torch.from_numpy(x)
    return x


GRID = [  # (B, H, Hkv, Nq, Nk, D, mask, extra attention kwargs)
    pytest.param(1, 2, 2, 16, 16, 8, None, {}, id="tiny-dense"),
    pytest.param(1, 2, 2, 16, 16, 8, masks.causal(), {"return_lse": True}, id="tiny-causal-lse"),
    pytest.param(1, 2, 2, 512, 512, 8, None, {}, id="dense-512"),
    pytest.param(1, 2, 2, 512, 512, 8, masks.causal(), {}, id="causal-512"),
    pytest.param(1, 2, 2, 1024, 1024, 8, masks.sliding_window(64), {}, id="sliding-1024"),
    pytest.param(1, 2, 2, 1024, 1024, 8, ~masks.sliding_window(64), {}, id="not-sliding-1024"),
    pytest.param(1, 8, 2, 1, 1024, 8, None, {}, id="gqa-decode"),
    pytest.param(1, 8, 2, 1, 1024, 8, masks.causal(), {}, id="gqa-decode-causal"),
    pytest.param(2, 8, 1, 4, 2048, 8, None, {}, id="mqa-decode"),
    pytest.param(1, 4, 2, 300, 700, 8, masks.causal(), {"return_weights": True}, id="gqa-weights"),
    pytest.param(1, 2, 2, 512, 512, 8, None, {"score_mod": qkv.scores.softcap(5.0)}, id="softcap"),
]


@pytest.mark.parametrize("lib", ["numpy", pytest.param("torch", marks=needs_torch)])
@pytest.mark.parametrize("b,h,hkv,nq,nk,d,mask,kw", GRID)
def test_dispatch_names_the_impl_that_attention_runs(b, h, hkv, nq, nk, d, mask, kw, lib, ran):
    q, k, v = zeros((b, h, nq, d), lib), zeros((b, hkv, nk, d), lib), zeros((b, hkv, nk, d), lib)
    said = qkv.dispatch(q, k, v, mask=mask, **kw)
    qkv.attention(q, k, v, mask=mask, **kw)
    assert ran == [said.impl] + ([said.engine] if said.impl == "flash" else []), (ran, said)
    assert said.engine in (("array", "native") if said.impl == "flash" else (None,))
    assert said.reason.endswith(")") and "rule" in said.reason  # one sentence naming its rule


@pytest.mark.parametrize("b,h,hkv,nq,nk,d,mask,kw", [p for p in GRID if not p.values[7]])
def test_estimate_auto_resolves_through_dispatch(b, h, hkv, nq, nk, d, mask, kw, ran):
    """The configurations without extra keywords: complexity counts the impl NumPy inputs would run."""
    q, k, v = zeros((b, h, nq, d)), zeros((b, hkv, nk, d)), zeros((b, hkv, nk, d))
    qkv.attention(q, k, v, mask=mask)
    e = qkv.complexity.estimate(nq, nk, d_k=d, heads=h, kv_heads=hkv, batch=b, impl="auto", mask=mask)
    assert e.impl == ran[0]


def test_grouped_decode_estimate_is_flash_like_attention():
    """The restated-rule bug: the estimate said "reference" where attention runs "flash"."""
    assert qkv.complexity.estimate(1, 1024, heads=8, kv_heads=2, impl="auto").impl == "flash"


def test_a_named_impl_is_reported_or_refused_as_attention_would():
    q = k = v = np.zeros((1, 2, 8, 4))
    assert qkv.dispatch(q, k, v, impl="reference") == (
        "reference",
        None,
        "impl='reference' was asked for",
        None,
        None,
        None,
    )
    with pytest.raises(ArgumentError, match="impl='torch' cannot run this call exactly"):
        qkv.dispatch(q, k, v, impl="torch")
    with pytest.raises(ArgumentError, match="impl must be one of"):
        qkv.dispatch(q, k, v, impl="fastest")
    with pytest.raises(ShapeError, match="d_k=3"):
        qkv.dispatch(q, np.zeros((1, 2, 8, 3)), v)


def test_explain_reports_the_dispatch():
    trace = qkv.explain(np.zeros((2, 600, 4)), np.zeros((2, 600, 4)), np.zeros((2, 600, 4)), causal=True)
    assert trace.options["dispatch"]["impl"] == "flash"
    assert (
        trace.to_dict()["options"]["dispatch"]
        == qkv.dispatch(np.zeros((2, 600, 4)), np.zeros((2, 600, 4)), np.zeros((2, 600, 4)), causal=True)._asdict()
    )


@pytest.mark.skipif(not qkv._native.available(), reason="compiled engine unavailable")
def test_auto_leaves_the_portable_path_the_calls_sdpa_can_run():
    """The portable ISA path (x86 without AVX2, other CPUs) runs dense work at ~0.11x SDPA: under
    it, rule C gives the calls SDPA can run to rules 1-6; calls SDPA cannot run (NumPy, score mods)
    stay with the compiled engine. The paths in FASTER_THAN_SDPA keep rule C."""
    torch = pytest.importorskip("torch")
    from qkv import _native, scores
    from qkv._impls._plan import FASTER_THAN_SDPA

    q = k = v = torch.randn(1, 4, 512, 64)
    with _native.use_isa("portable"):
        d = qkv.dispatch(q, k, v)
        assert d.impl == "torch" and "rule C" not in d.reason, d
        assert qkv.dispatch(q, k, v, score_mod=scores.softcap(5.0)).engine == "native"  # SDPA cannot run it
        qn = np.zeros((4, 512, 64), np.float32)
        assert qkv.dispatch(qn, qn, qn).engine == "native"
        torch.testing.assert_close(qkv.attention(q, k, v), torch.nn.functional.scaled_dot_product_attention(q, k, v))
    for path in _native.isas():
        with _native.use_isa(path):
            assert (qkv.dispatch(q, k, v).engine == "native") == (path in FASTER_THAN_SDPA), path


@pytest.mark.skipif(not qkv._native.available(), reason="compiled engine unavailable")
def test_auto_treats_an_unmeasured_path_like_portable(monkeypatch):
    """NEON (arm64) is checked under emulation only (scripts/test-aarch64), its speed against SDPA
    unmeasured: a path outside FASTER_THAN_SDPA (neon, or any path added later) leaves SDPA the
    calls it can run, and keeps those SDPA cannot."""
    torch = pytest.importorskip("torch")
    from qkv import _native, scores
    from qkv._impls._plan import FASTER_THAN_SDPA

    assert "neon" not in FASTER_THAN_SDPA and "portable" not in FASTER_THAN_SDPA
    q = k = v = torch.randn(1, 4, 512, 64)
    monkeypatch.setattr(_native, "isa", lambda: "neon")  # what an arm64 build reports
    d = qkv.dispatch(q, k, v, causal=True)
    assert d.impl == "torch" and "rule C" not in d.reason, d
    assert qkv.dispatch(q, k, v, score_mod=scores.softcap(5.0)).engine == "native"
    qn = np.zeros((4, 512, 64), np.float32)
    assert qkv.dispatch(qn, qn, qn).engine == "native"
