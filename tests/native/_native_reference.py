"""Dense float64 reference for qkv._native, written from the contract (NumPy only, no qkv).

Everything is materialised at Nq x Nk: scores -> mods -> + bias -> mask -> softmax (empty rows
give zeros and lse = -inf) -> dropout -> · V; the backward by the analytic formulas
(dS = P ∘ (dP − D) ∘ mods', D = rowsum(dO ∘ O) − dlse).
"""

from __future__ import annotations

import numpy as np

EMPTY, PARTIAL, FULL = 0, 1, 2


def dense_allowed(b, h, nq, nk, bq, bk, tile_class=None, rows=None, bitmap_index=None, bitmaps=None):
    """bool (B, H, Nq, Nk) from the tile representation (broadcast Bm/Hm axes expanded)."""
    i = np.arange(nq)[:, None]
    j = np.arange(nk)[None, :]
    out = np.ones((b, h, nq, nk), dtype=bool)
    for bb in range(b):
        for hh in range(h):
            iv = None
            if rows is not None:
                r = rows[bb % rows.shape[0], hh % rows.shape[1]]
                iv = (j >= r[:, 0:1]) & (j < r[:, 1:2])
            if tile_class is None:
                if iv is not None:
                    out[bb, hh] = iv
                continue
            tc = tile_class[bb % tile_class.shape[0], hh % tile_class.shape[1]]
            cls = tc[i // bq, j // bk]
            partial = np.ones((nq, nk), dtype=bool) if iv is None else iv.copy()
            if bitmap_index is not None:
                bi = bitmap_index[bb % bitmap_index.shape[0], hh % bitmap_index.shape[1]][i // bq, j // bk]
                ii, jj = np.broadcast_arrays(i, j)
                words = bitmaps[np.maximum(bi, 0), ii % bq, (jj % bk) // 64]
                bit = (words >> (jj % bk % 64).astype(np.uint64)) & np.uint64(1)
                partial &= (bi < 0) | (bit == 1)
            out[bb, hh] = np.where(cls == FULL, True, np.where(cls == EMPTY, False, partial))
    return out


def apply_mods(s, mods, nq, nk):
    """s (B, H, Nq, Nk) scaled scores -> (modded, derivative)."""
    b, h = s.shape[:2]
    p = (np.arange(nq) + (nk - nq))[:, None]
    j = np.arange(nk)[None, :]
    d = np.ones_like(s)
    for m in mods:
        if m[0] == "mul":
            s = s * m[1]
            d = d * m[1]
        elif m[0] == "softcap":
            t = np.tanh(s / m[1])
            s = m[1] * t
            d = d * (1 - t * t)
        elif m[0] == "alibi":
            sl = np.asarray(m[1], np.float64)
            sl = sl.reshape((1,) * (2 - sl.ndim) + sl.shape)
            sl = np.broadcast_to(sl, (b, h))
            s = s - sl[:, :, None, None] * np.abs(p - j)[None, None]
        elif m[0] == "relbias":
            tab = np.broadcast_to(np.asarray(m[1], np.float64), (h, 2 * m[2] + 1))
            idx = np.clip(j - p, -m[2], m[2]) + m[2]
            s = s + tab[:, idx][None]
        else:
            raise ValueError(m)
    return s, d


def forward(q, k, v, scale, allowed=None, mods=(), bias=None, keep=None, p=0.0):
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    b, h, nq, _ = q.shape
    g = h // k.shape[1]
    nk = k.shape[2]
    kk, vv = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = np.einsum("bhid,bhjd->bhij", q, kk) * scale
    s, dfac = apply_mods(s, mods, nq, nk)
    if bias is not None:
        s = s + np.asarray(bias, np.float64)
    ok = s > -np.inf
    if allowed is not None:
        ok = ok & allowed
    s = np.where(ok, s, -np.inf)
    m = s.max(-1, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    e = np.where(ok, np.exp(s - m_safe), 0.0)
    lsum = e.sum(-1, keepdims=True)
    P = np.where(lsum > 0, e / np.where(lsum > 0, lsum, 1.0), 0.0)
    lse = np.where(lsum[..., 0] > 0, (m_safe + np.log(np.where(lsum > 0, lsum, 1.0)))[..., 0], -np.inf)
    Pd = P if keep is None else P * keep / (1 - p)
    out = np.einsum("bhij,bhjd->bhid", Pd, vv)
    return out, lse, P, Pd, dfac


def backward(q, k, v, dout, scale, allowed=None, mods=(), bias=None, keep=None, p=0.0, dlse=None):
    q, k, v, dout = (np.asarray(x, np.float64) for x in (q, k, v, dout))
    b, h, nq, dk = q.shape
    hkv = k.shape[1]
    g = h // hkv
    out, lse, P, Pd, dfac = forward(q, k, v, scale, allowed, mods, bias, keep, p)
    kk, vv = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    dv_full = np.einsum("bhij,bhid->bhjd", Pd, dout)
    dP = np.einsum("bhid,bhjd->bhij", dout, vv)
    if keep is not None:
        dP = dP * keep / (1 - p)
    D = (dout * out).sum(-1)
    if dlse is not None:
        D = D - np.asarray(dlse, np.float64)
    dS = P * (dP - D[..., None]) * dfac
    dq = np.einsum("bhij,bhjd->bhid", dS, kk) * scale
    dk_full = np.einsum("bhij,bhid->bhjd", dS, q) * scale
    dk_ = dk_full.reshape(b, hkv, g, *dk_full.shape[2:]).sum(2)
    dv_ = dv_full.reshape(b, hkv, g, *dv_full.shape[2:]).sum(2)
    return out, lse, dq, dk_, dv_


def keep_mask(philox_keep, seed, b, h, nq, nk, p):
    """The kernel's dropout keep-mask for every (b, h) via qkv._native.philox_keep."""
    return np.stack([np.stack([philox_keep(seed, bb, hh, 0, nq, 0, nk, p) for hh in range(h)]) for bb in range(b)])
