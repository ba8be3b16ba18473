"""``train``: a ``TinyGPT`` learning one toy task, in a loop short enough to read.

Next-token cross-entropy on the answer tokens only; AdamW with a linear warm-up and a cosine
decay (Loshchilov & Hutter, arXiv:1711.05101, arXiv:1608.03983); gradient clipping at 1. Every
random draw comes from ``seed`` (the model's initialisation in a forked RNG, so the caller's
global torch RNG is untouched). Every ``record_every`` steps the attention maps of a fixed probe
sequence are recorded, for plots and animations. ``dtype="bfloat16"`` trains in mixed precision
(Micikevicius et al., arXiv:1710.03740): the forward, the loss and so the backward's matrix
products and attention in bfloat16 under ``torch.autocast``, the weights and AdamW's state in
float32.
"""

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import ArgumentError
from ..nn import TinyGPT
from .tasks import get_task, make_batch

DTYPES = ("float32", "bfloat16")
"""What ``train(dtype=...)`` accepts: the dtype the forward and backward compute in."""


@dataclass
class Snapshot:
    """Attention maps of the probe sequence after ``step`` optimiser steps: one ``(H, T, T)`` array per layer."""

    step: int
    weights: list[np.ndarray]


@dataclass
class History:
    """What ``train`` returns: per-step loss and accuracy, recorded attention maps, final scores, the model."""

    task: str
    loss: list[float] = field(default_factory=list)  # per step, on the training batch
    accuracy: list[float] = field(default_factory=list)  # per step: answer tokens predicted right (teacher forcing)
    attention: list[Snapshot] = field(default_factory=list)
    probe: np.ndarray | None = None  # the tokens (T,) whose attention maps are recorded
    eval_accuracy: float = float("nan")  # answer tokens right on fresh examples (teacher forcing)
    eval_exact: float = float("nan")  # sequences whose answer tokens are all right
    model: Any = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe summary (attention maps as nested lists)."""
        return {
            "task": self.task,
            "loss": self.loss,
            "accuracy": self.accuracy,
            "eval_accuracy": self.eval_accuracy,
            "eval_exact": self.eval_exact,
            "probe": None if self.probe is None else self.probe.tolist(),
            "attention": [{"step": s.step, "weights": [w.tolist() for w in s.weights]} for s in self.attention],
        }


def _predict(model: TinyGPT, tokens: Tensor, answer: Tensor) -> tuple[Tensor, Tensor]:
    """``(logits, targets)`` at the answer positions: token ``p`` is predicted at position ``p - 1``."""
    return model(tokens[:, :-1])[:, answer - 1], tokens[:, answer]


def _scores(model: TinyGPT, tokens: Tensor, answer: Tensor) -> tuple[Tensor, Tensor]:
    """``(loss, accuracy)`` of next-token prediction on the answer tokens."""
    logits, targets = _predict(model, tokens, answer)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    return loss, (logits.argmax(-1) == targets).float().mean()


@torch.no_grad()
def evaluate(model: TinyGPT, tokens: Tensor, answer: Tensor) -> tuple[float, float]:
    """``(answer tokens right, answers entirely right)`` with teacher forcing.

    An answer is entirely right under teacher forcing exactly when greedy decoding
    (``model.generate``) would write it: each step then sees the same tokens.
    """
    was_training = model.training
    model.eval()
    logits, targets = _predict(model, tokens, answer)
    right = logits.argmax(-1) == targets
    model.train(was_training)
    return float(right.float().mean()), float(right.all(dim=1).float().mean())


@torch.no_grad()
def _snapshot(model: TinyGPT, probe: Tensor, step: int) -> Snapshot:
    was_training = model.training
    model.eval()
    _, weights = model(probe[None, :-1], need_weights=True)
    model.train(was_training)
    return Snapshot(step, [w[0].float().cpu().numpy() for w in weights])


def compute(dtype: str) -> Any:
    """The context a forward runs in for ``dtype``: ``torch.autocast`` to bfloat16 (qkv's attention
    and the linear layers then run in bfloat16; their backward too), or nothing for float32."""
    if dtype not in DTYPES:
        raise ArgumentError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}")
    return torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bfloat16" else contextlib.nullcontext()


def _positive(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ArgumentError(f"{name} must be a positive integer, got {value!r}")
    return value


def train(
    task: str,
    steps: int | None = None,
    *,
    length: int | None = None,
    batch_size: int = 64,
    lr: float = 3e-3,
    d_model: int = 64,
    n_heads: int = 4,
    n_layers: int = 2,
    n_kv_heads: int | None = None,
    pos: str = "learned",
    record_every: int | None = None,
    keep_attention: bool = True,
    eval_size: int = 256,
    progress: bool = False,
    callback: Callable[[dict[str, Any]], bool | None] | None = None,
    seed: int = 0,
    dtype: str = "float32",
) -> History:
    """Train a fresh ``TinyGPT`` on ``task`` (``"copy"``, ``"reverse"``, ``"sort"``, ``"recall"``).

    ``steps`` defaults to the task's budget, ``length`` to its default size (prompt symbols; for
    recall, key–value pairs). ``record_every=k`` records the probe's attention maps at step 0,
    every ``k`` steps and at the end; ``keep_attention=False`` hands them to ``callback`` only,
    without keeping them in ``history.attention`` (a long run's memory stays flat).
    ``progress=True`` shows a rich progress bar; ``callback`` receives ``{"step", "loss",
    "accuracy"}`` after each step (plus ``"attention"`` when recorded); if it returns ``False``,
    training stops after that step and the partial history is evaluated and returned.
    ``dtype="bfloat16"`` computes the forward and backward in bfloat16 (``torch.autocast``; the
    weights and the optimiser's state stay float32), evaluation and recorded maps too. Returns a
    ``History``; ``history.model`` is the trained model (in eval mode, float32 weights).

    >>> h = train("reverse", seed=0)
    >>> h.eval_accuracy > 0.99
    True
    """
    t = get_task(task)
    steps = _positive(t.default_steps if steps is None else steps, "steps")
    n = t.default_length if length is None else _positive(length, "length")
    batch_size, eval_size = _positive(batch_size, "batch_size"), _positive(eval_size, "eval_size")
    record = None if record_every is None else _positive(record_every, "record_every")
    if not (isinstance(lr, (int, float)) and 0 < lr < math.inf):
        raise ArgumentError(f"lr must be a positive finite number, got {lr!r}")
    precision = compute(dtype)
    data = torch.Generator().manual_seed(seed)
    tokens, answer = make_batch(task, 1, n, data)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TinyGPT(
            t.vocab_size, d_model, n_heads, n_layers, max_len=tokens.shape[1], n_kv_heads=n_kv_heads, pos=pos
        )
    history = History(task, probe=tokens[0].numpy(), model=model)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    warmup = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps)))
    )
    model.train()
    if record is not None and keep_attention:
        with precision:
            history.attention.append(_snapshot(model, tokens[0], 0))
    bar = _progress(progress, task, steps)
    try:
        for step in range(1, steps + 1):
            batch, _ = make_batch(task, batch_size, n, data)
            with precision:
                loss, acc = _scores(model, batch, answer)
            opt.zero_grad(set_to_none=True)
            loss.backward()  # outside autocast, as PyTorch's recipe says: each op's backward in its forward's dtype
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            history.loss.append(float(loss.detach()))
            history.accuracy.append(float(acc.detach()))
            info: dict[str, Any] = {"step": step, "loss": history.loss[-1], "accuracy": history.accuracy[-1]}
            if record is not None and (step % record == 0 or step == steps):
                with precision:
                    snapshot = _snapshot(model, tokens[0], step)
                if keep_attention:
                    history.attention.append(snapshot)
                info["attention"] = snapshot.weights
            stop = callback is not None and callback(info) is False
            bar.update(info)
            if stop:
                break
    finally:
        bar.close()
    model.eval()
    held_out, _ = make_batch(task, eval_size, n, data)
    with precision:
        history.eval_accuracy, history.eval_exact = evaluate(model, held_out, answer)
    return history


class _Bar:
    """A rich progress bar (imported only when asked for), or nothing."""

    def __init__(self, progress: Any = None, task_id: Any = None) -> None:
        self.progress, self.task_id = progress, task_id

    def update(self, info: dict[str, Any]) -> None:
        if self.progress is not None:
            self.progress.update(self.task_id, advance=1, loss=info["loss"], acc=info["accuracy"])

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


def _progress(enabled: bool, name: str, total: int) -> _Bar:
    if not enabled:
        return _Bar()
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    p = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.3f}  acc {task.fields[acc]:.3f}"),
        TimeElapsedColumn(),
    )
    p.start()
    return _Bar(p, p.add_task(name, total=total, loss=float("nan"), acc=0.0))
