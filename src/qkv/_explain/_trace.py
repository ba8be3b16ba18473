"""``Step`` and ``Trace``: the record ``qkv.explain`` returns, every intermediate complete.

A ``Trace`` holds complete values even where its text and HTML renderings (``_render``)
abbreviate them; ``to_dict()`` is JSON-safe.
"""

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, overload

import numpy as np

from ._render import html, text


@dataclass(frozen=True, eq=False)
class Step:
    """One intermediate: ``name`` (the key in the trace), ``formula``, read-only ``value``, ``note``."""

    name: str
    formula: str
    value: np.ndarray
    note: str = ""

    def __post_init__(self) -> None:
        value = np.array(self.value)  # a private copy, frozen like the record
        value.flags.writeable = False
        object.__setattr__(self, "value", value)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: ``value`` as nested lists, non-finite numbers as ``"-inf"``, ``"inf"``, ``"nan"``."""
        return {
            "name": self.name,
            "formula": self.formula,
            "shape": list(self.shape),
            "note": self.note,
            "value": _jsonable(self.value.tolist()),
        }


@dataclass(frozen=True, eq=False)
class Trace(Sequence[Step]):
    """The steps of one ``explain`` call, in order; index by position or by name (``trace["A"]``).

    ``str(trace)`` is aligned text (long axes abbreviated), ``to_dict()`` is JSON-safe and
    ``to_html()`` a self-contained HTML fragment.
    """

    steps: tuple[Step, ...]
    inputs: Mapping[str, tuple[int, ...]]
    options: Mapping[str, Any]

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", MappingProxyType(dict(self.inputs)))
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))

    @overload
    def __getitem__(self, key: int | str) -> Step: ...
    @overload
    def __getitem__(self, key: slice) -> tuple[Step, ...]: ...
    def __getitem__(self, key: int | str | slice) -> Step | tuple[Step, ...]:
        return self.step(key) if isinstance(key, str) else self.steps[key]

    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self) -> Iterator[Step]:
        return iter(self.steps)

    def __contains__(self, item: object) -> bool:
        return item in self.names if isinstance(item, str) else item in self.steps

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.steps)

    def step(self, name: str) -> Step:
        """The step called ``name`` (``KeyError`` naming the available steps otherwise)."""
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(f"no step {name!r} in this trace; steps: {', '.join(self.names)}")

    @property
    def out(self) -> np.ndarray:
        """``O (*B, H, Nq, Dv)``."""
        return self.step("O").value

    @property
    def weights(self) -> np.ndarray:
        """``A (*B, H, Nq, Nk)``."""
        return self.step("A").value

    @property
    def lse(self) -> np.ndarray:
        """``lse (*B, H, Nq)``."""
        return self.step("lse").value

    @property
    def grads(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """``(dQ, dK, dV)`` with the shapes of ``q``, ``k``, ``v``, or None without ``grad=True``."""
        if "dQ" not in self:
            return None
        return self.step("dQ").value, self.step("dK").value, self.step("dV").value

    def to_dict(self) -> dict[str, Any]:
        """``{"inputs": {name: shape}, "options": {...}, "steps": [step.to_dict(), ...]}``, JSON-safe."""
        return {
            "inputs": {n: list(s) for n, s in self.inputs.items()},
            "options": dict(self.options),
            "steps": [s.to_dict() for s in self.steps],
        }

    def __str__(self) -> str:
        return text(self)

    def __repr__(self) -> str:
        return f"Trace({len(self)} steps: {', '.join(self.names)})"

    def to_html(self) -> str:
        """A self-contained HTML fragment: a table per step, text escaped, no external assets."""
        return html(self)


def _jsonable(x: Any) -> Any:
    if isinstance(x, list):
        return [_jsonable(e) for e in x]
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x
