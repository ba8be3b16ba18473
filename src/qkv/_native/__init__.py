"""qkv's compiled CPU attention kernel: the low-level API behind ``impl="flash"``.

FlashAttention-2 (Dao, arXiv:2307.08691) as a fused tile loop in C++ (``_ext``, built by
scikit-build-core with nanobind): scores, online softmax and ``P·V`` never leave a tile; K and
V are never copied (grouped heads share them); the GIL is released while it runs.

Everything here works on arrays the caller allocates: ``forward`` and ``backward`` write into
``out``/``lse`` and ``dq``/``dk``/``dv``. Inputs may be NumPy arrays, torch tensors (detached)
or JAX arrays on the CPU; float32, float64, float16 and bfloat16. The arguments are checked in
the extension's one entrance (``entrance.cpp``); a bad one raises ``qkv.errors``' ``ShapeError``,
``DTypeError`` or ``ArgumentError`` naming the argument, the axis and the sizes.

If the extension could not be built or loaded, ``available()`` is False and ``reason()`` says
why; nothing here raises on import.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _torch
from . import _facts
from ._facts import (
    BLOCK_K,
    BLOCK_Q,
    DECODE_MAX_NQ,
    DTYPES,
    EMPTY,
    FULL,
    LANES,
    MAX_THREADS,
    PARTIAL,
    KvFormat,
    MaskKind,
    ModKind,
)
from ._kernel_mod import KernelMod

# The facts the kernels and Python share are written once, in C++ (params.hpp); _facts.py is
# generated from the built extension (scripts/stubs) so that they exist without it, and an
# extension whose facts differ from it is refused below (a stale build or a stale _facts.py).


def _load() -> tuple[Any, str]:
    """``(the extension module, "")``, or ``(None, why not)``."""
    path = os.environ.get("QKV_NATIVE_LIB")  # a separately built module (scripts/sanitize)
    try:
        if path:
            spec = importlib.util.spec_from_file_location(__name__ + "._ext", path)
            if spec is None or spec.loader is None:
                raise ImportError(f"QKV_NATIVE_LIB={path!r} is not a loadable extension module")
            mod = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = mod
            spec.loader.exec_module(mod)
        else:
            # import_module, not `from . import _ext`: the editable-install finder does not always set
            # the package attribute, and the module-level name would shadow it
            mod = importlib.import_module(__name__ + "._ext")
    except ImportError as e:  # not built (pure-Python install) or not loadable
        missing = "No module named" in str(e) and "_ext" in str(e)
        return None, (
            "the compiled kernel qkv._native._ext is not installed (the C++ build was skipped or failed; "
            "reinstall with a C++17 compiler and CMake to get it)"
            if missing
            else f"the compiled kernel qkv._native._ext could not be loaded: {e}"
        )
    except Exception as e:  # noqa: BLE001 - any failure to load means "unavailable", never an import error
        return None, f"the compiled kernel qkv._native._ext failed to initialise: {type(e).__name__}: {e}"
    stale = _stale_facts(mod)
    if stale:
        return None, (
            f"the compiled kernel qkv._native._ext disagrees with qkv/_native/_facts.py on {', '.join(stale)} "
            "(rebuild, then run scripts/stubs)"
        )
    return mod, ""


def _stale_facts(ext: Any) -> list[str]:
    """The names of ``_facts.FACTS`` whose value in the extension ``ext`` differs from ``_facts``."""
    return [n for n in _facts.FACTS if _fact_value(getattr(ext, n, None)) != _fact_value(getattr(_facts, n))]


def _fact_value(x: Any) -> Any:
    """A fact as plain data: an enum as its ``{name: value}``, a sequence as a tuple."""
    if isinstance(x, type) and hasattr(x, "__members__"):
        return {name: int(m.value) for name, m in x.__members__.items()}
    return tuple(x) if isinstance(x, (list, tuple)) else x


if TYPE_CHECKING:
    import qkv._native._ext as _ext  # its stub, _ext.pyi, generated from the built module (scripts/stubs)

    _reason: str
else:
    _ext, _reason = _load()


def available() -> bool:
    """Whether the compiled kernel is there and loaded."""
    return _ext is not None


def reason() -> str:
    """Why the kernel is unavailable ("" when it is available)."""
    return _reason


def _need() -> Any:
    """The extension module, or RuntimeError saying why it is unavailable. Callers here use
    ``_ext`` itself after it, so that mypy checks each call against the stub ``_ext.pyi``."""
    if _ext is None:
        raise RuntimeError(f"qkv._native is unavailable: {_reason}")
    return _ext


def isa() -> str:
    """The instruction-set path in use: "avx512bf16" (avx512 plus vdpbf16ps for bfloat16 inputs),
    "avx512", "avx2", "neon" (arm64) or "portable"."""
    _need()
    return _ext.isa()


def isas() -> tuple[str, ...]:
    """The paths this CPU can run, best first ("portable" is always last)."""
    _need()
    return tuple(_ext.isas())


@contextlib.contextmanager
def _forced(get: Callable[[], str], put: Callable[[str], None], name: str) -> Iterator[None]:
    """One of the kernel's process-wide choices set to ``name`` for a ``with`` block, then restored."""
    _need()
    old = get()
    put(name)
    try:
        yield
    finally:
        put(old)


@contextlib.contextmanager
def use_isa(name: str) -> Iterator[None]:
    """Force the path ``name`` inside the ``with`` block (for tests); raises ValueError if this
    CPU cannot run it. Process-wide: not for concurrent use with other threads' calls."""
    with _forced(lambda: _ext.isa(), lambda x: _ext.set_isa(x), name):
        yield


def decode_prefetch() -> str:
    """Where the decode loop (``Nq <= DECODE_MAX_NQ``) prefetches the K/V lines it reads ahead:
    ``"l2"`` (into L2 only: AMD family 19h, where prefetching into L1 was measured slower than no
    prefetch) or ``"l1"`` (elsewhere). Picked once from the CPU; ``QKV_DECODE_PREFETCH=l1|l2``
    forces one."""
    _need()
    return _ext.decode_prefetch()


@contextlib.contextmanager
def use_decode_prefetch(name: str) -> Iterator[None]:
    """Force the decode loop's prefetch target ``"l1"`` or ``"l2"`` inside the ``with`` block (for
    tests and benchmarks). Process-wide, as ``use_isa``."""
    with _forced(lambda: _ext.decode_prefetch(), lambda x: _ext.set_decode_prefetch(x), name):
        yield


def tile_shape(nq: int, nk: int, dk: int, dv: int, dtype: str) -> tuple[int, int]:
    """``(block_q, block_k)`` of a call with these sizes: the grid of ``tile_class``,
    ``bitmap_index`` and ``bitmaps`` (``nbq = ceil(nq / block_q)``, ``nbk = ceil(nk / block_k)``)."""
    _need()
    bq, bk = _ext.tile_shape(int(nq), int(nk), int(dk), int(dv), str(dtype))
    return int(bq), int(bk)


def _mods(mods: Sequence[KernelMod]) -> tuple[KernelMod, ...]:
    """The mods with their tables as arrays the binding reads: a torch table detached (the kernel
    takes no gradient), a JAX one as its NumPy view, a list of slopes as float64."""
    out = []
    for m in mods:
        if not isinstance(m, KernelMod):
            raise TypeError(f"each mod must be a qkv._native.KernelMod, got {m!r}")
        t = m.table
        if m.positional and t is not None and type(t) is not np.ndarray:
            torch = _torch.loaded()
            if torch is not None and isinstance(t, torch.Tensor):
                m = m._replace(table=t.detach())
            else:
                m = m._replace(table=np.asarray(t, dtype=None if hasattr(t, "dtype") else np.float64))
        out.append(m)
    return tuple(out)


def _dl(x: Any) -> Any:
    """A detached CPU torch tensor as a DLPack capsule (``torch.utils.dlpack.to_dlpack``, a C call);
    anything else as it is. nanobind would otherwise call ``Tensor.__dlpack__``, whose Python-level
    checks cost ~7 us a tensor: most of a decode step's fixed cost. The capsule carries the same
    shape, strides and dtype, so the binding checks it the same way."""
    if x is None or type(x) is np.ndarray:
        return x
    torch = _torch.loaded()
    if torch is None or not isinstance(x, torch.Tensor) or x.requires_grad or x.device.type != "cpu":
        return x
    return torch.utils.dlpack.to_dlpack(x)


def forward_tensors(
    q: Any,
    k: Any,
    v: Any,
    out: Any,
    lse: Any,
    scale: float,
    threads: int,
    mask: dict[str, Any],
    kv_format: int = 0,
    k_scale: Any = None,
    v_scale: Any = None,
) -> tuple[int, int]:
    """``forward`` for the lean road (``_impls/_lean.py``): detached CPU torch tensors the caller
    has checked, the mask's arrays by keyword, no mods, bias or dropout; a quantized cache as its
    codes with ``kv_format`` (an int of ``KvFormat``) and the scales. The same kernel call in a
    third of the Python time: a decode step's whole budget is ~10 us, and ``forward``'s general
    argument handling costs ~3."""
    to = _to_dlpack or _dlpack_of_torch()
    if kv_format:
        return _ext.forward(
            to(q),
            to(k),
            to(v),
            to(out),
            to(lse),
            scale=scale,
            threads=threads,
            kv_format=kv_format,
            k_scale=to(k_scale),
            v_scale=to(v_scale),
            **mask,
        )
    return _ext.forward(to(q), to(k), to(v), to(out), to(lse), scale=scale, threads=threads, **mask)


_to_dlpack: Any = None


def _dlpack_of_torch() -> Any:
    """``torch.utils.dlpack.to_dlpack``, looked up once (torch is loaded: a tensor is in hand)."""
    global _to_dlpack
    _to_dlpack = _torch.loaded().utils.dlpack.to_dlpack
    return _to_dlpack


def forward(q: Any, k: Any, v: Any, out: Any, lse: Any, **options: Any) -> tuple[int, int]:
    """Attention forward into ``out (B, H, Nq, Dv)`` and ``lse (B, H, Nq)``. The keywords:

    - ``scale`` (required): the factor of ``q kᵀ``, a finite number;
    - the mask: ``rows`` int32 ``(Bm, Hm, Nq, 2)`` (each query row's allowed keys ``[lo, hi)``),
      and/or ``tile_class`` int8 ``(Bm, Hm, nbq, nbk)`` (EMPTY / PARTIAL / FULL on ``tile_shape``'s
      grid) with ``bitmap_index`` int32 of the same shape (-1: no bitmap) and ``bitmaps`` uint64
      ``(n, BQ, ceil(BK/64))`` (a bit per cell of a PARTIAL tile); ``Bm`` is 1 or B, ``Hm`` 1 or H;
    - ``mods``: score mods, a sequence of ``KernelMod`` run in order inside the tile;
    - ``bias``: float ``(B|1, H|1, Nq|1, Nk)``, added to the scores after the mods;
    - ``dropout_p`` in ``[0, 1)`` with its ``seed`` (``philox_keep`` draws the same keep-mask);
    - ``threads``: worker threads in ``[1, MAX_THREADS]`` (default 1);
    - ``kv_format`` (a ``KvFormat``): K and V in q's dtype, or quantized (int8, or the float8 bits
      of E4M3 / E5M2 as uint8) with float32 scales ``k_scale``, ``v_scale`` broadcasting to
      ``(B, Hkv, Nk)``;
    - ``lse_lo``: an optional result ``(B, H, Nq)`` in lse's dtype, written with lse's rounding
      residual (the lse computed minus the lse written; 0 where lse is not finite), for ``backward``.

    Returns ``(rows that attended a non-finite input, rows whose finite inputs overflowed)``: both
    kinds are written as NaN with ``lse`` NaN; the caller raises for the second (``finite.hpp``)."""
    _need()
    return _ext.forward(_dl(q), _dl(k), _dl(v), _dl(out), _dl(lse), **_options(options))


def backward(
    q: Any, k: Any, v: Any, out: Any, lse: Any, dout: Any, dq: Any, dk: Any, dv: Any, **options: Any
) -> tuple[int, int]:
    """Gradients into ``dq (B, H, Nq, Dk)``, ``dk (B, Hkv, Nk, Dk)``, ``dv (B, Hkv, Nk, Dv)``
    (float32; float64 for float64 inputs), recomputed from ``q, k, v, out, lse``; ``dlse`` (an
    optional keyword, ``(B, H, Nq)``) adds lse's gradient; ``lse_lo`` (optional, the forward's) is
    added to lse where P is rebuilt. A row that sends NaN (its forward was
    NaN, or its q / dO is not finite) sends it along its attended edges only. The other keywords
    and the returned counts are ``forward``'s."""
    _need()
    arrays = (_dl(x) for x in (q, k, v, out, lse, dout, dq, dk, dv))
    return _ext.backward(*arrays, **_options(options))


def _options(options: dict[str, Any]) -> dict[str, Any]:
    """The keywords as the binding reads them (``binding.cpp``'s ``keywords``): arrays through
    ``_dl``, mods through ``_mods``, numbers as Python's (a NumPy scalar too)."""
    out = {}
    for name, x in options.items():
        if name == "mods":
            x = _mods(x)
        elif name in _ARRAYS:
            x = _dl(x)
        elif name in _NUMBERS and x is not None and not isinstance(x, bool):
            x = _NUMBERS[name](x)
        out[name] = x
    return out


_ARRAYS = frozenset({"bias", "k_scale", "v_scale", "dlse", "lse_lo"})  # the mask arrays are NumPy (masks.plan)
_NUMBERS = {"scale": float, "dropout_p": float, "seed": int, "threads": int, "kv_format": int}


def philox_keep(seed: int, b: int, h: int, i0: int, i1: int, j0: int, j1: int, p: float) -> np.ndarray:
    """The dropout keep-mask the kernel uses for queries ``[i0, i1)`` x keys ``[j0, j1)`` of batch
    ``b``, head ``h``: bool ``(i1 - i0, j1 - j0)``. Philox4x32-10, key ``(seed & 0xffffffff,
    seed >> 32)``, counter ``(j >> 2, i, h, b)``, word ``j & 3``, keep iff ``word >= T`` with
    ``T = uint32(min(p·2^32, 2^32 − 1))``."""
    if i1 < i0 or j1 < j0:
        raise ValueError(f"philox_keep: need i0 <= i1 and j0 <= j1, got [{i0}, {i1}) x [{j0}, {j1})")
    keep = np.empty((int(i1) - int(i0), int(j1) - int(j0)), dtype=bool)
    _need()
    _ext.philox_keep_into(keep, int(seed) & 0xFFFFFFFFFFFFFFFF, int(b), int(h), int(i0), int(j0), float(p))
    return keep


__all__ = [
    "BLOCK_K",
    "BLOCK_Q",
    "DECODE_MAX_NQ",
    "DTYPES",
    "EMPTY",
    "FULL",
    "KernelMod",
    "KvFormat",
    "LANES",
    "MAX_THREADS",
    "PARTIAL",
    "MaskKind",
    "ModKind",
    "available",
    "backward",
    "decode_prefetch",
    "forward",
    "isa",
    "isas",
    "philox_keep",
    "reason",
    "tile_shape",
    "use_decode_prefetch",
    "use_isa",
]
