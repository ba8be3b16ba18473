"""Masks by name, the one grammar of the command line and the lab: ``"kind:key=value,..."``.

One table (``MASK_PARAMS``) names every kind, its parameters, their types and defaults, so the
command line (``qkv heatmap --mask``), the lab's controls and the error messages all read the
same list. Every mask is built from ``qkv.masks`` constructors; nothing here computes a mask.

    >>> parse_mask_spec("sliding_window:window=4,causal=false")
    ('sliding_window', {'window': 4, 'causal': False})
    >>> build_mask("document", 8, 8, doc_lengths=(3, 5)).dense(8, 8).sum()
    np.int64(34)
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._checks import check_int
from ..errors import ArgumentError, MaskError
from ._data import document, global_tokens, random_blocks
from ._mask import Mask
from ._positions import causal, chunked, dilated, prefix_lm, sliding_window
from ._sequences import padding

MASK_KINDS: tuple[str, ...] = (
    "none",
    "causal",
    "sliding_window",
    "document",
    "padding",
    "prefix_lm",
    "longformer",
    "bigbird",
    "dilated",
    "chunked",
)


@dataclass(frozen=True)
class Param:
    """One parameter of a mask kind: ``type`` is ``"int"``, ``"bool"``, ``"ints"`` (a list) or
    ``"int?"`` (an int or none); ``default`` is a value or a text saying how it follows Nq/Nk."""

    type: str
    default: Any
    help: str


_WINDOW = Param("int", 3, "keys within this distance of the query (>= 1)")
_CAUSAL_OFF = Param("bool", False, "also hide future keys (combine with causal)")
_GLOBAL = Param("ints", (0,), "global positions: attend and are attended by every token")

MASK_PARAMS: dict[str, dict[str, Param]] = {
    "none": {},
    "causal": {"offset": Param("int?", None, "key j is visible iff j <= i + offset; none: Nk - Nq (bottom-right)")},
    "sliding_window": {
        "window": Param("int", 4, "the window size: causal keeps the `window` most recent keys (>= 1)"),
        "causal": Param("bool", True, "false: `window - 1` keys on each side (Longformer)"),
    },
    "document": {
        "doc_lengths": Param("ints", None, "lengths of the packed documents, summing to Nk (e.g. 3+5)"),
        "n_docs": Param("int", 2, "split Nk into this many near-equal documents (when doc_lengths is not given)"),
        "causal": _CAUSAL_OFF,
    },
    "padding": {
        "kv_length": Param("int", "ceil(3 Nk / 4)", "real keys; keys at or past it are padding (1..Nk)"),
        "q_length": Param("int?", None, "real queries; later rows attend nothing (none: all real)"),
    },
    "prefix_lm": {"prefix": Param("int", "Nk // 2", "keys every query sees (bidirectional prefix; 0..Nk)")},
    "longformer": {"window": _WINDOW, "global_tokens": _GLOBAL, "causal": _CAUSAL_OFF},
    "bigbird": {
        "window": _WINDOW,
        "global_tokens": _GLOBAL,
        "block": Param("int", 2, "random attention block size (>= 1)"),
        "per_row": Param("int", 1, "random key blocks per query block (>= 0)"),
        "seed": Param("int", 0, "seed of the random blocks"),
        "causal": _CAUSAL_OFF,
    },
    "dilated": {
        "window": Param("int", 2, "attended keys on each side (>= 1)"),
        "dilation": Param("int", 2, "gap between attended keys (>= 1)"),
        "causal": _CAUSAL_OFF,
    },
    "chunked": {
        "size": Param("int", 4, "positions per chunk: causal attention inside each chunk only (>= 1)"),
        "offset": Param("int?", None, "query i sits at position i + offset; none: Nk - Nq (bottom-right)"),
    },
}
assert set(MASK_PARAMS) == set(MASK_KINDS)


def _kind(kind: Any) -> str:
    if not isinstance(kind, str) or kind not in MASK_KINDS:
        raise ArgumentError(f"unknown mask kind {kind!r}; choose one of: {', '.join(MASK_KINDS)}")
    return kind


def _where(kind: str, name: str) -> str:
    return f"mask {kind!r} parameter {name!r}"


def _to_int(kind: str, name: str, value: Any) -> int:
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            raise ArgumentError(f"{_where(kind, name)} must be an integer, got {value!r}") from None
    return check_int(value, _where(kind, name))


def _to_bool(kind: str, name: str, value: Any) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise ArgumentError(f"{_where(kind, name)} must be true or false, got {value!r}")


def _coerce(kind: str, name: str, value: Any) -> Any:
    """A Python or text value (``"3+5"``, ``"false"``, ``"none"``) as the parameter's type."""
    params = MASK_PARAMS[kind]
    if name not in params:
        allowed = ", ".join(params) or "none (this kind takes no parameters)"
        raise ArgumentError(f"mask {kind!r} has no parameter {name!r}; allowed: {allowed}")
    t = params[name].type
    if isinstance(params[name].default, str) and value == params[name].default:
        return value  # a size-dependent default echoed back (e.g. by the lab's form): resolved in _build
    if t == "bool":
        return _to_bool(kind, name, value)
    if t == "int?":
        if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "")):
            return None
        return _to_int(kind, name, value)
    if t == "ints":
        if isinstance(value, str):
            items: Sequence[Any] = [s for s in value.replace(" ", "+").split("+") if s]
        elif isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            items = [value]
        elif isinstance(value, (Sequence, np.ndarray)):
            items = list(value)
        else:
            raise ArgumentError(f"{_where(kind, name)} must be a list of integers (e.g. 3+5), got {value!r}")
        return tuple(_to_int(kind, name, x) for x in items)
    return _to_int(kind, name, value)


def _check_range(kind: str, name: str, value: int, lo: int, hi: int | None = None) -> int:
    if value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise ArgumentError(f"{_where(kind, name)} must be {bound}, got {value}")
    return value


def _doc_ids(kind: str, p: dict[str, Any], n_k: int) -> np.ndarray:
    if p.get("doc_lengths") is not None:
        lengths = p["doc_lengths"]
        if not lengths or any(x < 1 for x in lengths) or sum(lengths) != n_k:
            raise ArgumentError(
                f"{_where(kind, 'doc_lengths')} must be positive integers summing to Nk={n_k}, "
                f"got {'+'.join(map(str, lengths)) or 'nothing'}"
            )
    else:
        n = _check_range(kind, "n_docs", p["n_docs"], 1, n_k)
        lengths = [n_k // n + (1 if r < n_k % n else 0) for r in range(n)]
    return np.repeat(np.arange(len(lengths)), lengths)


def _global(kind: str, p: dict[str, Any], n_k: int) -> Mask:
    g = p["global_tokens"]
    for x in g:
        _check_range(kind, "global_tokens", x, 0, n_k - 1)
    return global_tokens(list(g))


def build_mask(kind: str, n_q: int, n_k: int, **params: Any) -> Mask | None:
    """The mask ``kind`` for ``Nq`` queries and ``Nk`` keys, or None for ``"none"``.

    ``params`` are the kind's parameters in ``MASK_PARAMS`` (Python values or their text form,
    e.g. ``doc_lengths="3+5"``); missing ones take the defaults listed there. Unknown kinds or
    parameters and bad values raise ``ArgumentError`` naming the kind, the parameter and what
    is allowed. Kinds: ``causal`` (offset), ``sliding_window`` (window, causal), ``document``
    (doc_lengths or n_docs, causal), ``padding`` (kv_length, q_length), ``prefix_lm`` (prefix),
    ``longformer`` = sliding window | global tokens (arXiv:2004.05150), ``bigbird`` = sliding
    window | global tokens | random blocks (arXiv:2007.14062), ``dilated`` (window, dilation),
    ``chunked`` (size, offset: Llama 4's chunked attention).
    """
    kind = _kind(kind)
    for name, n in (("n_q", n_q), ("n_k", n_k)):
        check_int(n, f"build_mask {name}", minimum=1)
    n_q, n_k = int(n_q), int(n_k)
    given = {name: _coerce(kind, name, value) for name, value in params.items()}
    p = {name: spec.default for name, spec in MASK_PARAMS[kind].items()} | given
    try:
        return _build(kind, n_q, n_k, p)
    except MaskError as e:  # a constructor's own check: report it as this kind's argument
        raise ArgumentError(f"mask {kind!r}: {e}") from None


def _build(kind: str, n_q: int, n_k: int, p: dict[str, Any]) -> Mask | None:
    if kind == "none":
        return None
    if kind == "causal":
        return causal(p["offset"])
    if kind == "sliding_window":
        return sliding_window(_check_range(kind, "window", p["window"], 1), causal=p["causal"])
    if kind == "document":
        if n_q > n_k:
            raise ArgumentError(f"mask 'document' needs Nq <= Nk, got Nq={n_q}, Nk={n_k}")
        m = document(_doc_ids(kind, p, n_k))
        return m & causal() if p["causal"] else m
    if kind == "padding":
        kv = n_k - n_k // 4 if isinstance(p["kv_length"], str) else p["kv_length"]  # str: the default
        kv = _check_range(kind, "kv_length", kv, 1, n_k)
        ql = p["q_length"]
        if ql is not None:
            _check_range(kind, "q_length", ql, 0, n_q)
        return padding(kv, ql)
    if kind == "prefix_lm":
        prefix = n_k // 2 if isinstance(p["prefix"], str) else p["prefix"]
        return prefix_lm(_check_range(kind, "prefix", prefix, 0, n_k))
    if kind in ("longformer", "bigbird"):
        m = sliding_window(_check_range(kind, "window", p["window"], 1), causal=False) | _global(kind, p, n_k)
        if kind == "bigbird":
            m = m | random_blocks(
                _check_range(kind, "block", p["block"], 1), _check_range(kind, "per_row", p["per_row"], 0), p["seed"]
            )
        return m & causal() if p["causal"] else m
    if kind == "chunked":
        return chunked(_check_range(kind, "size", p["size"], 1), offset=p["offset"])
    # dilated
    m = dilated(_check_range(kind, "window", p["window"], 1), _check_range(kind, "dilation", p["dilation"], 1))
    return m & causal() if p["causal"] else m


def parse_mask_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``"kind"`` or ``"kind:key=value,key=value"`` -> ``(kind, params)`` with typed values.

    Lists join with ``+`` (``doc_lengths=3+5``, ``global_tokens=0+7``); booleans are
    true/false (or 1/0, yes/no); ``none`` is None for optional integers. Raises
    ``ArgumentError`` for an unknown kind or parameter, a malformed pair or a bad value.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ArgumentError(
            f"empty mask spec; write kind or kind:key=value,... with kind one of: {', '.join(MASK_KINDS)}"
        )
    head, _, rest = spec.strip().partition(":")
    kind = _kind(head.strip())
    params: dict[str, Any] = {}
    for pair in (x for x in rest.split(",") if x.strip()) if rest.strip() else ():
        name, eq, value = pair.partition("=")
        name = name.strip()
        if not eq or not name:
            raise ArgumentError(f"mask spec {spec!r}: expected key=value, got {pair.strip()!r}")
        if name in params:
            raise ArgumentError(f"mask spec {spec!r}: parameter {name!r} given twice")
        params[name] = _coerce(kind, name, value.strip())
    return kind, params
