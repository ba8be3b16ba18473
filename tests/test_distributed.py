"""qkv.distributed on real process groups: spawned ranks (gloo, 127.0.0.1) against one process.

Spawns are expensive on 2 cores, so each world size runs once with many cases
(``_dist_worker.check_attention``); every case compares the gathered output and gradients
with torch SDPA (float64, autograd) and the float64 loop oracle on the whole tensors, the
ring with ``simulate_ring``, and the bytes sent with ``qkv.complexity.communication``.
"""

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


def test_world_size_2_ring_and_ulysses_equal_single_process_attention_and_errors_are_typed(worker):
    reports = worker.run(2, "suite", {"cases": W2_CASES, "errors": True})
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


def test_world_size_4_ring_and_ulysses_equal_single_process_attention(worker):
    judge(worker.run(4, "suite", {"cases": W4_CASES}), W4_CASES)


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


def test_import_qkv_does_not_import_the_distributed_package():
    code = (
        "import sys, qkv; qkv.merge_attention; qkv.complexity.communication; "
        "print(sorted(m for m in sys.modules if m.startswith(('qkv.distributed', 'torch'))))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr
