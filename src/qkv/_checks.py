"""Every shape and dtype rule of API.md, checked once at the boundary.

Impls trust the ``Dims`` they receive; each rule here has its own ``ShapeError`` or
``DTypeError`` whose message names the argument, the axis and both sizes.
"""

import math
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from ._backend import dtype_name, is_floating
from ._typing import IMPLS, Array, Dims
from .errors import ArgumentError, DTypeError, MaskError, QKVError, ShapeError

# --------------------------------------------------------------------------- scalar arguments


def _bounds(minimum: float | None, maximum: float | None) -> str:
    if minimum is not None and maximum is not None:
        return f" in {minimum}..{maximum}"
    if minimum is not None:
        return f" >= {minimum}"
    return f" <= {maximum}" if maximum is not None else ""


def check_int(
    value: Any,
    name: str,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    error: type[QKVError] = ArgumentError,
) -> int:
    """``value`` as an ``int``: a Python or NumPy integer (never a bool) within the bounds.

    Anything else raises ``error`` (``ArgumentError`` unless a mask or shape rule is checked)
    naming the argument, the bounds and the value: ``n_features must be an integer >= 1, got 0``.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise error(f"{name} must be an integer{_bounds(minimum, maximum)}, got {value!r}")
    if minimum is not None and value < minimum:
        raise error(f"{name} must be an integer >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise error(f"{name} must be at most {maximum}, got {value!r}")
    return int(value)


_LARGEST = sys.float_info.max


def check_number(
    value: Any,
    name: str,
    *,
    positive: bool = False,
    minimum: float | None = None,
    maximum: float | None = None,
    error: type[QKVError] = ArgumentError,
) -> float:
    """``value`` as a finite ``float`` (``positive``: > 0) within the bounds; else ``error``."""
    what = "a positive finite number" if positive else "a finite number"
    try:
        if isinstance(value, (str, bytes)):  # float("0.5") parses: a number given as text is a mistake
            raise TypeError
        v = float(value)
    except (TypeError, ValueError):
        raise error(f"{name} must be {what}{_bounds(minimum, maximum)}, got {value!r}") from None
    if (
        isinstance(value, (bool, np.bool_))
        or not abs(v) <= _LARGEST  # math.isfinite, spelled so Dynamo traces it under dynamic shapes
        or (positive and v <= 0)
        or (minimum is not None and v < minimum)
        or (maximum is not None and v > maximum)
    ):
        raise error(f"{name} must be {what}{_bounds(minimum, maximum)}, got {value!r}")
    return v


def check_flag(value: Any, name: str, *, error: type[QKVError] = ArgumentError) -> bool:
    """``value`` as a ``bool``: only ``True`` / ``False`` (NumPy's too), never a truthy object."""
    if not isinstance(value, (bool, np.bool_)):
        raise error(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_choice(value: Any, name: str, choices: tuple[str, ...], *, error: type[QKVError] = ArgumentError) -> str:
    """``value`` if it is one of ``choices``; else ``error`` listing them."""
    if not isinstance(value, str) or value not in choices:
        raise error(f"{name} must be one of {list(choices)}, got {value!r}")
    return value


def check_impl(value: Any, name: str = "impl") -> str:
    """One of ``IMPLS`` (``"auto"``, ``"reference"``, ``"flash"``, ``"torch"``)."""
    return check_choice(value, name, IMPLS)


# --------------------------------------------------------------------------- arrays


def _shapes(**arrays: Array) -> str:
    return ", ".join(f"{n}: {tuple(a.shape)}" for n, a in arrays.items())


def shapes_of(**arrays: Array) -> Callable[[], str]:
    """The arrays' shapes for an error message, formatted only when one is raised: under
    ``torch.compile`` with dynamic shapes the sizes are symbolic, and formatting them (Dynamo
    cannot trace ``str.join`` over them) would break the graph on every call, not only a bad one."""
    return partial(_shapes, **arrays)


def _broadcast(
    name_a: str, a: tuple[int, ...], name_b: str, b: tuple[int, ...], shapes: Callable[[], str]
) -> tuple[int, ...]:
    """Broadcast two batch shapes (right-aligned), naming the first axis that disagrees."""
    n = max(len(a), len(b))
    a1, b1 = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    out = []
    for ax, (x, y) in enumerate(zip(a1, b1, strict=True)):
        if x != y and x != 1 and y != 1:
            axis = ax - n - 3  # counted from the end, past (H, N, D)
            raise ShapeError(
                f"{name_b} has size {y} on batch axis {axis} but {name_a} has size {x}, and neither is 1, "
                f"so they do not broadcast ({shapes()})"
            )
        out.append(max(x, y))
    return tuple(out)


def check_heads(h: int, hkv: int, shapes: Callable[[], str] | None = None) -> None:
    """``H % Hkv == 0`` (each kv head serves ``H // Hkv`` consecutive query heads)."""
    if h == 0 and hkv >= 0:
        return  # no query heads: an empty call (SDPA returns the empty result)
    if hkv < 1 or h % hkv:
        raise ShapeError(
            f"q has H={h} heads on axis -3 but k has Hkv={hkv}, and H is not a multiple of Hkv"
            + (f" ({shapes()})" if shapes is not None else "")
        )


def check_qkv(q: Array, k: Array, v: Array, *, quantized: bool = False) -> Dims:
    """Validate ``q (*B, H, Nq, Dk)``, ``k (*B, Hkv, Nk, Dk)``, ``v (*B, Hkv, Nk, Dv)``.

    Leading axes broadcast; ``H % Hkv == 0`` (or ``H == 1``, a query broadcast over the kv heads).
    ``quantized``: ``k`` and ``v`` are the 8-bit values of a ``Quantized`` cache (their dtypes
    are the format's, checked there), so only ``q`` must be floating point.
    """
    shapes = shapes_of(q=q, k=k, v=v)
    for name, a in (("q", q), ("k", k), ("v", v)):
        if a.ndim < 2:
            raise ShapeError(f"{name} has {a.ndim} axes but needs at least 2, (..., N, D) ({shapes()})")
        if not is_floating(a) and not (quantized and name != "q"):
            raise DTypeError(f"{name} has dtype {dtype_name(a)}; attention needs floating-point inputs ({shapes()})")
    dtypes = {dtype_name(a) for a in ((q,) if quantized else (q, k, v))}
    if len(dtypes) > 1:
        raise DTypeError(
            f"q, k, v have different dtypes (q: {dtype_name(q)}, k: {dtype_name(k)}, v: {dtype_name(v)}); "
            "cast them to one dtype"
        )
    if k.shape[-1] != q.shape[-1]:
        raise ShapeError(f"k has d_k={k.shape[-1]} on its last axis but q has d_k={q.shape[-1]} ({_shapes(q=q, k=k)})")
    if v.shape[-2] != k.shape[-2]:
        raise ShapeError(f"v has Nk={v.shape[-2]} on axis -2 but k has Nk={k.shape[-2]} ({_shapes(k=k, v=v)})")
    has_heads = max(q.ndim, k.ndim, v.ndim) >= 3

    def head(a: Array) -> int:
        return a.shape[-3] if a.ndim >= 3 else 1

    hk, hv = head(k), head(v)
    if hk != hv and hk != 1 and hv != 1:
        raise ShapeError(f"v has Hkv={hv} heads on axis -3 but k has Hkv={hk} ({_shapes(k=k, v=v)})")
    hkv, hq = max(hk, hv), head(q)
    if hq == 1:
        h = hkv  # one query head broadcast over every kv head
    else:
        check_heads(hq, hkv, shapes)
        h = hq
    batch = _broadcast("q", tuple(q.shape[:-3]), "k", tuple(k.shape[:-3]), shapes)
    batch = _broadcast("q and k", batch, "v", tuple(v.shape[:-3]), shapes)
    return Dims(batch, h, hkv, q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1], has_heads)


def check_scale(scale: float | None, dk: int) -> float:
    """The scale to use: ``1/sqrt(Dk)`` by default; a given one must be a finite number."""
    if scale is None:
        return 1.0 / math.sqrt(dk) if dk > 0 else 1.0
    return check_number(scale, "scale")


def check_dropout(p: float) -> float:
    """Dropout probability in [0, 1)."""
    v = check_number(p, "dropout", minimum=0.0)
    if v >= 1.0:
        raise ArgumentError(f"dropout must be a probability in [0, 1), got {p!r}")
    return v


def check_seed(rng: Any) -> Any:
    """``rng`` as given, with an int seed of the counter-based dropout generator checked to be in
    ``0 … 2**64 - 1`` (the generator's 64-bit key); Generators, keys and None pass through."""
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, (bool, np.bool_)):
        if not 0 <= int(rng) < 2**64:
            raise ArgumentError(
                f"rng seed must be an integer in 0..2**64 - 1 (the dropout generator's 64-bit key), got {int(rng)}"
            )
        return int(rng)
    return rng


def check_covers(name: str, shape: tuple[int, ...], score_shape: tuple[int, ...]) -> None:
    """A mask or bias of ``shape`` must broadcast to the scores without growing them."""
    n = max(len(shape), len(score_shape))
    a = (1,) * (n - len(shape)) + tuple(shape)
    b = (1,) * (n - len(score_shape)) + tuple(score_shape)
    if len(shape) > len(score_shape) or any(x != y and x != 1 for x, y in zip(a, b, strict=True)):
        raise MaskError(
            f"{name} has shape {tuple(shape)}, which does not broadcast to the scores (..., Nq, Nk) = "
            f"{tuple(score_shape)}; batch-dependent masks follow the (B, H, Nq, Nk) layout"
        )
