"""Positional information: ALiBi slopes (sinusoidal tables and RoPE arrive with the building blocks)."""

import math

import numpy as np


def alibi_slopes(n_heads: int) -> np.ndarray:
    """The ALiBi head slopes (Press et al., arXiv:2108.12409), float64 ``(n_heads,)``.

    For ``n`` a power of two, head ``k = 1..n`` gets ``2^(-8k/n)``. Otherwise the paper's
    recipe: the slopes of the closest lower power of two ``m``, then every other slope of
    ``2m`` heads, until there are ``n_heads``.

    >>> alibi_slopes(4)
    array([0.25  , 0.0625  , 0.015625, 0.00390625])
    """
    from .errors import ArgumentError

    if isinstance(n_heads, bool) or int(n_heads) != n_heads or n_heads < 1:
        raise ArgumentError(f"n_heads must be a positive integer, got {n_heads!r}")
    n = int(n_heads)

    def power_of_two(m: int) -> np.ndarray:
        return 2.0 ** (-8.0 * np.arange(1, m + 1) / m)

    m = 2 ** int(math.floor(math.log2(n)))
    if m == n:
        return power_of_two(n)
    return np.concatenate([power_of_two(m), power_of_two(2 * m)[0::2][: n - m]])
