"""One ring step on one rank: this rank's queries against one block of keys and values.

Shared by the real ring (``_ring``) and the single-process simulator (``_simulate``), so both
run exactly the same arithmetic. Everything here is array-API code on NumPy or torch arrays
already in the compute dtype; the local work goes through qkv's flash kernel
(``qkv._impls.flash``), which returns the ``lse`` the merge needs and, in the backward pass,
recomputes the weights from the *global* ``lse`` (Liu et al., arXiv:2310.01889, sec. 3):

    A_blk = exp(S_blk − lse)        dS_blk = A_blk ∘ (dO V_blkᵀ − rowsum(dO ∘ O))

with ``O`` and ``lse`` the merged (global) results, so per-block gradients simply add up.

Causal masking is on global positions, bottom-right aligned as everywhere in qkv: query at
global position ``i`` may attend key ``j`` iff ``j <= i + (Nk − Nq)`` (global lengths). A
query segment starting at ``qs`` against a key segment starting at ``ks`` is therefore the
local mask ``causal(offset=qs − ks + Nk − Nq)``: FULL, EMPTY (skipped) or PARTIAL.
"""

from typing import Any

from .. import masks
from .._backend import device, namespace
from .._checks import check_qkv
from .._impls import build_call, flash, plan
from .._softmax import empty_result, merge_attention
from .._typing import Array
from ._layout import Segments, local_ranges
from ._layout import allowed_pairs as allowed_pairs


def ring_source(rank: int, step: int, world_size: int) -> int:
    """The rank whose K/V block rank ``rank`` holds at step ``step`` (blocks travel r -> r+1)."""
    return (rank - step) % world_size


def pair_mask(qseg: tuple[int, int], kseg: tuple[int, int], causal: bool, nq: int, nk: int) -> tuple[int, Any]:
    """``(class, mask)`` of a query segment against a key segment (global ``(start, length)``).

    ``class`` is ``masks.EMPTY`` (skip), ``masks.FULL`` (no mask) or ``masks.PARTIAL`` (the
    offset causal ``mask``); ``nq``, ``nk`` are the global sequence lengths.
    """
    (qs, ql), (ks, kl) = qseg, kseg
    if ql == 0 or kl == 0:
        return masks.EMPTY, None
    if not causal:
        return masks.FULL, None
    o = qs - ks + (nk - nq)  # local key jj is allowed for local query ii iff jj <= ii + o
    if kl - 1 <= o:
        return masks.FULL, None
    if o + ql - 1 < 0:
        return masks.EMPTY, None
    return masks.PARTIAL, masks.causal(offset=o)


def _nothing(q: Array, k: Array, v: Array) -> tuple[Array, Array]:
    """Zeros and ``lse = -inf`` for queries that attend no key of the block."""
    xp, dims = namespace(q=q), check_qkv(q, k, v)
    res = empty_result(xp, dims.score_shape[:-1], dims.nk, dims.dv, q.dtype, q.dtype, device(q), weights=False)
    return res.out, res.lse


def _flash(q: Array, k: Array, v: Array, mask: Any, scale: float) -> tuple[Array, Array]:
    p = plan("flash", build_call(q, k, v, mask=mask, scale=scale))
    res = flash.forward(p.call, p)
    return res.out, res.lse


def _flash_backward(dout: Array, c: Any, out: Array, lse: Array) -> tuple[Array, ...]:
    p = plan("flash", c)
    return flash.backward(dout, p.call, p, out, lse)


def block_forward(
    q: Array, k: Array, v: Array, q_segs: Segments, kv_segs: Segments, *, causal: bool, scale: float, nq: int, nk: int
) -> tuple[Array, Array, bool]:
    """This rank's queries against one K/V block: ``(out (..., nq_local, Dv), lse (..., nq_local), computed)``.

    ``q (..., H, nq_local, Dk)`` holds the query segments ``q_segs`` concatenated, ``k``, ``v``
    the key segments ``kv_segs``. ``computed`` is False when the causal mask hides the whole
    block (then ``out`` is zeros and ``lse`` is ``-inf``: a part that changes nothing when merged).
    """
    classes = [[pair_mask(qs, ks, causal, nq, nk) for ks in kv_segs] for qs in q_segs]
    if all(c == masks.FULL for row in classes for c, _ in row):
        o, l = _flash(q, k, v, None, scale)  # the whole block in one call (always, without causal)
        return o, l, True
    xp = namespace(q=q, k=k, v=v)
    outs, lses, computed = [], [], False
    for (qa, qb), row in zip(local_ranges(q_segs), classes, strict=True):
        qi = q[..., qa:qb, :]
        if all(c == masks.FULL for c, _ in row):
            parts = [_flash(qi, k, v, None, scale)]
        else:
            parts = [
                _flash(qi, k[..., ka:kb, :], v[..., ka:kb, :], m, scale)
                for (ka, kb), (c, m) in zip(local_ranges(kv_segs), row, strict=True)
                if c != masks.EMPTY
            ]
        if not parts:  # this query segment attends nothing in this block: the merge's neutral part
            o, l = _nothing(q[..., qa:qb, :], k, v)
            outs.append(o)
            lses.append(l)
            continue
        computed = True
        o, l = parts[0] if len(parts) == 1 else merge_attention([p[0] for p in parts], [p[1] for p in parts])
        outs.append(o)
        lses.append(l)
    return xp.concat(outs, axis=-2), xp.concat(lses, axis=-1), computed


def block_backward(
    dout: Array,
    q: Array,
    k: Array,
    v: Array,
    out: Array,
    lse: Array,
    q_segs: Segments,
    kv_segs: Segments,
    *,
    causal: bool,
    scale: float,
    nq: int,
    nk: int,
) -> tuple[Array, Array, Array] | None:
    """This block's share of the gradients ``(dq, dk, dv)``, or None when the block was skipped.

    ``out`` and ``lse`` are the merged (global) results of this rank's queries, so the
    weights rebuilt here are the final ones and the shares of all blocks add up to the gradient.
    """
    classes = [[pair_mask(qs, ks, causal, nq, nk) for ks in kv_segs] for qs in q_segs]
    if all(c == masks.FULL for row in classes for c, _ in row):
        return _flash_backward(dout, build_call(q, k, v, scale=scale), out, lse)
    if all(c == masks.EMPTY for row in classes for c, _ in row):
        return None
    xp = namespace(q=q, k=k, v=v)
    dq, dk, dv = xp.zeros_like(q), xp.zeros_like(k), xp.zeros_like(v)
    for (qa, qb), row in zip(local_ranges(q_segs), classes, strict=True):
        for (ka, kb), (c, m) in zip(local_ranges(kv_segs), row, strict=True):
            if c == masks.EMPTY:
                continue
            g = _flash_backward(
                dout[..., qa:qb, :],
                build_call(q[..., qa:qb, :], k[..., ka:kb, :], v[..., ka:kb, :], mask=m, scale=scale),
                out[..., qa:qb, :],
                lse[..., qa:qb],
            )
            dq[..., qa:qb, :] += g[0]
            dk[..., ka:kb, :] += g[1]
            dv[..., ka:kb, :] += g[2]
    return dq, dk, dv
