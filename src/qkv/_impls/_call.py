"""One normalised attention call, as every impl receives it, and the one function that builds it.

``build_call`` is what ``qkv.attention`` runs in its first lines (and ``explain``, the ring's
blocks and the benchmarks with it): it checks the arrays, turns the contract's shortcuts into
one ``Mask`` (``causal=`` and boolean arrays folded in), one float bias and one ``ScoreMod``,
and a numeric scale. Impls never see ``causal=`` or an array mask. A decided call is a ``Plan``
(made by ``_plan.plan``, read by the impls that run it) and reported as a ``Dispatch``.
"""

from typing import Any, NamedTuple

import numpy as np

from .. import masks
from .._backend import as_array, is_bool, is_floating, is_traced, namespace
from .._checks import (
    check_choice,
    check_covers,
    check_dropout,
    check_flag,
    check_int,
    check_qkv,
    check_scale,
    check_seed,
    shapes_of,
)
from .._quant import Quantized, dequantize
from .._typing import Array, Dims
from ..errors import ArgumentError, DTypeError, MaskError, ShapeError
from ..masks import Mask
from ..scores import ScoreMod

ENGINES = ("native", "array")
"""The flash kernel's engines: the compiled tile loop and the array-API one."""


class Call(NamedTuple):
    """A validated call: ``q (*B, H, Nq, Dk)``, ``k (*B, Hkv, Nk, Dk)``, ``v (*B, Hkv, Nk, Dv)``,
    their ``dims``, one ``mask`` (None: every key), one float ``bias`` broadcasting to
    ``(*B, H, Nq, Nk)``, one ``score_mod``, the numeric ``scale``; dropout and its ``rng``;
    which extra outputs are wanted; ``tiles = (block_q, block_k)`` forces the flash kernel's
    tile sizes (None: the kernel chooses); ``sinks`` one extra logit per head ``(*B, H, 1)`` that
    joins every row's softmax denominator and carries no value (gpt-oss attention sinks);
    ``engine`` forces the flash kernel's engine (``"native"`` or ``"array"``; None: the compiled
    one whenever it supports the call; given ``tiles`` are the array engine's); ``kv`` a quantized
    cache (``QuantizedKV``: ``k`` and ``v`` are then its 8-bit values, until the plan either hands
    them to the compiled kernel or dequantizes them, ``dequantized``)."""

    q: Array
    k: Array
    v: Array
    dims: Dims
    mask: Mask | None
    bias: Array | None
    score_mod: ScoreMod | None
    scale: float
    dropout: float = 0.0
    rng: Any = None
    want_weights: bool = False
    want_lse: bool = False
    tiles: tuple[int, int] | None = None
    sinks: Array | None = None
    engine: str | None = None
    kv: "QuantizedKV | None" = None


class QuantizedKV(NamedTuple):
    """``k`` and ``v`` as the caller passed them, two ``qkv.Quantized`` of one ``format``."""

    format: str
    k: Quantized
    v: Quantized


def _described(x: Any) -> str:
    if isinstance(x, Quantized):
        return f"a qkv.Quantized ({x.format})"
    return f"{type(x).__name__} of dtype {str(getattr(x, 'dtype', '?')).removeprefix('torch.')}"


def split_quantized(k: Any, v: Any) -> tuple[Any, Any, QuantizedKV | None]:
    """``(k, v, None)`` for float keys and values; for a quantized cache ``(k.values, v.values,
    QuantizedKV)``. Both or neither must be ``Quantized``, in one format."""
    kq, vq = isinstance(k, Quantized), isinstance(v, Quantized)
    if not (kq or vq):
        return k, v, None
    if kq != vq:
        raise DTypeError(
            f"k and v must both be qkv.Quantized (a quantized cache) or neither: k is {_described(k)}, "
            f"v is {_described(v)}"
        )
    if k.format != v.format:
        raise DTypeError(
            f"k and v are quantized in different formats (k: {k.format}, v: {v.format}); quantize both to one"
        )
    return k.values, v.values, QuantizedKV(k.format, k, v)


def dequantized(c: Call) -> Call:
    """``c`` with its quantized cache as float ``k`` and ``v`` in ``q``'s dtype: how every engine
    but the compiled kernel reads it (the result is exact with respect to those values)."""
    if c.kv is None:
        return c
    dtype = c.q.dtype
    return c._replace(k=dequantize(c.kv.k, dtype), v=dequantize(c.kv.v, dtype), kv=None)


class Dispatch(NamedTuple):
    """What runs a call (``qkv.dispatch``): ``impl`` (``"reference"``, ``"flash"`` or ``"torch"``),
    for flash its ``engine`` (``"native"``: the compiled tile loop; ``"array"``: array-API code;
    None for the others), the ``reason`` (one sentence), for the compiled engine the ``tiles``
    ``(block_q, block_k)`` and the worker ``threads`` it uses (None otherwise), and the format of
    a quantized K/V cache (``kv_format``: ``"int8"``, ``"float8_e4m3fn"``, ``"float8_e5m2"``;
    None when ``k`` and ``v`` are float arrays); the reason says whether it is read in place or
    dequantized first."""

    impl: str
    engine: str | None
    reason: str
    tiles: tuple[int, int] | None = None
    threads: int | None = None
    kv_format: str | None = None


class Plan(NamedTuple):
    """A decided call: ``call`` (its mask dropped where the mask hides nothing here), the
    ``impl`` and ``engine`` that run it, the ``reason``, the flash ``tiles`` and ``threads``, and
    the mask's plan for those tiles (``masks.BlockPlan``; None without a mask or off flash), and
    the format of the quantized cache the caller passed (``kv_format``; ``call.kv`` is None once
    it has been dequantized for an engine other than the compiled kernel)."""

    call: Call
    impl: str
    engine: str | None
    reason: str
    tiles: tuple[int, int] | None = None
    threads: int | None = None
    mask: masks.BlockPlan | None = None
    kv_format: str | None = None

    def report(self) -> Dispatch:
        native_run = self.engine == "native"
        return Dispatch(
            self.impl,
            self.engine,
            self.reason,
            self.tiles if native_run else None,
            self.threads if native_run else None,
            self.kv_format,
        )


def split_mask(mask: Any, causal: bool) -> tuple[Mask | None, Array | None]:
    """``mask=`` and ``causal=`` -> ``(Mask or None, float bias or None)``."""
    bias = None
    if mask is None or isinstance(mask, Mask):
        m = mask
    elif hasattr(mask, "dtype") and hasattr(mask, "shape"):
        mask = as_2d(mask)
        if is_bool(mask) and is_traced(mask):
            # a traced boolean array has no values to build a Mask from (jax.jit argument): the same
            # hiding as a bias of 0 / -inf, which the array engine takes (and a row hiding every key
            # still gives zeros: no finite score)
            import jax.numpy as jnp

            m, bias = None, jnp.where(mask, 0.0, -jnp.inf)
        elif is_bool(mask):
            m = masks.from_dense(mask)
        elif is_floating(mask):
            m, bias = None, mask
        else:
            raise MaskError(
                f"mask has dtype {str(mask.dtype).removeprefix('torch.')} and shape {tuple(mask.shape)}; "
                "pass a boolean array (True = may attend), a float bias or a qkv.masks.Mask"
            )
    else:
        raise MaskError(f"mask must be a boolean array, a float array or a qkv.masks.Mask, got {type(mask).__name__}")
    if check_flag(causal, "causal"):
        m = masks.causal() if m is None else m & masks.causal()
    return m, bias


def as_2d(a: Array) -> Array:
    """A key-only mask or bias ``(Nk,)`` is ``(1, Nk)``: every query row the same (API.md); a 0-D
    one is ``(1, 1)``, one value for every score (as SDPA broadcasts it)."""
    if len(a.shape) == 1:
        return a[None, :]
    return a[None, None] if len(a.shape) == 0 else a


def check_mask_covers(mask: Mask | None, bias: Array | None, score_shape: tuple[int, ...]) -> None:
    """A ``Mask`` and a float bias must broadcast to the scores ``(*B, H, Nq, Nk)`` without growing them."""
    nq, nk = score_shape[-2], score_shape[-1]
    if mask is not None:
        lead = masks.lead_shape(mask, nq, nk)  # a 1x1 tile's batch axes, once per mask and size
        check_covers("mask", (*lead, nq, nk), score_shape)
    if bias is not None:
        check_covers("mask", tuple(bias.shape), score_shape)


def check_bias(bias: Any, mask_bias: Array | None) -> Array | None:
    """``bias=`` (a float array; ``(Nk,)`` means ``(1, Nk)``) added to a float ``mask=`` if both are given."""
    if bias is None:
        return mask_bias
    if not (hasattr(bias, "dtype") and hasattr(bias, "shape")) or not is_floating(bias):
        what = f"dtype {str(bias.dtype).removeprefix('torch.')}" if hasattr(bias, "dtype") else type(bias).__name__
        raise MaskError(f"bias must be a float array added to the scores, got {what}; a boolean mask goes in mask=")
    bias = as_2d(bias)
    return bias if mask_bias is None else mask_bias + bias


def check_sinks(sinks: Any, lead: tuple[int, ...], like: Array) -> Array | None:
    """``sinks (H,)`` or broadcasting to ``(*B, H)``, as a float array ``(*B|1, H|1, 1)`` of ``like``'s kind."""
    if sinks is None:
        return None
    sinks = as_array(sinks, "sinks")
    if not is_floating(sinks):
        raise DTypeError(f"sinks has dtype {str(sinks.dtype).removeprefix('torch.')}; sinks are float logits")
    shape = tuple(sinks.shape)
    if not lead and shape in ((), (1,)):
        return sinks[None] if shape == () else sinks  # a call without heads: one sink
    # s == 1 or s == n, not `s in (1, n)`: Dynamo answers `in` over symbolic sizes False without a guard
    fits = len(shape) <= len(lead) and all(s == 1 or s == n for s, n in zip(shape[::-1], lead[::-1], strict=False))
    if not fits:
        raise ShapeError(
            f"sinks has shape {shape}, which does not broadcast to the (*B, H) = {lead} of the scores "
            "(one logit per head: (H,), or (B, H))"
        )
    return sinks[..., None]


def aligned_mod(score_mod: ScoreMod | None, mask: Mask | None, nq: int, nk: int) -> ScoreMod | None:
    """``score_mod`` measuring positions as ``mask`` aligns them: a per-sequence mask (``padding``,
    ``packed``; ``Mask.align``) realigns position-based mods (alibi, relative_bias) to each
    sequence, as flash-attn's varlen ALiBi does; itself when every row already sits at
    ``i + Nk - Nq`` (no mask, a plain mask, packed self-attention, left padding)."""
    if score_mod is None or score_mod.realign is None or mask is None or mask.align is None:
        return score_mod
    shift = np.asarray(mask.align(np.arange(nq), nq, nk), dtype=np.int64)
    return score_mod if bool((shift == nk - nq).all()) else score_mod.realign(shift)


def _tiles(tiles: Any) -> tuple[int, int] | None:
    if tiles is None:
        return None
    if not isinstance(tiles, tuple) or len(tiles) != 2:
        raise ArgumentError(f"tiles must be a pair (block_q, block_k), got {tiles!r}")
    return check_int(tiles[0], "tiles block_q", minimum=1), check_int(tiles[1], "tiles block_k", minimum=1)


def build_call(
    q: Array,
    k: Array,
    v: Array,
    *,
    mask: Any = None,
    causal: bool = False,
    scale: float | None = None,
    score_mod: ScoreMod | None = None,
    dropout: float = 0.0,
    rng: Any = None,
    want_weights: bool = False,
    want_lse: bool = False,
    tiles: tuple[int, int] | None = None,
    bias: Any = None,
    sinks: Any = None,
    engine: str | None = None,
) -> Call:
    """Validate ``qkv.attention``'s arguments and normalise them into a ``Call``.

    Raises the contract's errors (``ShapeError``, ``MaskError``, ``DTypeError``,
    ``ArgumentError``) naming the argument, the axis and the sizes. A mask whose tiles are
    classified analytically and that hides nothing for this call (e.g. ``causal`` for one query
    against a cache) is dropped: the impls then run the unmasked path.
    """
    k, v, kv = split_quantized(k, v)
    q, k, v = as_array(q, "q"), as_array(k, "k"), as_array(v, "v")
    arrays = {"q": q, "k": k, "v": v}
    if kv is not None:
        arrays.update(k_scales=kv.k.scales, v_scales=kv.v.scales)
    for name, x in (("mask", mask), ("bias", bias), ("sinks", sinks)):
        if x is not None and not isinstance(x, Mask) and hasattr(x, "shape"):
            arrays[name] = x
    namespace(**arrays)  # mixed NumPy / torch -> DTypeError (a TypeError)
    dims = check_qkv(q, k, v, quantized=kv is not None)
    m, mask_bias = split_mask(mask, causal)
    bias = check_bias(bias, mask_bias)
    if m is not None:
        m = m.bound(dims.score_shape[:-2])  # a mask of (b, h, i, j) sees this call's batch and heads
    check_mask_covers(m, bias, dims.score_shape)
    if score_mod is not None and not isinstance(score_mod, ScoreMod):
        raise DTypeError(f"score_mod must be a qkv.scores.ScoreMod, got {type(score_mod).__name__}")
    if score_mod is not None:
        score_mod.check_heads(dims.h, shapes_of(q=q))
    score_mod = aligned_mod(score_mod, m, dims.nq, dims.nk)
    if m is not None and m.tiles is not None and (m.blocks(dims.nq, dims.nk, dims.nq, dims.nk) == masks.FULL).all():
        m = None  # hides nothing here: no mask at all
    return Call(
        q,
        k,
        v,
        dims,
        m,
        bias,
        score_mod,
        check_scale(scale, dims.dk),
        check_dropout(dropout),
        check_seed(rng),
        check_flag(want_weights, "return_weights"),
        check_flag(want_lse, "return_lse"),
        _tiles(tiles),
        check_sinks(sinks, dims.score_shape[:-2] if dims.has_heads else (), q),
        None if engine is None else check_choice(engine, "engine", ENGINES),
        kv,
    )
