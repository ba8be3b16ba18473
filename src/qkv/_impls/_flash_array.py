"""The flash kernel's array engine: the tile loop in array-API code (NumPy, torch, JAX).

FlashAttention (Dao et al., arXiv:2205.14135; FlashAttention-2, arXiv:2307.08691) on the
CPU, in array-API code: for each block of ``block_q`` queries, walk the key blocks keeping a
running row maximum ``m``, a running sum ``l`` and an accumulator rescaled by
``exp(m_old - m_new)``; the ``Nq x Nk`` matrix never exists. ``Mask.blocks`` classifies
tiles: EMPTY tiles are skipped, FULL tiles run without evaluating the mask, PARTIAL tiles
evaluate it on the tile only. The backward pass recomputes each tile's weights from the
saved ``lse`` (``A = exp(S - lse)``) and skips the same tiles.

All batch and head axes go through each tile's matmul at once, so the Python loop runs over
tiles only; grouped heads stack each kv head's query heads along the rows
(``(*B, Hkv, H/Hkv · bq, D)``), so K and V are never copied.

Sums that run over many tiles (``acc`` and ``l`` over key tiles forward; ``dQ`` over key tiles,
``dK`` and ``dV`` over query blocks backward) add each tile's result with a compensated (Kahan)
addition (``_kahan``): the rounding of a float32 result then stays that of one tile's matmul at
every length, instead of growing with the number of tiles.

Output rows and gradient blocks are written into preallocated arrays through ``set_`` /
``iadd_`` (``_backend``): in place for NumPy and torch, ``x.at[rows].set`` for immutable JAX
arrays; which of the two is decided once per call.
"""

import math
from typing import Any

import numpy as np

from .. import masks
from .._backend import (
    add_,
    compute_dtype,
    device,
    exp_sub_,
    from_numpy,
    iadd_,
    imul_,
    in_place,
    is_torch,
    namespace,
    set_,
    unbroadcast,
)
from .._finite import bad_rows, hidden_to_inf, zeroed
from .._heads import cast, group_q, ungroup
from .._philox import index_grids, keep_mask
from .._softmax import finalise, safe_max
from .._typing import Array, Result
from ..scores import through
from ._call import Call
from ._nonfinite import poisoned, poisoned_rows
from .reference import recomputed


def _bias_tile(bias: Array, q0: int, q1: int, k0: int, k1: int) -> Array:
    rows = slice(q0, q1) if bias.shape[-2] != 1 else slice(None)
    cols = slice(k0, k1) if bias.shape[-1] != 1 else slice(None)
    return bias[..., rows, cols]


class _Tiles:
    """The scores of one tile after scale, score mod, bias and mask (shared by both passes)."""

    def __init__(self, xp: Any, c: Call, q: Array, k: Array, ct: Any):
        self.xp, self.c, self.ct = xp, c, ct
        self.q, self.kg = q, k
        self.q_block: tuple[int, Array] | None = None
        # scale folded into q saves a pass over each tile, but only a power of two folds exactly:
        # rounding q · 2^-2.5 (Dk = 32) put an error on each product that |q| ~ 50 made up to 4.7x
        # torch's float32 error in dQ (torch scales the product, as the unfolded path here does)
        self.fold_scale = math.frexp(c.scale)[0] == 0.5
        self.bad_k = bad_rows(xp, k)  # key rows holding NaN / inf: (*B, Hkv, Nk), or None (the usual case)
        # hide with where() when a hidden key or bias entry may be non-finite (NaN + -inf is NaN)
        self.exact_hide = self.bad_k is not None or (c.bias is not None and bad_rows(xp, c.bias) is not None)

    def dropped(self, a: Array, q0: int, q1: int, k0: int, k1: int) -> Array:
        """``a ∘ keep / (1 − p)`` for the tile's counter-based keep mask (``qkv._philox``)."""
        c = self.c
        b, h = index_grids(c.dims.score_shape[:-2], c.dims.has_heads)
        keep = keep_mask(int(c.rng), c.dropout, b, h, np.arange(q0, q1)[:, None], np.arange(k0, k1)[None, :])
        keep = from_numpy(np.broadcast_to(keep, tuple(a.shape)), a)
        return self.xp.where(keep, a * (1.0 / (1.0 - c.dropout)), self.xp.zeros_like(a))

    def key_block(self, k0: int, k1: int) -> Array:
        """``k[k0:k1]`` in the compute dtype, non-finite rows zeroed (for ``dQ = dS K``: ``dS`` is
        0 where such a key is hidden and NaN where it was attended)."""
        kb = self.kg[..., k0:k1, :]
        kb = kb if kb.dtype == self.ct else self.xp.astype(kb, self.ct)
        return kb if self.bad_k is None else zeroed(self.xp, kb, self.bad_k[..., k0:k1])

    def _q_block(self, q0: int, q1: int) -> Array:
        """``q[q0:q1]`` in the compute dtype (times ``scale`` when ``fold_scale``), kept while the
        row of tiles lasts."""
        if self.q_block is None or self.q_block[0] != q0:
            qb = group_q(self.xp, self.q[..., q0:q1, :], self.c.dims)
            qb = qb if qb.dtype == self.ct else self.xp.astype(qb, self.ct)
            self.q_block = (q0, qb * self.c.scale if self.fold_scale else qb)
        return self.q_block[1]

    def scores(self, q0: int, q1: int, k0: int, k1: int, cls: int) -> tuple[Array, Any]:
        xp, c, d = self.xp, self.c, self.c.dims
        kb = self.kg[..., k0:k1, :]
        if kb.dtype != self.ct:
            kb = xp.astype(kb, self.ct)
        s = ungroup(xp, self._q_block(q0, q1) @ kb.mT, d)
        if not self.fold_scale:
            s = imul_(s, self.c.scale, in_place(s))
        grad = None
        if c.score_mod is not None:
            i, j = np.arange(q0, q1)[:, None], np.arange(k0, k1)[None, :]
            s, grad = c.score_mod.with_grad(s, i, j, d.nq, d.nk)
        if c.bias is not None:
            s = add_(s, xp.astype(_bias_tile(c.bias, q0, q1, k0, k1), self.ct))
        if cls == masks.PARTIAL:
            hidden = ~c.mask.tile(q0, q1, k0, k1, d.nq, d.nk)  # type: ignore[union-attr]
            if self.exact_hide:
                s = hidden_to_inf(xp, s, from_numpy(hidden, s))
            else:  # adding a 0 / -inf tile: 0.07 ms against 0.54 ms for where() on an 8 x 256 x 512 float32 tile
                s = add_(s, from_numpy(np.where(hidden, np.float32(-np.inf), np.float32(0)), s, self.ct))
        return s, grad


def _values(xp: Any, p: Array, vb: Array, bad: Array | None) -> Array:
    """``P V`` of one tile (``p`` grouped, ``(*B, Hkv, r·bq, bk)``), a non-finite value row read
    only by the rows that attend it (``qkv._finite``)."""
    if bad is None or not bool(xp.any(bad)):
        return p @ vb
    reads = xp.any((p > 0) & bad[..., None, :], axis=-1)
    return xp.where(reads[..., None], p @ vb, p @ zeroed(xp, vb, bad))


def _kahan(acc: Array, err: Array, t: Array, alpha: Any, inplace: bool) -> tuple[Array, Array]:
    """``acc · alpha + t`` (alpha None: 1), compensated: ``err`` holds what ``acc``'s rounding lost
    (Kahan's carry, negated), rescaled along. Returns the new ``(acc, err)``. Each tile is summed
    from zero by its matmul and the tiles meet here, so N keys err like one tile's sum, not like
    ``N / block_k`` rounded additions. ``inplace`` (NumPy, torch): ``acc``, ``err`` and ``t`` (a
    fresh array the caller gives up) are overwritten, with no temporaries: the tile loop's
    elementwise passes are memory-bound."""
    if not inplace:
        a = acc if alpha is None else acc * alpha
        y = t + (err if alpha is None else err * alpha)
        s = a + y
        return s, (a - s) + y
    if alpha is not None:
        acc = imul_(acc, alpha, True)
        err = imul_(err, alpha, True)
    t += err  # y
    err[...] = acc  # a
    acc += t  # s = a + y
    err -= acc  # a - s: exact (Kahan)
    err += t  # (a - s) + y: what s lost
    return acc, err


def _wide_dtype(xp: Any, x: Array, ct: Any) -> Any:
    """float64 where the library has it on ``x``'s device (NumPy; torch on the CPU), else ``ct``:
    the dtype ``D = rowsum(dO ∘ O)`` is summed in (JAX without x64, GPUs keep ``ct``)."""
    if isinstance(x, np.ndarray) or (is_torch(x) and x.device.type == "cpu"):
        return xp.float64
    return ct


def _blocks(n: int, size: int) -> list[tuple[int, int]]:
    return [(a, min(a + size, n)) for a in range(0, n, size)]


def forward(c: Call, block_q: int, block_k: int, classes: np.ndarray) -> Result:
    """Out and lse (and the weights, when asked) by tiles of ``block_q x block_k`` of the given classes."""
    xp = namespace(q=c.q, k=c.k, v=c.v)
    d = c.dims
    ct = compute_dtype(xp, c.q)
    tiles = _Tiles(xp, c, c.q, c.k, ct)
    vg = c.v
    bad_v = bad_rows(xp, vg)  # value rows holding NaN / inf, or None
    kblocks = _blocks(d.nk, block_k)
    lead = d.score_shape[:-2]
    inplace = in_place(c.q)  # False for JAX: row blocks written by out.at[rows].set
    out = xp.empty((*lead, d.nq, d.dv), dtype=c.q.dtype, device=device(c.q))
    lse = xp.empty((*lead, d.nq), dtype=ct, device=device(c.q))
    for bi, (q0, q1) in enumerate(_blocks(d.nq, block_q)):
        m = xp.full((*lead, q1 - q0, 1), -float("inf"), dtype=ct)
        l = xp.zeros((*lead, q1 - q0, 1), dtype=ct)
        acc = xp.zeros((*lead, q1 - q0, d.dv), dtype=ct)
        acc_e, l_e = xp.zeros_like(acc), xp.zeros_like(l)  # what the sums lost (_kahan)
        for bj in np.flatnonzero(classes[bi] != masks.EMPTY):
            k0, k1 = kblocks[bj]
            s, _ = tiles.scores(q0, q1, k0, k1, int(classes[bi, bj]))
            m_new = xp.maximum(m, xp.max(s, axis=-1, keepdims=True))
            m_safe = safe_max(xp, m_new)  # all -inf so far: shift by 0
            p = exp_sub_(s, m_safe)
            alpha = xp.exp(m - m_safe)  # rescales what was summed under the old maximum
            vb = vg[..., k0:k1, :]
            if vb.dtype != ct:
                vb = xp.astype(vb, ct)
            l, l_e = _kahan(l, l_e, xp.sum(p, axis=-1, keepdims=True), alpha, inplace)  # every weight counts
            if c.dropout > 0:  # only what reaches V is dropped (inverted dropout, arXiv:2307.08691 §3.1)
                p = tiles.dropped(p, q0, q1, k0, k1)
            bad = None if bad_v is None else bad_v[..., k0:k1]
            pv = ungroup(xp, _values(xp, group_q(xp, p, d), vb, bad), d)
            acc, acc_e = _kahan(acc, acc_e, pv, alpha, inplace)
            m = m_new
            del s, p  # free this tile before the next one is allocated: one score tile alive, not two
        o, row_lse = finalise(xp, acc, l, m)
        # written in place (NumPy, torch): no list to concatenate
        out = set_(out, (..., slice(q0, q1), slice(None)), cast(xp, o, c.q.dtype), inplace)
        lse = set_(lse, (..., slice(q0, q1)), row_lse[..., 0], inplace)
    weights = _weights(xp, c, lse, tiles, classes, block_q, block_k) if c.want_weights else None
    return poisoned(xp, Result(out, weights, lse), poisoned_rows(xp, c))


def _weights(xp: Any, c: Call, lse: Array, tiles: _Tiles, classes: np.ndarray, bq: int, bk: int) -> Array:
    """``A = exp(S - lse)`` rebuilt tile by tile (asked for explicitly: this is ``Nq x Nk``)."""
    d = c.dims
    rows = []
    for bi, (q0, q1) in enumerate(_blocks(d.nq, bq)):
        cols = []
        for bj, (k0, k1) in enumerate(_blocks(d.nk, bk)):
            if classes[bi, bj] == masks.EMPTY:
                cols.append(xp.zeros((*d.score_shape[:-2], q1 - q0, k1 - k0), dtype=lse.dtype))
                continue
            s, _ = tiles.scores(q0, q1, k0, k1, int(classes[bi, bj]))
            a = recomputed(xp, s, lse[..., q0:q1])
            cols.append(tiles.dropped(a, q0, q1, k0, k1) if c.dropout > 0 else a)
        rows.append(xp.concat(cols, axis=-1))
    return xp.astype(xp.concat(rows, axis=-2), c.q.dtype)


def backward(
    dout: Array,
    c: Call,
    out: Array,
    lse: Array,
    dlse: Array | None,
    dbias: bool,
    block_q: int,
    block_k: int,
    classes: np.ndarray,
) -> tuple[Array, ...]:
    """Gradients by tiles, recomputing ``A = exp(S - lse)`` (FlashAttention-2, Algorithm 2).

    ``D = rowsum(dO ∘ O)``; per tile ``dV += Aᵀ dO``, ``dS = A ∘ (dO Vᵀ − D + dlse)`` through
    the score mod's derivative, ``dQ += dS K · scale``, ``dK += dSᵀ Q · scale``. ``dlse`` is
    the gradient reaching ``lse`` when the caller used it (``∂lse/∂S = A``).
    """
    xp = namespace(dout=dout, q=c.q, k=c.k, v=c.v)
    d = c.dims
    ct = compute_dtype(xp, c.q)
    tiles = _Tiles(xp, c, c.q, c.k, ct)
    lse = cast(xp, lse, ct)[..., None]
    shift = xp.where(lse == -float("inf"), xp.zeros_like(lse), lse)  # an empty row: its -inf scores give 0
    vg = c.v
    bad_v = bad_rows(xp, vg)
    lead = d.score_shape[:-2]
    kv_lead = (*lead[:-1], d.hkv) if d.grouped else lead
    inplace = in_place(c.q)
    dq = xp.zeros((*lead, d.nq, d.dk), dtype=ct)
    dk = xp.zeros((*kv_lead, d.nk, d.dk), dtype=ct)
    dv = xp.zeros((*kv_lead, d.nk, d.dv), dtype=ct)
    dk_e, dv_e = xp.zeros_like(dk), xp.zeros_like(dv)  # what the sums over query blocks lost (_kahan)
    wide = _wide_dtype(xp, c.q, ct)
    db_bias = xp.zeros(tuple(c.bias.shape), dtype=ct) if dbias and c.bias is not None else None
    kblocks = _blocks(d.nk, block_k)
    for bi, (q0, q1) in enumerate(_blocks(d.nq, block_q)):
        dob, sh = cast(xp, dout[..., q0:q1, :], ct), shift[..., q0:q1, :]
        # D = rowsum(dO ∘ O), in float64 where available: where a row is nearly one-hot, dA − D is
        # a rounding residue that |q| then scales into dK (docs/flash.md, "Accuracy")
        dw, ow = cast(xp, dout[..., q0:q1, :], wide), cast(xp, out[..., q0:q1, :], wide)
        db = xp.sum(dw * ow, axis=-1, keepdims=True)
        if dlse is not None:
            db = db - cast(xp, dlse[..., q0:q1], wide)[..., None]
        db = cast(xp, db, ct)
        dog = group_q(xp, dob, d)
        qb = group_q(xp, c.q[..., q0:q1, :], d)
        if qb.dtype != ct:
            qb = xp.astype(qb, ct)
        dq_acc = xp.zeros((*lead, q1 - q0, d.dk), dtype=ct)
        dq_e = xp.zeros_like(dq_acc)
        for bj in np.flatnonzero(classes[bi] != masks.EMPTY):
            k0, k1 = kblocks[bj]
            s, grad = tiles.scores(q0, q1, k0, k1, int(classes[bi, bj]))
            a = exp_sub_(s, sh)  # an empty row is all -inf here, so exp gives its zeros
            vb, kb = vg[..., k0:k1, :], tiles.key_block(k0, k1)
            if vb.dtype != ct:
                vb = xp.astype(vb, ct)
            if bad_v is not None:  # dA = dO Vᵀ with a non-finite value row as 0 (reference.grad_weights)
                vb = zeroed(xp, vb, bad_v[..., k0:k1])
            rows = (..., slice(k0, k1), slice(None))
            da = ungroup(xp, dog @ vb.mT, d)  # dA of the weights that reached V
            if c.dropout > 0:  # the same mask as the forward pass: O = (A ∘ Z) V, Z = keep / (1 − p)
                dv, dv_e = _add_rows(dv, dv_e, rows, group_q(xp, tiles.dropped(a, q0, q1, k0, k1), d).mT @ dog, inplace)
                da = tiles.dropped(da, q0, q1, k0, k1)
            else:
                dv, dv_e = _add_rows(dv, dv_e, rows, group_q(xp, a, d).mT @ dog, inplace)
            ds = a * (da - db)  # D = rowsum(dO ∘ O) = rowsum(dA ∘ A) with or without dropout
            if db_bias is not None:  # the bias is added after the score mod: its gradient is dS itself
                db_bias = _add_bias_grad(xp, db_bias, ds, q0, q1, k0, k1, inplace)
            ds = through(ds, grad)
            dq_acc, dq_e = _kahan(dq_acc, dq_e, ungroup(xp, group_q(xp, ds, d) @ kb, d), None, inplace)
            dk, dk_e = _add_rows(dk, dk_e, rows, group_q(xp, ds, d).mT @ qb, inplace)
            del s, a, ds, grad  # free this tile's arrays before the next tile's
        dq = set_(dq, (..., slice(q0, q1), slice(None)), dq_acc, inplace)
    dq = imul_(dq, c.scale, inplace)  # in place: no second N x D buffer
    dk = imul_(dk, c.scale, inplace)
    grads = tuple(cast(xp, unbroadcast(xp, g, tuple(x.shape)), x.dtype) for g, x in ((dq, c.q), (dk, c.k), (dv, c.v)))
    return grads if db_bias is None else (*grads, cast(xp, db_bias, c.bias.dtype))  # type: ignore[union-attr]


def _add_rows(x: Array, err: Array, rows: Any, t: Array, inplace: bool) -> tuple[Array, Array]:
    """``x[rows] += t`` compensated (``_kahan``), what it lost in ``err[rows]``: in place through
    the views ``x[rows]``, ``err[rows]`` where arrays are mutable, else by ``set_``."""
    if inplace:
        _kahan(x[rows], err[rows], t, None, True)
        return x, err
    s, e = _kahan(x[rows], err[rows], t, None, False)
    return set_(x, rows, s, False), set_(err, rows, e, False)


def _add_bias_grad(xp: Any, dbias: Array, ds: Array, q0: int, q1: int, k0: int, k1: int, inplace: bool) -> Array:
    """``dbias[tile] += dS`` summed over the axes the bias broadcasts along (``unbroadcast``)."""
    rows = slice(q0, q1) if dbias.shape[-2] != 1 else slice(None)
    cols = slice(k0, k1) if dbias.shape[-1] != 1 else slice(None)
    shape = (*dbias.shape[:-2], q1 - q0 if dbias.shape[-2] != 1 else 1, k1 - k0 if dbias.shape[-1] != 1 else 1)
    return iadd_(dbias, (..., rows, cols), unbroadcast(xp, ds, shape), inplace)
