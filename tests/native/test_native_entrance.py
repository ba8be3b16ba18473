"""The kernel's one entrance (``_native/entrance.cpp``): the K/V storage arguments it checks for
the quantized cache (``kv_format``, ``k_scale``, ``v_scale``), and the same checks, with the same
qkv.errors class and words, behind its three callers (the nanobind binding, XLA's FFI handlers and
the torch custom operator)."""

import numpy as np
import pytest
import torch

from qkv import _native as native
from qkv._native import KernelMod, KvFormat, ModKind
from qkv.errors import ArgumentError, DTypeError, ShapeError

B, H, HKV, NQ, NK, D = 2, 4, 2, 5, 33, 8
QUANTIZED = [f for f in KvFormat if f is not KvFormat.NATIVE]
STORAGE = {KvFormat.I8: np.int8, KvFormat.E4M3: np.uint8, KvFormat.E5M2: np.uint8}


def call(kv_format=KvFormat.NATIVE, k=None, v=None, k_scale=None, v_scale=None, backward=False):
    q = np.zeros((B, H, NQ, D), np.float32)
    k = np.zeros((B, HKV, NK, D), np.float32) if k is None else k
    v = np.zeros((B, HKV, NK, D), np.float32) if v is None else v
    out, lse = np.zeros((B, H, NQ, D), np.float32), np.zeros((B, H, NQ), np.float32)
    kw = dict(scale=1.0, kv_format=kv_format, k_scale=k_scale, v_scale=v_scale)
    if backward:
        g = [np.zeros(x.shape, np.float32) for x in (q, k, v)]
        return native.backward(q, k, v, out, lse, out, *g, **kw)
    return native.forward(q, k, v, out, lse, **kw)


def cache(fmt, hkv=HKV, nk=NK, d=D):
    return np.zeros((B, hkv, nk, d), STORAGE[fmt])


def scales(shape=(B, HKV, NK), dtype=np.float32):
    return np.ones(shape, dtype)


def codes(fmt, shape, seed):
    """Small integer values (exact in every format) as ``fmt``'s stored codes, and the values."""
    ints = torch.randint(-4, 5, shape, generator=torch.Generator().manual_seed(seed)).float()
    if fmt is KvFormat.I8:
        return ints.to(torch.int8).numpy(), ints.numpy()
    dtype = torch.float8_e4m3fn if fmt is KvFormat.E4M3 else torch.float8_e5m2
    return ints.to(dtype).view(torch.uint8).numpy(), ints.numpy()


def run(fmt, k, v, k_scale=None, v_scale=None, q=None):
    q = np.linspace(-1, 1, B * H * NQ * D, dtype=np.float32).reshape(B, H, NQ, D) if q is None else q
    out, lse = np.zeros((B, H, NQ, D), np.float32), np.zeros((B, H, NQ), np.float32)
    native.forward(q, k, v, out, lse, scale=0.5, kv_format=fmt, k_scale=k_scale, v_scale=v_scale)
    return out, lse


@pytest.mark.parametrize("fmt", QUANTIZED, ids=lambda f: f.name)
@pytest.mark.parametrize(
    "shape",
    [(B, HKV, NK), (1, HKV, 1), (1, 1, 1), (B, 1, NK), (1, HKV, NK)],
    ids=lambda s: "x".join(map(str, s)),
)
def test_a_well_formed_quantized_cache_is_read_as_its_dequantized_values(fmt, shape):
    (kc, kf), (vc, vf) = codes(fmt, (B, HKV, NK, D), 1), codes(fmt, (B, HKV, NK, D), 2)
    ks = np.linspace(0.5, 2, int(np.prod(shape)), dtype=np.float32).reshape(shape)
    vs = ks[..., ::-1].copy() if shape[-1] > 1 else ks * 3
    want = run(KvFormat.NATIVE, kf * ks[..., None], vf * vs[..., None])
    got = run(fmt, kc, vc, ks, vs)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    # a scale broadcast by strides (stride 0 on its axes of 1 or on stretched ones) reads the same
    wk, wv = (np.broadcast_to(s, (B, HKV, NK)) for s in (ks, vs))
    for g, w in zip(run(fmt, kc, vc, wk, wv), want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_torch_float8_caches_enter_as_their_uint8_bits():
    for fmt, dtype in ((KvFormat.E4M3, torch.float8_e4m3fn), (KvFormat.E5M2, torch.float8_e5m2)):
        ints = torch.randint(-4, 5, (B, HKV, NK, D), generator=torch.Generator().manual_seed(3)).float()
        k = ints.to(dtype).view(torch.uint8)  # zero-copy
        s = torch.full((B, HKV, NK), 0.25)
        got = run(fmt, k, k, s, s)
        want = run(KvFormat.NATIVE, (ints * 0.25).numpy(), (ints * 0.25).numpy())
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", QUANTIZED, ids=lambda f: f.name)
def test_the_storage_dtype_must_match_the_format(fmt):
    other = KvFormat.E4M3 if fmt is KvFormat.I8 else KvFormat.I8
    want = np.dtype(STORAGE[fmt]).name
    with pytest.raises(TypeError, match=f"k, v must be {want} with kv_format={fmt.name.lower()}, got"):
        call(fmt, cache(other), cache(other), scales(), scales())
    with pytest.raises(TypeError, match=f"k, v must be {want}"):
        call(fmt, np.zeros((B, HKV, NK, D), np.float32), cache(fmt), scales(), scales())
    with pytest.raises(TypeError, match=f"k, v must be {want}"):
        call(fmt, cache(fmt), np.zeros((B, HKV, NK, D), np.float32), scales(), scales())


@pytest.mark.parametrize("fmt", QUANTIZED, ids=lambda f: f.name)
def test_a_quantized_cache_is_shaped_as_a_float_one(fmt):
    with pytest.raises(ValueError, match=r"k must have shape \(B, Hkv, Nk, Dk\) .* \(axis 3\)"):
        call(fmt, cache(fmt, d=D + 1), cache(fmt), scales(), scales())
    with pytest.raises(ValueError, match=r"v must have shape \(B, Hkv, Nk\) .* \(axis 2\)"):
        call(fmt, cache(fmt), cache(fmt, nk=NK - 1), scales(), scales())
    with pytest.raises(ValueError, match="multiple of the kv heads"):
        call(fmt, cache(fmt, hkv=3), cache(fmt, hkv=3), scales((B, 3, NK)), scales((B, 3, NK)))


@pytest.mark.parametrize("fmt", QUANTIZED, ids=lambda f: f.name)
def test_the_scales_are_required_float32_and_broadcast_to_b_hkv_nk(fmt):
    k = cache(fmt)
    name = fmt.name.lower()
    with pytest.raises(ValueError, match=f"kv_format={name} needs k_scale and v_scale"):
        call(fmt, k, k)
    with pytest.raises(ValueError, match="needs k_scale and v_scale"):
        call(fmt, k, k, k_scale=scales())
    with pytest.raises(TypeError, match="k_scale must be float32, got float64"):
        call(fmt, k, k, scales(dtype=np.float64), scales())
    with pytest.raises(TypeError, match="v_scale must be float32, got float16"):
        call(fmt, k, k, scales(), scales(dtype=np.float16))
    with pytest.raises(ValueError, match=r"k_scale must be 3-D \(B\|1, Hkv\|1, Nk\|1\), got shape \(2, 33\)"):
        call(fmt, k, k, scales((B, NK)), scales())
    for axis, (label, size) in enumerate((("B", B), ("Hkv", HKV), ("Nk", NK))):
        shape = [B, HKV, NK]
        shape[axis] = size + 1
        with pytest.raises(ValueError, match=rf"v_scale: axis {axis} must be 1 or {label}={size}, got shape"):
            call(fmt, k, k, scales(), scales(tuple(shape)))


def test_scales_with_a_native_cache_and_unknown_formats_are_refused():
    with pytest.raises(ValueError, match="k_scale and v_scale scale a quantized K/V cache"):
        call(KvFormat.NATIVE, k_scale=scales(), v_scale=scales())
    with pytest.raises(ValueError, match="k_scale and v_scale scale a quantized"):
        call(KvFormat.NATIVE, v_scale=scales())
    for bad in (-1, len(KvFormat)):
        with pytest.raises(ValueError, match=rf"kv_format must be a KvFormat .*, got {bad}"):
            call(bad)


def test_the_backward_takes_a_native_cache_only():
    fmt = KvFormat.I8
    with pytest.raises(ValueError, match="the backward takes K and V in q's dtype"):
        call(fmt, cache(fmt), cache(fmt), scales(), scales(), backward=True)
    call(backward=True)  # the native one runs


# --------------------------------------------------------------------------- one set of messages


def _bad_calls():
    """(name, the qkv.errors class, q, k, v, extra keywords) of calls the entrance refuses."""
    f32 = np.float32
    q, k, v = np.zeros((1, 2, 20, 8), f32), np.zeros((1, 1, 30, 8), f32), np.zeros((1, 1, 30, 8), f32)
    yield "k's Dk", ShapeError, q, k[..., :4], v, {}
    yield "v's Nk", ShapeError, q, k, v[:, :, :10], {}
    yield (
        "kv heads",
        ShapeError,
        np.zeros((1, 3, 20, 8), f32),
        np.zeros((1, 2, 30, 8), f32),
        np.zeros((1, 2, 30, 8), f32),
        {},
    )
    yield "q's rank", ShapeError, q[0], k, v, {}
    yield "dtypes", DTypeError, q, k.astype(np.float64), v, {}
    yield "q's dtype", DTypeError, q.astype(np.int32), k, v, {}
    yield "rows shape", ShapeError, q, k, v, {"rows": np.zeros((1, 1, 19, 2), np.int32)}
    yield "rows dtype", DTypeError, q, k, v, {"rows": np.zeros((1, 1, 20, 2), np.int16)}
    yield "bias keys", ShapeError, q, k, v, {"bias": np.zeros((1, 1, 1, 29), f32)}
    yield "bias heads", ShapeError, q, k, v, {"bias": np.zeros((1, 3, 1, 30), f32)}
    yield "bias dtype", DTypeError, q, k, v, {"bias": np.zeros((1, 1, 1, 30), np.int8)}
    yield "threads", ArgumentError, q, k, v, {"threads": 0}
    yield "dropout", ArgumentError, q, k, v, {"dropout_p": 1.0}
    yield "scale", ArgumentError, q, k, v, {"scale": float("inf")}


BAD = [pytest.param(c, id=c[0]) for c in _bad_calls()]
# XLA hands every operand over with jax.vmap's axes in front, so a rank is the FFI's own check
BAD_FFI = [p for p in BAD if p.values[0][2].ndim == 4]
# the operator's inputs are (B, H, N, D) by its schema; it carries a mask as its recipe and takes
# the threads from qkv's setting
BAD_TORCH = [p for p in BAD_FFI if not set(p.values[0][5]) & {"rows", "threads"}]


def _binding_refusal(case) -> Exception:
    _, cls, q, k, v, kw = case
    out, lse = np.zeros((*q.shape[:-1], v.shape[-1]), np.float32), np.zeros(q.shape[:-1], np.float32)
    with pytest.raises(cls) as refused:
        native.forward(q, k, v, out, lse, **({"scale": 1.0} | kw))
    return refused.value


@pytest.mark.parametrize("case", BAD)
def test_the_binding_raises_the_qkv_error_of_each_refusal(case):
    name, cls = case[:2]
    err = _binding_refusal(case)
    assert type(err) is cls, (name, type(err))
    assert issubclass(cls, (ValueError, TypeError))  # callers catching those still do


@pytest.mark.parametrize("case", BAD_FFI)
def test_the_ffi_refuses_with_the_bindings_words(case):
    jax = pytest.importorskip("jax")
    if not hasattr(native._need(), "ffi_handlers"):
        pytest.skip("the compiled kernel was built without jaxlib's FFI header")
    from qkv._impls import _jax_ffi

    _, cls, q, k, v, kw = case
    binding = _binding_refusal(case)
    out, lse = np.zeros((*q.shape[:3], v.shape[3]), np.float32), np.zeros(q.shape[:3], np.float32)
    _jax_ffi._register()
    mask = {"rows": native.MaskKind.ROWS} if "rows" in kw else {}
    operands = [kw[n] for n in ("rows", "bias") if n in kw]
    attrs = dict(
        scale=np.float64(kw.get("scale", 1.0)),
        dropout_p=np.float64(kw.get("dropout_p", 0.0)),
        seed=np.int64(0),
        threads=np.int64(kw.get("threads", 1)),
        mask=np.int64(mask.get("rows", native.MaskKind.NONE)),
        has_bias=np.int64("bias" in kw),
        n_mods=np.int64(0),
        kv_format=np.int64(KvFormat.NATIVE),
        mod_kinds=np.zeros(1, np.int64),
        mod_c=np.zeros(1),
        mod_m=np.zeros(1, np.int64),
        has_dlse=np.int64(0),
    )
    shapes = (jax.ShapeDtypeStruct(out.shape, out.dtype), jax.ShapeDtypeStruct(lse.shape, lse.dtype))
    ffi = jax.ffi.ffi_call(_jax_ffi.FORWARD, shapes, vmap_method="broadcast_all")
    x64 = jax.config.read("jax_enable_x64")
    jax.config.update("jax_enable_x64", True)  # float64 operands stay float64
    try:
        with pytest.raises(Exception) as refused:  # XLA's runtime error, carrying the handler's message
            jax.block_until_ready(ffi(q, k, v, *operands, **attrs))
    finally:
        jax.config.update("jax_enable_x64", x64)
    assert f"{cls.__name__}: {binding}" in str(refused.value)


@pytest.mark.parametrize("case", BAD_TORCH)
def test_the_torch_operator_refuses_with_the_bindings_error(case):
    from qkv._impls import _torch_op  # noqa: F401 - registers torch.ops.qkv

    name, cls, q, k, v, kw = case
    binding = _binding_refusal(case)
    t = [torch.from_numpy(x) for x in (q, k, v)]
    bias = torch.from_numpy(kw["bias"]) if "bias" in kw else None
    lead = list(q.shape[:2])
    seed = torch.zeros((), dtype=torch.int64)
    with pytest.raises(cls) as refused:
        torch.ops.qkv.attention(*t, bias, "", [], lead, "()", [], kw.get("scale", 1.0), kw.get("dropout_p", 0.0), seed)
    assert type(refused.value) is cls and str(refused.value) == str(binding), name


def test_the_bindings_keywords_are_one_table_for_both_directions():
    q = np.zeros((1, 1, 3, 4), np.float32)
    out, lse = np.zeros_like(q), np.zeros((1, 1, 3), np.float32)
    g = [np.zeros_like(q) for _ in range(3)]
    ext = native._ext
    with pytest.raises(TypeError, match="forward\\(\\) got an unexpected keyword argument 'scael'"):
        ext.forward(q, q, q, out, lse, scael=1.0)
    with pytest.raises(TypeError, match="forward\\(\\) got an unexpected keyword argument 'dlse'"):
        ext.forward(q, q, q, out, lse, scale=1.0, dlse=lse)  # the backward's own
    with pytest.raises(TypeError, match="backward\\(\\) needs the keyword argument scale"):
        ext.backward(q, q, q, out, lse, out, *g)
    with pytest.raises(TypeError, match="scale must be a number, got str"):
        ext.forward(q, q, q, out, lse, scale="1")
    with pytest.raises(TypeError, match=r"seed must be an int in \[0, 18446744073709551615\], got -1"):
        ext.forward(q, q, q, out, lse, scale=1.0, seed=-1)
    with pytest.raises(TypeError, match="threads must be an int"):
        ext.forward(q, q, q, out, lse, scale=1.0, threads=2.0)
    with pytest.raises(TypeError, match="bias must be a CPU array"):
        ext.forward(q, q, q, out, lse, scale=1.0, bias="none")
    # every keyword, given its default, runs; the backward takes dlse too
    defaults = dict(tile_class=None, rows=None, bitmap_index=None, bitmaps=None, mods=(), bias=None)
    defaults |= dict(dropout_p=0.0, seed=0, threads=1, kv_format=0, k_scale=None, v_scale=None)
    assert ext.forward(q, q, q, out, lse, scale=1.0, **defaults) == (0, 0)
    assert ext.backward(q, q, q, out, lse, out, *g, scale=1.0, dlse=None, **defaults) == (0, 0)


def test_lse_lo_is_checked_as_lse_is_and_holds_lses_rounding():
    # the forward's residual of lse's rounding (params.hpp): written where given, read by the backward
    # small integers and a score mod (scores in natural units): every score exact, |lse| 15-41
    g = np.random.default_rng(0)
    q, k, v = (g.integers(-3, 4, (1, 2, n, 8)).astype(np.float32) for n in (20, 30, 30))
    out, lse, lo = np.zeros_like(q), np.zeros((1, 2, 20), np.float32), np.full((1, 2, 20), np.nan, np.float32)
    native.forward(q, k, v, out, lse, scale=1.0, lse_lo=lo, mods=(KernelMod(ModKind.MUL, 1.0),))
    s = np.einsum("bhid,bhjd->bhij", q.astype(np.float64), k.astype(np.float64))
    m = s.max(-1)
    exact = m + np.log(np.exp(s - m[..., None]).sum(-1))
    ulp = np.spacing(np.abs(lse)).astype(np.float64)
    assert np.all(np.abs(lo) <= ulp / 2)  # below half an ulp of lse
    both, alone = np.abs(lse + lo.astype(np.float64) - exact), np.abs(lse - exact)
    assert np.all(both < ulp / 4) and both.mean() < alone.mean() / 4, (both.max(), alone.max())
    ro = np.zeros_like(lse)
    ro.flags.writeable = False
    with pytest.raises(TypeError, match="lse_lo must be a writable CPU array"):
        native.forward(q, k, v, out, lse, scale=1.0, lse_lo=ro)
    with pytest.raises(ShapeError, match=r"lse_lo"):
        native.forward(q, k, v, out, lse, scale=1.0, lse_lo=np.zeros((1, 2, 21), np.float32))
    with pytest.raises(DTypeError, match="lse_lo must be float32, got float64"):
        native.forward(q, k, v, out, lse, scale=1.0, lse_lo=np.zeros((1, 2, 20), np.float64))
    grads = [np.zeros(x.shape, np.float32) for x in (q, k, v)]
    with pytest.raises(ShapeError, match=r"lse_lo"):
        native.backward(q, k, v, out, lse, out, *grads, scale=1.0, lse_lo=np.zeros((1, 2), np.float32))
    with pytest.raises(DTypeError, match="lse_lo must be float32, got float64"):
        native.backward(q, k, v, out, lse, out, *grads, scale=1.0, lse_lo=lo.astype(np.float64))
