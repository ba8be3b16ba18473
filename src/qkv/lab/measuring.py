"""The Complexity page's measurements, timed in a child process that is replaced every ``CALLS`` measurements.

Why a child: a measured call can leave native memory behind that no Python object holds. On CPU,
torch's bfloat16 backward through ``scaled_dot_product_attention`` (oneDNN underneath; torch
2.13) keeps about 4 MB for every new ``(H, N, D)`` shape and never returns it, and the page
sends a new shape with every change of a slider: in the server's own process that was
hundreds of MB after a few hundred measurements (``tests/test_lab_load.py``). A process that
is replaced bounds whatever any measured implementation keeps, ours included, without
changing what is timed (disabling oneDNN stops the growth but makes that backward 4x slower).

The child is ``python -m qkv.lab.measuring``: one JSON line in (the call), one JSON line out
(the timing, or the refusal), until its input closes (it also ends when the server does). It is
started by the first measurement and replaced after ``CALLS``; starting one costs about a second
(two with torch), so ``CALLS`` keeps that a small share of the measurements and the child's
growth to at most ``CALLS`` shapes. One measurement at a time (a lock: two cores are shared with
the page and a possible training run).
"""

import atexit
import json
import subprocess
import sys
import threading
from typing import Any

import numpy as np

CALLS = 16
"""Measurements one child makes before it is replaced (the bound on what it can have kept)."""


class MeasureFailed(Exception):
    """The child refused the call (``refused``: a ``qkv`` error's message) or ended without answering."""

    def __init__(self, message: str, refused: bool) -> None:
        super().__init__(message)
        self.message, self.refused = message, refused


def _inputs(shapes: list[list[int]], dtype: str, torch_inputs: bool) -> list[Any]:
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(tuple(s), dtype=np.float32) for s in shapes]
    if torch_inputs:
        import torch

        return [torch.from_numpy(x).to(getattr(torch, dtype)) for x in xs]
    return [x.astype(dtype, copy=False) for x in xs]


def timed_call(call: dict[str, Any]) -> dict[str, Any]:
    """``qkv.attention`` on random inputs of ``call["shapes"]`` (q, k, v), forward or forward +
    backward, timed by ``qkv.bench.measure``: ``{"median", "iqr", "samples"}`` in seconds."""
    import qkv

    from ..bench import measure
    from ..masks.spec import build_mask

    q, k, v = _inputs(call["shapes"], call["dtype"], call["torch"])
    n, n_k = call["shapes"][0][-2], call["shapes"][1][-2]
    mask = build_mask(call["mask"], n, n_k, **call["mask_params"])
    if call["backward"]:
        for x in (q, k, v):
            x.requires_grad_(True)

    def run() -> None:
        out = qkv.attention(q, k, v, mask=mask, impl=call["impl"])
        if call["backward"]:
            out.sum().backward()

    t = measure(run, warmup=1, repeats=3)
    return {"median": t.median, "iqr": t.iqr, "samples": list(t.samples)}


def serve() -> None:
    """The child's loop: a call per input line, its answer per output line."""
    from ..errors import QKVError

    for line in sys.stdin:
        try:
            answer = timed_call(json.loads(line))
        except QKVError as e:  # the caller's call, refused by qkv: a 422, not a dead child
            answer = {"refused": f"{type(e).__name__}: {e}"}
        print(json.dumps(answer), flush=True)


class _Child:
    def __init__(self) -> None:
        self.calls = 0
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "qkv.lab.measuring"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def ask(self, call: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(call) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except OSError:
            line = ""
        if not line:
            raise MeasureFailed("the measuring process ended before it answered (killed, or out of memory)", False)
        answer: dict[str, Any] = json.loads(line)
        if "refused" in answer:
            raise MeasureFailed(answer["refused"], True)
        return answer

    def close(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()  # the child reads the end of its input and exits
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_lock = threading.Lock()
_child: _Child | None = None


def in_child(call: dict[str, Any]) -> dict[str, Any]:
    """``timed_call(call)`` in the current child (a new one if ``CALLS`` were made or it ended);
    ``MeasureFailed`` if it refused the call or ended without an answer."""
    global _child
    with _lock:
        if _child is not None and (_child.calls >= CALLS or _child.proc.poll() is not None):
            _child.close()  # the child exits, and with it whatever the calls left behind
            _child = None
        if _child is None:
            _child = _Child()
        return _child.ask(call)


@atexit.register
def _close() -> None:
    global _child
    with _lock:
        if _child is not None:
            _child.close()
            _child = None


if __name__ == "__main__":
    serve()
