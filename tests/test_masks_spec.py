"""Masks by name (``qkv.masks.spec``): every kind equals the ``qkv.masks`` composition built by
hand, the CLI spec syntax parses to typed values, and bad kinds, parameters and values raise
``ArgumentError`` naming them."""

import numpy as np
import pytest

from qkv import masks
from qkv.errors import ArgumentError
from qkv.masks.spec import MASK_KINDS, MASK_PARAMS, build_mask, parse_mask_spec


def dense(m, nq, nk):
    return np.broadcast_to(m.dense(nq, nk), (nq, nk))


def test_the_kinds_and_their_parameter_table():
    assert MASK_KINDS == (
        "none",
        "causal",
        "sliding_window",
        "document",
        "padding",
        "prefix_lm",
        "longformer",
        "bigbird",
        "dilated",
        "chunked",
    )
    assert set(MASK_PARAMS) == set(MASK_KINDS)
    assert build_mask("none", 4, 4) is None
    for kind in MASK_KINDS[1:]:  # every kind builds with its defaults, on square and bottom-right shapes
        for nq, nk in ((8, 8), (3, 8)):
            a = dense(build_mask(kind, nq, nk), nq, nk)
            assert a.shape == (nq, nk) and a.dtype == bool and a.any()


@pytest.mark.parametrize(
    ("kind", "params", "expected"),
    [
        ("causal", {}, masks.causal()),
        ("causal", {"offset": 0}, masks.causal(0)),
        ("sliding_window", {}, masks.sliding_window(4)),
        ("sliding_window", {"window": 2, "causal": False}, masks.sliding_window(2, causal=False)),
        ("document", {"doc_lengths": (3, 5)}, masks.document(np.array([0, 0, 0, 1, 1, 1, 1, 1]))),
        (
            "document",
            {"n_docs": 3, "causal": True},
            masks.document(np.array([0, 0, 0, 1, 1, 1, 2, 2])) & masks.causal(),
        ),
        ("padding", {}, masks.padding(6)),
        ("padding", {"kv_length": 5, "q_length": 2}, masks.padding(5, 2)),
        ("prefix_lm", {}, masks.prefix_lm(4)),
        ("prefix_lm", {"prefix": 2}, masks.prefix_lm(2)),
        ("longformer", {}, masks.sliding_window(3, causal=False) | masks.global_tokens([0])),
        (
            "longformer",
            {"window": 2, "global_tokens": (0, 7), "causal": True},
            (masks.sliding_window(2, causal=False) | masks.global_tokens([0, 7])) & masks.causal(),
        ),
        (
            "bigbird",
            {"block": 2, "per_row": 2, "seed": 5},
            masks.sliding_window(3, causal=False) | masks.global_tokens([0]) | masks.random_blocks(2, 2, 5),
        ),
        ("dilated", {}, masks.dilated(2, 2)),
        ("dilated", {"window": 3, "dilation": 1, "causal": True}, masks.dilated(3, 1) & masks.causal()),
        ("chunked", {}, masks.chunked(4)),
        ("chunked", {"size": 3, "offset": 0}, masks.chunked(3, offset=0)),
    ],
)
def test_each_kind_equals_the_masks_built_directly(kind, params, expected):
    for nq in (8, 5):
        np.testing.assert_array_equal(dense(build_mask(kind, nq, 8, **params), nq, 8), dense(expected, nq, 8))


def test_chunked_cells_by_hand():
    # query i at position i + offset sees keys j <= position within the position's chunk of `size`
    a = dense(build_mask("chunked", 6, 6, size=3), 6, 6)
    expected = np.array([[j <= i and j // 3 == i // 3 for j in range(6)] for i in range(6)])
    np.testing.assert_array_equal(a, expected)
    b = dense(build_mask("chunked", 2, 6, size="2", offset="none"), 2, 6)  # text form; bottom-right
    np.testing.assert_array_equal(b, [[0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 1, 1]])
    with pytest.raises(ArgumentError, match="'chunked' parameter 'size' must be >= 1"):
        build_mask("chunked", 4, 4, size=0)


def test_document_cells_by_hand():
    a = dense(build_mask("document", 5, 5, doc_lengths=[2, 3]), 5, 5)
    expected = np.zeros((5, 5), bool)
    expected[:2, :2] = expected[2:, 2:] = True
    np.testing.assert_array_equal(a, expected)


def test_text_values_are_accepted_like_parsed_ones():
    a = build_mask("longformer", 8, 8, window="2", global_tokens="0+7", causal="true")
    b = build_mask("longformer", 8, 8, window=2, global_tokens=[0, 7], causal=True)
    np.testing.assert_array_equal(a.dense(8, 8), b.dense(8, 8))


def test_size_dependent_defaults_echoed_back_mean_the_default():
    for kind in ("padding", "prefix_lm"):
        name, p = next(iter(MASK_PARAMS[kind].items()))
        assert isinstance(p.default, str)
        np.testing.assert_array_equal(
            build_mask(kind, 8, 8, **{name: p.default}).dense(8, 8), build_mask(kind, 8, 8).dense(8, 8)
        )


def test_parse_mask_spec():
    assert parse_mask_spec("causal") == ("causal", {})
    assert parse_mask_spec(" sliding_window:window=4,causal=false ") == (
        "sliding_window",
        {"window": 4, "causal": False},
    )
    assert parse_mask_spec("document:doc_lengths=3+5") == ("document", {"doc_lengths": (3, 5)})
    assert parse_mask_spec("causal:offset=none") == ("causal", {"offset": None})
    assert parse_mask_spec("causal:offset=-2") == ("causal", {"offset": -2})
    assert parse_mask_spec("bigbird:global_tokens=0+1,seed=3,causal=yes") == (
        "bigbird",
        {"global_tokens": (0, 1), "seed": 3, "causal": True},
    )
    kind, params = parse_mask_spec("padding:kv_length=3")
    np.testing.assert_array_equal(build_mask(kind, 4, 4, **params).dense(4, 4), masks.padding(3).dense(4, 4))


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("", ["empty mask spec", "causal"]),
        ("flash", ["unknown mask kind 'flash'", "sliding_window", "bigbird"]),
        ("causal:window=3", ["mask 'causal' has no parameter 'window'", "allowed: offset"]),
        ("none:window=3", ["mask 'none' has no parameter 'window'"]),
        ("sliding_window:window", ["expected key=value", "'window'"]),
        ("sliding_window:window=four", ["'sliding_window' parameter 'window' must be an integer", "'four'"]),
        ("sliding_window:causal=maybe", ["parameter 'causal' must be true or false"]),
        ("sliding_window:window=2,window=3", ["'window' given twice"]),
        ("document:doc_lengths=3+x", ["'doc_lengths' must be an integer"]),
    ],
)
def test_parse_errors_name_the_problem(spec, words):
    with pytest.raises(ArgumentError) as e:
        parse_mask_spec(spec)
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize(
    ("kind", "params", "words"),
    [
        ("sliding_window", {"window": 0}, ["'window' must be >= 1, got 0"]),
        ("document", {"doc_lengths": (3, 4)}, ["summing to Nk=8", "3+4"]),
        ("document", {"n_docs": 9}, ["'n_docs' must be in 1..8"]),
        ("padding", {"kv_length": 9}, ["'kv_length' must be in 1..8, got 9"]),
        ("padding", {"q_length": 9}, ["'q_length' must be in 0..8"]),
        ("prefix_lm", {"prefix": -1}, ["'prefix' must be in 0..8"]),
        ("longformer", {"global_tokens": (8,)}, ["'global_tokens' must be in 0..7, got 8"]),
        ("bigbird", {"block": 0}, ["'block' must be >= 1"]),
        ("dilated", {"dilation": 0}, ["'dilation' must be >= 1"]),
        ("causal", {"offset": 1.5}, ["'offset' must be an integer, got 1.5"]),
        ("sliding_window", {"window": True}, ["must be an integer, got True"]),
        ("nope", {}, ["unknown mask kind 'nope'"]),
    ],
)
def test_build_errors_name_kind_parameter_and_allowed_values(kind, params, words):
    with pytest.raises(ArgumentError) as e:
        build_mask(kind, 8, 8, **params)
    for w in words:
        assert w in str(e.value)


def test_bad_sizes():
    with pytest.raises(ArgumentError, match="n_q must be an integer >= 1, got 0"):
        build_mask("causal", 0, 4)
    with pytest.raises(ArgumentError, match="'document' needs Nq <= Nk"):
        build_mask("document", 5, 4)
