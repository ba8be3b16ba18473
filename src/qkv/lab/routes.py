"""The lab's JSON API (``/api/...``): thin FastAPI routes over ``compute``, ``costs`` and ``training``.

A client is named by the ``client`` query parameter or, failing that, by the ``qkv_lab_client``
cookie that every page sets; training runs, their history and the learned positional table
belong to a client. Handlers that compute are plain ``def``: FastAPI runs them in its thread
pool, so a slow request never blocks the event loop or the training stream. The event stream
writes its events in chunks of up to ``CHUNK`` characters, made in at most ``WRITERS`` threads
at once, so that replaying a long run to many viewers leaves the event loop free.
"""

import asyncio
import secrets
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Cookie, Header, Query, Request, Response
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from . import compute, costs
from .model import ModelRunner
from .schemas import (
    ComplexityRequest,
    ExplainRequest,
    HeatmapRequest,
    LabError,
    Limits,
    ModelRequest,
    PositionalRequest,
    Refusal,
    TrainRequest,
)
from .training import TrainingManager

COOKIE = "qkv_lab_client"
POLL = 0.05  # seconds between looks at a run's events (and at the client's connection)
CHUNK = 1 << 18  # characters of events written at once (a replay of a whole run: a few writes)
WRITERS = 2  # threads making event chunks at once, over all streams (two cores)

ClientParam = Annotated[str | None, Query(alias="client", max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
_INVALID: dict[int | str, dict[str, Any]] = {422: {"model": Refusal, "description": "Invalid request or above a limit"}}
_BUSY: dict[int | str, dict[str, Any]] = {409: {"model": Refusal, "description": "A run is already going"}}
_UNKNOWN: dict[int | str, dict[str, Any]] = {404: {"model": Refusal, "description": "No such client or run"}}
_CROWDED: dict[int | str, dict[str, Any]] = {429: {"model": Refusal, "description": "Too many streams or clients"}}
ClientCookie = Annotated[str | None, Cookie(alias=COOKIE, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]


def client_id(response: Response, client: ClientParam = None, cookie: ClientCookie = None) -> str:
    """The caller's client id (query parameter, else cookie); a new one is set as a cookie if neither."""
    if client:
        return client
    if cookie:
        return cookie
    new = secrets.token_urlsafe(12)
    response.set_cookie(COOKIE, new, httponly=True, samesite="strict")
    return new


def _known_client(client: str | None, cookie: str | None) -> str:
    name = client or cookie
    if not name:
        raise LabError("no client id: pass ?client=ID or load a lab page first (it sets a cookie)", status=404)
    return name


_writers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, anyio.CapacityLimiter]" = weakref.WeakKeyDictionary()


def _writer_threads() -> anyio.CapacityLimiter:
    """The event loop's limiter of threads making event chunks (one per loop: a limiter is bound to its loop)."""
    loop = asyncio.get_running_loop()
    if loop not in _writers:
        _writers[loop] = anyio.CapacityLimiter(WRITERS)
    return _writers[loop]


class EventStream(StreamingResponse):
    """A ``text/event-stream`` response that calls ``release`` once it is over, however it ends."""

    def __init__(self, content: AsyncIterator[str], release: Callable[[], None]) -> None:
        super().__init__(
            content, media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )
        self.release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.release()


def build_router(limits: Limits, manager: TrainingManager, runner: ModelRunner | None = None) -> APIRouter:
    """Every ``/api`` route, bound to the app's limits, training manager and model."""
    api = APIRouter(prefix="/api")
    model_runner = runner or ModelRunner(limits)

    @api.get("/limits")
    def get_limits() -> dict[str, Any]:
        """Every limit of this lab: sizes, bodies, training memory, streams, connections (docs/lab.md)."""
        return {name: getattr(limits, name) for name in limits.__dataclass_fields__}

    @api.get("/masks")
    def get_masks() -> dict[str, Any]:
        """Mask kinds and their parameters (``qkv.masks.spec``)."""
        return compute.mask_kinds()

    @api.post("/explain", responses=_INVALID)
    def post_explain(req: ExplainRequest) -> dict[str, Any]:
        """``qkv.explain(q, k, v, ...).to_dict()``."""
        return compute.explain(req, limits)

    @api.post("/model", responses={**_INVALID, **_CROWDED})
    def post_model(req: ModelRequest) -> dict[str, Any]:
        """``qkv.inspect(text)`` on the server's model: tokens, weights, head patterns, rollout,
        entropy and ``approximations`` (window ``req.window``)."""
        return model_runner.run(req)

    @api.post("/heatmap", responses=_INVALID)
    def post_heatmap(req: HeatmapRequest) -> dict[str, Any]:
        """Attention weights, mask, row sums and entropy of every head."""
        return compute.heatmap(req, limits)

    @api.post("/positional", responses={**_INVALID, **_BUSY})
    def post_positional(
        req: PositionalRequest, response: Response, client: ClientParam = None, cookie: ClientCookie = None
    ) -> dict[str, Any]:
        """A positional encoding's table and similarity (ALiBi: biases per head)."""
        learned = None
        if req.kind == "learned":
            learned = manager.learned_table(client_id(response, client, cookie))
        return compute.positional_view(req, limits, learned)

    @api.post("/complexity", responses=_INVALID)
    def post_complexity(req: ComplexityRequest) -> dict[str, Any]:
        """``qkv.complexity.estimate`` for the call and over N."""
        return costs.estimate(req, limits)

    @api.post("/complexity/measure", responses=_INVALID)
    def post_measure(req: ComplexityRequest) -> dict[str, Any]:
        """Time the call (small sizes only)."""
        return costs.measure(req, limits)

    @api.post("/train/start", responses={**_INVALID, **_BUSY, **_CROWDED})
    def post_train_start(
        req: TrainRequest, response: Response, client: ClientParam = None, cookie: ClientCookie = None
    ) -> dict[str, Any]:
        """Start a training run for this client (409 if one is going)."""
        name = client_id(response, client, cookie)
        run = manager.start(name, req)
        return {"run": run.id, "client": name, "status": run.status, "events": f"/api/train/events?client={name}"}

    @api.post("/train/stop", responses={**_INVALID, **_UNKNOWN})
    def post_train_stop(client: ClientParam = None, cookie: ClientCookie = None) -> dict[str, Any]:
        """Ask this client's run to stop (it ends after the current step)."""
        run = manager.stop(_known_client(client, cookie))
        if run is None:
            raise LabError("this client has no training run to stop", status=404)
        return {"run": run.id, "status": run.status, "stopping": not run.finished}

    @api.get("/train/history", responses=_INVALID)
    def get_train_history(client: ClientParam = None, cookie: ClientCookie = None) -> Response:
        """Everything this client's latest run recorded (for the scrubber): ``loss``, ``accuracy``,
        the kept ``attention`` maps; ``{"status": "none"}`` when it has none (or it was forgotten)."""
        name = client or cookie
        run = None if name is None else manager.get(name)
        text = '{"run": null, "status": "none"}' if run is None else run.summary_json()
        return Response(text, media_type="application/json")

    @api.get("/train/events", responses={**_INVALID, **_UNKNOWN, **_CROWDED})
    async def get_train_events(
        request: Request,
        client: ClientParam = None,
        cookie: ClientCookie = None,
        since: Annotated[int, Query(ge=0)] = 0,
        last_event_id: Annotated[str | None, Header(max_length=20)] = None,
    ) -> StreamingResponse:
        """Server-sent events of this client's latest run from event ``since``; ends with the run.
        At most ``max_streams_per_run`` streams per run and ``max_streams`` in all (429 beyond).
        When the last stream of a run that is still going closes, the run stops
        ``orphan_grace_seconds`` later unless a stream opens again."""
        run, release = manager.open_stream(_known_client(client, cookie))
        if last_event_id is not None and last_event_id.isdigit():
            since = max(since, int(last_event_id) + 1)  # an EventSource reconnecting resumes

        async def stream() -> AsyncIterator[str]:
            index = since
            yield "retry: 1000\n\n"
            while True:
                if index < run.event_count() or run.finished:
                    text, index, ended = await anyio.to_thread.run_sync(
                        run.sse_chunk, index, CHUNK, limiter=_writer_threads()
                    )
                    if text:
                        yield text
                    if ended:
                        return
                    if text:
                        continue
                if await request.is_disconnected():
                    return
                await asyncio.sleep(POLL)

        try:
            return EventStream(stream(), release)
        except BaseException:
            release()
            raise

    return api
