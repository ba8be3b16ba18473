"""Training runs of the lab: ``qkv.train.train`` in a background thread, one run per client.

A ``Run`` collects its events (``start``, ``step`` with loss, accuracy and, at recorded steps,
the probe's attention maps of every layer and head, then one of ``done`` / ``stopped`` /
``error``) in a list that the server-sent-event stream replays from any index and that stays
for the scrubber once the run is over. Stopping sets an event that the training callback reads
after every step (it returns False, and ``train`` stops). The thread sets
``torch.set_num_threads(1)`` so that the server's own threads keep a core. No FastAPI here.
"""

import itertools
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from .schemas import LabError, TrainRequest

TERMINAL = ("done", "stopped", "error")
DIGITS = 4  # decimals of the attention maps sent to the browser


class Run:
    """One training run: its parameters, its events so far, and a way to stop it."""

    def __init__(self, run_id: int, client: str, req: TrainRequest) -> None:
        self.id, self.client, self.req = run_id, client, req
        self.events: list[dict[str, Any]] = []
        self.changed = threading.Condition()
        self.stop_requested = threading.Event()
        self.thread: threading.Thread | None = None
        self.learned: np.ndarray | None = None  # the trained positional table (pos="learned")

    @property
    def status(self) -> str:
        with self.changed:
            last = self.events[-1]["type"] if self.events else "start"
        return last if last in TERMINAL else "running"

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL

    def emit(self, event: dict[str, Any]) -> None:
        with self.changed:
            self.events.append({"index": len(self.events), "run": self.id, **event})
            self.changed.notify_all()

    def events_since(self, index: int) -> list[dict[str, Any]]:
        with self.changed:
            return self.events[index:]

    def stop(self) -> None:
        self.stop_requested.set()

    def summary(self) -> dict[str, Any]:
        """Everything recorded so far: the scrubber's data."""
        steps = [e for e in self.events_since(0) if e["type"] == "step"]
        end = self.events[-1] if self.finished else None
        return {
            "run": self.id,
            "status": self.status,
            "params": self.req.model_dump(),
            "probe": None if end is None else end.get("probe"),
            "loss": [e["loss"] for e in steps],
            "accuracy": [e["accuracy"] for e in steps],
            "attention": [{"step": e["step"], "weights": e["attention"]} for e in steps if "attention" in e],
            "end": end,
        }


def _maps(weights: list[np.ndarray]) -> list[Any]:
    """The maps to ``DIGITS`` decimals, NaN / ±inf (a diverged run) as ``None``: strict JSON."""
    out = []
    for w in weights:
        a = np.round(w.astype(np.float64), DIGITS).astype(object)
        a[~np.isfinite(w.astype(np.float64))] = None
        out.append(a.tolist())
    return out


def _finite(x: Any) -> float | None:
    """A loss or an accuracy as a JSON number; ``None`` when a diverged run made it NaN or ±inf."""
    return float(x) if x is not None and np.isfinite(x) else None


class TrainingManager:
    """The runs of every client: at most one running per client and ``max_runs`` in all."""

    def __init__(self, max_runs: int = 2, max_steps: int = 3000) -> None:
        self.max_runs, self.max_steps = max_runs, max_steps
        self._runs: dict[str, Run] = {}  # each client's latest run
        self._learned: dict[str, np.ndarray] = {}  # each client's last learned positional table
        self._lock = threading.Lock()
        self._ids = itertools.count(1)

    def get(self, client: str) -> Run | None:
        with self._lock:
            return self._runs.get(client)

    def learned_table(self, client: str) -> np.ndarray | None:
        with self._lock:
            return self._learned.get(client)

    def start(self, client: str, req: TrainRequest, target: Callable[..., Any] | None = None) -> Run:
        """Check the request (sizes, the model it builds) and start its thread; ``LabError`` 409 when
        this client already has a run going or the lab is at ``max_runs``."""
        if req.steps > self.max_steps:
            raise LabError(f"steps is {req.steps}, above the lab's limit of {self.max_steps}")
        if req.d_model % req.n_heads:
            raise LabError(f"d_model={req.d_model} must be a multiple of n_heads={req.n_heads}")
        if req.pos == "rope" and (req.d_model // req.n_heads) % 2:
            raise LabError(f"RoPE needs an even head size, got d_model / n_heads = {req.d_model // req.n_heads}")
        with self._lock:
            current = self._runs.get(client)
            if current is not None and not current.finished:
                raise LabError(
                    f"a training run ({current.id}) is already going for this client; stop it first "
                    "(POST /api/train/stop) or wait for it to finish",
                    status=409,
                )
            busy = sum(not r.finished for r in self._runs.values())
            if busy >= self.max_runs:
                raise LabError(
                    f"the lab is already running {busy} trainings (its limit); try again when one finishes", status=409
                )
            run = Run(next(self._ids), client, req)
            run.emit({"type": "queued", "params": req.model_dump()})
            self._runs[client] = run
        run.thread = threading.Thread(
            target=self._train, args=(run, target), name=f"qkv-lab-train-{run.id}", daemon=True
        )
        run.thread.start()
        return run

    def stop(self, client: str) -> Run | None:
        run = self.get(client)
        if run is not None:
            run.stop()
        return run

    def stop_all(self, timeout: float = 5.0) -> None:
        with self._lock:
            runs = list(self._runs.values())
        for run in runs:
            run.stop()
        for run in runs:
            if run.thread is not None:
                run.thread.join(timeout)

    def _train(self, run: Run, target: Callable[..., Any] | None) -> None:
        try:
            import torch

            from ..train import TASKS, train

            torch.set_num_threads(1)  # leave the other core to the server
            req = run.req
            task = TASKS[req.task]
            length = task.default_length if req.length is None else req.length
            every = req.record_every or max(1, req.steps // 25)

            def callback(info: dict[str, Any]) -> bool:
                event: dict[str, Any] = {
                    "type": "step",
                    "step": info["step"],
                    "loss": _finite(info["loss"]),
                    "accuracy": _finite(info["accuracy"]),
                }
                if "attention" in info:
                    event["attention"] = _maps(info["attention"])
                run.emit(event)
                return not run.stop_requested.is_set()

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
                eval_size=128,
                callback=callback,
                seed=req.seed,
            )
            model = history.model
            if req.pos == "learned" and model is not None:
                with self._lock:
                    self._learned[run.client] = model.pe.weight.detach().double().numpy().copy()
            run.emit(
                {
                    "type": "stopped" if run.stop_requested.is_set() else "done",
                    "steps": len(history.loss),
                    "probe": None if history.probe is None else history.probe.tolist(),
                    "eval_accuracy": _finite(history.eval_accuracy),
                    "eval_exact": _finite(history.eval_exact),
                }
            )
        except Exception as e:  # the thread must always end its stream
            run.emit({"type": "error", "message": f"{type(e).__name__}: {e}"})
