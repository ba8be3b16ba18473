"""Every impl against the float64 loop oracle on named awkward cases, plus a property test."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import oracle as O
import qkv
from helpers import HAS_TORCH, MASK_CASES, RUNNERS, SCORE_CASES, check_against_oracle, make_qkv

SHAPE_CASES = [
    pytest.param((2, 4, 5, 8), (1, 4, 7, 8), (1, 4, 7, 8), id="broadcast-batch-k-v"),
    pytest.param((1, 4, 5, 8), (3, 4, 7, 8), (3, 4, 7, 8), id="broadcast-batch-q"),
    pytest.param((3, 2, 4, 6), (2, 4, 6), (2, 4, 6), id="k-v-fewer-leading-axes"),
    pytest.param((2, 3, 2, 4, 5), (2, 1, 2, 6, 5), (1, 3, 2, 6, 5), id="five-dims-mixed-broadcast"),
    pytest.param((2, 8, 5, 16), (2, 2, 9, 16), (2, 2, 9, 16), id="gqa-4-per-kv-head"),
    pytest.param((2, 6, 1, 32), (2, 1, 13, 32), (2, 1, 13, 32), id="mqa-decode"),
    pytest.param((1, 4, 11, 8), (1, 4, 3, 8), (1, 4, 3, 8), id="nq>nk"),
    pytest.param((1, 2, 1, 4), (1, 2, 1, 4), (1, 2, 1, 4), id="one-query-one-key"),
    pytest.param((2, 2, 4, 1), (2, 2, 6, 1), (2, 2, 6, 1), id="dk-1"),
    pytest.param((2, 2, 7, 3), (2, 2, 5, 3), (2, 2, 5, 3), id="dk-3"),
    pytest.param((1, 2, 5, 33), (1, 2, 9, 33), (1, 2, 9, 33), id="dk-33"),
    pytest.param((1, 2, 5, 4), (1, 2, 9, 4), (1, 2, 9, 11), id="dv>dk"),
    pytest.param((1, 2, 5, 12), (1, 2, 9, 12), (1, 2, 9, 1), id="dv-1"),
]


@pytest.mark.parametrize("q_shape,k_shape,v_shape", SHAPE_CASES)
def test_every_impl_matches_the_oracle_on_awkward_shapes(q_shape, k_shape, v_shape, impl, rng):
    q, k, v = make_qkv(rng, q_shape, k_shape, v_shape)
    check_against_oracle(impl.attention(q, k, v), O.attention_oracle(q, k, v))


@pytest.mark.parametrize("q_shape,k_shape,v_shape", SHAPE_CASES[:2] + SHAPE_CASES[4:7])
def test_every_impl_matches_the_oracle_with_causal(q_shape, k_shape, v_shape, impl, rng):
    q, k, v = make_qkv(rng, q_shape, k_shape, v_shape)
    allowed = O.causal_allowed(q_shape[-2], k_shape[-2])
    check_against_oracle(impl.attention(q, k, v, causal=True), O.attention_oracle(q, k, v, allowed=allowed))


@pytest.mark.parametrize("case", [c.param() for c in MASK_CASES])
def test_every_mask_kind_matches_the_oracle(case, impl, rng):
    q, k, v = make_qkv(rng, (2, 4, case.nq, 5), (2, 2, case.nk, 5), (2, 2, case.nk, 3))
    mask = case.build(qkv.masks)
    allowed = case.oracle(case.nq, case.nk, qkv.masks)
    check_against_oracle(impl.attention(q, k, v, mask=mask), O.attention_oracle(q, k, v, allowed=allowed))


@pytest.mark.parametrize(
    "case",
    [c.param() for c in MASK_CASES if c.id in ("causal-square", "padding-q-lengths", "longformer", "from-dense")],
)
def test_mask_object_and_its_dense_bool_array_agree(case, impl, rng):
    q, k, v = make_qkv(rng, (2, 4, case.nq, 5), (2, 2, case.nk, 5), (2, 2, case.nk, 3))
    allowed = case.oracle(case.nq, case.nk, qkv.masks)
    check_against_oracle(impl.attention(q, k, v, mask=np.array(allowed)), O.attention_oracle(q, k, v, allowed=allowed))


def test_complement_of_a_mask_matches_the_oracle(impl, rng):
    q, k, v = make_qkv(rng, (2, 2, 6, 4), (2, 2, 8, 4))
    mask = ~(qkv.masks.sliding_window(3) | qkv.masks.global_tokens([2]))
    allowed = ~(O.sliding_window_allowed(6, 8, 3) | O.global_tokens_allowed(6, 8, [2]))
    check_against_oracle(impl.attention(q, k, v, mask=mask), O.attention_oracle(q, k, v, allowed=allowed))


def test_float_bias_with_minus_inf_and_causal(impl, rng):
    q, k, v = make_qkv(rng, (2, 2, 5, 4), (2, 2, 7, 4))
    bias = 2 * rng.standard_normal((2, 1, 5, 7))
    bias[0, 0, 3, :5] = -np.inf
    allowed = O.causal_allowed(5, 7)
    check_against_oracle(
        impl.attention(q, k, v, mask=bias, causal=True), O.attention_oracle(q, k, v, allowed=allowed, bias=bias)
    )


def test_bool_mask_array_per_head(impl, rng):
    q, k, v = make_qkv(rng, (2, 4, 5, 4), (2, 2, 6, 4))
    mask = rng.random((4, 5, 6)) < 0.5  # broadcast over batch, one pattern per query head
    mask[1, 2] = False
    check_against_oracle(impl.attention(q, k, v, mask=mask), O.attention_oracle(q, k, v, allowed=mask))


def test_every_row_empty(impl, rng):
    q, k, v = make_qkv(rng, (1, 2, 3, 4), (1, 2, 5, 4))
    res = impl.attention(q, k, v, mask=np.zeros((3, 5), dtype=bool))
    check_against_oracle(res, O.attention_oracle(q, k, v, allowed=np.zeros((3, 5), dtype=bool)))


def test_large_scores_are_stable(impl, rng):
    q, k, v = make_qkv(rng, (1, 2, 4, 6), (1, 2, 5, 6))
    check_against_oracle(impl.attention(q, k, v, scale=300.0), O.attention_oracle(q, k, v, scale=300.0))


@pytest.mark.parametrize("case", [c.param() for c in SCORE_CASES])
def test_every_score_mod_matches_the_oracle(case, impl, rng):
    nq, nk = 5, 7
    q, k, v = make_qkv(rng, (2, case.h, nq, 4), (2, case.hkv, nk, 4))
    kw = {} if case.scale is None else {"scale": case.scale}
    res = impl.attention(q, k, v, score_mod=case.build(qkv.scores), nonadditive=not case.additive, **kw)
    check_against_oracle(res, O.attention_oracle(q, k, v, score_fn=case.oracle(), **kw))


@pytest.mark.parametrize(
    "case",
    [c.param() for c in SCORE_CASES if c.id in ("alibi-n-heads-4", "relative-bias-per-head", "alibi-then-softcap")],
)
def test_score_mod_with_nq_gt_nk_and_causal(case, impl, rng):
    nq, nk = 7, 4
    q, k, v = make_qkv(rng, (1, case.h, nq, 4), (1, case.hkv, nk, 4))
    kw = {} if case.scale is None else {"scale": case.scale}
    res = impl.attention(q, k, v, score_mod=case.build(qkv.scores), causal=True, nonadditive=not case.additive, **kw)
    golden = O.attention_oracle(q, k, v, score_fn=case.oracle(), allowed=O.causal_allowed(nq, nk), **kw)
    check_against_oracle(res, golden)


def test_order_score_mod_then_bias_then_mask(impl, rng):
    """softcap acts on the scaled scores before the float bias is added: a +5 bias is not capped."""
    q, k, v = make_qkv(rng, (1, 2, 4, 3), (1, 2, 6, 3))
    bias = np.zeros((4, 6))
    bias[:, 1] = 5.0
    bias[2, 4] = -np.inf
    golden = O.attention_oracle(
        q, k, v, score_fn=O.softcap_score(1.0), bias=bias, scale=2.0, allowed=O.causal_allowed(4, 6)
    )
    res = impl.attention(
        q, k, v, score_mod=qkv.scores.softcap(1.0), mask=bias, causal=True, scale=2.0, nonadditive=True
    )
    check_against_oracle(res, golden)
    capped_bias = O.attention_oracle(
        q, k, v, score_fn=lambda s, *a: np.tanh(s + bias[a[1]]), scale=2.0, allowed=O.causal_allowed(4, 6)
    )[0]
    assert np.abs(golden[0] - capped_bias).max() > 1e-3  # the two orders are distinguishable


# --------------------------------------------------------------------------- property test

IMPL_IDS = [r.id for r in RUNNERS if HAS_TORCH or not r.torch]


@st.composite
def attention_problems(draw):
    batch = draw(st.sampled_from([(), (1,), (2,), (2, 1)]))
    hkv = draw(st.sampled_from([1, 2]))
    h = hkv * draw(st.sampled_from([1, 2, 3]))
    nq, nk = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    dk, dv = draw(st.integers(1, 9)), draw(st.integers(1, 6))
    # each of k, v may drop or collapse the batch axes (they broadcast)
    kv_batch = draw(st.sampled_from([batch, tuple(1 for _ in batch), batch[1:]]))
    mask_kind = draw(st.sampled_from(["none", "bool", "bias", "causal", "window", "bool+causal"]))
    scale = draw(st.sampled_from([None, 1.0, 0.37]))
    seed = draw(st.integers(0, 2**31 - 1))
    return batch, h, hkv, nq, nk, dk, dv, kv_batch, mask_kind, scale, seed


@pytest.mark.parametrize("impl_id", IMPL_IDS)
@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=attention_problems())
def test_property_every_impl_matches_the_oracle(impl_id, problem):
    batch, h, hkv, nq, nk, dk, dv, kv_batch, mask_kind, scale, seed = problem
    runner = next(r for r in RUNNERS if r.id == impl_id)
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(batch + (h, nq, dk))
    k = rng.standard_normal(kv_batch + (hkv, nk, dk))
    v = rng.standard_normal(kv_batch + (hkv, nk, dv))
    kw, allowed, bias = {"scale": scale}, None, None
    if mask_kind in ("bool", "bool+causal"):
        allowed = rng.random((nq, nk)) < 0.6
        kw["mask"] = allowed
    if mask_kind == "bias":
        bias = rng.standard_normal((h, nq, nk))
        kw["mask"] = bias
    if mask_kind in ("causal", "bool+causal"):
        kw["causal"] = True
        allowed = O.causal_allowed(nq, nk) if allowed is None else allowed & O.causal_allowed(nq, nk)
    if mask_kind == "window":
        kw["mask"] = qkv.masks.sliding_window(2)
        allowed = O.sliding_window_allowed(nq, nk, 2)
    check_against_oracle(
        runner.attention(q, k, v, **kw), O.attention_oracle(q, k, v, allowed=allowed, bias=bias, scale=scale)
    )
