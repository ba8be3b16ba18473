"""FlexAttention compiled on the CPU, as a benchmark competitor (forward only).

FlexAttention (arXiv:2412.05496) skips the tiles a block mask hides, but on the CPU it needs
``torch.compile`` (seconds of compilation per mask and shape) and has no backward pass. It is
called only on inputs without ``requires_grad``: one failed backward attempt would leave the
compiled function on its slow unfused path for the rest of the process. Compilation runs
under a timer; a failure or a timeout makes it unavailable (with the reason), never a crash.
"""

import signal
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

from ._workloads import Inputs, Unavailable, Workload

COMPILE_TIMEOUT = 240.0
"""Seconds allowed for one compilation (the first call)."""

_broken: str | None = None  # a compile was interrupted: dynamo's state is not trusted afterwards


def mask_mod(w: Workload) -> Callable[..., Any] | None:
    """FlexAttention's ``mask_mod(b, h, q_idx, kv_idx)`` for workload ``w`` (None: no mask)."""
    if w.mask is None:
        return None
    if w.nq != w.nk:
        raise Unavailable("masked workloads with Nq != Nk are not expressed for FlexAttention here")
    if w.window is not None:
        size = w.window
        return lambda b, h, q, kv: (q >= kv) & (q - kv < size)
    if w.doc_ids is not None:
        import torch

        doc = torch.from_numpy(w.doc_ids)
        return lambda b, h, q, kv: (doc[q] == doc[kv]) & (q >= kv)
    if w.causal:
        return lambda b, h, q, kv: q >= kv
    raise Unavailable(f"no FlexAttention mask_mod for workload {w.name!r}")


class _Timeout(Exception):
    pass


def _with_timer(fn: Callable[[], Any], seconds: float) -> Any:
    """``fn()``, interrupted after ``seconds`` (only possible in the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return fn()

    def alarm(signum: int, frame: Any) -> None:
        raise _Timeout

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


class FlexRun:
    """The compiled call for one case; ``compile_s`` is its first (compiling) call, ``mask_s``
    the time ``create_block_mask`` took."""

    def __init__(self, fn: Callable[[], Any], compile_s: float, mask_s: float):
        self.fn, self.compile_s, self.mask_s = fn, compile_s, mask_s

    def __call__(self) -> list[Any]:
        return [self.fn()]


def build(w: Workload, x: Inputs) -> FlexRun:
    """Compile FlexAttention for ``w`` and run it once; ``Unavailable`` if it cannot."""
    global _broken
    if _broken is not None:
        raise Unavailable(_broken)
    if any(t.requires_grad for t in (x.q, x.k, x.v)):
        raise Unavailable("FlexAttention has no CPU backward: called only on inputs without requires_grad")
    try:
        import torch
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as e:
        raise Unavailable(f"FlexAttention is not in this torch: {e}") from None
    mod = mask_mod(w)
    t0 = time.perf_counter()
    block_mask = None if mod is None else create_block_mask(mod, None, None, w.nq, w.nk, device="cpu")
    mask_s = time.perf_counter() - t0
    torch._dynamo.reset()  # a fresh compile per case: comparable compile times, no recompile limit
    compiled = torch.compile(flex_attention, dynamic=False)
    gqa = w.hkv != w.h

    def call() -> Any:
        return compiled(x.q, x.k, x.v, block_mask=block_mask, enable_gqa=gqa)

    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # compiler chatter is not the benchmark's business
            _with_timer(call, COMPILE_TIMEOUT)
    except _Timeout:
        _broken = f"compilation took over {COMPILE_TIMEOUT:.0f} s (interrupted; not retried in this process)"
        raise Unavailable(_broken) from None
    except Exception as e:  # any compiler failure is a reason to report, not to crash
        raise Unavailable(f"compile failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}") from None
    return FlexRun(call, time.perf_counter() - t0, mask_s)
