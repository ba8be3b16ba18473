"""The anchors benchmark's correctness pass (benchmarks/anchors.py) at small sizes: every peer that
is installed in this interpreter agrees with a float64 reference on every workload it can
express, within 8× SDPA's own error. Peers whose package is absent skip with the reason (in CI's
venv that leaves qkv, JAX and compiled FlexAttention, which must run)."""

import dataclasses
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import _anchor_peers as peers  # noqa: E402
import anchors  # noqa: E402

pytestmark = pytest.mark.slow
WORKLOADS = anchors.workloads()
CHECKED = [p for p in peers.PEERS if p != "read floor"]  # the floor reads bytes and returns nothing


@pytest.mark.parametrize("workload", list(WORKLOADS))
@pytest.mark.parametrize("peer", CHECKED)
def test_peer_agrees_with_float64(peer, workload):
    prepare, module = peers.PEERS[peer]
    reason = peers.missing(module) if module else None
    if reason:
        pytest.skip(reason)
    w = WORKLOADS[workload].shrunk()
    try:
        err, err_sdpa = anchors.check(w, prepare, seed=1)
    except peers.Unsupported as e:
        pytest.skip(f"{peer} skips {workload}: {e}")
    assert err <= anchors.tolerance(w, err_sdpa), f"{peer} on {workload}: error {err:.2e}, SDPA {err_sdpa:.2e}"


@pytest.mark.parametrize("workload", ["W3", "W4bf16", "W5"])
def test_check_refuses_a_wrong_kernel(workload):
    """The pass can fail: SDPA without the window, with a scale off by 1%, or with K/V heads in the
    wrong order is caught."""

    def wrong(w, q, k, v):
        f = torch.nn.functional.scaled_dot_product_attention
        box = []
        if w.hkv != w.h:
            k, v = k.flip(1), v.flip(1)  # the GQA head order mixed up
        kw = {"scale": 1.01 * peers.scale_of(w), "enable_gqa": w.hkv != w.h, "is_causal": w.causal and w.nq > 1}
        return peers.Prepared(lambda: box.__setitem__(slice(None), [f(q, k, v, **kw)]), lambda: box[0])

    w = WORKLOADS[workload].shrunk()
    err, err_sdpa = anchors.check(w, wrong, seed=1)
    assert err > anchors.tolerance(w, err_sdpa)


@pytest.mark.parametrize("window", [31, 33, None])
def test_openvino_pa_window_off_by_one_disagrees(window):
    """OpenVINO PagedAttention's ``sliding_window`` input counts the query's own key, as qkv's
    window does: the small W3 (window 32) run with 31, 33 or no window is refused."""
    reason = peers.missing("openvino")
    if reason:
        pytest.skip(reason)
    w = WORKLOADS["W3"].shrunk()

    def shifted(w_, q, k, v):
        return peers.openvino_pa(dataclasses.replace(w_, window=window), q, k, v)

    err, err_sdpa = anchors.check(w, shifted, seed=1)
    assert err > anchors.tolerance(w, err_sdpa)


def test_openvino_pa_refuses_dense_prefill():
    reason = peers.missing("openvino")
    if reason:
        pytest.skip(reason)
    with pytest.raises(peers.Unsupported, match="causal"):
        anchors.check(WORKLOADS["W1"].shrunk(), peers.openvino_pa, seed=1)


def test_table_names_every_skipped_peer_with_its_reason():
    # the header the script itself writes (a hand-built one drifted from it once: KeyError in CI)
    head = {**anchors.header(["benchmarks/anchors.py"]), "load_after": (0.6, 0, 0)}
    rows = [{"peer": "vLLM CPU", "workload": "W1", "status": "skipped", "note": "vllm is not installed"}]
    table = anchors.markdown(head, rows, "loaded machine")
    assert "| W1 | vLLM CPU | | | skipped | | | | vllm is not installed |" in table
    assert "loaded machine" in table and "benchmarks/anchors.py" in table
    assert head["qkv_info"] in table and head["cpu_family_model"] in table


@pytest.mark.parametrize("workload", ["W4q", "W4mhaq"])
def test_8bit_check_holds_a_peer_to_its_own_cache(workload):
    """On an 8-bit cache the reference is the float64 attention over what the peer attends: qkv's
    int8 cache passes against its own codes and is refused against the float K and V (whose
    difference is the quantization error, not the kernel's) and against its K codes in the wrong
    token order (a misread layout)."""
    honest = peers.PEERS["qkv int8"][0]
    w = WORKLOADS[workload].shrunk()

    def against_float(w_, q, k, v):
        return dataclasses.replace(honest(w_, q, k, v), used=None)

    def misread(w_, q, k, v):
        p = honest(w_, q, k, v)
        qd, kd, vd = p.used()
        return dataclasses.replace(p, used=lambda: (qd, kd.flip(2), vd))

    err, err_sdpa = anchors.check(w, honest, seed=1)
    assert err <= anchors.tolerance(w, err_sdpa)
    for wrong in (against_float, misread):
        err, err_sdpa = anchors.check(w, wrong, seed=1)
        assert err > anchors.tolerance(w, err_sdpa), wrong.__name__


def test_8bit_workloads_read_one_byte_per_element():
    w, w8 = WORKLOADS["W4"], WORKLOADS["W4q"]
    assert (w8.h, w8.hkv, w8.nq, w8.nk, w8.d) == (w.h, w.hkv, w.nq, w.nk, w.d)
    assert anchors.kv_bytes(w8) * 4 == anchors.kv_bytes(w)
