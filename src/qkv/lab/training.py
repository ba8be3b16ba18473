"""Training runs of the lab: ``qkv.train.train`` in a background thread, one run per client.

A ``Run`` keeps what it records compactly: loss and accuracy per step as ``array('d')``, and the
probe's attention maps (every layer and head) as ``uint16`` arrays in units of 10⁻⁴ (the four
decimals the browser was always sent; ``NONFINITE`` marks a diverged run's NaN), at most
``Limits.max_frames_per_run`` of them and ``Limits.max_frame_values_per_run`` numbers in all:
when a run records more, it keeps every k-th recorded map (k doubling as needed) and always the
newest. Its events (``queued``, ``start``, one ``step`` per step, then one of ``done`` /
``stopped`` / ``error``) are not stored: event ``i`` is written from that state when a stream
asks for it, many events to one chunk of text.

``TrainingManager`` holds each client's latest run and learned positional table, at most
``max_clients`` of them and ``max_recorded_bytes`` in all; a finished run is forgotten when it has
not been used for ``run_ttl_seconds``, or, least recently used first, when a bound is reached. It
counts the event streams open on each run (``max_streams_per_run``, ``max_streams`` in all) and
stops a run ``orphan_grace_seconds`` after its last viewer left (a reload keeps it going).

Stopping sets an event that the training callback reads after every step (it returns False,
and ``train`` stops). The thread sets ``torch.set_num_threads(1)`` so that the server's own
threads keep a core. No FastAPI here.
"""

import itertools
import json
import math
import threading
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .schemas import LabError, Limits, TrainRequest

TERMINAL = ("done", "stopped", "error")
UNIT = 10_000  # a recorded weight is stored as round(w * UNIT): the four decimals sent to the browser
NONFINITE = np.iinfo(np.uint16).max  # a NaN or ±inf weight (a diverged run), sent as null
_CELL = np.full(NONFINITE + 1, "null", dtype=object)  # the JSON text of every stored value
_CELL[: UNIT + 1] = [json.dumps(round(k / UNIT, 4)) for k in range(UNIT + 1)]


def quantize(weights: Sequence[np.ndarray]) -> np.ndarray:
    """One recorded frame, ``(layers, H, T, T)`` ``uint16`` from the per-layer ``(H, T, T)`` maps."""
    w = np.stack([np.asarray(x, dtype=np.float64) for x in weights])
    finite = np.isfinite(w)
    q = np.rint(np.clip(np.where(finite, w, 0.0), 0.0, 1.0) * UNIT).astype(np.uint16)
    q[~finite] = NONFINITE
    return q


def frame_json(q: np.ndarray) -> str:
    """A stored frame as nested JSON lists (strict JSON: ``null`` for non-finite weights)."""
    items: list[str] = list(_CELL[q.ravel()])
    for size in reversed(q.shape):  # join the innermost axis first
        items = ["[" + ",".join(items[i : i + size]) + "]" for i in range(0, len(items), size)]
    return items[0]


def _number(x: float) -> float | None:
    return None if math.isnan(x) else x


def _finite(x: Any) -> float:
    """A loss or an accuracy; NaN when a diverged run made it NaN or ±inf (sent as ``null``)."""
    return float(x) if x is not None and np.isfinite(x) else math.nan


class Frames:
    """The attention maps a run keeps: every ``stride``-th recorded one (``stride`` doubles when
    more than ``cap`` would be kept) and the newest."""

    def __init__(self, max_frames: int, max_values: int) -> None:
        self.max_frames, self.max_values = max(2, max_frames), max_values
        self.recorded, self.stride = 0, 1
        self.kept: dict[int, tuple[int, np.ndarray]] = {}  # step -> (recorded index, maps)
        self.newest: tuple[int, np.ndarray] | None = None  # (step, maps)

    def add(self, step: int, maps: np.ndarray) -> None:
        n, self.recorded = self.recorded, self.recorded + 1
        self.newest = (step, maps)
        if n % self.stride == 0:
            self.kept[step] = (n, maps)
        cap = max(2, min(self.max_frames, self.max_values // max(1, maps.size)))
        while len(self.kept) + (step not in self.kept) > cap:  # the first recorded map always stays
            self.stride *= 2
            self.kept = {s: (i, m) for s, (i, m) in self.kept.items() if i % self.stride == 0}

    def snapshot(self) -> dict[int, np.ndarray]:
        """``{step: maps}`` of every kept frame, in step order."""
        out = {s: m for s, (_, m) in self.kept.items()}
        if self.newest is not None:
            out[self.newest[0]] = self.newest[1]
        return dict(sorted(out.items()))

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m in self.snapshot().values())


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

    def _state(self, first: int = 0) -> tuple[list[dict[str, Any]], int, list[tuple[int, float, float]], Any, Any]:
        """A consistent copy (under the lock) of the head events, the number of steps, the steps from
        event index ``first`` on, the end and the kept maps."""
        with self._lock:
            a = max(0, first - len(self._head))
            steps = list(zip(self._steps[a:], self._loss[a:], self._accuracy[a:], strict=True))
            return list(self._head), len(self._steps), steps, self._end, self._frames.snapshot()

    def _step_json(self, index: int, step: tuple[int, float, float], frames: dict[int, np.ndarray]) -> str:
        number, loss, accuracy = step
        text = json.dumps(
            {"index": index, "run": self.id, "type": "step", "step": number}
            | {"loss": _number(loss), "accuracy": _number(accuracy)}
        )
        maps = frames.get(number)
        return text if maps is None else f'{text[:-1]}, "attention": {frame_json(maps)}}}'

    def sse_chunk(self, start: int, budget: int = 1 << 18) -> tuple[str, int, bool]:
        """Server-sent events ``start``, ``start + 1``, ... as one text of about ``budget``
        characters at most (at least one event if there is one); the index after the last one
        written; whether the stream is over (the terminal event written, or ``start`` past the end
        of a finished run)."""
        head, n, steps, end, frames = self._state(start)
        total, skipped = len(head) + n + (end is not None), max(0, start - len(head))
        parts: list[str] = []
        size, index = 0, start
        while index < total and (size < budget or not parts):
            if index < len(head):
                text = json.dumps(head[index])
            elif index < len(head) + n:
                text = self._step_json(index, steps[index - len(head) - skipped], frames)
            else:
                text = json.dumps(end)
            parts.append(f"id: {index}\ndata: {text}\n\n")
            size += len(parts[-1])
            index += 1
        return "".join(parts), index, end is not None and index >= total

    def summary_json(self) -> str:
        """Everything recorded so far, as JSON text: the scrubber's data."""
        _, _, steps, end, frames = self._state()
        summary = {
            "run": self.id,
            "status": "running" if end is None else end["type"],
            "params": self.req.model_dump(),
            "probe": None if end is None else end.get("probe"),
            "loss": [_number(loss) for _, loss, _ in steps],
            "accuracy": [_number(accuracy) for _, _, accuracy in steps],
            "recorded_maps": self._frames.recorded,
            "end": end,
        }
        maps = ", ".join(f'{{"step": {s}, "weights": {frame_json(m)}}}' for s, m in frames.items())
        return f'{json.dumps(summary)[:-1]}, "attention": [{maps}]}}'


class _Client:
    """What the lab remembers of one client: its latest run and its last learned positional table."""

    def __init__(self) -> None:
        self.run: Run | None = None
        self.learned: np.ndarray | None = None
        self.used = time.monotonic()

    @property
    def busy(self) -> bool:
        return self.run is not None and not self.run.finished

    @property
    def nbytes(self) -> int:
        return (0 if self.run is None else self.run.nbytes) + (0 if self.learned is None else self.learned.nbytes)


class TrainingManager:
    """The runs of every client: at most one running per client and ``max_runs`` in all, the
    memory and the event streams bounded by ``limits``."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self._clients: OrderedDict[str, _Client] = OrderedDict()  # least recently used first
        self._streams = 0
        self._lock = threading.Lock()
        self._ids = itertools.count(1)

    # ----------------------------------------------------------------- lookups

    def _touch(self, client: str) -> _Client | None:
        c = self._clients.get(client)
        if c is not None:
            c.used = time.monotonic()
            self._clients.move_to_end(client)
        return c

    def get(self, client: str) -> Run | None:
        with self._lock:
            self._evict()
            c = self._touch(client)
            return None if c is None else c.run

    def learned_table(self, client: str) -> np.ndarray | None:
        with self._lock:
            c = self._touch(client)
            return None if c is None else c.learned

    def recorded_bytes(self) -> int:
        with self._lock:
            return sum(c.nbytes for c in self._clients.values())

    def clients(self) -> list[str]:
        with self._lock:
            return list(self._clients)

    def _evict(self, room: int = 0) -> None:
        """Forget finished runs: unused for ``run_ttl_seconds``, then least recently used first while
        more than ``max_clients - room`` clients or ``max_recorded_bytes`` are held. Running runs stay."""
        lim, now = self.limits, time.monotonic()
        for name, c in list(self._clients.items()):
            if not c.busy and now - c.used > lim.run_ttl_seconds:
                del self._clients[name]
        total = sum(c.nbytes for c in self._clients.values())
        for name, c in list(self._clients.items()):
            if len(self._clients) <= lim.max_clients - room and total <= lim.max_recorded_bytes:
                break
            if not c.busy:
                total -= c.nbytes
                del self._clients[name]

    # ----------------------------------------------------------------- runs

    def start(self, client: str, req: TrainRequest, target: Callable[..., Any] | None = None) -> Run:
        """Check the request (sizes, the model it builds) and start its thread; ``LabError`` 409 when
        this client already has a run going or the lab is at ``max_runs``."""
        lim = self.limits
        if req.steps > lim.max_steps:
            raise LabError(f"steps is {req.steps}, above the lab's limit of {lim.max_steps}")
        if req.d_model % req.n_heads:
            raise LabError(f"d_model={req.d_model} must be a multiple of n_heads={req.n_heads}")
        if req.pos == "rope" and (req.d_model // req.n_heads) % 2:
            raise LabError(f"RoPE needs an even head size, got d_model / n_heads = {req.d_model // req.n_heads}")
        with self._lock:
            current = self._clients.get(client)
            if current is not None and current.busy:
                raise LabError(
                    f"a training run ({current.run.id}) is already going for this client; stop it first "  # type: ignore[union-attr]
                    "(POST /api/train/stop) or wait for it to finish",
                    status=409,
                )
            busy = sum(c.busy for c in self._clients.values())
            if busy >= lim.max_runs:
                raise LabError(
                    f"the lab is already running {busy} trainings (its limit); try again when one finishes", status=409
                )
            if current is None:
                self._evict(room=1)
                if len(self._clients) >= lim.max_clients:
                    raise LabError(
                        f"the lab holds the runs of {len(self._clients)} clients, its limit of "
                        f"max_clients={lim.max_clients}, and none can be forgotten yet; try again later",
                        status=429,
                    )
                current = self._clients[client] = _Client()
            self._touch(client)
            run = current.run = Run(next(self._ids), client, req, lim)
            run.emit({"type": "queued", "params": req.model_dump()})
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
            runs = [c.run for c in self._clients.values() if c.run is not None]
        for run in runs:
            run.stop()
        for run in runs:
            if run.thread is not None:
                run.thread.join(timeout)

    # ----------------------------------------------------------------- event streams

    def open_stream(self, client: str) -> tuple[Run, Callable[[], None]]:
        """The client's latest run, with one more viewer, and the function that ends the viewing
        (call it once the stream is over). ``LabError`` 404 without a run, 429 over a stream limit."""
        lim = self.limits
        with self._lock:
            c = self._touch(client)
            run = None if c is None else c.run
            if run is None:
                raise LabError("this client has no training run yet: POST /api/train/start", status=404)
            if run.viewers >= lim.max_streams_per_run:
                raise LabError(
                    f"run {run.id} already has {run.viewers} event streams open, the limit of "
                    f"max_streams_per_run={lim.max_streams_per_run}; close one first",
                    status=429,
                )
            if self._streams >= lim.max_streams:
                raise LabError(
                    f"the lab already has {self._streams} event streams open, the limit of "
                    f"max_streams={lim.max_streams}; close one first",
                    status=429,
                )
            self._streams += 1
            run.attach()
        released = threading.Event()

        def release() -> None:
            if released.is_set():
                return
            released.set()
            with self._lock:
                self._streams -= 1
            run.detach()

        return run, release

    def streams(self) -> int:
        with self._lock:
            return self._streams

    # ----------------------------------------------------------------- the training thread

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
                run.add_step(info["step"], _finite(info["loss"]), _finite(info["accuracy"]), info.get("attention"))
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
            )
            model = history.model
            if req.pos == "learned" and model is not None:
                table = model.pe.weight.detach().double().numpy().copy()
                with self._lock:
                    c = self._clients.get(run.client)
                    if c is not None:
                        c.learned = table
            run.emit(
                {
                    "type": "stopped" if run.stop_requested.is_set() else "done",
                    "steps": len(history.loss),
                    "probe": None if history.probe is None else history.probe.tolist(),
                    "eval_accuracy": _number(_finite(history.eval_accuracy)),
                    "eval_exact": _number(_finite(history.eval_exact)),
                }
            )
        except Exception as e:  # the thread must always end its stream
            run.emit({"type": "error", "message": f"{type(e).__name__}: {e}"})
        finally:
            with self._lock:
                self._evict()  # a finished run may now be forgotten to respect the memory bound
