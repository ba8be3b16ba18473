"""A training run: ``qkv.train.train`` in a background thread, what it recorded, its viewers, a
way to stop it.

Stopping sets an event that the training callback reads after every step (it returns False, and
``train`` stops); a run nobody watches any more stops ``grace`` seconds after its last viewer
left (a reload, which reconnects, keeps it going). The thread sets ``torch.set_num_threads(1)``
so that the server's own threads keep a core.
"""

import threading
import time
from array import array
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..schemas import Limits, TrainRequest
from .recording import Frames, finite_value, json_number, quantize
from .streams import Recorded, sse_chunk, summary_json

TERMINAL = ("done", "stopped", "error")


class Run:
    """One training run: its parameters, what it recorded so far, its viewers, a way to stop it."""

    def __init__(self, run_id: int, client: str, req: TrainRequest, limits: Limits) -> None:
        self.id, self.client, self.req = run_id, client, req
        self._lock = threading.Lock()
        self._head: list[dict[str, Any]] = []  # queued, start
        self._steps, self._loss, self._accuracy = array("q"), array("d"), array("d")
        self._frames = Frames(limits.max_frames_per_run, limits.max_frame_values_per_run)
        self._end: dict[str, Any] | None = None
        self.stop_requested = threading.Event()
        self.thread: threading.Thread | None = None
        self.viewers = 0
        self.orphaned_at: float | None = None  # when the last viewer left (monotonic)
        self.grace = limits.orphan_grace_seconds
        self.used = time.monotonic()

    # ----------------------------------------------------------------- recording (training thread)

    def emit(self, event: dict[str, Any]) -> None:
        """Record ``queued`` / ``start`` (before any step) or the terminal event."""
        with self._lock:
            if event["type"] in TERMINAL:
                self._end = {"index": len(self._head) + len(self._steps), "run": self.id, **event}
            else:
                self._head.append({"index": len(self._head), "run": self.id, **event})

    def add_step(self, step: int, loss: float, accuracy: float, weights: Sequence[np.ndarray] | None) -> None:
        maps = None if weights is None else quantize(weights)
        with self._lock:
            self._steps.append(step)
            self._loss.append(loss)
            self._accuracy.append(accuracy)
            if maps is not None:
                self._frames.add(step, maps)

    # ----------------------------------------------------------------- state

    @property
    def status(self) -> str:
        end = self._end
        return "running" if end is None else str(end["type"])

    @property
    def finished(self) -> bool:
        return self._end is not None

    def stop(self) -> None:
        self.stop_requested.set()

    def should_stop(self) -> bool:
        """Asked to stop, or nobody has watched it for ``grace`` seconds since its last viewer left."""
        if self.stop_requested.is_set():
            return True
        left = self.orphaned_at
        if self.viewers == 0 and left is not None and time.monotonic() - left >= self.grace:
            self.stop_requested.set()
            return True
        return False

    def attach(self) -> None:
        with self._lock:
            self.viewers += 1
            self.orphaned_at = None

    def detach(self) -> None:
        with self._lock:
            self.viewers -= 1
            if self.viewers == 0 and self._end is None:
                self.orphaned_at = time.monotonic()

    @property
    def nbytes(self) -> int:
        """Bytes of what the run recorded (maps, steps, losses, accuracies)."""
        with self._lock:
            return self._frames.nbytes + 24 * len(self._steps)

    def event_count(self) -> int:
        with self._lock:
            return len(self._head) + len(self._steps) + (self._end is not None)

    # ----------------------------------------------------------------- writing events

    def recorded(self, first: int = 0) -> Recorded:
        """A consistent copy (under the lock) of what the run recorded, its steps from event index ``first`` on."""
        with self._lock:
            a = max(0, first - len(self._head))
            steps = list(zip(self._steps[a:], self._loss[a:], self._accuracy[a:], strict=True))
            return Recorded(list(self._head), len(self._steps), steps, self._end, self._frames.snapshot())

    def sse_chunk(self, start: int, budget: int = 1 << 18) -> tuple[str, int, bool]:
        """Events ``start``, ... as server-sent event text of about ``budget`` characters
        (``streams.sse_chunk``): ``(text, next index, stream over)``."""
        return sse_chunk(self.id, self.recorded(start), start, budget)

    def summary_json(self) -> str:
        """Everything recorded so far, as JSON text: the scrubber's data (``streams.summary_json``)."""
        return summary_json(self.id, self.req.model_dump(), self._frames.recorded, self.recorded())


def train_run(run: Run, target: Callable[..., Any] | None, keep_table: Callable[[np.ndarray], None]) -> None:
    """The body of a run's thread: ``target`` (``qkv.train.train``) with a callback that records
    every step and stops the run when asked; the learned positional table goes to ``keep_table``
    before the terminal event, which is always recorded (``error`` if anything raised)."""
    try:
        import torch

        from ...train import TASKS, train

        torch.set_num_threads(1)  # leave the other core to the server
        req = run.req
        task = TASKS[req.task]
        length = task.default_length if req.length is None else req.length
        every = req.record_every or max(1, req.steps // 25)

        def callback(info: dict[str, Any]) -> bool:
            run.add_step(
                info["step"], finite_value(info["loss"]), finite_value(info["accuracy"]), info.get("attention")
            )
            return not run.should_stop()

        fn = target or train
        run.emit(
            {
                "type": "start",
                "total": req.steps,
                "record_every": every,
                "task": req.task,
                "description": task.description,
                "length": length,
                "layers": req.n_layers,
                "heads": req.n_heads,
            }
        )
        history = fn(
            req.task,
            req.steps,
            length=length,
            batch_size=req.batch_size,
            lr=req.lr,
            d_model=req.d_model,
            n_heads=req.n_heads,
            n_layers=req.n_layers,
            pos=req.pos,
            record_every=every,
            keep_attention=False,  # the maps go to the callback only: the run keeps them compactly
            eval_size=128,
            callback=callback,
            seed=req.seed,
            dtype=req.dtype,
        )
        model = history.model
        if req.pos == "learned" and model is not None:
            table = model.pe.weight.detach().double().numpy().copy()
            keep_table(table)  # before the terminal event: a page that sees "done" finds the table
        run.emit(
            {
                "type": "stopped" if run.stop_requested.is_set() else "done",
                "steps": len(history.loss),
                "probe": None if history.probe is None else history.probe.tolist(),
                "eval_accuracy": json_number(finite_value(history.eval_accuracy)),
                "eval_exact": json_number(finite_value(history.eval_exact)),
            }
        )
    except Exception as e:  # the thread must always end its stream
        run.emit({"type": "error", "message": f"{type(e).__name__}: {e}"})
