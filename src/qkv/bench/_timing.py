"""Wall-clock timing: ``measure`` one callable, ``compare`` several interleaved.

On a shared, noisy machine one absolute time means little; what survives the noise is the
*ratio* of two candidates measured side by side. ``compare`` therefore runs the candidates
round-robin (A B C A B C ...) so that a slow spell hits every candidate of a round alike,
and ``paired_ratios`` divides the times of the same round before taking the median.
"""

import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np


class Timing(NamedTuple):
    """Seconds per call: ``median``, interquartile range ``iqr``, ``min``, and every sample in order."""

    median: float
    iqr: float
    min: float
    samples: tuple[float, ...]


def timing(samples: list[float] | tuple[float, ...]) -> Timing:
    """The summary of raw samples (seconds)."""
    if not samples:
        raise ValueError("timing needs at least one sample")
    a = np.asarray(samples, dtype=np.float64)
    q1, med, q3 = np.percentile(a, [25, 50, 75])
    return Timing(float(med), float(q3 - q1), float(a.min()), tuple(float(x) for x in a))


def _timed(fn: Callable[[], Any], sync: Callable[[], Any] | None) -> float:
    t0 = time.perf_counter()
    fn()
    if sync is not None:
        sync()  # an asynchronous device has finished only when it says so
    return time.perf_counter() - t0


def measure(
    fn: Callable[[], Any], *, warmup: int = 1, repeats: int = 5, sync: Callable[[], Any] | None = None
) -> Timing:
    """Time ``fn()`` ``repeats`` times after ``warmup`` untimed calls; ``sync()`` ends each call.

    >>> t = measure(lambda: sum(range(1000)), repeats=7)
    >>> t.median, t.iqr
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    for _ in range(warmup):
        fn()
        if sync is not None:
            sync()
    return timing([_timed(fn, sync) for _ in range(repeats)])


def compare(
    fns: Mapping[str, Callable[[], Any]],
    *,
    warmup: int = 1,
    repeats: int = 5,
    sync: Callable[[], Any] | None = None,
    rotate: bool = False,
) -> dict[str, Timing]:
    """Time several candidates interleaved round-robin: warm-ups, then A B C A B C ... ``repeats`` rounds.

    Sample ``r`` of every candidate comes from round ``r``, so ``paired_ratios`` can divide
    times measured seconds apart rather than minutes apart. ``rotate=True`` starts round ``r``
    at candidate ``r mod k`` (A B C, B C A, C A B, ...): a candidate that runs right after one
    that trashes the caches or frees gigabytes then pays for it in only some rounds.

    >>> t = compare({"a": f, "b": g}, repeats=5)
    >>> t["a"].median / t["b"].median
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    for _ in range(warmup):
        for fn in fns.values():
            fn()
            if sync is not None:
                sync()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    items = list(fns.items())
    for r in range(repeats):
        shift = r % len(items) if rotate and items else 0
        for name, fn in items[shift:] + items[:shift]:
            samples[name].append(_timed(fn, sync))
    return {name: timing(s) for name, s in samples.items()}


class Ratio(NamedTuple):
    """Median and quartiles of per-round ratios ``numerator / denominator``."""

    median: float
    q1: float
    q3: float


def paired_ratios(numerator: Timing, denominator: Timing) -> Ratio:
    """Per-round ratios of two candidates timed by the same ``compare`` call, summarised.

    ``paired_ratios(baseline, candidate).median`` is the candidate's speed-up over the
    baseline (above 1: faster).
    """
    n = min(len(numerator.samples), len(denominator.samples))
    r = np.asarray(numerator.samples[:n]) / np.asarray(denominator.samples[:n])
    q1, med, q3 = np.percentile(r, [25, 50, 75])
    return Ratio(float(med), float(q1), float(q3))
