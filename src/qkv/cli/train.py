"""``qkv train``: teach a TinyGPT a toy task from the command line.

Parse -> ``qkv.train.train`` -> print a summary (rich) or ``--json``; ``--save FILE.npz``
writes the loss and accuracy curves and the recorded attention maps; ``--record DIR`` draws
them (``qkv.plot``): ``attention.gif``, ``attention_grid.png``, ``curves.png`` and
``history.npz``. Every argument is checked before training; all files are written together at
the end (``all_or_nothing``), so a failure leaves none behind. torch and matplotlib are
imported only when the command runs.
"""

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from ..errors import ArgumentError
from ._common import all_or_nothing

TASK_NAMES = "copy, reverse, sort, recall"


MAX_STEPS = 1_000_000
MAX_LENGTH = 512
"""``--length`` bound: TinyGPT's context is 256 positions by default and the toy tasks use ~3x the
prompt length; longer sequences only allocate without learning anything here."""


def _save(path: Path, history: Any) -> None:
    import numpy as np

    arrays: dict[str, Any] = {
        "loss": np.asarray(history.loss),
        "accuracy": np.asarray(history.accuracy),
        "probe": np.asarray(history.probe),
        "steps": np.asarray([s.step for s in history.attention], dtype=np.int64),
    }
    for layer in range(len(history.attention[0].weights) if history.attention else 0):
        arrays[f"attention_layer{layer}"] = np.stack([s.weights[layer] for s in history.attention])  # (S, H, T, T)
    with path.open("wb") as f:
        np.savez(f, **arrays)


def train_command(
    task: Annotated[str, typer.Option("--task", help=f"the toy task: {TASK_NAMES}")] = "reverse",
    steps: Annotated[
        int | None, typer.Option("--steps", min=1, max=MAX_STEPS, help="optimiser steps (default: the task's budget)")
    ] = None,
    length: Annotated[
        int | None,
        typer.Option(
            "--length", min=1, max=MAX_LENGTH, help="prompt symbols (recall: key-value pairs); default: the task's"
        ),
    ] = None,
    pos: Annotated[str, typer.Option("--pos", help="positions: learned, sinusoidal, rope, alibi")] = "learned",
    seed: Annotated[int, typer.Option("--seed", min=0, help="seed for the data and the initialisation")] = 0,
    dtype: Annotated[
        str,
        typer.Option(
            "--dtype", help="float32, or bfloat16: forward and backward in bfloat16 (autocast), weights in float32"
        ),
    ] = "float32",
    record_every: Annotated[
        int | None,
        typer.Option("--record-every", min=1, metavar="K", help="record the probe's attention maps every K steps"),
    ] = None,
    save: Annotated[
        Path | None, typer.Option("--save", metavar="FILE", help="write curves and attention maps to FILE (.npz)")
    ] = None,
    record: Annotated[
        Path | None,
        typer.Option(
            "--record",
            metavar="DIR",
            help="write attention.gif, attention_grid.png, curves.png and history.npz to DIR "
            "(recording every K = steps // 20 steps unless --record-every)",
        ),
    ] = None,
    layer: Annotated[int, typer.Option("--layer", help="the layer drawn by --record (default: the last)")] = -1,
    json_out: Annotated[bool, typer.Option("--json", help="print the history as JSON (no progress bar)")] = False,
) -> None:
    """Train a TinyGPT on a toy task that needs attention (copy, reverse, sort, recall) and report its accuracy."""
    from ..train import train

    if record is not None:
        _check_layer(layer, train)  # before training, not after it
    if save is not None and save.suffix != ".npz":
        raise ArgumentError(f"--save writes a .npz file, got {str(save)!r}")
    if record is not None and record_every is None:
        record_every = max(1, _budget(task, steps) // 20)
    history = train(
        task, steps, length=length, pos=pos, seed=seed, record_every=record_every, progress=not json_out, dtype=dtype
    )
    if record is not None:
        record.mkdir(parents=True, exist_ok=True)
    outputs = ([save] if save is not None else []) + (_record_paths(record) if record is not None else [])
    with all_or_nothing(outputs) as temps:
        if save is not None:
            _save(temps[0], history)
        if record is not None:
            _record(temps[-4:], history, layer)
    files = [str(p) for p in _record_paths(record)] if record is not None else []
    if json_out:
        typer.echo(json.dumps(history.to_dict() | ({"files": files} if record is not None else {})))
        return
    from rich.console import Console

    Console(highlight=False, soft_wrap=True).print(
        f"{task}: {len(history.loss)} steps, final loss {history.loss[-1]:.4f}, "
        f"held-out accuracy {history.eval_accuracy:.4f} (tokens), {history.eval_exact:.4f} (whole answers)"
        + (f"; saved to {save}" if save is not None else "")
        + (f"; pictures in {record}: {', '.join(Path(f).name for f in files)}" if record is not None else "")
    )


def _check_layer(layer: int, train: Any) -> None:
    import inspect

    n_layers = inspect.signature(train).parameters["n_layers"].default  # the command trains the default size
    if not -n_layers <= layer < n_layers:
        raise ArgumentError(
            f"--layer must be in {-n_layers}..{n_layers - 1} (the model has {n_layers} layers), got {layer}"
        )


def _budget(task: str, steps: int | None) -> int:
    """The steps a run will take: ``steps`` or the task's default budget."""
    from ..train.tasks import get_task

    return steps if steps is not None else get_task(task).default_steps


def _record_paths(directory: Path) -> list[Path]:
    return [directory / name for name in ("attention.gif", "attention_grid.png", "curves.png", "history.npz")]


def _record(paths: list[Path], history: Any, layer: int) -> None:
    """Draw the run into ``paths``: GIF (a frame per recorded step), small multiples, curves, arrays."""
    from .. import plot

    plot.save_animation(history, paths[0], layer)
    plot.save(plot.attention_grid(history, layer), paths[1], "png")
    plot.save(plot.curves(history, layer), paths[2], "png")
    _save(paths[3], history)
