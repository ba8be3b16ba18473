"""``create_app``: the lab's FastAPI application (pages, static assets, ``/api``, error answers).

Every refusal is a 4xx with ``{"detail": ..., "message": "one readable line"}``: pydantic's
validation errors (422, the message naming each field), ``LabError`` (its status, usually
422; 409 for a second training run) and any ``qkv.errors.QKVError`` a handler raises (422, the
library's own message). A bug is still a 500, never a refusal.
"""

import contextlib
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException

from .._version import __version__
from ..errors import QKVError
from .routes import COOKIE, build_router
from .schemas import LabError, Limits
from .training import TrainingManager

STATIC = Path(__file__).parent / "static"
PAGES = ("explain", "heatmap", "positional", "complexity", "training")


def _where(loc: tuple[Any, ...]) -> str:
    parts = [str(x) for x in loc if x not in ("body", "query", "cookie", "header")]
    return ".".join(parts) or "request"


def _validation_message(errors: list[dict[str, Any]]) -> str:
    lines = []
    for e in errors:
        msg = str(e.get("msg", "")).removeprefix("Value error, ")
        lines.append(f"{_where(tuple(e.get('loc', ())))}: {msg}")
    return "; ".join(dict.fromkeys(lines))


def create_app(max_n: int = 128, *, limits: Limits | None = None, max_steps: int | None = None) -> FastAPI:
    """The lab app: the five pages at ``/explain`` ... ``/training``, static files at ``/static``
    and the JSON API at ``/api`` (see ``docs/lab.md``). ``max_n`` caps the positions of the
    Explain, Heatmap and Positional pages; ``limits`` sets every limit at once."""
    lim = limits or Limits(max_n=max_n)
    if max_steps is not None:
        lim = Limits(**{**lim.__dict__, "max_steps": max_steps})
    manager = TrainingManager(max_runs=lim.max_runs, max_steps=lim.max_steps)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
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
        errors = [{k: v for k, v in e.items() if k in ("loc", "msg", "type")} for e in exc.errors()]
        return JSONResponse({"detail": errors, "message": _validation_message(errors)}, status_code=422)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        # FastAPI's own refusals (a body it cannot parse, e.g. nested too deep: 400; an unknown path)
        message = str(exc.detail)
        return JSONResponse({"detail": message, "message": message}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(LabError)
    async def _refused(request: Request, exc: LabError) -> JSONResponse:
        return JSONResponse({"detail": exc.message, "message": exc.message}, status_code=exc.status)

    @app.exception_handler(QKVError)
    async def _qkv_error(request: Request, exc: QKVError) -> JSONResponse:
        message = f"{type(exc).__name__}: {exc}"
        return JSONResponse({"detail": message, "message": message}, status_code=422)

    app.include_router(build_router(lim, manager))
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", include_in_schema=False)
    def index() -> RedirectResponse:
        return RedirectResponse("/explain")

    def page(name: str) -> Any:
        def serve(request: Request) -> Response:
            response = FileResponse(STATIC / f"{name}.html", media_type="text/html")
            if not request.cookies.get(COOKIE):
                response.set_cookie(COOKIE, secrets.token_urlsafe(12), httponly=True, samesite="strict")
            return response

        serve.__name__ = f"page_{name}"
        return serve

    for name in PAGES:
        app.get(f"/{name}", include_in_schema=False)(page(name))
    return app
