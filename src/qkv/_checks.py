"""Every shape and dtype rule of API.md, checked once at the boundary.

Impls trust the ``Dims`` they receive; each rule here has its own ``ShapeError`` or
``DTypeError`` whose message names the argument, the axis and both sizes.
"""

import math

from ._backend import dtype_name, is_floating
from ._typing import Array, Dims
from .errors import ArgumentError, DTypeError, ShapeError


def _shapes(**arrays: Array) -> str:
    return ", ".join(f"{n}: {tuple(a.shape)}" for n, a in arrays.items())


def _broadcast(name_a: str, a: tuple[int, ...], name_b: str, b: tuple[int, ...], shapes: str) -> tuple[int, ...]:
    """Broadcast two batch shapes (right-aligned), naming the first axis that disagrees."""
    n = max(len(a), len(b))
    a1, b1 = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    out = []
    for ax, (x, y) in enumerate(zip(a1, b1, strict=True)):
        if x != y and x != 1 and y != 1:
            axis = ax - n - 3  # counted from the end, past (H, N, D)
            raise ShapeError(
                f"{name_b} has size {y} on batch axis {axis} but {name_a} has size {x}, and neither is 1, "
                f"so they do not broadcast ({shapes})"
            )
        out.append(max(x, y))
    return tuple(out)


def check_heads(h: int, hkv: int, shapes: str = "") -> None:
    """``H % Hkv == 0`` (each kv head serves ``H // Hkv`` consecutive query heads)."""
    if hkv < 1 or h % hkv:
        raise ShapeError(
            f"q has H={h} heads on axis -3 but k has Hkv={hkv}, and H is not a multiple of Hkv"
            + (f" ({shapes})" if shapes else "")
        )


def check_qkv(q: Array, k: Array, v: Array) -> Dims:
    """Validate ``q (*B, H, Nq, Dk)``, ``k (*B, Hkv, Nk, Dk)``, ``v (*B, Hkv, Nk, Dv)``.

    Leading axes broadcast; ``H % Hkv == 0`` (or ``H == 1``, a query broadcast over the kv heads).
    """
    shapes = _shapes(q=q, k=k, v=v)
    for name, a in (("q", q), ("k", k), ("v", v)):
        if a.ndim < 2:
            raise ShapeError(f"{name} has {a.ndim} axes but needs at least 2, (..., N, D) ({shapes})")
        if not is_floating(a):
            raise DTypeError(f"{name} has dtype {dtype_name(a)}; attention needs floating-point inputs ({shapes})")
    dtypes = {dtype_name(a) for a in (q, k, v)}
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
    try:
        s = float(scale)
    except (TypeError, ValueError):
        raise ArgumentError(f"scale must be a number, got {scale!r}") from None
    if not math.isfinite(s):
        raise ArgumentError(f"scale must be finite, got {scale!r}")
    return s


def check_dropout(p: float) -> float:
    """Dropout probability in [0, 1)."""
    try:
        p = float(p)
    except (TypeError, ValueError):
        raise ArgumentError(f"dropout must be a probability in [0, 1), got {p!r}") from None
    if not 0.0 <= p < 1.0:
        raise ArgumentError(f"dropout must be a probability in [0, 1), got {p!r}")
    return p


def check_covers(name: str, shape: tuple[int, ...], score_shape: tuple[int, ...]) -> None:
    """A mask or bias of ``shape`` must broadcast to the scores without growing them."""
    from .errors import MaskError

    n = max(len(shape), len(score_shape))
    a = (1,) * (n - len(shape)) + tuple(shape)
    b = (1,) * (n - len(score_shape)) + tuple(score_shape)
    if len(shape) > len(score_shape) or any(x != y and x != 1 for x, y in zip(a, b, strict=True)):
        raise MaskError(
            f"{name} has shape {tuple(shape)}, which does not broadcast to the scores (..., Nq, Nk) = "
            f"{tuple(score_shape)}; batch-dependent masks follow the (B, H, Nq, Nk) layout"
        )
