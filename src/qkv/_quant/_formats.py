"""The three storage formats of a quantized cache, and float8 bit patterns in plain NumPy.

``int8``: symmetric integers ``-127 … 127`` (``-128`` unused, so the grid is symmetric), one
step = the scale. ``float8_e4m3fn`` and ``float8_e5m2``: the OCP 8-bit floats (Micikevicius et
al., "FP8 Formats for Deep Learning", arXiv:2209.05433): E4M3 with 3 mantissa bits, no
infinities, largest finite 448, NaN = ``S.1111.111``; E5M2 with 2 mantissa bits, IEEE-like
(infinities and NaNs at exponent 31), largest finite 57344.

NumPy has no float8 dtype: a NumPy cache holds float8 values as their ``uint8`` bit patterns,
encoded and decoded here (round to nearest, ties to even, subnormals kept), so ``import qkv``
needs NumPy only. torch and JAX hold them in their own ``float8`` dtypes and convert natively.
"""

from functools import cache
from typing import Any, NamedTuple

import numpy as np

from .._checks import check_choice
from ..errors import DTypeError


class Format(NamedTuple):
    """A storage format: ``name`` (the dtype name ``qkv.quantize`` takes), ``qmax`` (the largest
    magnitude a code holds: a row's largest value is scaled onto it), and for float8 the
    ``mantissa`` bits and exponent ``bias`` (0 and 0 for int8)."""

    name: str
    qmax: float
    mantissa: int = 0
    bias: int = 0

    @property
    def is_float(self) -> bool:
        return self.mantissa > 0

    @property
    def has_inf(self) -> bool:
        """E5M2 has infinities; E4M3 (``fn``: finite) saturates them to NaN."""
        return self.name == "float8_e5m2"


INT8 = Format("int8", 127.0)
E4M3 = Format("float8_e4m3fn", 448.0, mantissa=3, bias=7)
E5M2 = Format("float8_e5m2", 57344.0, mantissa=2, bias=15)
FORMATS: dict[str, Format] = {f.name: f for f in (INT8, E4M3, E5M2)}
"""The formats by name, in the order of the kernel's ``KvFormat`` (after ``native``)."""

SCALES = ("token", "head")
"""``scale=`` of ``qkv.quantize``: one scale per (kv head, token), or one per kv head."""


def _largest_scale(qmax: float) -> float:
    f32 = np.float32
    s = f32(np.finfo(np.float32).max) / f32(qmax)
    with np.errstate(over="ignore"):
        while not np.isfinite(f32(s * f32(qmax))):
            s = np.nextafter(s, f32(0))
    return float(s)


LARGEST_SCALE: dict[str, float] = {name: _largest_scale(f.qmax) for name, f in FORMATS.items()}
"""The largest float32 scale whose product with ``qmax`` stays finite in float32, per format: the
scale of a token near float32's largest value is clipped to it, so its largest code dequantizes
finite. (Constants: traced programs read them without running NumPy.)"""


def check_format(dtype: Any, name: str = "dtype") -> Format:
    """The ``Format`` named by ``dtype``: ``"int8"``, ``"float8_e4m3fn"``, ``"float8_e5m2"``, or a
    NumPy / torch / JAX dtype of that name."""
    if isinstance(dtype, Format):
        return dtype
    label = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
    if not isinstance(dtype, str) and label not in FORMATS:
        raise DTypeError(f"{name}={dtype!r} is not a quantized format; pass one of {', '.join(FORMATS)}")
    return FORMATS[check_choice(label, name, tuple(FORMATS), error=DTypeError)]


# --------------------------------------------------------------------------- float8 in NumPy


def _emin(f: Format) -> int:
    """The smallest normal exponent (``2**emin`` is the smallest normal magnitude)."""
    return 1 - f.bias


def encode_fp8(x: np.ndarray, f: Format) -> np.ndarray:
    """float32 ``x`` as ``f``'s ``uint8`` bit patterns: round to nearest, ties to even; magnitudes
    beyond ``f.qmax`` saturate to it (the caller clips first); NaN to NaN; ±inf to ±inf (E5M2) or
    NaN (E4M3, which has no infinity)."""
    x = np.asarray(x, dtype=np.float32)
    sign = np.signbit(x).astype(np.uint8) << 7
    a = np.abs(x)
    finite = np.isfinite(a)
    a = np.minimum(np.where(finite, a, 0), np.float32(f.qmax))
    m = f.mantissa
    # the exponent of each magnitude, floored at the smallest normal one (subnormals share its step)
    _, e = np.frexp(a)
    e = np.maximum(e.astype(np.int32) - 1, _emin(f))
    step = np.ldexp(np.float32(1), e - m).astype(np.float32)
    r = np.rint(a / step) * step  # exact: a / step scales by a power of two; rint ties to even
    normal = r >= np.float32(2.0 ** _emin(f))
    _, er = np.frexp(r)
    er = er.astype(np.int32) - 1
    mant_normal = np.ldexp(r, -er) - 1  # in [0, 1)
    code = np.where(
        normal,
        ((er + f.bias) << m) | np.rint(np.ldexp(mant_normal, m)).astype(np.int32),
        np.rint(np.ldexp(np.where(normal, 0, r), m - _emin(f))).astype(np.int32),
    ).astype(np.uint8)
    special = np.where(np.isinf(x) & f.has_inf, _inf_code(f), _nan_code(f)).astype(np.uint8)
    return np.where(finite, code, special) | sign


def _nan_code(f: Format) -> int:
    return 0x7F if f.name == "float8_e4m3fn" else 0x7E


def _inf_code(f: Format) -> int:
    return 0x7C  # E5M2: exponent 31, mantissa 0


@cache
def decode_table(name: str) -> np.ndarray:
    """The 256 float32 values of ``name``'s bit patterns (index = the ``uint8`` code)."""
    f = FORMATS[name]
    m, out = f.mantissa, np.empty(256, dtype=np.float32)
    top = (1 << (7 - m)) - 1  # the largest exponent field
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        ef, mf = (code >> m) & top, code & ((1 << m) - 1)
        if f.has_inf and ef == top:
            value = np.inf if mf == 0 else np.nan
        elif not f.has_inf and ef == top and mf == (1 << m) - 1:
            value = np.nan
        elif ef == 0:
            value = mf * 2.0 ** (_emin(f) - m)
        else:
            value = (1 + mf / (1 << m)) * 2.0 ** (ef - f.bias)
        out[code] = sign * value
    out.flags.writeable = False
    return out


def decode_fp8(codes: np.ndarray, f: Format) -> np.ndarray:
    """``uint8`` bit patterns of ``f`` as float32 values."""
    return decode_table(f.name)[codes]
