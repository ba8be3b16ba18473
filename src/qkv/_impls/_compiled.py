"""``qkv.attention`` while torch traces (``torch.compile``, ``torch.export``): one operator node.

Inside a traced program the front end must not look at values or run NumPy, so this path
normalises the call from shapes and structure alone — the mask as its recipe, a boolean array as
``from_dense`` data, a float array as the bias, the score mod as the kernel's ops — and hands
everything to ``torch.ops.qkv.attention`` (``_torch_op``), which checks, plans and runs the
compiled kernel when the graph runs; a quantized cache goes to
``torch.ops.qkv.attention_quantized`` as its codes and scales (dequantized in the graph only
with dropout, which that operator lacks). What this path cannot express (a mask or score mod
that is a plain Python function, a bias or mod table that needs its gradient, weights, an rng
that is not an int seed, a device other than the CPU) returns None: ``qkv.attention`` then runs
its usual path with the graph broken around it (``torch.compiler.disable``), never wrongly.
"""

import importlib.util
from typing import Any

from .. import _native as native
from .. import masks
from .._backend import is_floating, namespace
from .._checks import check_dropout, check_flag, check_qkv, check_scale, check_seed, shapes_of
from .._quant import dequantize
from .._softmax import with_sinks
from .._typing import Result
from ..masks import Mask
from ..scores import ScoreMod
from ._call import aligned_mod, as_2d, check_bias, check_sinks, split_quantized
from ._kernel_args import KV_FORMATS, flat, flat_bias


def _mask_recipe(mask: Any, causal: bool, torch: Any) -> tuple[Any, Any] | None:
    """``(recipe or None, float bias or None)``; None when the mask has no recipe."""
    bias = None
    if mask is None:
        recipe = None
    elif isinstance(mask, Mask):
        if mask.recipe is None:
            return None
        recipe = mask.recipe
    elif isinstance(mask, torch.Tensor):
        mask = as_2d(mask)  # (Nk,) is (1, Nk); a 0-D one (1, 1)
        if mask.dtype == torch.bool:
            recipe = ("from_dense", (mask,), {})
        elif is_floating(mask):
            recipe, bias = None, mask
        else:
            return None
    else:
        return None
    if check_flag(causal, "causal"):
        recipe = ("causal", (), {}) if recipe is None else ("&", recipe, ("causal", (), {}))
    return recipe, bias


def _ready(x: Any) -> Any:
    """A ``(B, H, N, D)`` layout as the kernel reads it: the last axis dense."""
    return x if x.stride(-1) == 1 else x.contiguous()


def compiled_attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    mask: Any,
    causal: Any,
    scale: Any,
    score_mod: Any,
    dropout: Any,
    rng: Any,
    want_weights: bool,
    bias: Any,
    sinks: Any,
) -> Result | None:
    """``Result(out, None, lse)`` through ``torch.ops.qkv.attention``, or None (see the module)."""
    import torch

    from . import _torch_op

    k, v, kv = split_quantized(k, v)
    if kv is not None and check_dropout(dropout) > 0:  # the quantized operator has no dropout: float K/V
        k, v, kv = dequantize(kv.k, q.dtype), dequantize(kv.v, q.dtype), None
    if not native.available() or want_weights or not all(isinstance(x, torch.Tensor) for x in (q, k, v)):
        return None
    if q.device.type != "cpu" or str(q.dtype).removeprefix("torch.") not in native.DTYPES:
        return None
    normalised = _mask_recipe(mask, causal, torch)
    if normalised is None:
        return None
    recipe, mask_bias = normalised
    dims = check_qkv(q, k, v, quantized=kv is not None)
    if 0 in (*dims.batch, dims.h, dims.nq, dims.nk, dims.dk, dims.dv):
        return None  # an empty axis: the eager path's answer (no kernel takes one)
    bias = check_bias(bias, mask_bias)
    if bias is not None and bias.requires_grad:
        return None  # its gradient comes from the array engine
    if score_mod is not None:
        if not isinstance(score_mod, ScoreMod) or score_mod.native is None:
            return None
        score_mod.check_heads(dims.h, shapes_of(q=q))
        if any(getattr(t, "requires_grad", False) for t in score_mod.tensors):
            return None
        if isinstance(mask, Mask) and aligned_mod(score_mod, mask, dims.nq, dims.nk) is not score_mod:
            return (
                None  # positions measured per sequence: the array engine's (inside torch.compile the operator refuses)
            )
    p = check_dropout(dropout)
    rng = check_seed(rng)
    if p > 0 and rng is None:
        seed = torch.randint(0, 2**62, (), dtype=torch.int64)  # a new draw per call, in the graph
    elif p > 0 and isinstance(rng, int) and not isinstance(rng, bool):
        seed = torch.tensor(rng - 2**64 if rng >= 2**63 else rng, dtype=torch.int64)
    elif p > 0:
        return None
    else:
        seed = torch.zeros((), dtype=torch.int64)
    sc = check_scale(scale, dims.dk)
    lead = dims.score_shape[:-2] if dims.has_heads else ()
    mask_code, mask_data = ("", []) if recipe is None else masks.encode(recipe)
    mods_code, mod_tables = _torch_op.encode_mods(score_mod.native if score_mod is not None else ())
    q4, k4, v4 = (flat(x, dims, n, torch.Tensor.expand) for x, n in ((q, dims.h), (k, dims.hkv), (v, dims.hkv)))
    q4, k4, v4 = (_ready(x) for x in (q4, k4, v4))
    data = [d if isinstance(d, torch.Tensor) else torch.as_tensor(d) for d in mask_data]
    b4 = None if bias is None else _ready(flat_bias(bias, dims, torch.Tensor.expand))
    call = (b4, mask_code, data, list(lead), mods_code, mod_tables, float(sc), float(p), seed)
    if kv is not None:  # the codes and scales read in place by the kernel
        if kv.format != "int8":
            k4, v4 = k4.view(torch.uint8), v4.view(torch.uint8)
        ks, vs = (flat(x.scales[..., None], dims, dims.hkv, torch.Tensor.expand)[..., 0] for x in (kv.k, kv.v))
        out, lse, _ = torch.ops.qkv.attention_quantized(q4, k4, v4, ks, vs, int(KV_FORMATS[kv.format]), *call)
    else:
        out, lse, _ = torch.ops.qkv.attention(q4, k4, v4, *call)
    out = out.reshape(*dims.score_shape[:-1], dims.dv)
    lse = lse.reshape(dims.score_shape[:-1])
    res = Result(out, None, lse)
    sinks = check_sinks(sinks, dims.score_shape[:-2] if dims.has_heads else (), q)
    return res if sinks is None else with_sinks(namespace(q=q), res, sinks)


def operator_reason() -> str | None:
    """Why ``torch.ops.qkv.attention`` is not there (None: it is registered). Imports torch, and
    registers the operator, when torch is installed."""
    if not native.available():
        return native.reason()
    try:
        if importlib.util.find_spec("torch") is None:
            return "torch is not installed (pip install 'qkv[torch]')"
        import torch

        from . import _torch_op  # noqa: F401 - importing it registers the operators
    except Exception as e:  # noqa: BLE001 - a torch that cannot load the operator: say why, never raise
        return f"torch could not register the operator: {type(e).__name__}: {e}"
    return None if hasattr(torch.ops.qkv, "attention") else "torch.ops.qkv.attention is missing after registration"
