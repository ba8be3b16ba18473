"""qkv.masks: dense() against independent definitions, blocks() against a brute-force tiling."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import oracle as O
import qkv
from helpers import MASK_CASES, check_against_oracle, make_qkv
from qkv import masks
from qkv.errors import MaskError


def assert_dense_equal(mask, nq, nk, expected):
    got = mask.dense(nq, nk)
    assert isinstance(got, np.ndarray) and got.dtype == np.bool_, f"dense() gave {type(got)} {got.dtype}"
    expected = np.asarray(expected, dtype=bool)
    assert np.broadcast_shapes(got.shape, expected.shape) == expected.shape, (
        f"dense() shape {got.shape} does not broadcast to {expected.shape}"
    )
    got = np.broadcast_to(got, expected.shape)
    bad = np.argwhere(got != expected)
    assert bad.size == 0, (
        f"{len(bad)} cells differ, first at {bad[:5].tolist()}\ngot\n{got.astype(int)}\n"
        f"expected\n{expected.astype(int)}"
    )


# --------------------------------------------------------------------------- dense()


@pytest.mark.parametrize("case", [c.param() for c in MASK_CASES if c.id != "random-blocks"])
def test_dense_matches_the_definition(case):
    assert_dense_equal(case.build(masks), case.nq, case.nk, case.oracle(case.nq, case.nk, masks))


SIZES = [(1, 1), (1, 7), (7, 1), (5, 9), (9, 5), (8, 8)]

CONSTRUCTORS = [
    pytest.param(lambda: masks.causal(), lambda nq, nk: O.causal_allowed(nq, nk), id="causal"),
    pytest.param(lambda: masks.causal(offset=0), lambda nq, nk: O.causal_allowed(nq, nk, 0), id="causal-offset0"),
    pytest.param(lambda: masks.causal(offset=3), lambda nq, nk: O.causal_allowed(nq, nk, 3), id="causal-offset3"),
    pytest.param(
        lambda: masks.sliding_window(1), lambda nq, nk: O.sliding_window_allowed(nq, nk, 1), id="sliding-window-1"
    ),
    pytest.param(
        lambda: masks.sliding_window(3), lambda nq, nk: O.sliding_window_allowed(nq, nk, 3), id="sliding-window-3"
    ),
    pytest.param(
        lambda: masks.sliding_window(3, causal=False),
        lambda nq, nk: O.sliding_window_allowed(nq, nk, 3, causal=False),
        id="sliding-window-3-bidir",
    ),
    pytest.param(lambda: masks.padding(3), lambda nq, nk: O.padding_allowed(nq, nk, 3), id="padding-3"),
    pytest.param(
        lambda: masks.padding(np.array([2, 0, 9])),
        lambda nq, nk: O.padding_allowed(nq, nk, [2, 0, 9]),
        id="padding-per-batch",
    ),
    pytest.param(
        lambda: masks.padding(np.array([4, 9]), q_lengths=np.array([1, 6])),
        lambda nq, nk: O.padding_allowed(nq, nk, [4, 9], [1, 6]),
        id="padding-q-lengths",
    ),
    pytest.param(lambda: masks.prefix_lm(2), lambda nq, nk: O.prefix_lm_allowed(nq, nk, 2), id="prefix-lm-2"),
    pytest.param(
        lambda: masks.global_tokens([0, 3]), lambda nq, nk: O.global_tokens_allowed(nq, nk, [0, 3]), id="global-tokens"
    ),
    pytest.param(lambda: masks.dilated(2, 3), lambda nq, nk: O.dilated_allowed(nq, nk, 2, 3), id="dilated-2-3"),
    pytest.param(lambda: masks.dilated(3, 1), lambda nq, nk: O.dilated_allowed(nq, nk, 3, 1), id="dilated-3-1"),
]


@pytest.mark.parametrize("build,definition", CONSTRUCTORS)
def test_constructor_dense_at_odd_sizes(build, definition):
    for nq, nk in SIZES:
        assert_dense_equal(build(), nq, nk, definition(nq, nk))


def test_padding_shapes():
    assert masks.padding(3).dense(4, 5).shape[-2:] == (4, 5)
    assert np.broadcast_shapes(masks.padding(3).dense(4, 5).shape, (4, 5)) == (4, 5)
    assert masks.padding(np.array([3, 4])).dense(4, 5).shape == (2, 1, 4, 5)


def test_document_per_batch_shape():
    assert masks.document(np.array([[0, 0, 1], [0, 1, 1]])).dense(3, 3).shape == (2, 1, 3, 3)


def test_from_fn_gets_index_columns_and_rows():
    seen = []

    def fn(i, j):
        seen.append((np.shape(i), np.shape(j)))
        return (i - j) % 4 == 1

    assert_dense_equal(masks.from_fn(fn), 6, 9, O._grid(6, 9, lambda i, j: (i - j) % 4 == 1))
    assert (np.broadcast_shapes(*seen[0]), seen[0]) == ((6, 9), ((6, 1), (1, 9)))


# --------------------------------------------------------------------------- combinators


def test_and_or_not_follow_the_definitions():
    a, b = masks.sliding_window(3, causal=False), masks.prefix_lm(2)
    da, db = O.sliding_window_allowed(6, 9, 3, causal=False), O.prefix_lm_allowed(6, 9, 2)
    assert_dense_equal(a & b, 6, 9, da & db)
    assert_dense_equal(a | b, 6, 9, da | db)
    assert_dense_equal(~a, 6, 9, ~da)
    assert_dense_equal(~(a & ~b) | masks.causal(offset=-4), 6, 9, ~(da & ~db) | O.causal_allowed(6, 9, -4))


def test_combinator_with_a_batched_mask_broadcasts():
    pad = masks.padding(np.array([2, 7]), q_lengths=np.array([4, 1]))
    assert_dense_equal(
        pad | masks.global_tokens([0]),
        4,
        7,
        O.padding_allowed(4, 7, [2, 7], [4, 1]) | O.global_tokens_allowed(4, 7, [0]),
    )


# --------------------------------------------------------------------------- random blocks (BigBird)


@pytest.mark.parametrize("nq,nk,block,per_row", [(8, 8, 2, 2), (10, 13, 4, 2), (9, 9, 3, 1), (6, 11, 4, 10)])
def test_random_blocks_properties(nq, nk, block, per_row):
    dense = np.broadcast_to(masks.random_blocks(block, per_row, seed=7).dense(nq, nk), (nq, nk))
    n_kb = -(-nk // block)
    for qb in range(-(-nq // block)):
        rows = dense[qb * block : (qb + 1) * block]
        assert (rows == rows[0]).all(), f"rows of query block {qb} differ"
        chosen = [kb for kb in range(n_kb) if rows[0, kb * block : (kb + 1) * block].all()]
        assert len(chosen) == min(per_row, n_kb), f"query block {qb} attends key blocks {chosen}"
        expected = np.zeros(nk, dtype=bool)
        for kb in chosen:
            expected[kb * block : (kb + 1) * block] = True
        assert (rows[0] == expected).all(), f"query block {qb}: cells outside whole key blocks"


def test_random_blocks_are_deterministic_in_the_seed():
    a = masks.random_blocks(4, 2, seed=1).dense(64, 64)
    assert (a == masks.random_blocks(4, 2, seed=1).dense(64, 64)).all()
    assert (a == masks.random_blocks(4, 2, seed=1).dense(64, 64)).all()
    assert any((a != masks.random_blocks(4, 2, seed=s).dense(64, 64)).any() for s in (2, 3))


def test_random_blocks_attention_is_reproducible(rng):
    q, k, v = rng.standard_normal((3, 1, 2, 12, 4))
    m = masks.random_blocks(3, 2, seed=5)
    o1 = qkv.attention(q, k, v, mask=m)
    o2 = qkv.attention(q, k, v, mask=masks.random_blocks(3, 2, seed=5))
    assert (o1 == o2).all()
    np.testing.assert_allclose(o1, O.attention_oracle(q, k, v, allowed=m.dense(12, 12))[0], rtol=0, atol=1e-12)


# --------------------------------------------------------------------------- blocks()


def test_block_constants():
    assert (masks.EMPTY, masks.PARTIAL, masks.FULL) == (0, 1, 2)


TILES = [(1, 1), (2, 3), (3, 2), (4, 4), (16, 16)]


def check_blocks(mask, dense, block_q, block_k, exact):
    truth = O.tile_classes(dense, block_q, block_k)
    got = np.asarray(mask.blocks(dense.shape[-2], dense.shape[-1], block_q, block_k))
    assert got.shape[-2:] == truth.shape[-2:], f"blocks() shape {got.shape}, tiles {truth.shape}"
    shape = np.broadcast_shapes(got.shape, truth.shape)
    assert shape == truth.shape, f"blocks() shape {got.shape} does not broadcast to {truth.shape}"
    got = np.broadcast_to(got, shape)
    assert np.isin(got, [0, 1, 2]).all()
    bad_empty = np.argwhere((got == 0) & (truth != 0))
    bad_full = np.argwhere((got == 2) & (truth != 2))
    assert bad_empty.size == 0, f"tiles reported EMPTY hold allowed cells: {bad_empty[:5].tolist()}"
    assert bad_full.size == 0, f"tiles reported FULL hold hidden cells: {bad_full[:5].tolist()}"
    if exact:
        bad = np.argwhere(got != truth)
        assert bad.size == 0, (
            f"inexact tiles {bad[:5].tolist()}: got {got[tuple(bad[0])]}, "
            f"true {truth[tuple(bad[0])]}\ngot\n{got}\ntrue\n{truth}"
        )


@pytest.mark.parametrize("case", [c.param() for c in MASK_CASES])
def test_blocks_match_a_brute_force_tiling(case):
    mask = case.build(masks)
    dense = np.asarray(case.oracle(case.nq, case.nk, masks), dtype=bool)
    for block_q, block_k in TILES:
        check_blocks(mask, dense, block_q, block_k, case.exact_blocks)


@pytest.mark.parametrize("build,definition", CONSTRUCTORS[:11])
def test_blocks_of_plain_constructors_are_exact_at_odd_sizes(build, definition):
    for nq, nk in SIZES + [(37, 53), (64, 64)]:
        for block_q, block_k in [(2, 3), (4, 4), (8, 16), (5, 7)]:
            check_blocks(build(), definition(nq, nk), block_q, block_k, exact=True)


def test_blocks_at_131072_are_analytic():
    """causal and sliding-window blocks of a 131072 x 131072 mask in 128-tiles: under 2 s each,
    in a process that cannot allocate N² memory (address space capped at 3 GiB)."""
    script = textwrap.dedent("""
        import json, resource, time
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
        import numpy as np
        from qkv import masks
        n, b = 131072, 128
        result = {}
        for name, mask, size in [("causal", masks.causal(), None), ("sliding", masks.sliding_window(1000), 1000)]:
            t = time.perf_counter()
            try:
                got = np.asarray(mask.blocks(n, n, b, b))
            except MemoryError:
                result[name] = {"error": "MemoryError"}
                continue
            seconds = time.perf_counter() - t
            a = np.arange(n // b)
            dmin = (a[:, None] - a[None, :]) * b - (b - 1)   # p - j over tile (row a, col c)
            dmax = dmin + 2 * (b - 1)
            hi = n if size is None else size - 1
            expected = np.where((dmin >= 0) & (dmax <= hi), 2, np.where((dmax < 0) | (dmin > hi), 0, 1))
            ok_shape = got.shape[-2:] == expected.shape and got.size == expected.size
            mismatches = int((got.reshape(expected.shape) != expected).sum()) if ok_shape else -1
            result[name] = {"seconds": seconds, "shape": list(got.shape), "mismatches": mismatches}
        print(json.dumps(result))
    """)
    env = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    for name, r in result.items():
        assert "error" not in r, f"{name}: {r}"
        assert r["mismatches"] == 0, f"{name}: {r}"
        assert r["seconds"] < 2.0, f"{name}: blocks() took {r['seconds']:.2f} s"


# --------------------------------------------------------------------------- repr, errors


def test_repr_is_a_small_text_picture():
    pictures = [
        repr(m)
        for m in (masks.causal(), ~masks.causal(), masks.sliding_window(1), masks.causal() | masks.global_tokens([0]))
    ]
    for p in pictures:
        assert isinstance(p, str) and p.count("\n") >= 2 and len(p) < 4000, p
    assert len(set(pictures)) == len(pictures), "different masks draw the same picture"


@pytest.mark.parametrize("bad", [np.ones(5, dtype=bool), np.ones((), dtype=bool)], ids=["1-d", "0-d"])
def test_from_dense_rejects_fewer_than_two_axes(bad):
    with pytest.raises(qkv.errors.MaskError, match="(?i)shape|axes|dim"):
        masks.from_dense(bad).dense(1, 5)


def test_from_dense_rejects_a_wrong_size():
    m = masks.from_dense(np.ones((3, 4), dtype=bool))
    with pytest.raises(qkv.errors.MaskError, match=r"\(3, 4\)"):
        m.dense(5, 4)
    with pytest.raises(qkv.errors.MaskError, match=r"\(3, 4\)"):
        qkv.attention(np.ones((1, 5, 2)), np.ones((1, 4, 2)), np.ones((1, 4, 2)), mask=m)


def test_causal_offsets_beyond_the_sequence_show_or_hide_everything_without_overflow(impl, rng):
    q, k, v = make_qkv(rng, (1, 3, 2), (1, 4, 2))
    for offset, allowed in (
        (10**30, np.ones((3, 4), bool)),
        (-(10**30), np.zeros((3, 4), bool)),
        (4, np.ones((3, 4), bool)),
        (-3, np.zeros((3, 4), bool)),
    ):
        m = masks.causal(offset)
        np.testing.assert_array_equal(m.dense(3, 4), allowed)
        expected = O.attention_oracle(q, k, v, allowed=allowed)
        check_against_oracle(impl.attention(q, k, v, mask=m), expected)


def test_empty_global_tokens_add_nothing():
    m = masks.sliding_window(2) | masks.global_tokens([])
    np.testing.assert_array_equal(m.dense(5, 5), masks.sliding_window(2).dense(5, 5))
    np.testing.assert_array_equal(m.blocks(5, 5, 2, 2), masks.sliding_window(2).blocks(5, 5, 2, 2))


@pytest.mark.parametrize(
    ("build", "words"),
    [
        (lambda: masks.random_blocks(4, 1, -1), "seed must be an integer >= 0"),
        (lambda: masks.random_blocks(2**64, 1, 0), "block must be at most"),
        (lambda: masks.dilated(3, 2**64), "dilation must be at most"),
        (lambda: masks.sliding_window(2**40), "size must be at most"),
    ],
)
def test_mask_parameters_out_of_range_raise_mask_errors(build, words):
    with pytest.raises(MaskError, match=words):
        build()
