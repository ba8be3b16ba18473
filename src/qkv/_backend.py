"""What the array code needs to know about the library an array comes from.

The rest of qkv writes array code once against the Python array API
(``xp = namespace(q, k, v)``); torch and JAX are never imported by this module unless one of
their arrays was passed in (``array_api_compat`` checks the type without importing them).

Three kinds are supported: NumPy (the float64 reference), torch, and JAX (``jax.numpy`` is
itself an array API namespace). JAX arrays are immutable, so the in-place helpers below
(``add_``, ``exp_sub_``, ``set_``, ``iadd_``, ``imul_``) fall back to their functional forms
for them (``x.at[index].set(value)``); under ``jax.grad`` the inputs are tracers, which must
never reach NumPy (``as_array`` passes them through).

The roads into the compiled kernel are the other library-specific places, one adapter per host:
``_impls/_flash_native.py`` (eager NumPy, torch and JAX: its ``_host``), ``_lean.py`` and
``_torch_op.py`` / ``_compiled.py`` (torch), ``_jax_ffi.py`` (traced JAX).
"""

import contextlib
import sys
from typing import Any

import array_api_compat
import numpy as np

from . import _torch
from ._typing import Array
from .errors import DTypeError

HALF = ("float16", "bfloat16")


_TORCH_TENSOR: Any = None


def is_torch(x: Any) -> bool:
    """True for a ``torch.Tensor`` (without importing torch). An ``isinstance`` against the class
    once torch is loaded: array_api_compat's check costs ~1 us, and a call asks ~20 times."""
    global _TORCH_TENSOR
    if _TORCH_TENSOR is None:
        torch = _torch.loaded()
        if torch is None:
            return False
        _TORCH_TENSOR = torch.Tensor
    return isinstance(x, _TORCH_TENSOR)


def no_grad(x: Any) -> Any:
    """A context in which torch records no graph (for ``x`` a torch tensor), else a no-op."""
    if is_torch(x):
        import torch

        return torch.no_grad()
    return contextlib.nullcontext()


def is_traced(x: Any) -> bool:
    """True for a JAX tracer (inside ``jax.grad`` / ``jax.jit``): it has no concrete values to look at."""
    return is_jax(x) and type(x).__name__.endswith("Tracer")


def kind(x: Any) -> str:
    """``"torch"``, ``"jax"`` or ``"numpy"``: the array library of ``x``."""
    if isinstance(x, np.ndarray):
        return "numpy"  # the common case first: no further type checks
    return "torch" if is_torch(x) else "jax" if is_jax(x) else "numpy"


_NOT_JAX = (np.ndarray, np.generic, bool, int, float, complex, str, bytes, list, tuple, dict)


def is_jax(x: Any) -> bool:
    """True for a ``jax.Array`` or a JAX tracer (without importing jax)."""
    if x is None or isinstance(x, _NOT_JAX) or "jax" not in sys.modules or is_torch(x):
        return False  # before array_api_compat's check: it is lru_cached, which torch's tracer warns about
    return bool(array_api_compat.is_jax_array(x))


def as_array(x: Any, name: str) -> Array:
    """Return ``x`` unchanged if it is a NumPy array, torch tensor or JAX array; array-likes become NumPy."""
    if isinstance(x, np.ndarray) or is_torch(x) or is_jax(x):
        return x
    if x is None:
        raise DTypeError(f"{name} is None; expected a NumPy array, a torch tensor or a JAX array")
    try:
        return np.asarray(x)
    except Exception as e:  # ragged lists and other non-arrays
        raise DTypeError(f"{name} of type {type(x).__name__} is not an array: {e}") from None


def namespace(**arrays: Array) -> Any:
    """The array API namespace shared by ``arrays`` (keyword names are used in the error).

    Mixed kinds (NumPy with torch or JAX, torch with JAX) raise ``DTypeError`` (a
    ``TypeError``): qkv never moves data between libraries behind the caller's back.
    """
    kinds = {name: kind(a) for name, a in arrays.items() if a is not None}
    if len(set(kinds.values())) > 1:
        listed = ", ".join(f"{n} is {k}" for n, k in kinds.items())
        raise DTypeError(
            f"arrays of mixed kinds ({listed}); pass arrays of one library (all NumPy, all torch or all JAX)"
        )
    if "torch" in kinds.values():
        _same_device(**{n: a for n, a in arrays.items() if a is not None})
    given = [a for a in arrays.values() if a is not None]
    lib = next(iter(kinds.values()), "numpy")
    if lib == "jax" or not given:
        return array_api_compat.array_namespace(*given)
    if lib not in _NAMESPACES:  # one namespace per library: array_namespace costs ~50 us a call
        _NAMESPACES[lib] = array_api_compat.array_namespace(*given)
    return _NAMESPACES[lib]


_NAMESPACES: dict[str, Any] = {}


def _same_device(**tensors: Any) -> None:
    """torch tensors must share one device and hold data (a ``meta`` tensor has none)."""
    devices = {name: str(t.device) for name, t in tensors.items()}
    meta = [name for name, d in devices.items() if d == "meta"]
    if meta:
        raise DTypeError(
            f"{', '.join(meta)} {'is a meta tensor' if len(meta) == 1 else 'are meta tensors'} "
            "(shapes without data); pass tensors that hold values"
        )
    if len(set(devices.values())) > 1:
        listed = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise DTypeError(f"tensors on different devices ({listed}); move them to one device")


def dtype_name(x: Array) -> str:
    """``"float32"``, ``"bfloat16"``, ... for NumPy and torch alike."""
    return str(x.dtype).removeprefix("torch.")


def is_floating(x: Array) -> bool:
    if is_torch(x):
        return bool(x.dtype.is_floating_point)
    if dtype_name(x) == "bfloat16":  # JAX's bfloat16 (ml_dtypes) is not a NumPy floating subtype
        return True
    return bool(np.issubdtype(x.dtype, np.floating))


def is_bool(x: Array) -> bool:
    return dtype_name(x) == "bool"


def compute_dtype(xp: Any, x: Array) -> Any:
    """The dtype arithmetic runs in: float32 for half precision (statistics and products
    accumulate in float32, API.md), else the input dtype."""
    return xp.float32 if dtype_name(x) in HALF else x.dtype


def device(x: Array) -> Any:
    return array_api_compat.device(x)


def from_numpy(a: np.ndarray, like: Array, dtype: Any = None) -> Array:
    """Put a NumPy array (mask, bias, index grid) on the library, device and dtype of ``like``."""
    if is_torch(like):
        import torch

        a = np.ascontiguousarray(a)
        if not a.flags.writeable:  # broadcast views are read-only; torch wants to own writable memory
            a = a.copy()
        t = torch.from_numpy(a).to(device=like.device)
        return t if dtype is None else t.to(dtype)
    if is_jax(like):
        import jax.numpy as jnp  # only reached with a JAX array in hand

        return jnp.asarray(a, dtype=dtype)
    return a if dtype is None else a.astype(dtype, copy=False)


def to_numpy(x: Array) -> np.ndarray:
    """A NumPy view or copy of ``x`` (detached from autograd for torch)."""
    if is_torch(x):
        x = x.detach().cpu()
        return (x.float() if dtype_name(x) == "bfloat16" else x).numpy()  # NumPy has no bfloat16
    return np.asarray(x)


def unbroadcast(xp: Any, g: Array, shape: tuple[int, ...]) -> Array:
    """Sum ``g`` over the axes that broadcasting added or stretched, giving ``shape``.

    The gradient of a broadcast input is the sum over the copies it stood for.
    """
    extra = g.ndim - len(shape)
    if extra > 0:
        g = xp.sum(g, axis=tuple(range(extra)))
    axes = tuple(a for a, (n, m) in enumerate(zip(g.shape, shape, strict=True)) if m == 1 and n != 1)
    if axes:
        g = xp.sum(g, axis=axes, keepdims=True)
    return g


def rand_uniform(rng: Any, like: Array, shape: tuple[int, ...]) -> Array:
    """Uniform [0, 1) numbers of ``shape`` from ``rng`` in the library of ``like``.

    ``rng`` is a ``numpy.random.Generator`` for NumPy arrays, a ``torch.Generator`` (or None,
    the global generator) for torch tensors, and a JAX PRNG key (``jax.random.key(0)``; required,
    JAX has no global generator) for JAX arrays.
    """
    if is_jax(like):
        import jax

        if rng is None or not is_jax(rng):
            raise DTypeError(
                f"rng is {type(rng).__name__}; dropout on JAX arrays needs a JAX PRNG key, e.g. rng=jax.random.key(0)"
            )
        return jax.random.uniform(rng, shape, dtype=jax.numpy.float32)
    if is_torch(like):
        import torch

        if rng is not None and not isinstance(rng, torch.Generator):
            raise DTypeError(f"rng is a {type(rng).__name__}; torch inputs need a torch.Generator or None")
        gen_device = rng.device if rng is not None else like.device
        u = torch.rand(shape, generator=rng, device=gen_device, dtype=torch.float32)
        return u.to(like.device)
    if rng is None:
        rng = np.random.default_rng()
    if not isinstance(rng, np.random.Generator):
        raise DTypeError(f"rng is a {type(rng).__name__}; NumPy inputs need a numpy.random.Generator or None")
    return rng.random(shape, dtype=np.float32)


def add_(x: Array, y: Array) -> Array:
    """``x + y`` written into ``x`` (a fresh tile the caller owns); saves a pass and an allocation."""
    if is_torch(x):
        return x.add_(y)
    if isinstance(x, np.ndarray) and np.broadcast_shapes(x.shape, y.shape) == x.shape:
        return np.add(x, y, out=x)
    return x + y  # immutable arrays (JAX) and shapes that grow: the functional form


def exp_sub_(x: Array, m: Array) -> Array:
    """``exp(x - m)`` written into ``x`` (a fresh tile the caller owns)."""
    if is_torch(x):
        return x.sub_(m).exp_()
    if not isinstance(x, np.ndarray):  # immutable arrays (JAX): the functional form
        return array_api_compat.array_namespace(x).exp(x - m)
    np.subtract(x, m, out=x)
    return np.exp(x, out=x)


def in_place(x: Array) -> bool:
    """True when ``x``'s library writes into arrays (NumPy, torch); False for immutable JAX arrays.

    Asked once per call: the ``set_`` / ``iadd_`` / ``imul_`` tile writes then branch on a bool.
    """
    return not is_jax(x)


def set_(x: Array, index: Any, value: Array, inplace: bool) -> Array:
    """``x[index] = value``; returns the updated array (``x`` itself unless JAX's ``x.at[index].set``)."""
    if inplace:
        x[index] = value
        return x
    return x.at[index].set(value)


def iadd_(x: Array, index: Any, value: Array, inplace: bool) -> Array:
    """``x[index] += value``; returns the updated array (``x`` itself unless JAX's ``x.at[index].add``)."""
    if inplace:
        x[index] += value
        return x
    return x.at[index].add(value)


def imul_(x: Array, y: Any, inplace: bool) -> Array:
    """``x *= y`` (no second buffer) where arrays are mutable, else ``x * y``."""
    if inplace:
        x *= y
        return x
    return x * y
