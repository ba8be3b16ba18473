"""The float64 test oracle: boring loops written from the definitions, NumPy only.

Nothing here imports qkv.  Every implementation of ``qkv.attention`` (the readable
reference included) is checked against ``attention_oracle``; every mask constructor
against the ``*_allowed`` builders; every score mod against the ``*_score`` functions;
``attention_backward`` against ``numerical_gradients`` (central differences).

Alignment used throughout: query row ``i`` sits at the aligned position
``p = i + (Nk - Nq)`` (bottom-right), and ``d = p - j`` is its distance to key ``j``.

Order of operations (as decided for qkv):
``s = q·k * scale -> score_fn(s) -> + bias -> disallowed keys dropped -> softmax -> · v``.
"""

import math

import numpy as np

# --------------------------------------------------------------------------- attention


def _pad_leading(x, ndim):
    return x.reshape((1,) * (ndim - x.ndim) + x.shape)


def attention_oracle(q, k, v, allowed=None, bias=None, scale=None, score_fn=None):
    """Exact softmax attention, one query row at a time, in float64.

    q (..., H, Nq, Dk), k (..., Hkv, Nk, Dk), v (..., Hkv, Nk, Dv); leading axes broadcast;
    query head h reads kv head h // (H // Hkv) (repeat_interleave order).
    allowed: bool, broadcastable to (..., H, Nq, Nk), True = may attend.
    bias: float, broadcastable to (..., H, Nq, Nk), added after score_fn (may hold -inf).
    score_fn(s_row, h, i, j, nq, nk) -> s_row, with j = arange(Nk): applied to the scaled scores.
    Returns (out (..., H, Nq, Dv), weights (..., H, Nq, Nk), lse (..., H, Nq)); a row with no
    allowed finite score gives zeros, zero weights and lse = -inf.
    """
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    out_ndim = max(q.ndim, k.ndim, v.ndim)
    nd = max(out_ndim, 3)
    q, k, v = (_pad_leading(t, nd) for t in (q, k, v))
    h_q, nq, dk = q.shape[-3:]
    h_kv, nk, dv = v.shape[-3:]
    assert k.shape[-3:-1] == (h_kv, nk) and k.shape[-1] == dk
    assert h_q % h_kv == 0
    group = h_q // h_kv
    batch = np.broadcast_shapes(q.shape[:-3], k.shape[:-3], v.shape[:-3])
    q = np.broadcast_to(q, batch + q.shape[-3:])
    k = np.broadcast_to(k, batch + k.shape[-3:])
    v = np.broadcast_to(v, batch + v.shape[-3:])
    full = batch + (h_q, nq, nk)
    allowed = np.ones(full, dtype=bool) if allowed is None else np.broadcast_to(np.asarray(allowed), full)
    bias = np.zeros(full) if bias is None else np.broadcast_to(np.asarray(bias, dtype=np.float64), full)
    scale = 1.0 / math.sqrt(dk) if scale is None else float(scale)

    out = np.zeros(batch + (h_q, nq, dv))
    weights = np.zeros(full)
    lse = np.full(batch + (h_q, nq), -np.inf)
    j = np.arange(nk)
    for b in np.ndindex(*batch):
        for h in range(h_q):
            kv = h // group
            for i in range(nq):
                s = np.array([scale * float(np.dot(q[b + (h, i)], k[b + (kv, jj)])) for jj in range(nk)])
                if score_fn is not None:
                    s = np.asarray(score_fn(s, h, i, j, nq, nk), dtype=np.float64)
                s = s + bias[b + (h, i)]
                keep = allowed[b + (h, i)] & (s > -np.inf)
                if not keep.any():
                    continue
                m = s[keep].max()
                e = np.zeros(nk)
                e[keep] = np.exp(s[keep] - m)
                z = e.sum()
                weights[b + (h, i)] = e / z
                lse[b + (h, i)] = m + math.log(z)
                for jj in range(nk):
                    out[b + (h, i)] += weights[b + (h, i, jj)] * v[b + (kv, jj)]
    strip = nd - out_ndim
    return (out.reshape(out.shape[strip:]), weights.reshape(weights.shape[strip:]), lse.reshape(lse.shape[strip:]))


def weighted_values(weights, v):
    """out[..., h, i] = sum_j weights[..., h, i, j] * v[..., h // (H // Hkv), j] (loops)."""
    weights, v = np.asarray(weights, np.float64), np.asarray(v, np.float64)
    out_ndim = max(weights.ndim, v.ndim)
    nd = max(out_ndim, 3)
    weights, v = _pad_leading(weights, nd), _pad_leading(v, nd)
    h_q, nq, nk = weights.shape[-3:]
    group = h_q // v.shape[-3]
    batch = np.broadcast_shapes(weights.shape[:-3], v.shape[:-3])
    weights = np.broadcast_to(weights, batch + weights.shape[-3:])
    v = np.broadcast_to(v, batch + v.shape[-3:])
    out = np.zeros(batch + (h_q, nq, v.shape[-1]))
    for b in np.ndindex(*batch):
        for h in range(h_q):
            for i in range(nq):
                for jj in range(nk):
                    out[b + (h, i)] += weights[b + (h, i, jj)] * v[b + (h // group, jj)]
    return out.reshape(out.shape[nd - out_ndim :])


def softmax_oracle(x):
    """Row-wise softmax over the last axis; an all -inf row gives zeros."""
    x = np.asarray(x, np.float64)
    out = np.zeros_like(x)
    for idx in np.ndindex(*x.shape[:-1]):
        row = x[idx]
        keep = row > -np.inf
        if keep.any():
            e = np.exp(row[keep] - row[keep].max())
            out[idx][keep] = e / e.sum()
    return out


def logsumexp_oracle(x):
    """Row-wise log-sum-exp over the last axis; an all -inf row gives -inf."""
    x = np.asarray(x, np.float64)
    out = np.full(x.shape[:-1], -np.inf)
    for idx in np.ndindex(*x.shape[:-1]):
        row = x[idx]
        keep = row > -np.inf
        if keep.any():
            m = row[keep].max()
            out[idx] = m + math.log(np.exp(row[keep] - m).sum())
    return out


# --------------------------------------------------------------------------- gradients


def numerical_gradients(f, arrays, dout, eps=1e-6):
    """Central differences of L = sum(f(*arrays) * dout) with respect to each array (float64)."""
    arrays = [np.array(a, dtype=np.float64) for a in arrays]
    dout = np.asarray(dout, np.float64)
    grads = []
    for n, a in enumerate(arrays):
        g = np.zeros_like(a)
        for idx in np.ndindex(*a.shape):
            old = a[idx]
            a[idx] = old + eps
            plus = float(np.sum(f(*arrays) * dout))
            a[idx] = old - eps
            minus = float(np.sum(f(*arrays) * dout))
            a[idx] = old
            g[idx] = (plus - minus) / (2 * eps)
        grads.append(g)
        arrays[n] = a
    return grads


# --------------------------------------------------------------------------- masks


def _grid(nq, nk, pred):
    a = np.zeros((nq, nk), dtype=bool)
    for i in range(nq):
        for j in range(nk):
            a[i, j] = bool(pred(i, j))
    return a


def causal_allowed(nq, nk, offset=None):
    """j <= i + offset; offset None means Nk - Nq (bottom-right)."""
    off = nk - nq if offset is None else offset
    return _grid(nq, nk, lambda i, j: j <= i + off)


def sliding_window_allowed(nq, nk, size, causal=True):
    """causal: 0 <= p - j < size; otherwise |p - j| < size."""

    def pred(i, j):
        d = i + (nk - nq) - j
        return 0 <= d < size if causal else abs(d) < size

    return _grid(nq, nk, pred)


def padding_allowed(nq, nk, kv_lengths, q_lengths=None):
    """int kv_lengths -> (Nq, Nk): j < kv_lengths.  Arrays (B,) -> (B, 1, Nq, Nk), with rows
    i >= q_lengths[b] attending nothing."""
    if np.ndim(kv_lengths) == 0:
        return _grid(nq, nk, lambda i, j: j < int(kv_lengths))
    kv_lengths = [int(x) for x in kv_lengths]
    q_lengths = [nq] * len(kv_lengths) if q_lengths is None else [int(x) for x in q_lengths]
    out = np.zeros((len(kv_lengths), 1, nq, nk), dtype=bool)
    for b, (lk, lq) in enumerate(zip(kv_lengths, q_lengths, strict=True)):
        out[b, 0] = _grid(nq, nk, lambda i, j, lk=lk, lq=lq: j < lk and i < lq)
    return out


def document_allowed(nq, nk, doc_ids):
    """doc_ids (Nk,) -> (Nq, Nk); (B, Nk) -> (B, 1, Nq, Nk): doc_ids[p] == doc_ids[j]."""
    doc_ids = np.asarray(doc_ids)
    assert nq <= nk, "the oracle defines document masks for Nq <= Nk only"

    def one(ids):
        return _grid(nq, nk, lambda i, j: ids[i + (nk - nq)] == ids[j])

    if doc_ids.ndim == 1:
        return one(doc_ids)
    return np.stack([one(ids) for ids in doc_ids])[:, None]


def prefix_lm_allowed(nq, nk, prefix_len):
    """j < prefix_len or j <= p."""
    return _grid(nq, nk, lambda i, j: j < prefix_len or j <= i + (nk - nq))


def global_tokens_allowed(nq, nk, indices):
    """p in indices or j in indices."""
    idx = {int(x) for x in indices}
    return _grid(nq, nk, lambda i, j: (i + (nk - nq)) in idx or j in idx)


def dilated_allowed(nq, nk, window, dilation):
    """|d| < window * dilation and d divisible by dilation (symmetric)."""

    def pred(i, j):
        d = i + (nk - nq) - j
        return abs(d) < window * dilation and d % dilation == 0

    return _grid(nq, nk, pred)


def tile_classes(dense, block_q, block_k):
    """Brute-force tiling of a dense (..., Nq, Nk) mask: 0 = no cell allowed, 2 = every cell
    allowed, 1 = some; edge tiles cover only the cells inside the matrix."""
    dense = np.asarray(dense, dtype=bool)
    nq, nk = dense.shape[-2:]
    nbq, nbk = -(-nq // block_q), -(-nk // block_k)
    out = np.zeros(dense.shape[:-2] + (nbq, nbk), dtype=np.int64)
    for a in range(nbq):
        for b in range(nbk):
            tile = dense[..., a * block_q : (a + 1) * block_q, b * block_k : (b + 1) * block_k]
            out[..., a, b] = np.where(tile.all(axis=(-2, -1)), 2, np.where(tile.any(axis=(-2, -1)), 1, 0))
    return out


# --------------------------------------------------------------------------- score mods
# Each takes (s, h, i, j, nq, nk, xp=np): s the scaled scores (a row in the oracle, or a full
# (..., H, Nq, Nk) torch tensor with h (H, 1, 1), i (Nq, 1), j (1, Nk) index arrays in tests).


def alibi_slopes(n_heads):
    """ALiBi (arXiv:2108.12409): 2^(-8k/n) for k = 1..n when n is a power of two; otherwise the
    slopes of the closest lower power of two m, then every other slope of 2m, truncated to n."""

    def power_of_two(n):
        return [2.0 ** (-8.0 * k / n) for k in range(1, n + 1)]

    m = 2 ** int(math.floor(math.log2(n_heads)))
    if m == n_heads:
        return np.array(power_of_two(n_heads))
    return np.array(power_of_two(m) + power_of_two(2 * m)[0::2][: n_heads - m])


def _const(xp, a):
    return xp.asarray(np.asarray(a, dtype=np.float64))


def alibi_score(slopes):
    """s - slopes[h] * |p - j|."""
    slopes = np.asarray(slopes, dtype=np.float64)

    def fn(s, h, i, j, nq, nk, xp=np):
        return s - _const(xp, slopes[h] * np.abs(i + (nk - nq) - j))

    return fn


def softcap_score(c):
    """c * tanh(s / c)."""

    def fn(s, h, i, j, nq, nk, xp=np):
        return c * xp.tanh(s / c)

    return fn


def temperature_score(t):
    """s / t."""

    def fn(s, h, i, j, nq, nk, xp=np):
        return s / t

    return fn


def relative_bias_score(table, max_distance):
    """s + table[h, clip(j - p, -M, M) + M]; a 1-D table is shared by every head."""
    table = np.asarray(table, dtype=np.float64)
    table = table[None] if table.ndim == 1 else table

    def fn(s, h, i, j, nq, nk, xp=np):
        head = np.asarray(h) if table.shape[0] > 1 else np.zeros_like(np.asarray(h))
        rel = np.clip(j - (i + (nk - nq)), -max_distance, max_distance) + max_distance
        return s + _const(xp, table[head, rel])

    return fn


def chain_scores(*fns):
    """Apply fns[0], then fns[1], ...: the meaning of ``a + b`` on qkv score mods."""

    def fn(s, h, i, j, nq, nk, xp=np):
        for f in fns:
            s = f(s, h, i, j, nq, nk, xp=xp)
        return s

    return fn
