"""The compiled kernel's arguments, built once for every road to it.

Four adapters reach the kernel: the eager call (``_flash_native``: NumPy, torch and JAX arrays
through the binding), the lean road (``_lean``: plain torch tensors), the torch custom operator
(``_torch_op``) and XLA's FFI (``_jax_ffi``: traced JAX programs). Each lays q, k, v and the bias
out as ``(B, H, N, D)`` arrays of its own library (``flat``, ``flat_bias``) and allocates the
results; what the call asks of the kernel beyond them — the mask's plan, the score mods, the
bias, dropout's seed, the worker threads, the scale and the K/V storage — becomes the kernel's
arguments here, in ``kernel_args``. Their checks are the kernel's own, in its one entrance
(``_native/entrance.cpp``), which every adapter reaches.

A new host library is one more adapter calling ``kernel_args``; a new kernel argument is one
field of ``KernelArgs`` here and one of the entrance's ``CallArgs`` (docs/architecture.md).
"""

import math
from collections.abc import Callable
from typing import Any, NamedTuple

from .._native import KernelMod, KvFormat, MaskKind
from .._quant import FORMATS
from .._typing import Array, Dims
from ..masks import BlockPlan
from ..scores import kernel_ops

KV_FORMATS: dict[str, KvFormat] = {name: KvFormat(i + 1) for i, name in enumerate(FORMATS)}
"""A quantized cache's format (``qkv.Quantized.format``) as the kernel's ``kv_format``."""


class KernelArgs(NamedTuple):
    """What one kernel call is asked beyond q, k, v and its results (``_native/entrance.hpp``'s
    ``CallArgs``): the ``scale``, the worker ``threads``, the mask as ``mask_kind`` and its arrays
    by keyword (``{}``, ``rows``, or ``tile_class``, ``bitmap_index`` and ``bitmaps``), the score
    ``mods`` (tables checked against the heads), the ``bias`` ``(B|1, H|1, Nq|1, Nk)`` as the
    adapter laid it out, dropout's ``dropout_p`` and ``seed`` (an unsigned 64-bit int), and how K
    and V are stored: ``kv_format`` with the float32 scales ``k_scale``, ``v_scale``
    ``(B|1, Hkv|1, Nk|1)`` of a quantized cache."""

    scale: float
    threads: int
    mask_kind: MaskKind
    mask: dict[str, Any]
    mods: tuple[KernelMod, ...] = ()
    bias: Any = None
    dropout_p: float = 0.0
    seed: int = 0
    kv_format: KvFormat = KvFormat.NATIVE
    k_scale: Any = None
    v_scale: Any = None

    def keywords(self) -> dict[str, Any]:
        """The arguments as ``qkv._native.forward`` / ``backward`` take them."""
        return {
            "scale": self.scale,
            "threads": self.threads,
            "mods": self.mods,
            "bias": self.bias,
            "dropout_p": self.dropout_p,
            "seed": self.seed,
            "kv_format": self.kv_format,
            "k_scale": self.k_scale,
            "v_scale": self.v_scale,
            **self.mask,
        }


def kernel_args(
    scale: float,
    threads: int,
    mask: BlockPlan | None = None,
    mods: tuple[KernelMod, ...] = (),
    lead: tuple[int, ...] = (),
    bias: Any = None,
    dropout: float = 0.0,
    rng: Any = None,
    kv_format: KvFormat = KvFormat.NATIVE,
    k_scale: Any = None,
    v_scale: Any = None,
) -> KernelArgs:
    """The kernel's arguments for a call whose scores are ``(*lead, Nq, Nk)`` (``lead = (*B, H)``,
    ``()`` without heads): ``mask`` is the mask's plan on the kernel's tiles (``masks.plan``;
    None or one that hides nothing: no mask), ``mods`` the score mod's kernel ops
    (``ScoreMod.native``), ``rng`` dropout's integer seed (read only when ``dropout > 0``)."""
    arrays: dict[str, Any]
    if mask is None or mask.hides_nothing:
        kind, arrays = MaskKind.NONE, {}
    elif mask.rows is not None:
        kind, arrays = MaskKind.ROWS, {"rows": mask.rows}
    else:
        kind = MaskKind.TILES
        arrays = {"tile_class": mask.classes, "bitmap_index": mask.bitmap_index, "bitmaps": mask.bitmaps}
    ops = kernel_ops(mods, lead) if mods else ()
    seed = int(rng) & 0xFFFF_FFFF_FFFF_FFFF if dropout > 0 else 0
    # tuple.__new__, not KernelArgs(...): the generated __new__ is a Python call (~0.2 us a decode step)
    return _new(KernelArgs, (scale, threads, kind, arrays, ops, bias, dropout, seed, kv_format, k_scale, v_scale))


_new = tuple.__new__


def flat(x: Array, dims: Dims, heads: int, broadcast_to: Callable[[Any, tuple[int, ...]], Any]) -> Array:
    """``x (*b, heads|1, N, D)`` as the kernel's ``(B, heads, N, D)`` (``B = prod(dims.batch)``;
    a 2-D call is one batch element and one head): views where the batch axes allow, in the
    library of ``broadcast_to`` (``np.broadcast_to``, ``torch.Tensor.expand``, ``jnp.broadcast_to``)."""
    if not dims.has_heads:
        return x[None, None]
    x = x.reshape((1,) * (len(dims.batch) + 3 - x.ndim) + tuple(x.shape))
    x = broadcast_to(x, (*dims.batch, heads, *x.shape[-2:]))
    return x.reshape(math.prod(dims.batch), heads, *x.shape[-2:])


def flat_bias(bias: Array, dims: Dims, broadcast_to: Callable[[Any, tuple[int, ...]], Any]) -> Array:
    """A bias broadcasting to the scores as the kernel's ``(B|1, H|1, Nq|1, Nk)``: batch axes it
    has spread to the call's and merged into one, the keys' axis spread; an axis of 1 elsewhere
    stays 1 (the kernel reads it with stride 0; a traced program's constant stays small)."""
    shape = dims.score_shape if dims.has_heads else (1, 1, dims.nq, dims.nk)
    b = bias.reshape((1,) * (len(shape) - bias.ndim) + tuple(bias.shape))
    batch = shape[:-3] if math.prod(b.shape[:-3]) != 1 else (1,) * (len(shape) - 3)
    want = (*batch, b.shape[-3], b.shape[-2], shape[-1])
    return broadcast_to(b, want).reshape(math.prod(batch), *want[-3:])
