"""``qkv.explain``: every step against numbers computed by hand, the float64 oracle or finite differences."""

import dataclasses
import json
import math
import re
import warnings

import numpy as np
import pytest

import oracle as O
import qkv
from helpers import HAS_TORCH, assert_close, make_qkv
from qkv import masks, scores
from qkv.errors import ArgumentError, ShapeError

BUILTIN_V = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
LIT_Q = np.array([[1.0, 0.0], [0.0, 1.0]])
LIT_K = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
LIT_V = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])


def builtin_by_hand():
    """The built-in example worked out on paper: S = QKᵀ = [[1, 1, 0], [0, 1, 1]], scale 1/√2."""
    e = math.exp(1 / math.sqrt(2))
    z = 2 * e + 1
    a = np.array([[e, e, 1], [1, e, e]]) / z
    out = np.array([[(e + 1) / z, 2 * e / z + 1 / z], [(1 + e) / z, 2 * e / z + e / z]])  # rows of A V
    entropy = -(2 * (e / z) * math.log(e / z) + (1 / z) * math.log(1 / z))
    return a, out, entropy, math.log(z)


def test_builtin_example_reproduces_the_worked_numbers():
    t = qkv.explain()
    a, out, entropy, lse = builtin_by_hand()
    assert_close(t["S"].value, [[1, 1, 0], [0, 1, 1]], name="S")
    assert_close(t["S_scaled"].value, np.array([[1, 1, 0], [0, 1, 1]]) / math.sqrt(2), name="S_scaled")
    assert_close(t["row_max"].value, [1 / math.sqrt(2)] * 2, name="row_max")
    assert_close(t.weights, a, name="A")
    assert_close(t.out, out, name="O")
    np.testing.assert_allclose(t.out, [[0.5989, 1.0000], [0.5989, 1.2033]], atol=5e-5)
    assert_close(t["row_sum"].value, [1.0, 1.0], name="row sums")
    assert_close(t["entropy"].value, [entropy, entropy], name="entropy")
    assert_close(t.lse, [lse, lse], name="lse")
    assert t.names == ("Q", "K", "V", "S", "S_scaled", "row_max", "A", "row_sum", "entropy", "O", "lse")
    assert t["V"].value.tolist() == BUILTIN_V.tolist()
    assert t.options["example"] and t.options["default_scale"] and t.grads is None
    assert "0.7071" in t["S_scaled"].formula  # the scale value is shown


def test_literature_example_with_scale_one_and_identity_upstream_gradient():
    t = qkv.explain(LIT_Q, LIT_K, LIT_V, scale=1.0, dout=np.eye(2))
    e = math.e
    a = np.array([[e, 1, e], [1, e, e]]) / (2 * e + 1)
    assert_close(t.weights, a, name="A")
    np.testing.assert_allclose(t.weights, [[0.4223, 0.1554, 0.4223], [0.1554, 0.4223, 0.4223]], atol=5e-5)
    # the literature prints 3.533 / 4.533, truncated: the exact value is (1 + 8e) / (2e + 1) = 3.53391...
    np.testing.assert_allclose(t.out, [[3.000, 4.000], [3.533, 4.533]], atol=1e-3)
    z = 2 * e + 1
    assert_close(t.out, [[3.0, 4.0], [(1 + 8 * e) / z, (2 + 10 * e) / z]], name="O")  # rows of A V on paper
    dq, dk, dv = t.grads
    assert_close(dv, a.T, name="dV")  # dO = I  ->  dV = Aᵀ
    np.testing.assert_allclose(dv, [[0.4223, 0.1554], [0.1554, 0.4223], [0.4223, 0.4223]], atol=5e-5)
    assert t["S_scaled"].formula.endswith("(scale = 1.0000)") and not t.options["default_scale"]


def test_causal_trace_shows_minus_inf_and_zero_weight():
    t = qkv.explain(causal=True)
    s = t["S_masked"].value
    assert np.isneginf(s[0, 2]) and np.isfinite(s[1]).all()  # Nq=2, Nk=3 bottom-right: query 0 sees keys 0, 1
    assert_close(t.weights, [[0.5, 0.5, 0.0], builtin_by_hand()[0][1]], name="A")
    assert "-inf" in str(t)
    assert t.options["mask"] == "causal" and t.options["causal"]
    assert t.names.index("S_scaled") < t.names.index("S_masked") < t.names.index("A")


def test_empty_rows_give_zero_sum_zero_entropy_and_no_warning(rng):
    q, k, v = make_qkv(rng, (2, 3, 4), (2, 5, 4), (2, 5, 3))
    mask = np.ones((3, 5), dtype=bool)
    mask[1] = False  # query 1 may attend nothing
    with warnings.catch_warnings(), np.errstate(divide="raise", invalid="raise", over="raise"):
        warnings.simplefilter("error")
        t = qkv.explain(q, k, v, mask=mask, grad=True)
        text, blob = str(t), json.dumps(t.to_dict())
    assert (t["row_sum"].value[:, 1] == 0).all() and (t["entropy"].value[:, 1] == 0).all()
    assert_close(t["row_sum"].value[:, [0, 2]], np.ones((2, 2)), name="row sums")
    assert np.isneginf(t["row_max"].value[:, 1]).all() and np.isneginf(t.lse[:, 1]).all()
    assert (t.out[:, 1] == 0).all() and (t["dS"].value[:, 1] == 0).all() and (t.grads[0][:, 1] == 0).all()
    assert not any(np.isnan(s.value).any() for s in t)
    assert "nan" not in text and '"nan"' not in blob


def test_entropy_is_zero_for_one_key_and_log_n_for_uniform_weights():
    q = np.zeros((2, 3))  # equal scores: uniform weights over all 4 keys
    k, v = np.ones((4, 3)), np.arange(8.0).reshape(4, 2)
    t = qkv.explain(q, k, v)
    assert_close(t["entropy"].value, [math.log(4)] * 2, name="entropy")
    one = np.zeros((2, 4), dtype=bool)
    one[:, 2] = True
    assert_close(qkv.explain(q, k, v, mask=one)["entropy"].value, [0.0, 0.0], name="entropy")


GRAD_CASES = [
    pytest.param((3, 4), (5, 4), (5, 2), {}, id="2d"),
    pytest.param((2, 4, 3, 3), (2, 2, 4, 3), (2, 2, 4, 2), {"causal": True}, id="gqa-causal"),
    pytest.param((1, 3, 2, 2), (2, 1, 4, 2), (2, 1, 4, 3), {"scale": 0.7}, id="mqa-broadcast-batch"),
    pytest.param((2, 3, 2), (2, 4, 2), (2, 4, 2), {"score_mod": "softcap", "bias": True}, id="softcap-bias"),
]


@pytest.mark.parametrize("q_shape,k_shape,v_shape,kw", GRAD_CASES)
def test_gradients_match_attention_backward_and_finite_differences(q_shape, k_shape, v_shape, kw, rng):
    q, k, v = make_qkv(rng, q_shape, k_shape, v_shape)
    kw, oracle_kw = dict(kw), {}
    if kw.pop("score_mod", None):
        kw["score_mod"], oracle_kw["score_fn"] = scores.softcap(1.5), O.softcap_score(1.5)
    if kw.pop("bias", None):
        kw["mask"] = oracle_kw["bias"] = rng.standard_normal((q_shape[-2], k_shape[-2]))
    if kw.get("causal"):
        oracle_kw["allowed"] = O.causal_allowed(q_shape[-2], k_shape[-2])
    if "scale" in kw:
        oracle_kw["scale"] = kw["scale"]
    golden_out, golden_a, golden_lse = O.attention_oracle(q, k, v, **oracle_kw)
    dout = rng.standard_normal(golden_out.shape)
    t = qkv.explain(q, k, v, dout=dout, **kw)
    assert_close(t.out, golden_out, name="O")
    assert_close(t.weights, golden_a, name="A")
    assert_close(t.lse, golden_lse, name="lse")
    grads = O.numerical_gradients(lambda *a: O.attention_oracle(*a, **oracle_kw)[0], [q, k, v], dout)
    out, lse = qkv.attention(q, k, v, return_lse=True, impl="reference", **kw)
    analytic = qkv.attention_backward(dout, q, k, v, out, lse, impl="reference", **kw)
    for name, got, fd, ref in zip(("dQ", "dK", "dV"), t.grads, grads, analytic, strict=True):
        assert got.shape == fd.shape, name
        assert_close(got, fd, tol=1e-6, name=f"{name} vs finite differences")
        assert_close(got, ref, tol=1e-12, name=f"{name} vs attention_backward")
    assert ("dS_mod" in t) == ("score_mod" in kw)


def test_backward_steps_follow_their_formulas_on_the_worked_example():
    t = qkv.explain(grad=True)
    a, out, _, _ = builtin_by_hand()
    do = np.ones((2, 2))
    da = do @ BUILTIN_V.T
    d = (do * out).sum(-1)
    ds = a * (da - d[:, None])
    assert_close(t["dO"].value, do, name="dO")
    assert_close(t["dV"].value, a.T @ do, name="dV")
    assert_close(t["dA"].value, da, name="dA")
    assert_close(t["D"].value, d, name="D")
    assert_close(t["dS"].value, ds, name="dS")
    k = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    assert_close(t["dQ"].value, ds @ k / math.sqrt(2), name="dQ")
    assert_close(t["dK"].value, ds.T @ np.eye(2) / math.sqrt(2), name="dK")


def test_score_mod_and_bias_steps_hold_their_values(rng):
    q, k, v = make_qkv(rng, (3, 2), (4, 2), (4, 2))
    bias = rng.standard_normal((3, 4))
    t = qkv.explain(q, k, v, mask=bias, score_mod=scores.softcap(2.0))
    scaled = (q @ k.T) / math.sqrt(2)
    assert_close(t["S_scaled"].value, scaled, name="S_scaled")
    assert_close(t["S_mod"].value, 2.0 * np.tanh(scaled / 2.0), name="S_mod")
    assert_close(t["S_bias"].value, 2.0 * np.tanh(scaled / 2.0) + bias, name="S_bias")
    assert t.options["score_mod"] == "softcap(2)" and t.options["bias"] and t.inputs["bias"] == (3, 4)


def test_to_dict_is_json_safe_and_round_trips_minus_inf():
    t = qkv.explain(causal=True, grad=True)
    d = json.loads(json.dumps(t.to_dict(), allow_nan=False))
    assert d["inputs"] == {"q": [2, 2], "k": [3, 2], "v": [3, 2]}
    assert d["options"]["causal"] is True and d["options"]["scale"] == pytest.approx(1 / math.sqrt(2))
    steps = {s["name"]: s for s in d["steps"]}
    assert [s["name"] for s in d["steps"]] == list(t.names)
    assert steps["S_masked"]["value"][0][2] == "-inf"
    assert steps["S_masked"]["shape"] == [2, 3] and steps["A"]["formula"] == "A = softmax(S)"
    back = np.array([[float(x) for x in row] for row in steps["S_masked"]["value"]])
    assert np.array_equal(back, t["S_masked"].value)
    assert np.array_equal(np.array(steps["O"]["value"]), t.out)


def test_to_dict_encodes_inf_and_nan_as_strings():
    mask = np.array([[0.0, np.inf, np.nan]])  # a bias holding every non-finite value
    t = qkv.explain(np.ones((1, 2)), np.ones((3, 2)), np.ones((3, 2)), mask=mask)
    row = t.to_dict()["steps"][t.names.index("S_bias")]["value"][0]
    assert row[1:] == ["inf", "nan"]
    json.dumps(t.to_dict(), allow_nan=False)


def test_to_html_is_a_self_contained_fragment_with_every_step():
    t = qkv.explain(grad=True, mask=masks.from_fn(lambda i, j: j <= i + 1, name="<b>&co"))
    page = t.to_html()
    for name in t.names:
        assert f'data-step="{name}"' in page
    assert page.count("<table") == len(t)
    assert "&lt;b&gt;&amp;co" in page and "<b>" not in page
    assert "<td>0.5989</td>" in page and "<td>-inf</td>" in page
    assert not re.search(r"(src|href)=|<script|<link|@import|url\(", page)
    assert page.startswith("<div") and page.rstrip().endswith("</div>")


def test_text_output_is_aligned():
    t = qkv.explain(grad=True, causal=True)
    lines = str(t).splitlines()
    headers = [ln for ln in lines if ln and not ln.startswith(" ") and not ln.startswith("qkv.explain")]
    assert [h.split()[0] for h in headers] == list(t.names)
    formula_at = [h.index(s.formula, len(s.name)) for h, s in zip(headers, t, strict=True)]
    shape_at = [h.index(str(s.shape), f + len(s.formula)) for h, s, f in zip(headers, t, formula_at, strict=True)]
    assert len(set(formula_at)) == 1 and len(set(shape_at)) == 1
    blocks = "\n".join(lines).split("\n\n")[1:]
    for block in blocks:
        rows = [r for r in block.splitlines()[1:] if r.strip()]
        assert len({len(r) for r in rows}) == 1, block  # right-aligned columns of one width
        cols = [[m.end() for m in re.finditer(r"\S+", r)] for r in rows]
        assert all(c == cols[0] for c in cols), block
        for r in rows:
            assert all(re.fullmatch(r"-?\d+\.\d{4}|-?inf", x) for x in r.split()), r
    assert "0.5989" in str(qkv.explain()) and "1.2033" in str(qkv.explain())


def test_large_inputs_render_abbreviated_but_keep_complete_values(rng):
    q, k, v = make_qkv(rng, (2, 6, 30, 4), (2, 3, 40, 4), (2, 3, 40, 5))
    t = qkv.explain(q, k, v, causal=True)
    assert t.weights.shape == (2, 6, 30, 40) and t.out.shape == (2, 6, 30, 5)
    assert_close(t.out, O.attention_oracle(q, k, v, allowed=O.causal_allowed(30, 40))[0], name="O")
    text = str(t)
    assert "…" in text and "more 30×40 matrices" in text
    assert len(text.splitlines()) < 1000
    assert len(t.to_html()) < 500_000


def test_trace_is_an_immutable_sequence_of_named_steps():
    t = qkv.explain()
    assert isinstance(t, qkv.Trace) and len(t) == 11 and t[0].name == "Q" and t[-1].name == "lse"
    assert t["A"] is t.step("A") and [s.name for s in t[3:5]] == ["S", "S_scaled"]
    assert "A" in t and "dQ" not in t and t["A"] in t
    with pytest.raises(KeyError, match="steps: Q, K, V"):
        t["nope"]
    with pytest.raises(ValueError):
        t["A"].value[0, 0] = 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.steps = ()
    with pytest.raises(TypeError):
        t.options["scale"] = 2.0
    assert t["A"].shape == (2, 3) and repr(t).startswith("Trace(11 steps")


def test_errors_match_qkv_attention_and_dropout_is_refused():
    q, k = np.ones((2, 4)), np.ones((3, 3))
    with pytest.raises(ShapeError) as explained:
        qkv.explain(q, k, np.ones((3, 2)))
    with pytest.raises(ShapeError) as attended:
        qkv.attention(q, k, np.ones((3, 2)))
    assert str(explained.value) == str(attended.value) and "d_k=3" in str(explained.value)
    with pytest.raises(ArgumentError, match="dropout"):
        qkv.explain(dropout=0.1)
    with pytest.raises(ArgumentError, match=r"missing: k, v"):
        qkv.explain(np.ones((2, 2)))
    with pytest.raises(ShapeError, match=r"dout has shape \(3, 2\)"):
        qkv.explain(dout=np.ones((3, 2)))
    with pytest.raises(ArgumentError, match="scale"):
        qkv.explain(scale=float("nan"))


@pytest.mark.skipif(not HAS_TORCH, reason="torch not installed")
@pytest.mark.parametrize("dtype_name", ["float64", "bfloat16"])
def test_torch_inputs_are_explained_on_numpy(dtype_name, rng):
    import torch

    dtype = getattr(torch, dtype_name)
    tq, tk, tv = (torch.from_numpy(x).to(dtype) for x in make_qkv(rng, (2, 3, 4), (2, 5, 4)))
    t = qkv.explain(tq, tk, tv, causal=True, grad=True)
    assert isinstance(t.out, np.ndarray)
    assert t.options["dtype"] == ("float64" if dtype_name == "float64" else "float32")
    tol = 1e-12 if dtype_name == "float64" else 1e-5  # bfloat16 inputs are computed in float32
    q, k, v = (x.to(torch.float64).numpy() for x in (tq, tk, tv))
    golden = O.attention_oracle(q, k, v, allowed=O.causal_allowed(3, 5))[0]
    assert_close(t.out, golden, tol=tol, name="O")
