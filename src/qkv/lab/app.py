"""``create_app``: the lab's FastAPI application (pages, static assets, ``/api``, error answers).

Every refusal is a 4xx with ``{"detail": ..., "message": "one readable line"}``: pydantic's
validation errors (422, the message naming each field; at most ``PROBLEMS`` of them listed),
``LabError`` (its status, usually 422; 409 for a second training run, 429 over a stream limit),
any ``qkv.errors.QKVError`` a handler raises (422, the library's own message), a body above the
limit (413) and, when the app is given its ``hosts``, a foreign ``Host`` header (400). A refusal
quotes at most ``schemas.ECHO`` characters of a caller's value and is at most about a thousand
characters long. A bug is still a 500, never a refusal.
"""

import contextlib
import secrets
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException

from .._version import __version__
from ..errors import QKVError
from .guard import BodyLimit, HostGuard
from .model import ModelRunner
from .pages import TITLES, render
from .routes import COOKIE, build_router
from .schemas import LabError, Limits, clipped
from .training import TrainingManager

STATIC = Path(__file__).parent / "static"
PAGES = tuple(TITLES)
PROBLEMS = 20  # field problems a 422 lists at most (a body with a million bad numbers has a million)


def _where(loc: tuple[Any, ...]) -> str:
    parts = [str(x) for x in loc if x not in ("body", "query", "cookie", "header")]
    return ".".join(parts) or "request"


def _validation_message(errors: list[dict[str, Any]], more: int) -> str:
    lines = []
    for e in errors:
        msg = clipped(str(e.get("msg", "")).removeprefix("Value error, "), 300)
        lines.append(f"{_where(tuple(e.get('loc', ())))[:100]}: {msg}")
    tail = f"; and {more} more problems" if more else ""
    return "; ".join(dict.fromkeys(lines)) + tail


def create_app(
    max_n: int = 128,
    *,
    limits: Limits | None = None,
    max_steps: int | None = None,
    hosts: Sequence[str] | None = None,
    any_address: bool = False,
    model: str | None = None,
    preload_model: bool = False,
) -> FastAPI:
    """The lab app: the six pages at ``/explain`` ... ``/model``, static files at ``/static``
    and the JSON API at ``/api`` (see ``docs/lab.md``). ``max_n`` caps the positions of the
    Explain, Heatmap and Positional pages; ``limits`` sets every limit at once.

    ``hosts``: the names the server is reached by (``qkv lab`` passes 127.0.0.1, localhost, [::1]
    and its ``--host``); a request with another ``Host`` header is refused with 400 (DNS
    rebinding). ``None`` checks nothing: for a ``TestClient`` or an app mounted elsewhere.
    ``any_address`` also accepts any IP address as the host (a wildcard bind). ``model``: the
    folder (or hub name) the Model page inspects (None: the ``qkv[model]`` extra's
    all-MiniLM-L6-v2); ``preload_model`` starts loading it, in the background, when the server
    starts (``qkv lab`` does), else its first request does."""
    lim = limits or Limits(max_n=max_n)
    if max_steps is not None:
        lim = Limits(**{**lim.__dict__, "max_steps": max_steps})
    manager = TrainingManager(lim)
    runner = ModelRunner(lim, model)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if preload_model:
            runner.start()  # a background thread: the server answers at once, Model requests wait for it
        yield
        manager.stop_all()  # a server shutting down ends its training threads

    app = FastAPI(
        title="qkv lab",
        version=__version__,
        lifespan=lifespan,
        docs_url="/api/docs",
        redoc_url=None,
        openapi_url="/api/openapi.json",
    )
    app.state.limits, app.state.training = lim, manager

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # the caller's input is never echoed: only where (loc, clipped), what (msg) and the type
        found = exc.errors()
        errors = [
            {"loc": [x if isinstance(x, int) else str(x)[:100] for x in e.get("loc", ())][:20]}
            | {"msg": clipped(str(e.get("msg", "")), 300), "type": str(e.get("type", ""))[:100]}
            for e in found[:PROBLEMS]
        ]
        message = _validation_message(errors, len(found) - len(errors))
        return JSONResponse({"detail": errors, "message": clipped(message)}, status_code=422)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        # FastAPI's own refusals (a body it cannot parse, e.g. nested too deep: 400; an unknown path)
        message = clipped(str(exc.detail))
        return JSONResponse({"detail": message, "message": message}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(LabError)
    async def _refused(request: Request, exc: LabError) -> JSONResponse:
        message = clipped(exc.message)
        return JSONResponse({"detail": message, "message": message}, status_code=exc.status)

    @app.exception_handler(QKVError)
    async def _qkv_error(request: Request, exc: QKVError) -> JSONResponse:
        message = clipped(f"{type(exc).__name__}: {exc}")
        return JSONResponse({"detail": message, "message": message}, status_code=422)

    app.include_router(build_router(lim, manager, runner))
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", include_in_schema=False)
    def index() -> RedirectResponse:
        return RedirectResponse("/explain")

    def page(name: str) -> Any:
        html = render(name)  # once, when the app is built

        def serve(request: Request) -> Response:
            response = HTMLResponse(html)
            if not request.cookies.get(COOKIE):
                response.set_cookie(COOKIE, secrets.token_urlsafe(12), httponly=True, samesite="strict")
            return response

        serve.__name__ = f"page_{name}"
        return serve

    for name in PAGES:
        app.get(f"/{name}", include_in_schema=False)(page(name))
    app.add_middleware(BodyLimit, limit=lim.max_body_bytes)
    if hosts is not None:
        app.add_middleware(HostGuard, hosts=hosts, any_address=any_address)  # outermost: checked first
    return app
