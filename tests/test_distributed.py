"""qkv.distributed on real process groups: spawned ranks (gloo, 127.0.0.1) against one process.

Spawns are expensive on 2 cores, so each world size runs once with many cases
(``_dist_worker.check_attention``); every case compares the gathered output and gradients
with torch SDPA (float64, autograd) and the float64 loop oracle on the whole tensors, the
ring with ``simulate_ring``, and the bytes sent with ``qkv.complexity.communication``. The
same spawn runs the table of calls on which ranks disagree (``DISAGREE_W2``, ``DISAGREE_W4``):
every rank must raise, naming the ranks, the field and both values, and the group must still
work afterwards.
"""

import ast
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from helpers import HAS_TORCH

pytestmark = pytest.mark.skipif(not HAS_TORCH, reason="qkv.distributed needs torch")

ROOT = Path(__file__).resolve().parents[1]
TOL64 = 1e-10

W2_CASES = [
    {"name": "ring-dense", "fn": "ring", "h": 2, "hkv": 2, "n": 8, "dk": 4, "seed": 1},
    {
        "name": "ring-causal-gqa",
        "fn": "ring",
        "b": 2,
        "h": 4,
        "hkv": 2,
        "n": 8,
        "dk": 4,
        "dv": 3,
        "causal": True,
        "seed": 2,
    },
    {
        "name": "ring-causal-zigzag-mqa",
        "fn": "ring",
        "h": 4,
        "hkv": 1,
        "n": 8,
        "dk": 4,
        "causal": True,
        "layout": "zigzag",
        "seed": 3,
    },
    {"name": "ring-dense-zigzag", "fn": "ring", "h": 2, "hkv": 2, "n": 8, "dk": 4, "layout": "zigzag", "seed": 4},
    {"name": "ring-causal-nq<nk", "fn": "ring", "h": 2, "hkv": 1, "n": 8, "nk": 16, "dk": 4, "causal": True, "seed": 5},
    {
        "name": "ring-causal-float32",
        "fn": "ring",
        "h": 2,
        "hkv": 2,
        "n": 16,
        "dk": 8,
        "causal": True,
        "dtype": "float32",
        "seed": 6,
    },
    {
        "name": "ring-group-of-one",
        "fn": "ring",
        "h": 2,
        "hkv": 2,
        "n": 8,
        "dk": 4,
        "causal": True,
        "layout": "zigzag",
        "group": "single",
        "seed": 7,
    },
    {
        "name": "ulysses-causal-gqa",
        "fn": "ulysses",
        "h": 4,
        "hkv": 2,
        "n": 8,
        "dk": 4,
        "dv": 6,
        "causal": True,
        "seed": 8,
    },
    {
        "name": "ulysses-dense-float32",
        "fn": "ulysses",
        "b": 2,
        "h": 2,
        "hkv": 2,
        "n": 16,
        "dk": 8,
        "dtype": "float32",
        "seed": 9,
    },
]
W4_CASES = [
    {"name": "ring-causal-gqa", "fn": "ring", "h": 4, "hkv": 2, "n": 16, "dk": 4, "causal": True, "seed": 11},
    {
        "name": "ring-causal-zigzag-gqa",
        "fn": "ring",
        "b": 2,
        "h": 4,
        "hkv": 2,
        "n": 16,
        "dk": 4,
        "dv": 5,
        "causal": True,
        "layout": "zigzag",
        "seed": 12,
    },
    {
        "name": "ring-dense-zigzag-nq<nk",
        "fn": "ring",
        "h": 2,
        "hkv": 2,
        "n": 8,
        "nk": 16,
        "dk": 4,
        "layout": "zigzag",
        "seed": 13,
    },
    {
        "name": "ring-subgroups-of-two",
        "fn": "ring",
        "h": 2,
        "hkv": 1,
        "n": 8,
        "dk": 4,
        "causal": True,
        "layout": "zigzag",
        "group": "pairs",
        "seed": 14,
    },
    {"name": "ulysses-causal-gqa", "fn": "ulysses", "h": 8, "hkv": 4, "n": 8, "dk": 4, "causal": True, "seed": 15},
    {
        "name": "ulysses-subgroups-of-two",
        "fn": "ulysses",
        "h": 2,
        "hkv": 2,
        "n": 8,
        "dk": 4,
        "causal": True,
        "group": "pairs",
        "seed": 16,
    },
]


# ------------------------------------------------------------ ranks that disagree (same spawns)

RING = {"fn": "ring", "q": (1, 2, 32, 8), "k": (1, 2, 32, 8), "v": (1, 2, 32, 8)}
RING_T = {"fn": "ring", "q": (1, 2, 32, 16), "k": (1, 2, 32, 16), "v": (1, 2, 32, 16)}
GQA = {"fn": "ring", "q": (1, 4, 32, 8), "k": (1, 2, 32, 8), "v": (1, 2, 32, 8)}
ULYSSES = {"fn": "ulysses", "q": (1, 4, 16, 8), "k": (1, 2, 16, 8), "v": (1, 2, 16, 8)}
ULYSSES_W4 = {"fn": "ulysses", "q": (1, 4, 16, 8), "k": (1, 4, 16, 8), "v": (1, 4, 16, 8)}
GATHER = {"fn": "gather", "x": (1, 2, 32, 16)}
ISSUE_EXAMPLE = (
    "rank 1 has Nk=16 on axis -2 but rank 0 has 32 (k: (1, 2, 16, 8) vs (1, 2, 32, 8))"  # the issue's example
)


def disagree(id, base, odd, *words, odd_ranks=(1,), odd_error=None):
    """Ranks ``odd_ranks`` call with ``odd`` over ``base``, the others with ``base``. Every rank raises
    ``DistributedError`` containing ``words`` (``odd_error = (type, words)``: what the odd ranks raise
    instead, when their own checks reject their arguments)."""
    return {"id": id, "base": base, "odd": odd, "words": words, "odd_ranks": odd_ranks, "odd_error": odd_error}


DISAGREE_W2 = [
    disagree("ring-shard-length-32-vs-16", RING, {"k": (1, 2, 16, 8), "v": (1, 2, 16, 8)}, ISSUE_EXAMPLE),
    disagree(
        "ring-transposed-shards-same-bytes",
        RING_T,
        {"q": (1, 2, 16, 32), "k": (1, 2, 16, 32), "v": (1, 2, 16, 32)},
        "rank 1 has Nq=16 on axis -2 but rank 0 has 32 (q: (1, 2, 16, 32) vs (1, 2, 32, 16))",
        "rank 1 has Nk=16 on axis -2 but rank 0 has 32 (k: (1, 2, 16, 32) vs (1, 2, 32, 16))",
    ),
    disagree("ring-dtype", RING, {"dtype": "float32"}, "rank 1 has k.dtype=float32 but rank 0 has k.dtype=float64"),
    disagree(
        "ring-query-heads", GQA, {"q": (1, 2, 32, 8)}, "rank 1 has H=2 on axis -3 but rank 0 has 4 (q: (1, 2, 32, 8) vs"
    ),
    disagree(
        "ring-kv-heads",
        GQA,
        {"k": (1, 1, 32, 8), "v": (1, 1, 32, 8)},
        "rank 1 has Hkv=1 on axis -3 but rank 0 has 2 (k: (1, 1, 32, 8) vs (1, 2, 32, 8))",
    ),
    disagree(
        "ring-head-dim",
        RING,
        {"q": (1, 2, 32, 4), "k": (1, 2, 32, 4)},
        "rank 1 has Dk=4 on axis -1 but rank 0 has 8 (q: (1, 2, 32, 4) vs (1, 2, 32, 8))",
        f"rank 1 has scale=0.5 but rank 0 has scale={1 / math.sqrt(8)!r}",
    ),
    disagree(
        "ring-value-dim", RING, {"v": (1, 2, 32, 4)}, "rank 1 has Dv=4 on axis -1 but rank 0 has 8 (v: (1, 2, 32, 4) vs"
    ),
    disagree("ring-batch", RING, {"q": (2, 2, 32, 8)}, "rank 1 has B=2 on axis -4 but rank 0 has 1"),
    disagree(
        "ring-axis-count",
        RING,
        {"q": (2, 32, 8), "k": (2, 32, 8), "v": (2, 32, 8)},
        "rank 1 has q with 3 axes but rank 0 has 4 (q: (2, 32, 8) vs (1, 2, 32, 8))",
    ),
    disagree("ring-causal", RING, {"causal": True}, "rank 1 has causal=True but rank 0 has causal=False"),
    disagree(
        "ring-layout", RING, {"layout": "zigzag"}, "rank 1 has layout='zigzag' but rank 0 has layout='contiguous'"
    ),
    disagree("ring-scale", RING, {"scale": 0.5}, f"rank 1 has scale=0.5 but rank 0 has scale={1 / math.sqrt(8)!r}"),
    disagree("ring-grad", RING, {"requires_grad": True}, "rank 1 has grad=True but rank 0 has grad=False"),
    disagree(
        "ring-odd-zigzag-shard-on-one-rank",
        {**RING, "layout": "zigzag"},
        {"q": (1, 2, 3, 8), "k": (1, 2, 3, 8), "v": (1, 2, 3, 8)},
        "rank 1 rejected its arguments with a ShapeError",
        odd_error=("ShapeError", "q has 3 positions on axis -2 on this rank"),
    ),
    disagree(
        "ulysses-shard-length",
        ULYSSES,
        {"q": (1, 4, 8, 8)},
        "rank 1 has Nq=8 on axis -2 but rank 0 has 16 (q: (1, 4, 8, 8) vs (1, 4, 16, 8))",
    ),
    disagree(
        "ulysses-dtype", ULYSSES, {"dtype": "float32"}, "rank 1 has q.dtype=float32 but rank 0 has q.dtype=float64"
    ),
    disagree("ulysses-heads", ULYSSES, {"q": (1, 2, 16, 8)}, "rank 1 has H=2 on axis -3 but rank 0 has 4"),
    disagree("ulysses-causal", ULYSSES, {"causal": True}, "rank 1 has causal=True but rank 0 has causal=False"),
    disagree(
        "ulysses-requires-grad",
        ULYSSES,
        {"requires_grad": True},
        "rank 1 has q.requires_grad=True but rank 0 has q.requires_grad=False",
    ),
    disagree(
        "gather-transposed-shards-same-bytes",
        GATHER,
        {"x": (1, 2, 16, 32)},
        "rank 1 has N=16 on axis -2 but rank 0 has 32 (x: (1, 2, 16, 32) vs (1, 2, 32, 16))",
    ),
    disagree("gather-dtype", GATHER, {"dtype": "float32"}, "rank 1 has x.dtype=float32 but rank 0 has x.dtype=float64"),
    disagree("gather-layout", GATHER, {"layout": "zigzag"}, "rank 1 has layout='zigzag' but rank 0 has"),
    disagree("different-calls", RING, GATHER, "rank 1 called gather_sequence but rank 0 called ring_attention"),
]
DISAGREE_W4 = [
    disagree(
        "ring-one-rank-of-four",
        RING,
        {"k": (1, 2, 16, 8), "v": (1, 2, 16, 8)},
        "rank 2 has Nk=16 on axis -2 but ranks 0, 1, 3 have 32 (k: (1, 2, 16, 8) vs (1, 2, 32, 8))",
        odd_ranks=(2,),
    ),
    disagree(
        "ulysses-two-against-two",
        ULYSSES_W4,
        {"causal": True},
        "ranks 1, 3 have causal=True but ranks 0, 2 have causal=False",
        odd_ranks=(1, 3),
    ),
    disagree(
        "ring-two-ranks-reject-their-arguments",
        {**RING, "layout": "zigzag"},
        {"q": (1, 2, 3, 8), "k": (1, 2, 3, 8), "v": (1, 2, 3, 8)},
        "ranks 1, 2 rejected their arguments (rank 1: ShapeError, rank 2: ShapeError",
        odd_ranks=(1, 2),
        odd_error=("ShapeError", "q has 3 positions on axis -2 on this rank"),
    ),
]


def judge_disagreement(reports, row):
    """Every rank raised (DistributedError with the row's words, or the odd ranks' own error), quickly;
    ranks that made the same call raised the same message."""
    messages = set()
    for rank, report in enumerate(reports):
        kind, message, seconds = report["disagree"]["rows"][row["id"]]
        want, words = ("DistributedError", row["words"])
        if rank in row["odd_ranks"] and row["odd_error"]:
            want, words = row["odd_error"][0], row["odd_error"][1:]
        elif row["base"]["fn"] == {**row["base"], **row["odd"]}["fn"]:
            messages.add(message)
        assert kind == want, f"{row['id']}, rank {rank}: expected {want}, got {kind}: {message}"
        for w in words:
            assert w in message, f"{row['id']}, rank {rank}: {w!r} not in {message!r}"
        assert seconds < 10, f"{row['id']}, rank {rank}: took {seconds:.1f} s (waited on a timeout?)"
    assert len(messages) <= 1, f"{row['id']}: ranks raised different messages: {messages}"


def judge(reports, cases):
    """Every rank's errors within tolerance; bytes sent as predicted."""
    for rank, report in enumerate(reports):
        for case in cases:
            err = report["cases"][case["name"]]
            where = f"rank {rank}, case {case['name']}"
            if case.get("dtype", "float64") == "float64":
                for name in ("out_vs_oracle", "out", "dq", "dk", "dv"):
                    assert err[name] <= TOL64, f"{where}: {name} error {err[name]:.3g} > {TOL64}"
            else:  # STYLE rule 13: within a small factor of torch SDPA's own float32 error
                assert err["out_vs_oracle"] <= 2 * err["baseline_out"] + 1e-9, f"{where}: {err}"
                for name, factor in (("out", 2), ("dq", 3), ("dk", 3), ("dv", 3)):
                    assert err[name] <= factor * err["baseline_" + name] + 1e-9, f"{where}: {name}: {err}"
            if case["fn"] == "ring":
                assert err["vs_simulator"] <= 1e-12, f"{where}: ring and simulate_ring differ by {err['vs_simulator']}"
                assert err["simulated_bytes"] == err["bytes"][0], f"{where}: simulator bytes {err}"
            fwd_sent, fwd_pred, all_sent, all_pred = err["bytes"]
            assert (fwd_sent, all_sent) == (fwd_pred, all_pred), (
                f"{where}: sent {fwd_sent} B forward, {all_sent} B with backward; "
                f"qkv.complexity.communication predicts {fwd_pred} and {all_pred}"
            )


@pytest.fixture(scope="module")
def worker():
    import _dist_worker

    return _dist_worker


@pytest.fixture(scope="module")
def w2_reports(worker):
    """One spawn of 2 ranks for the correctness cases, the typed errors and the disagreement table."""
    return worker.run(2, "suite", {"cases": W2_CASES, "errors": True, "disagree": DISAGREE_W2})


@pytest.fixture(scope="module")
def w4_reports(worker):
    return worker.run(4, "suite", {"cases": W4_CASES, "disagree": DISAGREE_W4})


def test_world_size_2_ring_and_ulysses_equal_single_process_attention_and_errors_are_typed(w2_reports):
    reports = w2_reports
    judge(reports, W2_CASES)
    expected = {
        "ulysses_heads": ("ShapeError", "q has H=3 heads on axis -3, which does not divide by the world size 2"),
        "ulysses_kv_heads": ("ShapeError", "k has Hkv=1 heads on axis -3, which does not divide by the world size 2"),
        "zigzag_odd_shard": ("ShapeError", "q has 3 positions on axis -2 on this rank"),
        "shard_not_divisible": (
            "ShapeError",
            "x has N=5 positions on axis -2, which does not divide into world size 2",
        ),
        "shard_zigzag_not_divisible": (
            "ShapeError",
            "x has N=6 positions on axis -2, which does not divide into 2 · world size = 4 chunks",
        ),
        "unknown_layout": ("ArgumentError", "layout must be one of ['contiguous', 'zigzag'], got 'striped'"),
        "gather_numpy": ("DTypeError", "gather_sequence runs on torch tensors"),
    }
    for report in reports:
        for name, (kind, words) in expected.items():
            got_kind, message = report["errors"][name]
            assert got_kind == kind and words in message, f"{name}: {got_kind}: {message}"


def test_world_size_4_ring_and_ulysses_equal_single_process_attention(w4_reports):
    judge(w4_reports, W4_CASES)


@pytest.mark.parametrize("row", DISAGREE_W2, ids=[r["id"] for r in DISAGREE_W2])
def test_ranks_that_disagree_all_raise_naming_the_rank_the_field_and_both_values(w2_reports, row):
    judge_disagreement(w2_reports, row)


@pytest.mark.parametrize("row", DISAGREE_W4, ids=[r["id"] for r in DISAGREE_W4])
def test_ranks_that_disagree_in_a_group_of_four_are_named_against_the_majority(w4_reports, row):
    judge_disagreement(w4_reports, row)


@pytest.mark.parametrize("reports", ["w2_reports", "w4_reports"])
def test_after_a_disagreement_the_group_still_computes_exact_attention(request, reports):
    for rank, report in enumerate(request.getfixturevalue(reports)):
        assert report["disagree"]["afterwards"] <= TOL64, f"rank {rank}: {report['disagree']['afterwards']}"


def test_a_rank_that_raises_fails_the_run_quickly_with_its_message(worker):
    start = time.monotonic()
    with pytest.raises(worker.RankError, match="rank 1 raised:(.|\n)*ValueError: rank 1 exploded on purpose"):
        worker.run(2, "raise_on_rank1")  # rank 0 waits in the ring for rank 1 and is terminated
    assert time.monotonic() - start < 20


def test_torchrun_recipe_runs_the_example_on_two_processes():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "error"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            str(ROOT / "examples" / "ring_torchrun.py"),
        ],
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert any(line.startswith("ring     on 2 ranks") for line in lines), proc.stdout
    assert any(line.startswith("ulysses  on 2 ranks") for line in lines), proc.stdout


# ----------------------------------------------------------------- in this process, no group


@pytest.mark.parametrize("call", ["ring", "ulysses", "shard", "gather"])
def test_without_a_process_group_the_error_says_how_to_start_one(call):
    import torch
    import torch.distributed as dist

    from qkv.distributed import DistributedError, gather_sequence, ring_attention, shard_sequence, ulysses_attention

    assert not dist.is_initialized()
    x = torch.zeros(1, 2, 4, 4)
    run = {
        "ring": lambda: ring_attention(x, x, x),
        "ulysses": lambda: ulysses_attention(x, x, x),
        "shard": lambda: shard_sequence(x),
        "gather": lambda: gather_sequence(x),
    }[call]
    with pytest.raises(DistributedError, match=r"init_process_group(.|\n)*torchrun(.|\n)*simulate_ring"):
        run()
    assert issubclass(DistributedError, RuntimeError)


def test_numpy_inputs_to_the_ring_raise_type_error():
    from qkv.distributed import ring_attention
    from qkv.errors import DTypeError

    x = np.zeros((1, 2, 4, 4))
    with pytest.raises(DTypeError, match="ring_attention runs on torch tensors(.|\n)*q is numpy"):
        ring_attention(x, x, x)


def test_import_qkv_does_not_import_torch_or_the_torch_modules_of_the_distributed_package():
    """``qkv.complexity`` reads the torch-free ``qkv.distributed._layout`` (docs/architecture.md); the
    package's ``__init__`` loads nothing else until one of its names is used."""
    code = (
        "import sys, qkv; qkv.merge_attention; qkv.complexity.communication; "
        "print(sorted(m for m in sys.modules if m.startswith(('qkv.distributed', 'torch'))))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    loaded = set(ast.literal_eval(proc.stdout.strip()))
    assert loaded <= {"qkv.distributed", "qkv.distributed._layout"}, loaded
