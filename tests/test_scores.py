"""qkv.scores beyond the oracle sweep: ALiBi's default slopes, chaining order and associativity."""

import numpy as np
import pytest

import oracle as O
import qkv
from helpers import check_against_oracle, make_qkv


@pytest.mark.parametrize("n_heads", [1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32])
def test_alibi_slopes_follow_the_paper(n_heads):
    positional = pytest.importorskip("qkv.positional")
    got = np.asarray(positional.alibi_slopes(n_heads), dtype=np.float64)
    np.testing.assert_allclose(got, O.alibi_slopes(n_heads), rtol=1e-12, atol=0)


def test_oracle_alibi_slopes_known_values():
    """The independent slopes themselves: 8 heads give 1/2, 1/4, ..., 1/256 (arXiv:2108.12409)."""
    np.testing.assert_allclose(O.alibi_slopes(8), [2.0**-k for k in range(1, 9)], rtol=1e-15)
    np.testing.assert_allclose(O.alibi_slopes(6), [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3], rtol=1e-15)


def test_alibi_default_takes_the_heads_from_the_scores(impl, rng):
    q, k, v = make_qkv(rng, (1, 6, 4, 3), (1, 2, 7, 3))
    res = impl.attention(q, k, v, score_mod=qkv.scores.alibi())
    check_against_oracle(res, O.attention_oracle(q, k, v, score_fn=O.alibi_score(O.alibi_slopes(6))))


def test_chaining_is_associative_and_ordered(impl, rng):
    q, k, v = make_qkv(rng, (1, 4, 5, 3), (1, 4, 6, 3))
    s = qkv.scores
    a, b, c = s.alibi(n_heads=4), s.temperature(0.7), s.softcap(2.0)
    golden = O.attention_oracle(
        q,
        k,
        v,
        scale=1.0,
        score_fn=O.chain_scores(O.alibi_score(O.alibi_slopes(4)), O.temperature_score(0.7), O.softcap_score(2.0)),
    )
    for mod in ((a + b) + c, a + (b + c)):
        check_against_oracle(impl.attention(q, k, v, score_mod=mod, scale=1.0, nonadditive=True), golden)
    swapped = O.attention_oracle(
        q,
        k,
        v,
        scale=1.0,
        score_fn=O.chain_scores(O.softcap_score(2.0), O.temperature_score(0.7), O.alibi_score(O.alibi_slopes(4))),
    )[0]
    assert np.abs(golden[0] - swapped).max() > 1e-3  # order matters, so the check above can fail
