"""The lab's Model page: ``qkv.inspect`` on the server's one model, bounded like every page.

The model (the ``qkv[model]`` extra's all-MiniLM-L6-v2 unless ``qkv lab --model`` names a
folder) is loaded once, in a background thread, and kept for the life of the server: ``qkv
lab`` starts the load when the server starts (``ModelRunner.start``), otherwise the first
request does; a request names only its text, never a model. A request that arrives while the
model loads waits for it, and then for a run slot (up to ``QUEUED`` seconds): the page's first
request and a reload during the load are both answered, never refused as busy (at most
``WAITING`` requests wait at once: each holds a server thread). A model that
cannot be loaded is refused with the loader's one-line reason (422, or the ``MissingExtra``
message); the first request ``RETRY`` seconds after the failure loads it again (a folder mended
in place, an extra installed since, is picked up without a restart; a folder that stays bad
costs one load per ``RETRY`` seconds, never one per request). A text may have at most ``max_model_chars`` characters and
``max_model_tokens`` tokens (the weights grow as layers x heads x N²); at most
``max_model_runs`` forward passes run at once, and once the model is loaded a request beyond
that is refused with 429 rather than queued. No math here: the numbers are
``Inspection.to_dict()`` and ``Approximations.to_dict()``.
"""

import threading
import time
from typing import Any

from .._inspect import check_text, inspect, load_model
from ..errors import QKVError
from .schemas import LabError, Limits, ModelRequest

QUEUED = 120.0
"""Seconds a request that waited for the model's load then waits for a run slot (before 429)."""
WAITING = 4
"""Requests that may wait for the model's load at once (each holds one of the server's threads);
one more is refused with 429."""
RETRY = 30.0
"""Seconds after a failed load before a request starts the load again."""


class ModelRunner:
    """The server's model, loaded once in the background, and the bound on concurrent runs."""

    def __init__(self, limits: Limits, model: str | None = None) -> None:
        self.limits, self.model = limits, model
        self._runs = threading.BoundedSemaphore(limits.max_model_runs)
        self._waiting = threading.BoundedSemaphore(WAITING)
        self._starting = threading.Lock()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._loaded: Any = None
        self._error: BaseException | None = None
        self._failed_at = 0.0

    def start(self) -> None:
        """Begin loading the model in a background thread (once; later calls do nothing, except
        that a load which failed ``RETRY`` or more seconds ago is started again)."""
        with self._starting:
            if self._error is not None and time.monotonic() - self._failed_at >= RETRY:
                self._thread, self._error, self._ready = None, None, threading.Event()
            if self._thread is None:
                self._thread = threading.Thread(target=self._load, name="qkv-lab-model", daemon=True)
                self._thread.start()

    def _load(self) -> None:
        try:
            self._loaded = load_model(self.model)
        except Exception as e:  # kept and raised to the requests until RETRY: a QKVError is a 4xx, a bug a 500
            self._failed_at = time.monotonic()
            self._error = e
        finally:
            self._ready.set()

    @property
    def ready(self) -> bool:
        """True once the load has finished (loaded or failed)."""
        return self._ready.is_set()

    def loaded(self) -> Any:
        """The model: starts the load if nothing has, waits for it, raises what it raised."""
        self.start()
        self._ready.wait()
        with self._starting:  # one attempt's outcome (a retry may have begun since the wait)
            error, loaded = self._error, self._loaded
        if error is None and loaded is None:
            return self.loaded()  # a retry began: wait for it
        if isinstance(error, QKVError):  # the model's problem: its one-line reason, a 4xx
            raise error.with_traceback(None)
        if error is not None:  # a bug: a 500 whose log keeps where the load failed
            raise RuntimeError(f"loading the model {self.model or 'all-MiniLM-L6-v2'!r} failed") from error
        return loaded

    def _acquire(self, waited: bool) -> None:
        lim = self.limits
        if not (self._runs.acquire(timeout=QUEUED) if waited else self._runs.acquire(blocking=False)):
            raise LabError(
                f"the model is busy with max_model_runs={lim.max_model_runs} other run(s); try again in a moment",
                status=429,
            )

    def run(self, req: ModelRequest) -> dict[str, Any]:
        """``qkv.inspect(req.text)`` and its approximations with ``req.window``, as JSON."""
        lim = self.limits
        if len(req.text) > lim.max_model_chars:
            raise LabError(
                f"text has {len(req.text)} characters, above the lab's limit of max_model_chars={lim.max_model_chars}"
            )
        check_text(req.text)
        self.start()  # a failed load RETRY seconds old starts again: this request waits for it
        if self.ready:
            loaded = self.loaded()
            self._acquire(waited=False)
        else:  # waiting for the load is not a run: it is bounded on its own
            if not self._waiting.acquire(blocking=False):
                raise LabError(
                    f"the model is still loading and {WAITING} requests already wait for it; try again in a moment",
                    status=429,
                )
            try:
                loaded = self.loaded()
                self._acquire(waited=True)
            finally:
                self._waiting.release()
        try:
            n = len(loaded.tokenizer(req.text, verbose=False)["input_ids"])
            if n > lim.max_model_tokens:
                raise LabError(
                    f"text is {n} tokens long, above the lab's limit of max_model_tokens={lim.max_model_tokens}"
                )
            insp = inspect(req.text, loaded)
            approx = insp.approximations(req.window)
        finally:
            self._runs.release()
        return insp.to_dict() | {"approximations": approx.to_dict()}
