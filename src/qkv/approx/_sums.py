"""Normalised linear attention on features: ``φ(q)(φ(k)ᵀ V) / φ(q)(φ(k)ᵀ 1)``.

Non-causal: two small products, ``φ(k)ᵀ V`` (F x Dv) and ``φ(k)ᵀ 1`` (F), shared by every query
(Katharopoulos et al., arXiv:2006.16236, eq. 5-6).

Causal (bottom-right, as ``qkv.attention``: query ``i`` sees keys ``j <= i + Nk - Nq``) by prefix
sums in chunks, the chunkwise form of the paper's eq. 8-9 (also Hua et al., arXiv:2202.10447):
the keys are cut into chunks of ``C``; the state before chunk ``c``,
``S_c = Σ_{j < cC} φ(k_j) v_jᵀ`` and ``z_c = Σ_{j < cC} φ(k_j)``, is an exclusive cumulative sum
over the chunks; a query in chunk ``c`` reads ``φ(q)·S_c`` plus its causal ``C x C`` block
inside the chunk. Time ``O(N·F·Dv + N·C·(F + Dv))``, memory ``O(N/C · F·Dv + N·C)``: the
``N x N`` matrix never exists, and there is no Python loop over positions.

Numerical safety: with non-negative features the output row is a weighted average of value
rows, so ``|out| <= max |v|`` whatever the size of the sums. A row whose normaliser
``φ(q)·z`` is exactly 0 (all-zero ``relu`` features, or ``exp`` underflowing) has nothing to
average and gives zeros, like an empty row of exact attention; no epsilon is added, so every
other row is the formula exactly. The division uses a safe denominator, so autograd's backward
never sees ``0 / 0`` either.
"""

import math
from typing import Any

import numpy as np

from .._backend import device, from_numpy
from .._typing import Array

CHUNK = 64
"""Chunk length of the causal prefix sums: balances the ``C x C`` blocks against the states."""


def _normalise(xp: Any, num: Array, den: Array) -> Array:
    ok = den > 0
    return xp.where(ok, num / xp.where(ok, den, xp.ones_like(den)), xp.zeros_like(num))


def _pad_rows(xp: Any, x: Array, before: int, after: int) -> Array:
    """Zero rows added on axis -2 (zero features add nothing to any sum)."""
    if before == 0 and after == 0:
        return x
    parts = []
    if before:
        parts.append(xp.zeros((*x.shape[:-2], before, x.shape[-1]), dtype=x.dtype, device=device(x)))
    parts.append(x)
    if after:
        parts.append(xp.zeros((*x.shape[:-2], after, x.shape[-1]), dtype=x.dtype, device=device(x)))
    return xp.concat(parts, axis=-2)


def linear(xp: Any, fq: Array, fk: Array, v: Array) -> Array:
    """Non-causal: ``fq (..., Nq, F)``, ``fk (..., Nk, F)``, ``v (..., Nk, Dv)`` -> ``(..., Nq, Dv)``."""
    kv = fk.mT @ v  # (..., F, Dv)
    z = xp.sum(fk, axis=-2)[..., None]  # (..., F, 1)
    return _normalise(xp, fq @ kv, fq @ z)


def causal_linear(xp: Any, fq: Array, fk: Array, v: Array, chunk: int | None = None) -> Array:
    """Causal (bottom-right) by chunked prefix sums; shapes as in ``linear``."""
    nq, nk = fq.shape[-2], fk.shape[-2]
    dead = max(0, nq - nk)  # queries whose aligned position i + Nk - Nq is negative: nothing to see
    live = fq[..., dead:, :]
    offset = nk - live.shape[-2]  # aligned position of the first live query
    c = max(1, min(chunk or CHUNK, nk))
    n_chunks = math.ceil(nk / c)
    first = offset // c  # the chunk holding the first live query; earlier chunks only feed the states
    tail = n_chunks * c - nk
    fkc = xp.reshape(_pad_rows(xp, fk, 0, tail), (*fk.shape[:-2], n_chunks, c, fk.shape[-1]))
    vc = xp.reshape(_pad_rows(xp, v, 0, tail), (*v.shape[:-2], n_chunks, c, v.shape[-1]))
    # states before each chunk: exclusive cumulative sums over the chunk axis
    s = xp.cumulative_sum(fkc.mT @ vc, axis=-3, include_initial=True)[..., first:n_chunks, :, :]
    z = xp.cumulative_sum(xp.sum(fkc, axis=-2), axis=-2, include_initial=True)[..., first:n_chunks, :]
    fkc, vc = fkc[..., first:, :, :], vc[..., first:, :, :]
    lead = offset - first * c  # live queries start this far into chunk `first`
    fqc = _pad_rows(xp, live, lead, tail)
    fqc = xp.reshape(fqc, (*fqc.shape[:-2], n_chunks - first, c, fqc.shape[-1]))
    tril = from_numpy(np.tril(np.ones((c, c))), fqc, fqc.dtype)  # j <= i inside a chunk
    a = (fqc @ fkc.mT) * tril  # (..., chunks, C, C): within-chunk weights φ(q_i)·φ(k_j)
    num = fqc @ s + a @ vc
    den = xp.sum(fqc * z[..., None, :], axis=-1) + xp.sum(a, axis=-1)
    out = _normalise(xp, num, den[..., None])
    out = xp.reshape(out, (*out.shape[:-3], (n_chunks - first) * c, out.shape[-1]))[
        ..., lead : lead + live.shape[-2], :
    ]
    return _pad_rows(xp, out, dead, 0)
