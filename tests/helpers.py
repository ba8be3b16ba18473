"""Test helpers: inputs, tolerances against a float64 golden, the impl runners, named cases.

qkv is imported lazily (inside functions) so that ``oracle`` and this module stay importable
without the package; torch is optional.
"""

import dataclasses
import importlib.util
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import numpy as np

import oracle as O

HAS_TORCH = importlib.util.find_spec("torch") is not None


def engine_params(*extra: str) -> list[Any]:
    """pytest params ``(impl, engine)`` for the exact engines: the reference, the array engine, the
    compiled engine (skipped with the reason when it is unavailable), then ``extra`` impls
    (``"torch"``, ``"auto"``) with no engine."""
    import pytest

    from qkv import _native

    unavailable = pytest.mark.skipif(not _native.available(), reason=f"compiled engine unavailable: {_native.reason()}")
    return [
        pytest.param("reference", None, id="reference"),
        pytest.param("flash", "array", id="array-engine"),
        pytest.param("flash", "native", id="compiled-engine", marks=unavailable),
        *(pytest.param(name, None, id={"torch": "torch-sdpa"}.get(name, name)) for name in extra),
    ]


# --------------------------------------------------------------------------- inputs


def make_qkv(rng, q_shape, k_shape, v_shape=None, dtype=np.float64):
    """Standard-normal q, k, v with the given shapes (v defaults to k's shape)."""
    v_shape = k_shape if v_shape is None else v_shape
    return tuple(rng.standard_normal(s).astype(dtype) for s in (q_shape, k_shape, v_shape))


def to_numpy64(x):
    """Any array (NumPy or torch, any float dtype) as a float64 NumPy array."""
    if x is None:
        return None
    if not isinstance(x, np.ndarray) and hasattr(x, "detach"):
        import torch

        return x.detach().to(torch.float64).cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def to_torch(x):
    """NumPy array -> torch tensor of the same dtype (other values pass through)."""
    import torch

    if isinstance(x, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(x))
    return x


# --------------------------------------------------------------------------- tolerances


def assert_close(actual, expected, *, tol=1e-12, name="out"):
    """Same shape, same infinities, no NaN, and max |actual - expected| <= tol * max(1, max|expected|).

    Used for float64 candidates against the float64 oracle, where the naive float64 baseline's
    error is ~1e-15; ``tol`` is the float64 floor of STYLE rule 13.
    """
    actual = to_numpy64(actual)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape}, expected {expected.shape}"
    assert not np.isnan(actual).any(), f"{name}: NaN at {np.argwhere(np.isnan(actual))[:5].tolist()}"
    inf_e = np.isinf(expected)
    bad_inf = (np.isinf(actual) != inf_e) | (inf_e & (actual != expected))
    assert not bad_inf.any(), (
        f"{name}: infinities differ at {np.argwhere(bad_inf)[:5].tolist()} "
        f"(got {actual[bad_inf][:5]}, expected {expected[bad_inf][:5]})"
    )
    fin = ~inf_e
    err = float(np.abs(actual[fin] - expected[fin]).max(initial=0.0))
    bound = tol * max(1.0, float(np.abs(expected[fin]).max(initial=0.0)))
    if err > bound:
        where = np.unravel_index(
            np.argmax(np.where(fin, np.abs(np.where(fin, actual - expected, 0)), -1)), actual.shape
        )
        raise AssertionError(
            f"{name}: max abs err {err:.3g} > {bound:.3g} at {tuple(int(w) for w in where)}: "
            f"got {actual[where]!r}, expected {expected[where]!r}"
        )


def assert_close_to_golden(out, golden, baseline, *, factor=2.0, floor=1e-12, name="out"):
    """STYLE rule 13: the candidate's max error against the float64 golden is at most
    ``factor`` times the max error of a naive same-precision baseline (plus a tiny floor)."""
    out64, base64 = to_numpy64(out), to_numpy64(baseline)
    golden = np.asarray(golden, dtype=np.float64)
    assert out64.shape == golden.shape, f"{name}: shape {out64.shape}, expected {golden.shape}"
    assert np.isfinite(out64).all(), f"{name}: non-finite values"
    err = float(np.abs(out64 - golden).max(initial=0.0))
    base = float(np.abs(base64 - golden).max(initial=0.0))
    assert err <= factor * base + floor, (
        f"{name}: max err {err:.3g} > {factor} x baseline err {base:.3g} (+ {floor:.1g})"
    )


# --------------------------------------------------------------------------- impl runners


class Result(NamedTuple):
    out: np.ndarray
    weights: np.ndarray | None
    lse: np.ndarray | None
    raw: Any


def documented_refusal(err, word="torch"):
    """True when ``err`` is the error qkv documents for a call impl="torch" cannot serve:
    a qkv.errors.QKVError that is a ValueError and whose message mentions ``word``."""
    import qkv.errors

    return isinstance(err, qkv.errors.QKVError) and isinstance(err, ValueError) and word in str(err).lower()


@dataclasses.dataclass(frozen=True)
class Runner:
    """One way of calling qkv.attention: an impl name and the array kind fed to it."""

    impl: str
    torch: bool
    tiles: tuple[int, int] | None = None  # flash tile sizes (block_q, block_k) forced for the call

    @property
    def id(self):
        tiles = f"-tiles{self.tiles[0]}x{self.tiles[1]}" if self.tiles else ""
        return self.impl + tiles + ("-torch" if self.torch and self.impl != "torch" else "")

    def kind(self, x):
        return to_torch(x) if self.torch else x

    def _call(self, q, k, v, want_weights, want_lse, kw):
        import qkv

        kw = dict(kw)
        if isinstance(kw.get("mask"), np.ndarray):
            kw["mask"] = self.kind(kw["mask"])
        attend = qkv.attention if self.tiles is None else partial(tiled_attention, tiles=self.tiles)
        return attend(
            self.kind(q),
            self.kind(k),
            self.kind(v),
            impl=self.impl,
            return_weights=want_weights,
            return_lse=want_lse,
            **kw,
        )

    def attention(self, q, k, v, *, weights=True, lse=True, nonadditive=False, **kw):
        """Run qkv.attention and return float64 NumPy (out, weights, lse, raw return value).

        impl="torch" is documented to refuse (a qkv ValueError naming torch) return_weights /
        return_lse and score mods that are not additive biases; only those refusals are
        accepted: the first by asking for ``out`` alone, the second by skipping the test.
        """
        import pytest

        try:
            raw = self._call(q, k, v, weights, lse, kw)
        except ValueError as e:
            if not (self.impl == "torch" and documented_refusal(e)):
                raise
            if weights or lse:
                weights = lse = False
                try:
                    raw = self._call(q, k, v, False, False, kw)
                except ValueError as e2:
                    if nonadditive and documented_refusal(e2):
                        pytest.skip("impl='torch' refuses non-additive score mods (documented)")
                    raise
            elif nonadditive:
                pytest.skip("impl='torch' refuses non-additive score mods (documented)")
            else:
                raise
        parts = list(raw) if (weights or lse) else [raw]
        for part in parts:  # arrays in, arrays of the same kind out
            assert isinstance(part, np.ndarray) != self.torch, f"{self.id} returned a {type(part)}"
        out = parts.pop(0)
        w = parts.pop(0) if weights else None
        s = parts.pop(0) if lse else None
        return Result(to_numpy64(out), to_numpy64(w), to_numpy64(s), raw)


def tiled_attention(q, k, v, *, tiles=None, impl="auto", return_weights=False, return_lse=False, **kw):
    """``qkv.attention`` with the flash kernel's tile sizes ``tiles = (block_q, block_k)`` given
    (through the internal ``Call``), so tiny inputs still span many tiles."""
    from qkv._core import picked, run
    from qkv._impls import build_call

    c = build_call(q, k, v, want_weights=return_weights, want_lse=return_lse, tiles=tiles, **kw)
    return picked(run(c, impl), return_weights, return_lse)


def tiled_backward(dout, q, k, v, out, lse, *, tiles=None, impl="auto", **kw):
    """``qkv.attention_backward`` with the flash kernel's tile sizes given."""
    from qkv._core import run_backward
    from qkv._impls import build_call

    return run_backward(build_call(q, k, v, tiles=tiles, **kw), dout, out, lse, impl)


RUNNERS = [
    Runner("reference", False),
    Runner("reference", True),
    Runner("torch", True),
    Runner("flash", False, tiles=(2, 3)),  # odd tiles (array engine): many PARTIAL and EMPTY tiles, ragged edges
    Runner("flash", True, tiles=(3, 2)),
    Runner("flash", False),  # the compiled engine wherever it supports the call
    Runner("flash", True),
    Runner("auto", False),
    Runner("auto", True),
]


def runner_params():
    import pytest

    return [
        pytest.param(
            r, id=r.id, marks=[] if (HAS_TORCH or not r.torch) else pytest.mark.skip(reason="torch not installed")
        )
        for r in RUNNERS
    ]


def check_against_oracle(res, golden, tol=1e-12):
    """out always; weights and lse when the runner returned them."""
    out, weights, lse = golden
    assert_close(res.out, out, tol=tol, name="out")
    if res.weights is not None:
        assert_close(res.weights, weights, tol=tol, name="weights")
    if res.lse is not None:
        assert_close(res.lse, lse, tol=tol, name="lse")


# --------------------------------------------------------------------------- named mask cases

_FROM_DENSE = np.random.default_rng(11).random((5, 7)) < 0.5
_FROM_DENSE[2] = False  # one query row attends nothing


@dataclasses.dataclass(frozen=True)
class MaskCase:
    """A qkv Mask (built from the qkv.masks module) and its independent dense definition."""

    id: str
    nq: int
    nk: int
    build: Callable[[Any], Any]
    oracle: Callable[[int, int, Any], np.ndarray]
    exact_blocks: bool = False  # plain constructors whose blocks() must be exact

    def param(self):
        import pytest

        return pytest.param(self, id=self.id)


MASK_CASES = [
    MaskCase("causal-square", 6, 6, lambda m: m.causal(), lambda nq, nk, m: O.causal_allowed(nq, nk), True),
    MaskCase("causal-nq<nk-bottom-right", 3, 7, lambda m: m.causal(), lambda nq, nk, m: O.causal_allowed(nq, nk), True),
    MaskCase(
        "causal-nq>nk-empty-top-rows", 7, 3, lambda m: m.causal(), lambda nq, nk, m: O.causal_allowed(nq, nk), True
    ),
    MaskCase(
        "causal-offset0-top-left",
        4,
        6,
        lambda m: m.causal(offset=0),
        lambda nq, nk, m: O.causal_allowed(nq, nk, 0),
        True,
    ),
    MaskCase(
        "causal-offset-minus2-empty-rows",
        5,
        5,
        lambda m: m.causal(offset=-2),
        lambda nq, nk, m: O.causal_allowed(nq, nk, -2),
        True,
    ),
    MaskCase(
        "sliding-window-3",
        7,
        7,
        lambda m: m.sliding_window(3),
        lambda nq, nk, m: O.sliding_window_allowed(nq, nk, 3),
        True,
    ),
    MaskCase(
        "sliding-window-1-self-only-nq<nk",
        5,
        8,
        lambda m: m.sliding_window(1),
        lambda nq, nk, m: O.sliding_window_allowed(nq, nk, 1),
        True,
    ),
    MaskCase(
        "sliding-window-2-bidirectional",
        5,
        8,
        lambda m: m.sliding_window(2, causal=False),
        lambda nq, nk, m: O.sliding_window_allowed(nq, nk, 2, causal=False),
        True,
    ),
    MaskCase("padding-int", 5, 7, lambda m: m.padding(4), lambda nq, nk, m: O.padding_allowed(nq, nk, 4), True),
    MaskCase(
        "padding-per-batch",
        5,
        7,
        lambda m: m.padding(np.array([3, 7])),
        lambda nq, nk, m: O.padding_allowed(nq, nk, [3, 7]),
        True,
    ),
    MaskCase(
        "padding-q-lengths",
        5,
        7,
        lambda m: m.padding(np.array([6, 2]), q_lengths=np.array([5, 2])),
        lambda nq, nk, m: O.padding_allowed(nq, nk, [6, 2], [5, 2]),
        True,
    ),
    MaskCase(
        "padding-zero-length-batch",
        4,
        6,
        lambda m: m.padding(np.array([0, 6])),
        lambda nq, nk, m: O.padding_allowed(nq, nk, [0, 6]),
        True,
    ),
    MaskCase(
        "document",
        6,
        6,
        lambda m: m.document(np.array([0, 0, 1, 1, 1, 2])),
        lambda nq, nk, m: O.document_allowed(nq, nk, [0, 0, 1, 1, 1, 2]),
    ),
    MaskCase(
        "document-and-causal",
        6,
        6,
        lambda m: m.document(np.array([0, 0, 1, 1, 1, 2])) & m.causal(),
        lambda nq, nk, m: O.document_allowed(nq, nk, [0, 0, 1, 1, 1, 2]) & O.causal_allowed(nq, nk),
    ),
    MaskCase(
        "document-per-batch-nq<nk",
        4,
        6,
        lambda m: m.document(np.array([[0, 0, 0, 1, 1, 1], [0, 1, 1, 2, 2, 2]])),
        lambda nq, nk, m: O.document_allowed(nq, nk, [[0, 0, 0, 1, 1, 1], [0, 1, 1, 2, 2, 2]]),
    ),
    MaskCase("prefix-lm", 6, 6, lambda m: m.prefix_lm(3), lambda nq, nk, m: O.prefix_lm_allowed(nq, nk, 3), True),
    MaskCase("prefix-lm-nq<nk", 3, 6, lambda m: m.prefix_lm(2), lambda nq, nk, m: O.prefix_lm_allowed(nq, nk, 2), True),
    MaskCase(
        "global-tokens",
        8,
        8,
        lambda m: m.global_tokens([0, 5]),
        lambda nq, nk, m: O.global_tokens_allowed(nq, nk, [0, 5]),
        True,
    ),
    MaskCase(
        "global-tokens-nq<nk",
        3,
        8,
        lambda m: m.global_tokens([1, 6]),
        lambda nq, nk, m: O.global_tokens_allowed(nq, nk, [1, 6]),
        True,
    ),
    MaskCase("dilated", 8, 8, lambda m: m.dilated(2, 2), lambda nq, nk, m: O.dilated_allowed(nq, nk, 2, 2)),
    MaskCase(
        "dilated-and-causal",
        9,
        9,
        lambda m: m.dilated(3, 2) & m.causal(),
        lambda nq, nk, m: O.dilated_allowed(nq, nk, 3, 2) & O.causal_allowed(nq, nk),
    ),
    MaskCase(
        "random-blocks",
        8,
        9,
        lambda m: m.random_blocks(2, 2, seed=0),
        lambda nq, nk, m: m.random_blocks(2, 2, seed=0).dense(nq, nk),
    ),
    MaskCase("from-dense", 5, 7, lambda m: m.from_dense(_FROM_DENSE), lambda nq, nk, m: _FROM_DENSE),
    MaskCase(
        "from-fn",
        5,
        7,
        lambda m: m.from_fn(lambda i, j: (i + 2 * j) % 3 != 0),
        lambda nq, nk, m: O._grid(nq, nk, lambda i, j: (i + 2 * j) % 3 != 0),
    ),
    MaskCase(
        "longformer",
        8,
        8,
        lambda m: m.sliding_window(2) | m.global_tokens([0]),
        lambda nq, nk, m: O.sliding_window_allowed(nq, nk, 2) | O.global_tokens_allowed(nq, nk, [0]),
    ),
    MaskCase(
        "bigbird",
        8,
        8,
        lambda m: m.sliding_window(2, causal=False) | m.global_tokens([0, 7]) | m.random_blocks(2, 1, seed=3),
        lambda nq, nk, m: (
            O.sliding_window_allowed(nq, nk, 2, causal=False)
            | O.global_tokens_allowed(nq, nk, [0, 7])
            | m.random_blocks(2, 1, seed=3).dense(nq, nk)
        ),
    ),
    MaskCase("not-causal-last-row-empty", 5, 5, lambda m: ~m.causal(), lambda nq, nk, m: ~O.causal_allowed(nq, nk)),
    MaskCase(
        "padding-and-causal",
        5,
        7,
        lambda m: m.padding(np.array([7, 4]), q_lengths=np.array([5, 3])) & m.causal(),
        lambda nq, nk, m: O.padding_allowed(nq, nk, [7, 4], [5, 3]) & O.causal_allowed(nq, nk),
    ),
    MaskCase(
        "prefix-or-sliding-and-not-global",
        7,
        7,
        lambda m: (m.prefix_lm(2) | m.sliding_window(2, causal=False)) & ~m.global_tokens([3]),
        lambda nq, nk, m: (
            (O.prefix_lm_allowed(nq, nk, 2) | O.sliding_window_allowed(nq, nk, 2, causal=False))
            & ~O.global_tokens_allowed(nq, nk, [3])
        ),
    ),
]


# --------------------------------------------------------------------------- named score-mod cases


@dataclasses.dataclass(frozen=True)
class ScoreCase:
    """A qkv ScoreMod (built from the qkv.scores module) and its independent definition."""

    id: str
    h: int
    hkv: int
    build: Callable[[Any], Any]
    oracle: Callable[[], Any]
    additive: bool  # a pure additive bias (impl="torch" must accept it)
    scale: float | None = None

    def param(self):
        import pytest

        return pytest.param(self, id=self.id)


_TABLE_SHARED = np.array([0.3, -0.7, 0.5, 1.1, -0.2])  # M = 2
_TABLE_PER_HEAD = np.random.default_rng(5).standard_normal((4, 7))  # M = 3
_SLOPES = np.array([0.5, 0.25, 1.0, 2.0])

SCORE_CASES = [
    ScoreCase("alibi-n-heads-4", 4, 2, lambda s: s.alibi(n_heads=4), lambda: O.alibi_score(O.alibi_slopes(4)), True),
    ScoreCase(
        "alibi-n-heads-6-not-power-of-two",
        6,
        3,
        lambda s: s.alibi(n_heads=6),
        lambda: O.alibi_score(O.alibi_slopes(6)),
        True,
    ),
    ScoreCase("alibi-default-slopes", 4, 4, lambda s: s.alibi(), lambda: O.alibi_score(O.alibi_slopes(4)), True),
    ScoreCase("alibi-custom-slopes", 4, 1, lambda s: s.alibi(slopes=_SLOPES), lambda: O.alibi_score(_SLOPES), True),
    ScoreCase("softcap", 2, 2, lambda s: s.softcap(2.0), lambda: O.softcap_score(2.0), False, scale=1.0),
    ScoreCase("temperature", 2, 1, lambda s: s.temperature(0.5), lambda: O.temperature_score(0.5), False),
    ScoreCase(
        "relative-bias-shared-table",
        2,
        2,
        lambda s: s.relative_bias(_TABLE_SHARED, 2),
        lambda: O.relative_bias_score(_TABLE_SHARED, 2),
        True,
    ),
    ScoreCase(
        "relative-bias-per-head",
        4,
        2,
        lambda s: s.relative_bias(_TABLE_PER_HEAD, 3),
        lambda: O.relative_bias_score(_TABLE_PER_HEAD, 3),
        True,
    ),
    ScoreCase(
        "temperature-then-softcap",
        2,
        2,
        lambda s: s.temperature(2.0) + s.softcap(1.5),
        lambda: O.chain_scores(O.temperature_score(2.0), O.softcap_score(1.5)),
        False,
        scale=1.0,
    ),
    ScoreCase(
        "softcap-then-temperature",
        2,
        2,
        lambda s: s.softcap(1.5) + s.temperature(2.0),
        lambda: O.chain_scores(O.softcap_score(1.5), O.temperature_score(2.0)),
        False,
        scale=1.0,
    ),
    ScoreCase(
        "alibi-then-softcap",
        4,
        2,
        lambda s: s.alibi(n_heads=4) + s.softcap(3.0),
        lambda: O.chain_scores(O.alibi_score(O.alibi_slopes(4)), O.softcap_score(3.0)),
        False,
        scale=1.0,
    ),
    ScoreCase(
        "relative-bias-then-alibi",
        4,
        4,
        lambda s: s.relative_bias(_TABLE_PER_HEAD, 3) + s.alibi(n_heads=4),
        lambda: O.chain_scores(O.relative_bias_score(_TABLE_PER_HEAD, 3), O.alibi_score(O.alibi_slopes(4))),
        True,
    ),
]


def assert_one_line_error(result, *words):
    """A command (typer's CliRunner result) that failed on bad input: exit 1, one ``error:`` line
    on stderr holding each of ``words``, no traceback, nothing on stdout."""
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert "Traceback" not in result.output and result.stdout == ""
