"""qkv.bench: timing and interleaving on trivial functions, FLOP counts by hand, the quick suite.

Benchmarks never assert speed here: only that things are measured, counted and run.
"""

import json
import math
import subprocess
import sys

import numpy as np
import pytest

import qkv
from qkv import masks
from qkv.bench import (
    allowed_entries,
    compare,
    flops,
    measure,
    naive_attention,
    paired_ratios,
    peak_memory,
    run_suite,
    workload,
)
from qkv.bench._timing import Timing, timing
from qkv.bench._workloads import WORKLOADS, kept_tile_entries


def test_measure_calls_warmup_plus_repeats_and_summarises():
    calls = []
    t = measure(lambda: calls.append(1), warmup=2, repeats=5)
    assert len(calls) == 7
    assert isinstance(t, Timing) and len(t.samples) == 5
    assert 0 <= t.min <= t.median and t.iqr >= 0
    assert all(s >= 0 for s in t.samples)


def test_measure_calls_sync_after_every_call():
    events = []
    measure(lambda: events.append("fn"), warmup=1, repeats=2, sync=lambda: events.append("sync"))
    assert events == ["fn", "sync"] * 3


def test_compare_interleaves_round_robin():
    order = []
    fns = {name: (lambda name=name: order.append(name)) for name in "abc"}
    t = compare(fns, warmup=1, repeats=3)
    assert order == ["a", "b", "c"] * 4  # one warm-up round, then three timed rounds
    assert set(t) == {"a", "b", "c"} and all(len(x.samples) == 3 for x in t.values())


def test_compare_can_rotate_the_order_each_round():
    order = []
    fns = {name: (lambda name=name: order.append(name)) for name in "abc"}
    compare(fns, warmup=0, repeats=4, rotate=True)
    assert "".join(order) == "abc" + "bca" + "cab" + "abc"


def test_timing_summary_and_paired_ratios():
    t = timing([4.0, 1.0, 3.0, 2.0])
    assert (t.median, t.iqr, t.min) == (2.5, 1.5, 1.0)
    assert t.samples == (4.0, 1.0, 3.0, 2.0)  # kept in round order, for pairing
    base, fast = timing([2.0, 4.0, 6.0]), timing([1.0, 1.0, 3.0])
    r = paired_ratios(base, fast)  # per round 2, 4, 2
    assert r.median == 2.0 and r.q1 == 2.0 and r.q3 == 3.0


def test_measure_rejects_no_repeats():
    with pytest.raises(ValueError, match="repeats"):
        measure(lambda: None, repeats=0)


def test_flops_dense_by_hand():
    w = workload("dense", 8, h=2, d=4)
    assert flops(w, "fwd") == 4 * 1 * 2 * 8 * 8 * 4  # QKᵀ and AV: 2 matmuls x 2 flops per multiply-add
    assert flops(w, "fwdbwd") == 3.5 * flops(w, "fwd")  # backward = 2.5 x forward


def test_flops_causal_by_hand():
    w = workload("causal", 8, h=2, d=4)
    assert allowed_entries(w) == 8 * 9 // 2
    assert flops(w, "fwd") == 4 * 2 * 36 * 4


def test_flops_gqa_counts_query_heads():
    w = workload("gqa", 8, h=4, d=4)
    assert (w.h, w.hkv) == (4, 1)
    assert flops(w, "fwd") == 4 * 4 * 36 * 4


@pytest.mark.parametrize("name", ["causal", "sliding", "document", "gqa"])
def test_allowed_entries_match_the_dense_mask(name):
    w = workload(name, 1000)  # not a multiple of any tile size
    assert allowed_entries(w, block=128) == int(w.dense_mask().sum())


def test_kept_tile_entries_by_brute_force():
    from qkv._impls import flash

    w = workload("sliding", 1500)
    bq, bk = flash.BLOCK_Q, flash.BLOCK_K
    dense = w.dense_mask()
    expected = sum(
        dense[i : i + bq, j : j + bk].size
        for i in range(0, w.nq, bq)
        for j in range(0, w.nk, bk)
        if dense[i : i + bq, j : j + bk].any()
    )
    assert kept_tile_entries(w, bq, bk) == expected
    assert flops(w, "fwd", count="tiles") == 4 * w.h * w.d * expected


def test_workloads_follow_the_issue():
    assert workload("dense", 64)[1:7] == (1, 8, 8, 64, 64, 64)
    assert workload("gqa", 64).hkv == 2
    d = workload("decode-gqa", 4096)
    assert (d.nq, d.nk, d.h, d.hkv, d.mask) == (1, 4096, 8, 2, None)
    doc = workload("document", 64)
    assert len(np.unique(doc.doc_ids)) == 8
    assert np.array_equal(doc.dense_mask(), (masks.document(doc.doc_ids) & masks.causal()).dense(64, 64))


def test_naive_numpy_attention_matches_the_reference(rng):
    q = rng.standard_normal((1, 4, 9, 8), dtype=np.float32)
    k, v = (rng.standard_normal((1, 2, 9, 8), dtype=np.float32) for _ in range(2))
    allowed = masks.sliding_window(3).dense(9, 9)
    ref = qkv.attention(q, k, v, mask=allowed, impl="reference")
    np.testing.assert_allclose(naive_attention(q, k, v, allowed), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["causal", "sliding", "document", "gqa"])
def test_flex_mask_mods_match_qkv_masks(name):
    torch = pytest.importorskip("torch")
    from qkv.bench._flex import mask_mod

    w = workload(name, 777)
    i, j = torch.arange(w.nq)[:, None], torch.arange(w.nk)[None, :]
    got = mask_mod(w)(0, 0, i, j).numpy()
    assert np.array_equal(got, w.dense_mask())


def test_quick_suite_runs_every_workload():
    pytest.importorskip("torch")
    rows = run_suite("quick", quick=True)
    assert {r["workload"] for r in rows} == set(WORKLOADS)
    ok = [r for r in rows if r["status"] == "ok"]
    assert {r["impl"] for r in ok} >= {"qkv-flash", "qkv-auto", "sdpa-flash"}
    for r in ok:
        assert math.isfinite(r["median_s"]) and r["median_s"] > 0, r
        assert r["gflops"] > 0 and r["speedup"] > 0, r
        # every candidate computed the same thing: float32 to 1e-4, bfloat16 to 4 of its ulps at 1
        tol = 2**-6 if r["workload"].endswith("bf16") else 1e-4
        assert r["max_abs_err"] is None or r["max_abs_err"] < tol, r
    assert all(r["note"] for r in rows if r["status"] != "ok")  # a row that did not run says why
    json.dumps(rows)  # rows are JSON-ready


def test_peak_memory_runs_in_a_subprocess():
    pytest.importorskip("torch")
    m = peak_memory("qkv-flash", "causal", 1024, "fwdbwd", h=1)
    tensor = 1024 * 64 * 4
    assert m.inputs == 4 * tensor  # q, k, v, dout
    assert m.outputs == 4 * tensor  # out, dq, dk, dv
    assert m.peak >= m.baseline > 0 and m.extra == m.peak - m.baseline and m.seconds > 0


def test_bench_command_json():
    pytest.importorskip("torch")
    pytest.importorskip("typer")
    from typer.testing import CliRunner

    from qkv.cli import app

    args = ["bench", "--quick", "--workload", "causal", "--n", "256", "--mode", "fwd", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert {(r["workload"], r["n"], r["mode"]) for r in rows} == {("causal", 256, "fwd")}
    header = result.stderr.splitlines()[0]  # qkv.info()'s line, on stderr under --json
    assert header.startswith(f"qkv {qkv.__version__} | ") and qkv.info().cpu.model in header
    if qkv._native.available():
        assert f"isa {qkv._native.isa()} of " in header
    bad = CliRunner().invoke(app, ["bench", "--suite", "nope"])
    assert bad.exit_code == 2 and bad.output.count("\n") == 1 and "--suite must be one of" in bad.output


def test_importing_bench_does_not_import_torch():
    code = "import sys, qkv, qkv.bench, qkv.cli.bench; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
