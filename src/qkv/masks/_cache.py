"""The one bounded, thread-safe cache of the masks family: plans, tile classes, bound masks and
decoded recipes, remembered per mask and size (``_plan``, ``_mask``, ``_recipe`` read it).
"""

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

CACHE_SIZE = 128
"""Entries the cache keeps (least recently used first out): a few sizes of a few masks."""

_cache: "OrderedDict[Any, Any]" = OrderedDict()
_lock = threading.Lock()


def cached(key: tuple[Any, ...], build: Callable[[], Any]) -> Any:
    """``build()`` remembered under ``key`` (whose first item is the mask: masks hash by identity,
    and the cache holds them, so an id is never reused while its entry lives). Built outside the
    lock: two threads may build the same value once each, never a torn one."""
    with _lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    value = build()
    with _lock:
        _cache[key] = value
        _cache.move_to_end(key)
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return value


def cache_clear() -> None:
    """Forget every plan (tests and benchmarks that time planning itself)."""
    with _lock:
        _cache.clear()
