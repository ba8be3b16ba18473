"""``communication``: bytes each rank sends for ring or Ulysses attention, per step."""

from dataclasses import asdict, dataclass
from typing import Any

from .._checks import check_choice, check_flag, check_int
from ..distributed import LAYOUTS, allowed_pairs, segments
from ..errors import ArgumentError, ShapeError
from ._model import ITEMSIZE, check_sizes, compute_itemsize

SCHEMES = ("ring", "ulysses")


@dataclass(frozen=True)
class Communication:
    """Bytes each rank sends for one sequence-parallel attention call (``qkv.distributed``).

    ``bytes_per_step[t]`` is what every rank sends at communication step ``t`` (forward steps,
    then backward steps); ``bytes_per_rank`` their sum, ``total_bytes`` over all ranks.
    ``work_per_rank[r]`` counts the (batch, head, query, key) scores rank ``r`` attends, the
    useful work (diagonal tiles compute a little more): the causal balance of a layout.
    """

    scheme: str
    layout: str
    world_size: int
    n_q: int
    n_k: int
    d_k: int
    d_v: int
    heads: int
    kv_heads: int
    batch: int
    dtype: str
    causal: bool
    backward: bool
    steps: int
    bytes_per_step: tuple[int, ...]
    bytes_per_rank: int
    total_bytes: int
    work_per_rank: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict of every field."""
        d = asdict(self)
        d["bytes_per_step"], d["work_per_rank"] = list(self.bytes_per_step), list(self.work_per_rank)
        return d


def communication(
    n: int,
    d_k: int = 64,
    d_v: int | None = None,
    heads: int = 1,
    kv_heads: int | None = None,
    batch: int = 1,
    dtype: str = "float32",
    world_size: int = 2,
    scheme: str = "ring",
    causal: bool = False,
    layout: str = "contiguous",
    backward: bool = False,
    n_k: int | None = None,
) -> Communication:
    """Bytes each rank sends, per step, for ``ring_attention`` or ``ulysses_attention`` over ``world_size`` ranks.

    ``n`` is the whole sequence length (``n_k`` the key length if different); shards are
    ``n / world_size`` long. With ``s`` the itemsize of ``dtype``, ``c`` the compute itemsize
    (float32 for half precision), ``W`` the world size and ``kv = B·Hkv·(Nk/W)·(Dk + Dv)``:

    - ring (Liu et al., arXiv:2310.01889): forward ``W − 1`` steps, each sending the held K/V
      block, ``kv·s`` bytes (causal masking skips work, not transfers); backward ``W`` steps:
      ``W − 1`` send the block and its gradient accumulators, ``kv·(s + c)``, the last only
      the accumulators, ``kv·c``, home to their owner.
    - ulysses (Jacobs et al., arXiv:2309.14509): one all-to-all per tensor, each sending the
      ``(W − 1) / W`` of the rank's shard that other ranks' heads need: forward ``q``, ``k``,
      ``v`` then ``out``; backward ``dout`` then ``dq``, ``dk``, ``dv``.

    >>> communication(32768, d_k=128, heads=32, kv_heads=8, world_size=8, dtype="bfloat16").bytes_per_step[0]
    16777216
    """
    nq, nk, dk, dv, h, hkv, b, dtype = check_sizes(n, n_k, d_k, d_v, heads, kv_heads, batch, dtype, q_name="n")
    w = check_int(world_size, "world_size", minimum=1)
    check_choice(scheme, "scheme", SCHEMES)
    if layout not in LAYOUTS or (scheme == "ulysses" and layout != "contiguous"):
        allowed = list(LAYOUTS) if scheme == "ring" else ["contiguous"]
        raise ArgumentError(f"layout must be one of {allowed} for scheme={scheme!r}, got {layout!r}")
    causal, backward = check_flag(causal, "causal"), check_flag(backward, "backward")
    pieces = 2 * w if layout == "zigzag" else w
    for name, length in (("n", nq), ("n_k", nk)):
        if length % pieces:
            raise ShapeError(
                f"{name}={length} does not divide into {pieces} equal pieces "
                f"(world_size={w}{', zigzag layout: 2 chunks per rank' if layout == 'zigzag' else ''})"
            )
    s, c = ITEMSIZE[dtype], compute_itemsize(dtype)
    if scheme == "ring":
        kv = b * hkv * (nk // w) * (dk + dv)
        steps = [kv * s] * (w - 1)
        if backward and w > 1:
            steps += [kv * (s + c)] * (w - 1) + [kv * c]
        work = tuple(
            b
            * h
            * sum(
                allowed_pairs(segments(r, w, nq, layout), segments(src, w, nk, layout), causal, nq, nk)
                for src in range(w)
            )
            for r in range(w)
        )
    else:
        for name, count in (("heads", h), ("kv_heads", hkv)):
            if count % w:
                raise ShapeError(
                    f"{name}={count} does not divide by world_size={w}: Ulysses gives each rank "
                    f"{name} / world_size heads"
                )

        def a2a(heads_: int, n_: int, d: int) -> int:  # one all-to-all of a (B, heads, n/W, d) shard
            return b * heads_ * (n_ // w) * d * s * (w - 1) // w

        steps = [] if w == 1 else [a2a(h, nq, dk), a2a(hkv, nk, dk), a2a(hkv, nk, dv), a2a(h, nq, dv)]
        if backward and w > 1:
            steps += [a2a(h, nq, dv), a2a(h, nq, dk), a2a(hkv, nk, dk), a2a(hkv, nk, dv)]
        work = (b * (h // w) * allowed_pairs(((0, nq),), ((0, nk),), causal, nq, nk),) * w
    return Communication(
        scheme=scheme,
        layout=layout,
        world_size=w,
        n_q=nq,
        n_k=nk,
        d_k=dk,
        d_v=dv,
        heads=h,
        kv_heads=hkv,
        batch=b,
        dtype=dtype,
        causal=causal,
        backward=backward,
        steps=len(steps),
        bytes_per_step=tuple(steps),
        bytes_per_rank=sum(steps),
        total_bytes=w * sum(steps),
        work_per_rank=work,
    )
