"""``qkv.quantize`` / ``qkv.dequantize`` / ``qkv.Quantized`` against independent references.

int8 codes and scales are checked against exact rational arithmetic (``fractions.Fraction``:
the scale is ``amax / 127`` rounded once to float32, a code the float32 quotient rounded half to
even and clipped to ±127); float8 bit patterns against ``ml_dtypes`` and torch's own float8
conversion (two libraries that share no code with qkv's NumPy encoder), over every grid point,
every midpoint and its float32 neighbours. Then the special values (zeros, subnormals, values
beyond the scale, NaN and ±inf), the error bounds of the round trip, appending, and the errors.
"""

from fractions import Fraction

import numpy as np
import pytest

import qkv
from qkv.errors import ArgumentError, DTypeError, ShapeError

ml_dtypes = pytest.importorskip("ml_dtypes")

FORMATS = ["int8", "float8_e4m3fn", "float8_e5m2"]
FP8 = {"float8_e4m3fn": (ml_dtypes.float8_e4m3fn, 448.0, 3), "float8_e5m2": (ml_dtypes.float8_e5m2, 57344.0, 2)}
QMAX = {"int8": 127.0, "float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}


def _values(rng, shape, spread=True):
    """Normal numbers whose magnitude varies from token to token over many binades."""
    x = rng.standard_normal(shape)
    if spread:
        x = x * np.exp2(rng.integers(-20, 20, size=(*shape[:-1], 1)))
    return x.astype(np.float32)


def _round_half_even(r: Fraction) -> int:
    f = r.numerator // r.denominator
    rest = r - f
    return f + (rest > Fraction(1, 2) or (rest == Fraction(1, 2) and f % 2 == 1))


def _int8_reference(row: np.ndarray) -> tuple[float, list[int]]:
    """One token's float32 scale and int8 codes, from exact rationals."""
    amax = max(Fraction(float(abs(x))) for x in row)
    scale = Fraction(float(np.float32(float(amax / 127))))  # float64 then float32: innocuous double rounding
    if scale == 0:
        return 0.0, [0] * len(row)
    codes = []
    for x in row:
        quotient = Fraction(float(np.float32(Fraction(float(x)) / scale)))  # IEEE float32 division, rounded once
        codes.append(max(-127, min(127, _round_half_even(quotient))))
    return float(scale), codes


def test_int8_codes_and_scales_match_exact_rationals():
    rng = np.random.default_rng(0)
    x = _values(rng, (2, 3, 9, 7))
    x[0, 0, 0] = [0.5, -1.5, 2.5, 127.0, -0.25, 1e-3, 3.0]  # ties at .5 of the step, the largest value exact
    qx = qkv.quantize(x, "int8")
    assert qx.values.dtype == np.int8 and qx.scales.dtype == np.float32
    assert qx.values.shape == x.shape and qx.scales.shape == x.shape[:-1]
    for idx in np.ndindex(*x.shape[:-1]):
        scale, codes = _int8_reference(x[idx])
        assert qx.scales[idx] == np.float32(scale), idx
        assert qx.values[idx].tolist() == codes, idx
        assert np.abs(qx.values[idx]).max() == 127  # the token's largest magnitude lands on the largest code


@pytest.mark.parametrize("fmt", list(FP8))
def test_float8_bit_patterns_match_ml_dtypes_and_torch_on_every_grid_point_and_midpoint(fmt):
    from qkv._quant._formats import FORMATS as F
    from qkv._quant._formats import decode_table, encode_fp8

    md, qmax, _ = FP8[fmt]
    table = np.arange(256, dtype=np.uint8).view(md).astype(np.float32)
    np.testing.assert_array_equal(decode_table(fmt), table)  # every code's value, NaN and inf included
    grid = np.unique(table[np.isfinite(table)].astype(np.float64))
    mids = ((grid[1:] + grid[:-1]) / 2).astype(np.float32)  # exact: one more bit than the format
    near = [np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf))]
    rng = np.random.default_rng(1)
    x = np.concatenate([grid.astype(np.float32), mids, *near, _values(rng, (4096,), spread=False) * 37.0])
    x = np.clip(x, -qmax, qmax).astype(np.float32)
    mine = encode_fp8(x, F[fmt])
    np.testing.assert_array_equal(mine, x.astype(md).view(np.uint8))
    torch = pytest.importorskip("torch")
    theirs = torch.from_numpy(x).to(getattr(torch, fmt)).view(torch.uint8).numpy()
    np.testing.assert_array_equal(mine, theirs)


@pytest.mark.parametrize("fmt", list(FP8))
def test_float8_per_token_quantize_matches_ml_dtypes(fmt):
    md, qmax, _ = FP8[fmt]
    rng = np.random.default_rng(2)
    x = _values(rng, (3, 2, 11, 16))
    qx = qkv.quantize(x, fmt)
    assert qx.values.dtype == np.uint8  # NumPy holds float8 as bit patterns
    scale = (np.abs(x).max(-1) / np.float32(qmax)).astype(np.float32)
    np.testing.assert_array_equal(qx.scales, scale)
    want = np.clip(x / scale[..., None], -qmax, qmax).astype(np.float32).astype(md).view(np.uint8)
    np.testing.assert_array_equal(qx.values, want)
    np.testing.assert_array_equal(
        qkv.dequantize(qx), (want.view(md).astype(np.float32) * scale[..., None]).astype(np.float32)
    )


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_torch_quantize_equals_numpy_bit_for_bit(fmt, dtype):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    x = _values(rng, (2, 4, 13, 8))
    x[0, 0, :6] = 0.0  # special tokens: zeros, -0, a NaN, an inf, the largest floats, a subnormal
    x[0, 0, 1, ::2] = -0.0
    x[0, 0, 2, 3], x[0, 0, 3, 1] = np.nan, -np.inf
    x[0, 0, 4] = np.finfo(np.float32).max * np.linspace(-1, 1, 8, dtype=np.float32)
    x[0, 0, 5] = np.float32(1e-40) * np.arange(8, dtype=np.float32)
    x[0, 1, 0] = -x[0, 1, 0]
    t = torch.from_numpy(x).to(getattr(torch, dtype))
    x = t.to(torch.float32).numpy()  # the values torch quantizes, as float32
    want, got = qkv.quantize(x, fmt), qkv.quantize(t, fmt)
    assert got.values.dtype == (torch.int8 if fmt == "int8" else getattr(torch, fmt))
    assert got.scales.dtype == torch.float32
    np.testing.assert_array_equal(got.values.view(torch.uint8).numpy(), want.values.view(np.uint8))
    np.testing.assert_array_equal(got.scales.numpy(), want.scales)
    np.testing.assert_array_equal(qkv.dequantize(got).numpy(), qkv.dequantize(want))
    if dtype == "float32":  # the special tokens above reached the comparison intact
        assert np.isnan(want.scales[0, 0, 2:4]).all() and want.scales[0, 0, 0] == 0
        assert np.isfinite(qkv.dequantize(want)[0, 0, 4]).all()
    assert qkv.dequantize(got).dtype == torch.float32 and qkv.dequantize(want).dtype == np.float32


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_error_is_within_half_a_step(fmt):
    """int8: |x - x̂| <= scale / 2; float8: half a unit in the last place of the format (relative
    2^-(M+1) for normal values, an absolute half step below the smallest normal)."""
    rng = np.random.default_rng(4)
    x = _values(rng, (4, 3, 17, 32)).astype(np.float64)
    qx = qkv.quantize(x, fmt)
    back = qkv.dequantize(qx, np.float64)
    s = qx.scales[..., None].astype(np.float64)
    err = np.abs(back - x.astype(np.float32))
    if fmt == "int8":
        assert (err <= s / 2 * (1 + 2e-6)).all()
    else:
        m = FP8[fmt][2]
        emin = {"float8_e4m3fn": -6, "float8_e5m2": -14}[fmt]
        y = np.abs(x / s)
        ulp = np.exp2(np.maximum(np.floor(np.log2(np.maximum(y, 1e-300))), emin) - m)
        assert (err <= ulp / 2 * s * (1 + 2e-6) + 1e-30).all()


@pytest.mark.parametrize("fmt", FORMATS)
def test_zero_tokens_get_scale_zero_and_dequantize_to_zeros_without_warnings(fmt):
    x = np.zeros((2, 5, 8), np.float32)
    x[1, 2] = np.linspace(-1, 1, 8)
    x[0, 3] = -0.0
    qx = qkv.quantize(x, fmt)  # filterwarnings=error: no division warning either
    zero = np.ones((2, 5), bool)
    zero[1, 2] = False
    assert (qx.scales[zero] == 0).all() and (qx.values[zero].view(np.uint8) & 0x7F == 0).all()
    back = qkv.dequantize(qx)
    assert np.isfinite(back).all() and (back[zero] == 0).all()


@pytest.mark.parametrize("fmt", FORMATS)
def test_subnormal_tokens(fmt):
    """float32 subnormals: a token of them still quantizes (scale a subnormal, error within the
    step and below the token's own size), and one whose scale underflows gives exact zeros."""
    tiny = np.float32(1e-40)  # subnormal in float32
    x = np.array([[tiny, -tiny / 3, tiny / 7, 0.0], [1e-44, -1e-45, 0.0, 1e-45]], np.float32)
    qx = qkv.quantize(x, fmt)
    back = qkv.dequantize(qx, np.float64)
    assert np.isfinite(back).all()
    assert np.abs(back[0] - x[0]).max() <= np.abs(x[0]).max() * 0.5
    assert qx.scales[0] > 0
    assert qx.scales[1] == 0 and (back[1] == 0).all()  # 1e-44 / qmax underflows float32: zeros, never NaN


@pytest.mark.parametrize("fmt", FORMATS)
def test_values_beyond_the_scale_saturate_to_the_largest_code(fmt):
    """A stored Quantized read back with a scale smaller than its values need is the format's
    business; quantize itself never produces codes beyond ±qmax, and the largest value of each
    token maps onto ±qmax exactly (also for float32's largest finite numbers)."""
    big = np.finfo(np.float32).max
    x = np.array([[big, -big, 1.0, 0.0], [3e38, 1e-30, -3e38, 2.0], [7.0, -7.0, 7.0, 6.999]], np.float32)
    qx = qkv.quantize(x, fmt)
    back = qkv.dequantize(qx)
    assert np.isfinite(back).all()
    decoded = qkv.dequantize(qkv.Quantized(qx.values, np.ones_like(qx.scales), fmt))
    assert np.abs(decoded).max() <= QMAX[fmt]
    np.testing.assert_array_equal(np.abs(decoded).max(-1), QMAX[fmt])
    np.testing.assert_allclose(back[:, 0], x[:, 0], rtol=1e-6)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_non_finite_token_stores_scale_nan_and_dequantizes_to_a_nan_row(fmt):
    x = np.ones((3, 4, 6), np.float32)
    x[0, 1, 2], x[1, 3, 0], x[2, 0, 5] = np.nan, np.inf, -np.inf
    qx = qkv.quantize(x, fmt)
    bad = np.zeros((3, 4), bool)
    bad[0, 1] = bad[1, 3] = bad[2, 0] = True
    assert np.isnan(qx.scales[bad]).all() and not np.isnan(qx.scales[~bad]).any()
    assert (qx.values[bad] == 0).all()
    back = qkv.dequantize(qx)
    assert np.isnan(back[bad]).all()  # never silently finite
    np.testing.assert_array_equal(back[~bad], 1.0)  # the other tokens untouched


@pytest.mark.parametrize("fmt", list(FP8))
def test_per_head_scales_keep_non_finite_values_element_by_element(fmt):
    md, qmax, _ = FP8[fmt]
    rng = np.random.default_rng(5)
    x = _values(rng, (2, 3, 10, 8), spread=False)
    x[0, 1, 4, 2], x[1, 2, 0, 0], x[1, 2, 9, 7] = np.nan, np.inf, -np.inf
    qx = qkv.quantize(x, fmt, scale="head")
    assert qx.scales.shape == (2, 3, 1) and not qx.per_token
    finite = np.where(np.isfinite(x), np.abs(x), 0)
    np.testing.assert_array_equal(qx.scales, (finite.max((-2, -1)) / np.float32(qmax)).astype(np.float32)[..., None])
    back = qkv.dequantize(qx)
    assert np.isnan(back[0, 1, 4, 2])
    if fmt == "float8_e5m2":
        assert back[1, 2, 0, 0] == np.inf and back[1, 2, 9, 7] == -np.inf
    else:  # E4M3 has no infinity: NaN, still not finite
        assert np.isnan(back[1, 2, 0, 0]) and np.isnan(back[1, 2, 9, 7])
    fin = np.isfinite(x)
    assert np.isfinite(back[fin]).all() and np.sum(~np.isfinite(back)) == 3
    want = np.clip(x / qx.scales[..., None], -qmax, qmax).astype(np.float32)
    want = np.where(fin, want, x).astype(md).view(np.uint8)
    np.testing.assert_array_equal(qx.values, want)


def test_per_head_error_against_per_token_error_is_recorded_by_shape():
    """Why float8 defaults to one scale per token: over tokens whose sizes differ (as a head's keys
    do), a per-head scale leaves small tokens in the subnormal range; per token each keeps the
    format's relative precision. (The sizes are in docs/quantized-cache.md.)"""
    rng = np.random.default_rng(6)
    x = _values(rng, (1, 4, 256, 64))
    for fmt in FP8:
        tok = qkv.dequantize(qkv.quantize(x, fmt)) - x
        head = qkv.dequantize(qkv.quantize(x, fmt, scale="head")) - x
        rel = lambda e: np.abs(e).max(-1) / np.abs(x).max(-1)  # noqa: E731 - per token, relative to its size
        assert rel(tok).max() < rel(head).max()


@pytest.mark.parametrize("fmt", FORMATS)
def test_appending_equals_quantizing_everything_at_once(fmt):
    rng = np.random.default_rng(7)
    x = _values(rng, (2, 3, 12, 8))
    whole = qkv.quantize(x, fmt)
    grown = qkv.quantize(x[..., :5, :], fmt).append(x[..., 5:6, :]).append(x[..., 6:, :])
    np.testing.assert_array_equal(grown.values, whole.values)
    np.testing.assert_array_equal(grown.scales, whole.scales)
    assert grown.shape == whole.shape == x.shape
    with pytest.raises(ShapeError, match="leading axes"):
        whole.append(x[:1])
    with pytest.raises(ShapeError, match="leading axes"):
        whole.append(x[..., :4])


def test_appending_in_torch_keeps_the_format():
    torch = pytest.importorskip("torch")
    x = torch.randn(1, 2, 6, 8)
    for fmt in FORMATS:
        grown = qkv.quantize(x[..., :2, :], fmt).append(x[..., 2:, :])
        whole = qkv.quantize(x, fmt)
        assert grown.values.dtype == whole.values.dtype
        assert torch.equal(grown.values.view(torch.uint8), whole.values.view(torch.uint8))
        assert torch.equal(grown.scales, whole.scales)


def test_a_per_head_cache_refuses_to_grow():
    x = np.ones((2, 4, 8), np.float32)
    with pytest.raises(ArgumentError, match="one scale per token"):
        qkv.quantize(x, "float8_e4m3fn", scale="head").append(x)


def test_quantized_describes_the_array_it_stands_for():
    x = np.ones((2, 3, 4, 8), np.float32)
    qx = qkv.quantize(x, "int8")
    assert qx.shape == (2, 3, 4, 8) and qx.ndim == 4 and qx.dtype == np.float32 and qx.format == "int8"
    assert qx.nbytes == 2 * 3 * 4 * 8 + 4 * 2 * 3 * 4 and qx.per_token
    assert "int8" in repr(qx) and "(2, 3, 4, 8)" in repr(qx)
    with pytest.raises(AttributeError):
        qx.values = None


def test_errors_name_what_is_wrong():
    x = np.ones((2, 4, 8), np.float32)
    with pytest.raises(DTypeError, match="int8"):
        qkv.quantize(x, "int4")
    with pytest.raises(DTypeError, match="float"):
        qkv.quantize(np.ones((2, 4), np.int32), "int8")
    with pytest.raises(ShapeError, match=r"\(\.\.\., N, D\)"):
        qkv.quantize(np.ones(4, np.float32), "int8")
    with pytest.raises(ArgumentError, match="scale='head' is for float8"):
        qkv.quantize(x, "int8", scale="head")
    with pytest.raises(ArgumentError, match="scale"):
        qkv.quantize(x, "int8", scale="tensor")
    qx = qkv.quantize(x, "int8")
    with pytest.raises(DTypeError, match="int8"):
        qkv.Quantized(qx.values.astype(np.uint8), qx.scales, "int8")
    with pytest.raises(DTypeError, match="float32"):
        qkv.Quantized(qx.values, qx.scales.astype(np.float64), "int8")
    with pytest.raises(ShapeError, match="one per token"):
        qkv.Quantized(qx.values, qx.scales[..., :2], "int8")
    with pytest.raises(DTypeError, match="Quantized"):
        qkv.dequantize(x)


def test_torch_dtypes_name_formats_and_nothing_records_gradients():
    torch = pytest.importorskip("torch")
    x = torch.randn(2, 5, 8, requires_grad=True)
    qx = qkv.quantize(x, torch.float8_e5m2)
    assert qx.format == "float8_e5m2" and not qx.scales.requires_grad


def test_jax_arrays_quantize_as_numpy_does_eagerly_and_under_jit():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    rng = np.random.default_rng(8)
    x = _values(rng, (2, 3, 7, 8))
    for fmt in FORMATS:
        want = qkv.quantize(x, fmt)
        got = qkv.quantize(jnp.asarray(x), fmt)
        np.testing.assert_array_equal(np.asarray(got.values).view(np.uint8), want.values.view(np.uint8))
        np.testing.assert_array_equal(np.asarray(got.scales), want.scales)
        assert got.values.dtype == (jnp.int8 if fmt == "int8" else getattr(jnp, fmt))
        np.testing.assert_array_equal(np.asarray(qkv.dequantize(got)), qkv.dequantize(want))
        # inside jit XLA multiplies by reciprocals: a scale within one float32 ulp, a code within one step
        jitted = jax.jit(lambda a, f=fmt: qkv.quantize(a, f))(jnp.asarray(x))
        np.testing.assert_allclose(np.asarray(jitted.scales), want.scales, rtol=2**-23, atol=0)
        back = np.asarray(qkv.dequantize(jitted))
        step = want.scales[..., None] * (
            1.0 if fmt == "int8" else np.abs(qkv.dequantize(want)) / want.scales[..., None] / 4
        )
        assert (np.abs(back - qkv.dequantize(want)) <= step * 1.0001 + 1e-30).all()
