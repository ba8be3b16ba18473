"""``TrainingManager``: the runs of every client, one run per client, bounded.

It holds each client's latest run and learned positional table, at most ``max_clients`` of them
and ``max_recorded_bytes`` in all; a finished run is forgotten when it has not been used for
``run_ttl_seconds``, or, least recently used first, when a bound is reached. At most one run per
client and ``max_runs`` in all go at once. It counts the event streams open on each run
(``max_streams_per_run``, ``max_streams`` in all). No FastAPI here.
"""

import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from ..schemas import LabError, Limits, TrainRequest
from .runs import Run, train_run


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
        def keep_table(table: np.ndarray) -> None:
            with self._lock:
                c = self._clients.get(run.client)
                if c is not None:
                    c.learned = table

        try:
            train_run(run, target, keep_table)
        finally:
            with self._lock:
                self._evict()  # a finished run may now be forgotten to respect the memory bound
