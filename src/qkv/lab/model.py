"""The lab's Model page: ``qkv.inspect`` on the server's one model, bounded like every page.

The model (the ``qkv[model]`` extra's all-MiniLM-L6-v2 unless ``qkv lab --model`` names a
folder) is loaded on the first request and kept for the life of the server; a request names
only its text, never a model. A text may have at most ``max_model_chars`` characters and
``max_model_tokens`` tokens (the weights grow as layers x heads x N²); at most
``max_model_runs`` forward passes run at once, and a request beyond that is refused with 429
rather than queued. No math here: the numbers are ``Inspection.to_dict()`` and
``Approximations.to_dict()``.
"""

import threading
from typing import Any

from .._inspect import inspect, load_model
from .schemas import LabError, Limits, ModelRequest


class ModelRunner:
    """The server's model, loaded once, and the bound on concurrent runs."""

    def __init__(self, limits: Limits, model: str | None = None) -> None:
        self.limits, self.model = limits, model
        self._runs = threading.BoundedSemaphore(limits.max_model_runs)
        self._loading = threading.Lock()
        self._loaded: Any = None

    def loaded(self) -> Any:
        """The model, loaded on first use (two first requests at once load it once)."""
        with self._loading:
            if self._loaded is None:
                self._loaded = load_model(self.model)
            return self._loaded

    def run(self, req: ModelRequest) -> dict[str, Any]:
        """``qkv.inspect(req.text)`` and its approximations with ``req.window``, as JSON."""
        lim = self.limits
        if len(req.text) > lim.max_model_chars:
            raise LabError(
                f"text has {len(req.text)} characters, above the lab's limit of max_model_chars={lim.max_model_chars}"
            )
        if not self._runs.acquire(blocking=False):
            raise LabError(
                f"the model is busy with max_model_runs={lim.max_model_runs} other run(s); try again in a moment",
                status=429,
            )
        try:
            loaded = self.loaded()
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
