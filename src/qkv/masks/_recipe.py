"""A mask's recipe: the constructor and the arguments that made it, sendable where a ``Mask`` cannot go.

A torch custom operator takes tensors, numbers and strings, not Python objects; a compiled graph
(``torch.compile``, ``torch.export``) keeps the same. So every built-in constructor records how
it was called (``recorded``), the combinators combine the records, and ``encode`` turns a recipe
into ``(code, data)``: a string, the same for every call of the same structure, and the arrays
it refers to (sequence lengths, document ids, a boolean matrix) as tensors. ``decode`` builds
the mask back (once per code and data contents: ``_cache.cached``). ``from_fn`` masks have no
recipe: their predicate is opaque Python.

Inside ``torch.compile`` a constructor only records (``lazy``): its data may be a traced tensor
without values, and it is read, checked and planned where the operator runs.
"""

import ast
import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import _torch
from ._cache import cached
from ._mask import Mask

compiling = _torch.compiling


def lazy(name: str, recipe: Any) -> Mask:
    def allowed(i: np.ndarray, j: np.ndarray, nq: int, nk: int) -> np.ndarray:
        raise RuntimeError(f"mask {name} was made inside torch.compile: it is evaluated by qkv's operator only")

    return Mask(allowed, name, recipe=recipe)


def recorded(constructor: Callable[..., Mask]) -> Callable[..., Mask]:
    """A constructor whose masks carry their recipe ``(name, args, kwargs)``."""
    name = constructor.__name__

    @functools.wraps(constructor)
    def make(*args: Any, **kwargs: Any) -> Mask:
        if compiling():
            return lazy(name, (name, args, kwargs))
        import dataclasses

        mask = constructor(*args, **kwargs)
        # the arrays copied, as the constructors copy theirs: the caller may change its own later
        recipe = (name, tuple(_copy(a) for a in args), {k: _copy(v) for k, v in kwargs.items()})
        return dataclasses.replace(mask, recipe=recipe)

    return make


def _is_array(x: Any) -> bool:
    if isinstance(x, np.ndarray):
        return True
    torch = _torch.loaded()
    return torch is not None and isinstance(x, torch.Tensor)


def _copy(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return x.copy()
    if _is_array(x):
        return x.detach().clone()
    return x


def encode(recipe: Any) -> tuple[str, list[Any]]:
    """``(code, data)``: the recipe as a Python literal in which each array is ``("@", i)``, the
    arrays in ``data`` (as given: NumPy arrays or tensors; the caller turns them into tensors).
    Written with f-strings and ``isinstance`` only, so that torch's tracer follows it."""
    data: list[Any] = []

    def walk(x: Any) -> str:
        if _is_array(x):
            data.append(x)
            return f"('@', {len(data) - 1})"
        if isinstance(x, dict):
            return "{" + "".join(f"'{key}': {walk(x[key])}, " for key in sorted(x)) + "}"
        if isinstance(x, tuple):
            return "(" + "".join(f"{walk(v)}, " for v in x) + ")"
        if isinstance(x, list):
            return "[" + "".join(f"{walk(v)}, " for v in x) + "]"
        if isinstance(x, str):
            return f"'{x}'"
        if isinstance(x, bool) or x is None:
            return f"{x}"
        if isinstance(x, (int, np.integer)):
            return f"{int(x)}"
        return f"{float(x)!r}"

    return walk(recipe), data


def decode_tree(code: str, data: list[Any]) -> Any:
    """The tree ``encode`` wrote, its arrays taken from ``data``."""

    def walk(x: Any) -> Any:
        if isinstance(x, tuple) and len(x) == 2 and x[0] == "@":
            return data[x[1]]
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, tuple):
            return tuple(walk(v) for v in x)
        if isinstance(x, list):
            return [walk(v) for v in x]
        return x

    return walk(ast.literal_eval(code))


def build(recipe: Any) -> Mask:
    """The mask a recipe describes (its constructors run: their checks too)."""
    from .. import masks

    op = recipe[0]
    if op == "&":
        return build(recipe[1]) & build(recipe[2])
    if op == "|":
        return build(recipe[1]) | build(recipe[2])
    if op == "~":
        return ~build(recipe[1])
    name, args, kwargs = recipe
    return getattr(masks, name)(*args, **kwargs)


def decode(code: str, data: list[np.ndarray]) -> Mask:
    """``build`` of an encoded recipe, remembered per code and data contents."""
    key = (code, tuple((a.dtype.str, a.shape, a.tobytes()) for a in data))
    return cached(("recipe", key), lambda: build(decode_tree(code, data)))
