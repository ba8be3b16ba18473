"""``Quantized``: keys or values stored in 8 bits with float32 scales.

    values (…, Hkv, N, D)   int8, or float8 (torch / JAX float8 dtypes; NumPy: uint8 bit patterns)
    scales (…, Hkv, N)      float32, one per token and kv head  (scale="token")
           (…, Hkv, 1)      float32, one per kv head            (scale="head")
    x ≈ values · scales[…, None]

A small immutable record: what a cache holds, what ``qkv.attention`` reads in place of ``k``
and ``v``. It is built by ``qkv.quantize`` (or from stored arrays, checked here) and grows by
``append``.
"""

import math
from typing import Any

import numpy as np

from .._backend import dtype_name, is_jax, is_torch, kind, namespace
from ..errors import ArgumentError, DTypeError, ShapeError
from ._formats import Format, check_format


def storage_dtype(f: Format, lib: str) -> str:
    """The dtype name the values of format ``f`` have in library ``lib`` (``"numpy"``, ``"torch"``,
    ``"jax"``): float8 is ``uint8`` bit patterns in NumPy, its own dtype elsewhere."""
    return "uint8" if f.is_float and lib == "numpy" else f.name


class Quantized:
    """Keys or values in 8 bits: ``values (…, Hkv, N, D)`` and float32 ``scales (…, Hkv, N)``
    (one per token and kv head) or ``(…, Hkv, 1)`` (one per kv head); ``format`` is ``"int8"``,
    ``"float8_e4m3fn"`` or ``"float8_e5m2"``. The array it stands for is ``values · scales[…, None]``
    (``qkv.dequantize``), which ``shape`` and ``dtype`` (float32) describe.

    NumPy holds float8 values as their ``uint8`` bit patterns; torch and JAX in their float8
    dtypes. Build one with ``qkv.quantize(x, "int8")``; ``Quantized(values, scales, format)``
    checks arrays stored earlier.

    >>> qk = qkv.quantize(k, "int8")            # k (B, Hkv, Nk, Dk)
    >>> qk = qk.append(k_new)                   # k_new (B, Hkv, n, Dk): quantized, appended
    >>> out = qkv.attention(q, qk, qkv.quantize(v, "int8"), causal=True)
    """

    __slots__ = ("values", "scales", "format")
    values: Any
    scales: Any
    format: str

    def __init__(self, values: Any, scales: Any, format: Any) -> None:  # noqa: A002 - the contract's name
        f = check_format(format, "format")
        namespace(values=values, scales=scales)  # one library
        lib = kind(values)
        if values.ndim < 2:
            raise ShapeError(f"Quantized values need (..., N, D), got shape {tuple(values.shape)}")
        want = storage_dtype(f, lib)
        if dtype_name(values) != want:
            raise DTypeError(
                f"Quantized values of format {f.name} are {want} in {lib}, got {dtype_name(values)} "
                f"(values: {tuple(values.shape)})"
            )
        if dtype_name(scales) != "float32":
            raise DTypeError(f"Quantized scales are float32, got {dtype_name(scales)}")
        per_token, per_head = tuple(values.shape[:-1]), (*values.shape[:-2], 1)
        if tuple(scales.shape) not in (per_token, per_head):
            raise ShapeError(
                f"Quantized scales have shape {tuple(scales.shape)}, but values {tuple(values.shape)} need "
                f"{per_token} (one per token and kv head) or {per_head} (one per kv head)"
            )
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "scales", scales)
        object.__setattr__(self, "format", f.name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Quantized is immutable; append() returns a new one")

    @property
    def shape(self) -> tuple[int, ...]:
        """``(…, Hkv, N, D)``: the shape of the array it stands for."""
        return tuple(self.values.shape)

    @property
    def ndim(self) -> int:
        return len(self.values.shape)

    @property
    def dtype(self) -> Any:
        """float32 of the values' library: the dtype ``qkv.dequantize`` gives."""
        if is_torch(self.values):
            import torch

            return torch.float32
        if is_jax(self.values):
            import jax.numpy as jnp

            return jnp.dtype("float32")
        return np.dtype(np.float32)

    @property
    def device(self) -> Any:
        return getattr(self.values, "device", "cpu")

    @property
    def per_token(self) -> bool:
        """True when there is one scale per token (``scale="token"``), False for one per kv head."""
        return tuple(self.scales.shape) == tuple(self.values.shape[:-1])

    @property
    def nbytes(self) -> int:
        """Bytes held: the 8-bit values and the float32 scales."""
        return math.prod(self.values.shape) + 4 * math.prod(self.scales.shape)

    def append(self, x: Any) -> "Quantized":
        """This cache with ``x (…, Hkv, n, D)`` quantized (one scale per token, as stored) and
        appended along the token axis: ``(…, Hkv, N + n, D)``. Quantizing per token makes
        appending exact: ``quantize(a).append(b)`` holds what ``quantize(concat(a, b))`` holds."""
        from ._quantize import quantize

        if not self.per_token and self.values.shape[-2] != 1:
            raise ArgumentError(
                "append() needs one scale per token; this Quantized has one per kv head (scale='head'), which "
                "the new tokens could only saturate against: quantize the whole array again instead"
            )
        new = quantize(x, self.format)
        if tuple(new.shape[:-2]) != self.shape[:-2] or new.shape[-1] != self.shape[-1]:
            raise ShapeError(
                f"appended x has shape {tuple(new.shape)} but the cache holds {self.shape}: the leading axes "
                "(…, Hkv) and D must match"
            )
        xp = namespace(values=self.values)
        if is_torch(self.values):
            import torch

            return Quantized(
                torch.cat([self.values, new.values], dim=-2), torch.cat([self.scales, new.scales], dim=-1), self.format
            )
        return Quantized(
            xp.concat([self.values, new.values], axis=-2), xp.concat([self.scales, new.scales], axis=-1), self.format
        )

    def __repr__(self) -> str:
        per = "token" if self.per_token else "head"
        return f"Quantized({self.format}, shape={self.shape}, scale={per!r}, {kind(self.values)})"
