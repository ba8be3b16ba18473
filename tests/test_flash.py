"""The flash kernel's own promises: tiles a mask hides are skipped, FULL tiles never evaluate
the mask, memory stays O(N), and ``impl="auto"`` follows its decision table.

Its numbers are checked with every other impl against the oracle (test_oracle.py,
test_backward.py, test_conventions.py run it with tiny odd tiles).
"""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import oracle as O
import qkv
from helpers import HAS_TORCH, assert_close, make_qkv, tiled_attention, tiled_backward
from qkv import masks
from qkv._impls import _flash_array, build_call, flash

needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")


def _count_tiles(monkeypatch):
    """Record every tile the kernel scores, and every tile whose mask it evaluates."""
    scored, evaluated = [], []
    real_scores = _flash_array._Tiles.scores

    def scores(self, q0, q1, k0, k1, cls):
        scored.append((q0, k0))
        if cls == masks.PARTIAL:
            evaluated.append((q0, k0))
        return real_scores(self, q0, q1, k0, k1, cls)

    monkeypatch.setattr(_flash_array._Tiles, "scores", scores)
    return scored, evaluated


@pytest.mark.parametrize(
    "mask",
    [masks.causal(), masks.sliding_window(5), masks.document(np.repeat([0, 1, 2], 7)) & masks.causal()],
    ids=["causal", "sliding-5", "document-causal"],
)
def test_forward_and_backward_score_only_the_tiles_the_mask_keeps(mask, monkeypatch, rng):
    q, k, v = make_qkv(rng, (1, 2, 21, 4), (1, 2, 21, 4))
    classes = mask.blocks(21, 21, 4, 6)
    kept, partial = int((classes != masks.EMPTY).sum()), int((classes == masks.PARTIAL).sum())
    assert kept < classes.size  # the case has something to skip
    scored, evaluated = _count_tiles(monkeypatch)
    out, lse = tiled_attention(q, k, v, tiles=(4, 6), mask=mask, impl="flash", return_lse=True)
    assert len(scored) == kept and len(evaluated) == partial
    scored.clear(), evaluated.clear()
    grads = tiled_backward(np.ones_like(out), q, k, v, out, lse, tiles=(4, 6), mask=mask, impl="flash")
    assert len(scored) == kept and len(evaluated) == partial
    golden = O.attention_oracle(q, k, v, allowed=mask.dense(21, 21))
    assert_close(out, golden[0], name="out")
    fd = O.numerical_gradients(
        lambda a, b, c: O.attention_oracle(a, b, c, allowed=mask.dense(21, 21))[0], (q, k, v), np.ones_like(out)
    )
    for name, g, want in zip(("dq", "dk", "dv"), grads, fd, strict=True):
        assert_close(g, want, tol=1e-7, name=name)


def test_full_tiles_never_evaluate_the_mask(monkeypatch, rng):
    calls = []
    plain = masks.causal()
    counting = masks.Mask(
        lambda i, j, nq, nk: calls.append(i.shape) or plain.allowed(i, j, nq, nk), "counting-causal", plain.tiles
    )
    q, k, v = make_qkv(rng, (1, 1, 16, 4), (1, 1, 16, 4))
    out = tiled_attention(q, k, v, tiles=(4, 4), mask=counting, impl="flash")
    n_partial = int((plain.blocks(16, 16, 4, 4) == masks.PARTIAL).sum())
    assert len([c for c in calls if c == (4, 1)]) == n_partial  # one evaluation per PARTIAL tile
    assert_close(out, O.attention_oracle(q, k, v, allowed=O.causal_allowed(16, 16))[0])


def test_tile_sizes_widen_along_nk_for_a_decode_step():
    bq, bk = flash.tile_sizes(1, 32768)
    assert bq == 1 and bk == 32768  # one tile: no per-tile overhead on a decode step
    assert flash.tile_sizes(4096, 4096) == (flash.BLOCK_Q, flash.BLOCK_K)
    assert flash.tile_sizes(5, 7, 2, 3) == (2, 3)


MEMORY_SCRIPT = textwrap.dedent("""
    import resource, sys
    import numpy as np
    import qkv
    n = int(sys.argv[1])
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, n, 64), dtype=np.float32) for _ in range(3))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out, lse = qkv.attention(q, k, v, causal=True, impl="flash", return_lse=True)
    qkv.attention_backward(out, q, k, v, out, lse, causal=True, impl="flash")
    print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024)
""")


def test_long_sequence_forward_and_backward_stay_far_below_the_materialised_size():
    n = 16384  # materialised float32 scores: 1 GiB, weights and their gradient as much again
    run = subprocess.run(
        [sys.executable, "-c", MEMORY_SCRIPT, str(n)],
        capture_output=True,
        text=True,
        timeout=600,
        env={"OMP_NUM_THREADS": "2", "PATH": "/usr/bin:/bin"},
    )
    assert run.returncode == 0, run.stderr
    extra = int(run.stdout.strip())
    materialised = n * n * 4
    assert extra < 64 * 2**20, f"peak extra RSS {extra / 2**20:.1f} MiB"
    assert extra < materialised / 16


def _chosen(q, k, v, **kw):
    kw["return_weights"], kw["return_lse"] = kw.pop("weights", False), kw.pop("lse", False)
    return qkv.dispatch(q, k, v, **kw).impl


def test_auto_on_numpy_uses_reference_for_small_and_flash_for_large_problems(rng):
    from qkv import _native

    small = make_qkv(rng, (1, 2, 16, 8), (1, 2, 16, 8), dtype=np.float32)
    large = [np.zeros((1, 2, 512, 8), np.float32)] * 3
    # rule C: the compiled engine takes every call it runs; without it, small calls stay unfused (rule 2)
    assert _chosen(*small) == ("flash" if _native.available() else "reference")
    assert _chosen(*small, causal=True, weights=True) == "reference"
    assert _chosen(*large) == "flash"
    assert _chosen(*large, mask=masks.sliding_window(16), lse=True) == "flash"


@needs_torch
def test_auto_on_torch_follows_the_decision_table():
    import torch

    from qkv import _native

    compiled = _native.available()
    big = [torch.zeros((1, 2, 1024, 8))] * 3
    small = [torch.zeros((1, 2, 16, 8))] * 3
    decode = [torch.zeros((1, 2, 1, 8)), torch.zeros((1, 2, 1024, 8)), torch.zeros((1, 2, 1024, 8))]
    # rule C: the compiled engine takes what it runs; without it SDPA's fused kernel (rule 3)
    assert _chosen(*big) == ("flash" if compiled else "torch")
    assert _chosen(*big, causal=True) == ("flash" if compiled else "torch")
    assert _chosen(*decode, causal=True) == ("flash" if compiled else "torch")  # small: rule C, else SDPA (rule 1)
    long = [torch.zeros((1, 2, 8192, 8))] * 3
    assert _chosen(*long, mask=masks.sliding_window(64)) == "flash"  # most tiles hidden: skip them
    assert _chosen(*big, causal=True, lse=True) == "flash"  # SDPA returns no lse
    assert _chosen(*big, mask=~masks.sliding_window(64)) == ("flash" if compiled else "torch")
    assert _chosen(*small, mask=masks.sliding_window(4)) == ("flash" if compiled else "torch")  # else no tiling (1)
    assert _chosen(*small, lse=True) == ("flash" if compiled else "reference")
    assert _chosen(*big, score_mod=qkv.scores.softcap(5.0)) == "flash"
    gqa_decode = [torch.zeros((1, 8, 1, 8)), torch.zeros((1, 2, 4096, 8)), torch.zeros((1, 2, 4096, 8))]
    assert _chosen(*gqa_decode, causal=True) == "flash"  # SDPA's GQA path copies K and V per query head
    opaque = qkv.scores.from_fn(lambda s, b, h, i, j: s * 2)
    assert _chosen(*big, score_mod=opaque) == "flash"  # the array engine runs what the compiled one cannot


def test_tile_choice_follows_narrow_masks_and_keeps_large_tiles_for_dense_work():
    z = np.zeros((1, 8, 8192, 64), np.float32)

    def tiles(mask):
        return flash.choose_tiles(build_call(z, z, z, mask=mask))

    assert tiles(None) == (flash.BLOCK_Q, flash.BLOCK_K)
    assert tiles(masks.causal()) == (flash.BLOCK_Q, flash.BLOCK_K)
    narrow = tiles(masks.sliding_window(256))
    assert narrow[0] * narrow[1] < flash.BLOCK_Q * flash.BLOCK_K
    kept = [(masks.sliding_window(256).blocks(8192, 8192, *t) != masks.EMPTY) for t in (narrow, tiles(None))]
    assert kept[0].sum() * narrow[0] * narrow[1] < kept[1].sum() * flash.BLOCK_Q * flash.BLOCK_K
