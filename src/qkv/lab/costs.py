"""The Complexity page's handlers: ``qkv.complexity.estimate`` for one call and over N, and a
measurement of the same call for sizes that run in about a second (``qkv.bench.measure``).

A measurement runs on NumPy arrays (or torch tensors for ``impl="torch"``, bfloat16 and the
backward pass) in a child process that is replaced every few measurements (``measuring``: what
a measured call leaves in native memory goes with it), one at a time, after the estimate says it
fits ``Limits.measure_*``.
"""

import importlib.util
from typing import Any

from .. import complexity
from ..errors import QKVError
from ..masks.spec import build_mask
from .compute import mask_errors
from .measuring import MeasureFailed, in_child
from .schemas import ComplexityRequest, LabError, Limits


def _block_pairs(req: ComplexityRequest, n: int, n_k: int) -> int:
    """The (query block, key block) pairs of a bigbird mask's random-block grid (0 for other masks):
    what counting its tiles costs (about 0.15 µs a pair in this version of qkv)."""
    block = req.mask_params.get("block", 2)
    if req.mask != "bigbird" or isinstance(block, bool) or not isinstance(block, int) or block < 1:
        return 0  # not bigbird, or a block build_mask refuses with its own message
    return -(-n // block) * -(-n_k // block)


def _estimate(req: ComplexityRequest, limits: Limits, n: int, n_k: int | None = None) -> complexity.Estimate:
    nk = n if n_k is None else n_k
    pairs = _block_pairs(req, n, nk)
    if pairs > limits.max_bigbird_block_pairs:
        raise LabError(
            f"the bigbird mask with block={req.mask_params.get('block', 2)} at N={max(n, nk)} has {pairs} pairs of "
            f"blocks, above the lab's limit of max_bigbird_block_pairs={limits.max_bigbird_block_pairs} (a larger "
            "block or a smaller N; `qkv complexity` on the command line has no limit)"
        )
    with mask_errors(req.mask, req.mask_params):
        mask = build_mask(req.mask, n, nk, **req.mask_params)
        return complexity.estimate(
            n,
            nk,
            d_k=req.d,
            d_v=req.d_v,
            heads=req.heads,
            kv_heads=req.kv_heads,
            batch=req.batch,
            dtype=req.dtype,
            impl=req.impl,
            mask=mask,
            backward=req.backward,
        )


def _sizes(n: int, limit: int) -> list[int]:
    """Powers of two from 16 to 4 N (at most ``limit``), with N itself."""
    top = min(limit, max(4 * n, 256))
    sizes = {n} | {1 << e for e in range(4, 31) if (1 << e) <= top}
    return sorted(sizes)


def estimate(req: ComplexityRequest, limits: Limits) -> dict[str, Any]:
    """``{"estimate": Estimate.to_dict(), "series": [{n, flops, score_bytes, peak_bytes, kv_cache_bytes}],
    "skipped": [n, ...]}``; the series keeps ``n_k / n_q`` fixed as N grows and leaves out (in
    ``skipped``) the sizes where the mask's parameters do not apply."""
    for name, value in (("n", req.n), ("n_k", req.n_k)):
        if value is not None and value > limits.max_complexity_n:
            raise LabError(
                f"{name} is {value}, above the lab's limit of {limits.max_complexity_n} for the "
                "calculator (use `qkv complexity` on the command line for larger sizes)"
            )
        # qkv counts BigBird's random blocks over the whole (Nq, Nk) grid: seconds at 8192, minutes at 65536
        if req.mask == "bigbird" and value is not None and value > limits.max_complexity_n_bigbird:
            raise LabError(
                f"{name} is {value}, above the lab's limit of {limits.max_complexity_n_bigbird} for the "
                "calculator with the bigbird mask (counting its random blocks grows as N²)"
            )
    top = limits.max_complexity_n_bigbird if req.mask == "bigbird" else limits.max_complexity_n
    one = _estimate(req, limits, req.n, req.n_k)
    ratio = 1.0 if req.n_k is None else req.n_k / req.n
    series: list[dict[str, Any]] = []
    skipped: list[int] = []
    for n in _sizes(req.n, top):
        n_k = max(1, min(top, round(n * ratio)))
        if _block_pairs(req, n, n if req.n_k is None else n_k) > limits.max_bigbird_block_pairs:
            break  # the curve ends where the calculator's bigbird limit does
        try:
            e = one if n == req.n else _estimate(req, limits, n, None if req.n_k is None else n_k)
        except (LabError, QKVError):  # parameters valid at the asked N but not at this one (prefix=100 at N=16)
            skipped.append(n)
            continue
        series.append(
            {
                "n": n,
                "flops": e.flops,
                "score_bytes": e.score_bytes,
                "peak_bytes": e.peak_bytes,
                "kv_cache_bytes": e.kv_cache_bytes,
            }
        )
    return {"estimate": one.to_dict(), "series": series, "skipped": skipped}


def measure(req: ComplexityRequest, limits: Limits) -> dict[str, Any]:
    """Run the call (forward, or forward + backward) a few times, in the measuring process
    (``measuring.in_child``): median seconds beside the estimate."""
    n_k = req.n if req.n_k is None else req.n_k
    e = _estimate(req, limits, req.n, req.n_k)
    work = e.input_bytes + e.output_bytes + e.peak_bytes
    if max(req.n, n_k) > limits.measure_max_n or e.flops > limits.measure_flops or work > limits.measure_bytes:
        raise LabError(
            f"measure runs only calls that take about a second: N <= {limits.measure_max_n}, at most "
            f"{limits.measure_flops:.3g} FLOPs and {limits.measure_bytes / 1e6:.0f} MB; this one is "
            f"N={max(req.n, n_k)}, {e.flops:.3g} FLOPs, {work / 1e6:.0f} MB (make N, heads or batch "
            "smaller)"
        )
    torch_inputs = req.impl == "torch" or req.dtype == "bfloat16" or req.backward
    if torch_inputs and importlib.util.find_spec("torch") is None:
        raise LabError("measuring impl='torch', bfloat16 or the backward pass needs PyTorch")
    with mask_errors(req.mask, req.mask_params):
        build_mask(req.mask, req.n, n_k, **req.mask_params)  # refused here, before a process is asked
    h, hkv = req.heads, req.heads if req.kv_heads is None else req.kv_heads
    dv = req.d if req.d_v is None else req.d_v
    call = {
        "shapes": [[req.batch, h, req.n, req.d], [req.batch, hkv, n_k, req.d], [req.batch, hkv, n_k, dv]],
        "dtype": req.dtype,
        "torch": torch_inputs,
        "backward": req.backward,
        "impl": req.impl,
        "mask": req.mask,
        "mask_params": req.mask_params,
    }
    try:
        t = in_child(call)
    except MeasureFailed as failed:
        raise LabError(failed.message, status=422 if failed.refused else 503) from None
    median = t["median"]
    return {
        "seconds": median,
        "iqr": t["iqr"],
        "samples": t["samples"],
        "flops": e.flops,
        "gflops_per_s": e.flops / median / 1e9 if median > 0 else None,
        "estimate": e.to_dict(),
        "arrays": "torch" if torch_inputs else "numpy",
    }
