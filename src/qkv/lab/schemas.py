"""Request bodies of the lab's JSON API (pydantic), with the lab's limits.

Fixed bounds live in the field definitions (pydantic answers 422 naming the field); the bounds
an app is configured with (``Limits``, e.g. ``create_app(max_n=...)``) are checked by the
handlers, which raise ``LabError`` (also 422) with the limit in the message. Matrices are
lists of rows of finite numbers; their shapes are checked here, their agreement with each
other (``Dk`` of q and k, ``Nk`` of k and v) by ``qkv.attention``'s own checks.
"""

import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator

from .._typing import Impl
from ..masks.spec import MASK_KINDS

Number = Annotated[float, Strict(), Field(allow_inf_nan=False)]  # JSON numbers only: no "1", NaN or inf
Matrix = list[list[Number]]
POS = ("rope", "alibi", "sinusoidal", "learned")


NUMBER_BYTES = 26  # the longest JSON a float64 needs ("-1.2345678901234567e-308") and ", "
ECHO = 100  # characters of a caller's value a refusal quotes at most
_LONG_WORD = re.compile(rf"\S{{{ECHO + 21},}}")


@dataclass(frozen=True)
class Limits:
    """Everything the lab bounds, as ``/api/limits`` shows it (``docs/lab.md``, "Limits and safety").

    Sizes: ``max_n`` positions on the Explain, Heatmap and Positional pages, ``max_d`` features,
    ``max_heads``; ``max_complexity_n`` for the calculator (``max_complexity_n_bigbird`` with the
    bigbird mask, and at most ``max_bigbird_block_pairs`` pairs of its random blocks);
    ``measure_*`` for the measure button (about a second on a laptop core); ``max_steps`` of a
    training run and ``max_runs`` running at once.

    Requests: ``max_body_bytes`` per body (0: 1 MiB, or three ``max_n`` x ``max_d`` matrices of
    full-precision numbers if that is more, so that every Explain request within the size limits
    fits).

    Training memory: a run keeps at most ``max_frames_per_run`` recorded attention maps and
    ``max_frame_values_per_run`` numbers in them (2 bytes each); the lab remembers the runs of
    ``max_clients`` clients and ``max_recorded_bytes`` of their records in all, and forgets a
    finished run unused for ``run_ttl_seconds`` (least recently used first when over a bound).

    Event streams: ``max_streams_per_run`` and ``max_streams`` in all (more are refused with
    429); a run nobody watches any more stops ``orphan_grace_seconds`` after its last viewer left.

    Connections (``qkv lab``'s uvicorn): a request's headers and body must arrive within
    ``request_timeout_seconds``, an idle keep-alive connection closes after
    ``keep_alive_seconds``, headers are at most ``max_header_bytes``, and at most
    ``max_connections`` are served at once (503 beyond).

    Model page: a text of at most ``max_model_chars`` characters and ``max_model_tokens``
    tokens; at most ``max_model_runs`` runs of the model at once (429 beyond).
    """

    max_n: int = 128
    max_d: int = 256
    max_heads: int = 16
    max_complexity_n: int = 1 << 16
    max_complexity_n_bigbird: int = 1 << 13
    max_bigbird_block_pairs: int = 1 << 26  # block=1 at N=8192: its random blocks are counted in ~0.3 s
    measure_max_n: int = 4096
    measure_flops: float = 4e9
    measure_bytes: float = 512e6
    max_steps: int = 3000
    max_runs: int = 2  # training runs at once over all clients (two cores)
    max_body_bytes: int = 0
    max_frames_per_run: int = 64
    max_frame_values_per_run: int = 1 << 20
    max_recorded_bytes: int = 32 << 20
    max_clients: int = 32
    run_ttl_seconds: float = 3600.0
    max_streams_per_run: int = 4
    max_streams: int = 32
    orphan_grace_seconds: float = 3.0
    request_timeout_seconds: float = 5.0
    keep_alive_seconds: int = 5
    max_header_bytes: int = 16 << 10
    max_connections: int = 128
    max_model_chars: int = 400
    max_model_tokens: int = 64
    max_model_runs: int = 1  # forward passes of the Model page at once (two cores)

    def __post_init__(self) -> None:
        if self.max_body_bytes <= 0:
            explain = 3 * self.max_n * self.max_d * NUMBER_BYTES + (64 << 10)
            object.__setattr__(self, "max_body_bytes", max(1 << 20, explain))


def shown(value: Any, limit: int = ECHO) -> str:
    """``repr(value)``, cut to ``limit`` characters with the full length said: what a refusal may
    quote of a caller's value (a megabyte-long string is never sent back)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def clipped(message: str, limit: int = 1000) -> str:
    """A refusal's message of at most about ``limit`` characters, whoever wrote it (the library's
    messages quote values in full): every word longer than ``ECHO`` + 20 characters cut to ``ECHO``,
    then, if still too long, its start and its end (which name the field and the limit) kept and
    the middle elided."""
    message = _LONG_WORD.sub(lambda m: f"{m[0][:ECHO]}... ({len(m[0])} characters)", message)
    if len(message) <= limit:
        return message
    half = limit // 2
    return f"{message[:half]} ... ({len(message) - 2 * half} characters elided) ... {message[-half:]}"


class LabError(Exception):
    """A request the lab refuses (answered 422 with ``message``)."""

    def __init__(self, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.message, self.status = message, status


class FieldProblem(BaseModel):
    """One problem of a request pydantic found: where (``loc``), what (``msg``), its ``type``."""

    loc: list[str | int]
    msg: str
    type: str


class Refusal(BaseModel):
    """The body of every 4xx the lab answers: ``message`` is one readable line; ``detail`` is the
    list of field problems (request validation) or the same line (a refusal by a handler)."""

    detail: list[FieldProblem] | str
    message: str


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _kind(value: str) -> str:
    if value not in MASK_KINDS:
        raise ValueError(f"unknown mask kind {shown(value)}; allowed: {', '.join(MASK_KINDS)}")
    return value


class MaskSpec(_Body):
    """A mask by name (``qkv.masks.spec.MASK_KINDS``) and its parameters."""

    mask: str = "none"
    mask_params: dict[str, Any] = Field(default_factory=dict)

    _check_kind = field_validator("mask")(_kind)


class ModelRequest(BaseModel):
    """The Model page: a sentence for the server's model, and the window of the approximations table."""

    model_config = ConfigDict(extra="forbid")

    text: Annotated[str, Field(min_length=1, max_length=100_000)]
    window: Annotated[int, Field(ge=1, le=512)] = 8


class ExplainRequest(MaskSpec):
    """Q (Nq, Dk), K (Nk, Dk), V (Nk, Dv) as lists of rows; all three omitted = the worked example."""

    q: Matrix | None = None
    k: Matrix | None = None
    v: Matrix | None = None
    causal: bool = False
    scale: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    grad: bool = False

    @field_validator("q", "k", "v")
    @classmethod
    def _rectangular(cls, m: list[list[float]] | None, info: Any) -> list[list[float]] | None:
        if m is None:
            return m
        name = info.field_name
        if not m or not m[0]:
            raise ValueError(f"{name} must be a non-empty matrix (a list of rows of numbers), got {shown(m)}")
        for i, row in enumerate(m):
            if len(row) != len(m[0]):
                raise ValueError(
                    f"row {i} has {len(row)} numbers but row 0 has {len(m[0])} (ragged: every row "
                    f"of {name} needs the same length)"
                )
        return m


class HeatmapRequest(MaskSpec):
    """Random Gaussian q (H, Nq, D), k, v (H, Nk, D) from ``seed``; weights of every head."""

    n_q: int = Field(12, ge=1)
    n_k: int | None = Field(None, ge=1)
    d: int = Field(16, ge=1)
    heads: int = Field(2, ge=1)
    seed: int = Field(0, ge=0, le=2**32 - 1)
    scale: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    temperature: float = Field(1.0, gt=0, le=1e3, allow_inf_nan=False)


class PositionalRequest(_Body):
    """A positional encoding to look at: ``kind``, ``n`` positions, ``d`` features, ``base``, ALiBi ``heads``."""

    kind: Literal["sinusoidal", "rope", "alibi", "learned"] = "sinusoidal"
    n: int = Field(32, ge=1)
    d: int = Field(32, ge=1)
    base: float = Field(10000.0, gt=1.0, le=1e9, allow_inf_nan=False)
    heads: int = Field(4, ge=1)
    seed: int = Field(0, ge=0, le=2**32 - 1)
    causal: bool = True


class ComplexityRequest(MaskSpec):
    """The arguments of ``qkv.complexity.estimate`` (``mask`` by kind)."""

    n: int = Field(1024, ge=1)
    n_k: int | None = Field(None, ge=1)
    d: int = Field(64, ge=1, le=4096)
    d_v: int | None = Field(None, ge=1, le=4096)
    heads: int = Field(8, ge=1, le=1024)
    kv_heads: int | None = Field(None, ge=1, le=1024)
    batch: int = Field(1, ge=1, le=4096)
    dtype: Literal["float32", "float64", "float16", "bfloat16"] = "float32"
    impl: Impl = "reference"
    backward: bool = False


class TrainRequest(_Body):
    """A ``qkv.train.train`` run: task, steps, model size, positional encoding, seed, compute dtype."""

    task: Literal["copy", "reverse", "sort", "recall"] = "reverse"
    steps: int = Field(300, ge=1)
    length: int | None = Field(None, ge=2, le=16)
    pos: Literal["rope", "alibi", "sinusoidal", "learned"] = "learned"
    d_model: int = Field(64, ge=8, le=128)
    n_heads: int = Field(4, ge=1, le=8)
    n_layers: int = Field(2, ge=1, le=4)
    batch_size: int = Field(64, ge=1, le=256)
    lr: float = Field(3e-3, gt=0, le=1.0, allow_inf_nan=False)
    record_every: int | None = Field(None, ge=1)
    seed: int = Field(0, ge=0, le=2**32 - 1)
    dtype: Literal["float32", "bfloat16"] = "float32"
