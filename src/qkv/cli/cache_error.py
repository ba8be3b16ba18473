"""``qkv cache-error``: what storing K and V in 8 bits changes, per head (``qkv.diagnostics.cache_error``).

For ``--q/--k/--v`` files, or random normal inputs of the sizes given (``--heads``, ``--kv-heads``,
``--nq``, ``--nk``, ``--d``; ``--spread`` varies the tokens' sizes over that many decades), each
format's error per query head: a bar of the relative rms error, the largest ``|Δout|``, and per kv
head each token's largest stored error relative to its size; ``--json`` prints the numbers.
"""

import json
from typing import Annotated, Any

import typer

from .._quant import FORMATS, SCALES
from ..errors import ArgumentError
from ._common import Inputs, JsonOut, KFile, MaskSpec, QFile, VFile, mask_of, read_inputs

BAR = 12
"""Characters of the longest bar (the largest relative error of the table)."""


def _formats(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [n for n in names if n not in FORMATS]
    if not names or unknown:
        raise ArgumentError(f"--dtype takes {', '.join(FORMATS)} (comma-separated), got {text!r}")
    return list(dict.fromkeys(names))


def _random(heads: int, kv_heads: int, nq: int, nk: int, d: int, spread: float, seed: int) -> tuple[Any, Any, Any]:
    import numpy as np

    if heads % kv_heads:
        raise ArgumentError(f"--heads {heads} must be a multiple of --kv-heads {kv_heads}")
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, heads, nq, d)).astype(np.float32)
    k, v = rng.standard_normal((2, 1, kv_heads, nk, d)).astype(np.float32)
    if spread > 0:  # each token's size drawn log-uniformly over `spread` decades
        sizes = 10.0 ** rng.uniform(-spread / 2, spread / 2, (2, 1, kv_heads, nk, 1))
        k, v = k * sizes[0].astype(np.float32), v * sizes[1].astype(np.float32)
    return q, k, v


def cache_error_command(
    q: QFile = None,
    k: KFile = None,
    v: VFile = None,
    inputs: Inputs = None,
    dtype: Annotated[str, typer.Option("--dtype", help="formats, comma-separated")] = ",".join(FORMATS),
    per: Annotated[str, typer.Option("--per", help="one scale per token or per kv head (float8)")] = "token",
    heads: Annotated[int, typer.Option("--heads", min=1, max=256, help="query heads (random inputs)")] = 8,
    kv_heads: Annotated[int, typer.Option("--kv-heads", min=1, max=256, help="kv heads (random inputs)")] = 2,
    nq: Annotated[int, typer.Option("--nq", min=1, max=4096, help="queries (random inputs)")] = 16,
    nk: Annotated[int, typer.Option("--nk", min=1, max=65536, help="cached keys (random inputs)")] = 2048,
    d: Annotated[int, typer.Option("--d", min=1, max=1024, help="head dimension (random inputs)")] = 128,
    spread: Annotated[float, typer.Option("--spread", min=0.0, max=12.0, help="decades of token sizes")] = 0.0,
    seed: Annotated[int, typer.Option("--seed", help="random inputs' seed")] = 0,
    mask: MaskSpec = None,
    causal: Annotated[bool, typer.Option("--causal", help="causal, bottom-right")] = False,
    json_out: JsonOut = False,
) -> None:
    """Per-head error of attention over a KV cache stored as int8 / float8, against the float cache."""
    from rich.console import Console
    from rich.table import Table

    from .. import diagnostics

    formats = _formats(dtype)
    if per not in SCALES:
        raise ArgumentError(f"--per must be one of {', '.join(SCALES)}, got {per!r}")
    qa, ka, va = read_inputs(q, k, v, inputs)
    if qa is None:
        qa, ka, va = _random(heads, kv_heads, nq, nk, d, spread, seed)
    m = mask_of(mask, causal, qa.shape[-2], ka.shape[-2])
    results = {
        f: diagnostics.cache_error(qa, ka, va, f, per=per, mask=m) for f in formats if f != "int8" or per == "token"
    }
    if not results:
        raise ArgumentError("--per head is for the float8 formats; int8 keeps one scale per token")
    if json_out:
        typer.echo(
            json.dumps(
                {"shape": {"q": list(qa.shape), "k": list(ka.shape)}, **{f: e.to_dict() for f, e in results.items()}}
            )
        )
        return
    largest = max(float(e.relative.max()) for e in results.values()) or 1.0
    table = Table(title=f"attention over an 8-bit cache against the float one (a scale per {per})")
    for column in ("format", "head", "rms error", "", "max |Δout|"):
        table.add_column(column, justify="left" if column in ("format", "") else "right", no_wrap=True)
    for f, e in results.items():
        for h, (rel, mx) in enumerate(zip(e.relative, e.max_error, strict=True)):
            bar = "█" * max(1, round(BAR * rel / largest))
            table.add_row(f if h == 0 else "", str(h), f"{rel:.2%}", bar, f"{mx:.3g}")
        table.add_section()
    Console().print(table)
    for f, e in results.items():  # the stored values' own error, per kv head
        k_err, v_err = (" ".join(f"{x:.2%}" for x in err) for err in (e.k_error, e.v_error))
        typer.echo(f"{f}: each token's stored error relative to its size, per kv head: k {k_err}; v {v_err}")
    first = next(iter(results.values()))
    typer.echo(f"cache bytes: {first.nbytes} quantized against {first.float_nbytes} as given")
