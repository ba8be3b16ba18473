"""``Quantized``, ``quantize`` and ``dequantize``: a float array and its 8-bit form with float32
scales, in one module (``Quantized.append`` quantizes what it appends).

    values (…, Hkv, N, D)   int8, or float8 (torch / JAX float8 dtypes; NumPy: uint8 bit patterns)
    scales (…, Hkv, N)      float32, one per token and kv head  (scale="token")
           (…, Hkv, 1)      float32, one per kv head            (scale="head")
    x ≈ values · scales[…, None]

A ``Quantized`` is a small immutable record: what a cache holds, what ``qkv.attention`` reads in
place of ``k`` and ``v``. It is built by ``qkv.quantize`` (or from stored arrays, checked here)
and grows by ``append``.

One scale per token and kv head by default, ``scale = amax / qmax`` over the token's ``D``
features (``qmax`` = 127 for int8, the largest finite float8 otherwise), so the token's largest
magnitude lands on the format's largest code. int8 codes are ``round(x / scale)`` (ties to even)
clipped to ±127; float8 codes are ``x / scale`` rounded to the format (ties to even) after
clipping to ±qmax. Arithmetic in float32: ``x`` is rounded to float32 first, ``x / scale`` is a
correctly rounded float32 division (never a multiplication by ``1 / scale``).

Per token, appending is exact: a token's codes depend on that token only, so quantizing the new
keys when they arrive and concatenating gives the cache that quantizing everything at once gives.

Special values (README "Conventions": an attended non-finite value makes its row NaN, a hidden
one changes nothing):

- a token whose ``D`` values are all zero has scale 0 and codes 0: it dequantizes to zeros;
  so does a token whose scale underflows float32 (``amax`` below ~1.8e-43);
- a token holding NaN or ±inf has scale NaN and codes 0: it dequantizes to a row of NaN, so
  attending it gives NaN as attending the float token does, and hiding it changes nothing;
- ``scale="head"`` (float8 only): one scale per kv head from the head's finite values; a NaN or
  ±inf is stored as the format's NaN (E5M2: ±inf as ±inf), element by element.
"""

import math
from typing import Any

import numpy as np

from .._backend import as_array, dtype_name, is_floating, is_jax, is_torch, is_traced, kind, namespace
from .._checks import check_choice
from ..errors import ArgumentError, DTypeError, ShapeError
from ._formats import LARGEST_SCALE, SCALES, Format, check_format, decode_fp8, encode_fp8


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


def quantize(x: Any, dtype: Any, *, scale: str = "token") -> Quantized:
    """``x (…, Hkv, N, D)`` in 8 bits: ``Quantized(values (…, Hkv, N, D), scales, format)``.

    ``dtype``: ``"int8"``, ``"float8_e4m3fn"`` or ``"float8_e5m2"`` (or a torch / JAX dtype of
    that name). ``scale="token"``: float32 scales ``(…, Hkv, N)``, one per token and kv head,
    ``amax / qmax`` over the token's ``D`` values (qmax: 127, 448, 57344); ``scale="head"``
    (float8 only): ``(…, Hkv, 1)``, one per kv head. NumPy, torch or JAX ``x`` of any float dtype;
    torch and JAX keep the device. Nothing here records gradients (a cache is inference state).

    >>> qk = qkv.quantize(k, "int8")                 # k (B, Hkv, Nk, Dk) -> values int8, scales (B, Hkv, Nk)
    >>> qkv.dequantize(qk)                           # float32 (B, Hkv, Nk, Dk), within scale / 2 of k
    """
    f = check_format(dtype)
    per = check_choice(scale, "scale", SCALES)
    x = as_array(x, "x")
    if x.ndim < 2:
        raise ShapeError(f"x has shape {tuple(x.shape)}; quantize needs (..., N, D): tokens on axis -2, features on -1")
    if not is_floating(x):
        raise DTypeError(f"x has dtype {dtype_name(x)}; quantize takes floating-point arrays")
    if per == "head" and not f.is_float:
        raise ArgumentError(
            "scale='head' is for float8 formats; int8 keeps one scale per token (its uniform grid would spend its "
            "255 steps on a head's largest value, leaving small tokens a few codes)"
        )
    if is_torch(x):
        import torch

        with torch.no_grad():
            return _quantize_torch(x.detach(), f) if per == "token" else _quantize(x.detach(), f, per)
    if is_jax(x) and not is_traced(x):
        return _from_numpy(quantize(np.asarray(x), f.name, scale=per))
    with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN are handled as values, never warned about
        return _quantize(x, f, per)


def _from_numpy(qx: Quantized) -> Quantized:
    """A NumPy ``Quantized`` as JAX arrays. Concrete JAX arrays are quantized by NumPy: XLA turns a
    division by a broadcast divisor into a multiplication by its reciprocal, which is not the
    correctly rounded ``x / scale`` (inside ``jax.jit`` that is what runs: a scale may differ by
    one float32 unit in the last place, and a code by one where ``x / scale`` sits at a tie)."""
    import jax.numpy as jnp

    _register_jax()
    values = jnp.asarray(qx.values)
    if qx.format != "int8":
        values = values.view(getattr(jnp, qx.format))
    return Quantized(values, jnp.asarray(qx.scales), qx.format)


def _float32(x: Any) -> Any:
    if is_torch(x):
        import torch

        return x.to(torch.float32)
    return x.astype(np.float32) if dtype_name(x) != "float32" else x


def _quantize(x: Any, f: Format, per: str) -> Quantized:
    xp = namespace(x=x)
    xf = _float32(x)
    finite = xp.isfinite(xf)
    if x.shape[-1] == 0:  # no features: nothing to scale
        amax = xp.zeros((*x.shape[:-1], 1) if per == "token" else (*x.shape[:-2], 1, 1), dtype=xp.float32)
        amax = _like(amax, xf)
    elif per == "token":
        amax = xp.max(xp.abs(xf), axis=-1, keepdims=True)  # NaN or inf for a non-finite token
        amax = xp.where(xp.all(finite, axis=-1, keepdims=True), amax, xp.asarray(np.nan, dtype=xp.float32))
    elif x.shape[-2] == 0:
        amax = _like(xp.zeros((*x.shape[:-2], 1, 1), dtype=xp.float32), xf)
    else:  # per head: the head's finite values set the scale
        amax = xp.max(xp.where(finite, xp.abs(xf), xp.asarray(0.0, dtype=xp.float32)), axis=(-2, -1), keepdims=True)
    qmax = xp.asarray(f.qmax, dtype=xp.float32)
    # near float32's largest value qmax · s may round past it: the scale stops where it stays finite
    s = xp.minimum(amax / qmax, xp.asarray(LARGEST_SCALE[f.name], dtype=xp.float32))
    usable = s > 0  # False for 0 (zeros, underflow) and NaN (a non-finite token)
    q = xf / xp.where(usable, s, xp.asarray(1.0, dtype=xp.float32))
    if f.is_float:
        q = xp.where(finite, xp.clip(q, -qmax, qmax), xf) if per == "head" else xp.clip(q, -qmax, qmax)
    else:
        q = xp.clip(xp.round(q), -qmax, qmax)
    zero = xp.asarray(0.0, dtype=xp.float32)
    if per == "token":
        q = xp.where(usable, q, zero)
    else:
        q = xp.where(usable | ~finite, q, zero)  # a head of zeros: zeros; its non-finite values stay
    return Quantized(_codes(q, f), s[..., 0], f.name)


def _quantize_torch(x: Any, f: Format) -> Quantized:
    """``_quantize`` per token for torch in a dozen operations (it runs for every layer of every
    decode step): the same rule, the same bits (``tests/test_quantize.py`` compares them)."""
    import torch

    xf = x.to(torch.float32)
    amax = xf.abs().amax(-1, keepdim=True)  # NaN or inf for a non-finite token
    s = amax / f.qmax
    s = torch.where(torch.isfinite(s), s, torch.nan).clamp_(max=LARGEST_SCALE[f.name])  # inf: NaN; clamp keeps NaN
    usable = s > 0
    q = xf / torch.where(usable, s, 1.0)
    q = q.clamp_(-f.qmax, f.qmax) if f.is_float else q.round_().clamp_(-f.qmax, f.qmax)
    q = torch.where(usable, q, 0.0)
    return Quantized(q.to(torch.int8 if f.name == "int8" else getattr(torch, f.name)), s[..., 0], f.name)


def _like(a: Any, x: Any) -> Any:
    if is_torch(x):
        return a.to(x.device)
    return a


def _codes(q: Any, f: Format) -> Any:
    """float32 ``q`` (already on the format's grid for int8, within ±qmax for float8) as stored codes."""
    if is_torch(q):
        import torch

        return q.to(torch.int8 if f.name == "int8" else getattr(torch, f.name))
    if is_jax(q):
        import jax.numpy as jnp

        _register_jax()
        return q.astype(jnp.int8 if f.name == "int8" else getattr(jnp, f.name))
    if f.is_float:
        return encode_fp8(q, f)
    return q.astype(np.int8)


def dequantize(qx: Quantized, dtype: Any = None) -> Any:
    """The float array ``qx`` stands for, ``values · scales[…, None]``: ``(…, Hkv, N, D)`` float32
    (or ``dtype``: float64 gives the products exactly). A token stored with scale 0 gives zeros,
    one stored with scale NaN (it held NaN or inf) a row of NaN."""
    if not isinstance(qx, Quantized):
        raise DTypeError(f"dequantize takes a qkv.Quantized, got {type(qx).__name__}")
    f = check_format(qx.format)
    v, s = qx.values, qx.scales
    wide = dtype is not None and str(dtype).removeprefix("torch.") == "float64"
    if is_torch(v):
        import torch

        acc = torch.float64 if wide else torch.float32
        out = v.to(acc) * s.to(acc)[..., None]
        return out if dtype is None else out.to(getattr(torch, dtype) if isinstance(dtype, str) else dtype)
    if is_jax(v):
        import jax.numpy as jnp

        acc = jnp.float64 if wide else jnp.float32
        out = v.astype(acc) * s.astype(acc)[..., None]
        return out if dtype is None else out.astype(dtype)
    vals = decode_fp8(v, f) if f.is_float else v
    wide_np: Any = np.float64 if wide else np.float32
    with np.errstate(over="ignore", invalid="ignore"):  # a stored NaN scale or code is a NaN row, by design
        out = vals.astype(wide_np) * s.astype(wide_np)[..., None]
    return out if dtype is None else out.astype(dtype)


_JAX_REGISTERED: list[bool] = []


def _register_jax() -> None:
    """``Quantized`` as a JAX pytree (values and scales the leaves, the format static), so it passes
    through ``jax.jit``; done when the first JAX array is quantized (``import qkv`` never imports jax)."""
    if _JAX_REGISTERED:
        return
    import jax

    jax.tree_util.register_pytree_node(
        Quantized,
        lambda q: ((q.values, q.scales), q.format),
        lambda fmt, leaves: _unchecked(leaves[0], leaves[1], fmt),
    )
    _JAX_REGISTERED.append(True)


def _unchecked(values: Any, scales: Any, fmt: str) -> Quantized:
    """A ``Quantized`` rebuilt by JAX's tree functions (its leaves may be tracers or placeholders)."""
    q = object.__new__(Quantized)
    object.__setattr__(q, "values", values)
    object.__setattr__(q, "scales", scales)
    object.__setattr__(q, "format", fmt)
    return q
