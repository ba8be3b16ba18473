"""The text a run's viewers are sent, written from what it recorded when a stream asks: server-sent
events (``queued``, ``start``, one ``step`` per step, then one of ``done`` / ``stopped`` /
``error``; many events to one chunk of text) and the scrubber's summary. Events are not stored:
event ``i`` is written from a ``Recorded`` copy of the run's state."""

import json
from typing import Any, NamedTuple

import numpy as np

from .recording import frame_json, json_number


class Recorded(NamedTuple):
    """A consistent copy of what a run recorded (``Run.recorded``)."""

    head: list[dict[str, Any]]  # the events before the first step: queued, start
    n_steps: int  # steps recorded in all
    steps: list[tuple[int, float, float]]  # (step, loss, accuracy) from the asked-for event on
    end: dict[str, Any] | None  # the terminal event, once there is one
    frames: dict[int, np.ndarray]  # step -> kept attention maps


def _step_json(run_id: int, index: int, step: tuple[int, float, float], frames: dict[int, np.ndarray]) -> str:
    number, loss, accuracy = step
    text = json.dumps(
        {"index": index, "run": run_id, "type": "step", "step": number}
        | {"loss": json_number(loss), "accuracy": json_number(accuracy)}
    )
    maps = frames.get(number)
    return text if maps is None else f'{text[:-1]}, "attention": {frame_json(maps)}}}'


def sse_chunk(run_id: int, rec: Recorded, start: int, budget: int) -> tuple[str, int, bool]:
    """Server-sent events ``start``, ``start + 1``, ... as one text of about ``budget``
    characters at most (at least one event if there is one); the index after the last one
    written; whether the stream is over (the terminal event written, or ``start`` past the end
    of a finished run). ``rec`` holds the steps from event ``start`` on."""
    head, n, steps, end, frames = rec
    total, skipped = len(head) + n + (end is not None), max(0, start - len(head))
    parts: list[str] = []
    size, index = 0, start
    while index < total and (size < budget or not parts):
        if index < len(head):
            text = json.dumps(head[index])
        elif index < len(head) + n:
            text = _step_json(run_id, index, steps[index - len(head) - skipped], frames)
        else:
            text = json.dumps(end)
        parts.append(f"id: {index}\ndata: {text}\n\n")
        size += len(parts[-1])
        index += 1
    return "".join(parts), index, end is not None and index >= total


def summary_json(run_id: int, params: dict[str, Any], recorded_maps: int, rec: Recorded) -> str:
    """Everything recorded so far, as JSON text: the scrubber's data. ``rec`` holds every step."""
    _, _, steps, end, frames = rec
    summary = {
        "run": run_id,
        "status": "running" if end is None else end["type"],
        "params": params,
        "probe": None if end is None else end.get("probe"),
        "loss": [json_number(loss) for _, loss, _ in steps],
        "accuracy": [json_number(accuracy) for _, _, accuracy in steps],
        "recorded_maps": recorded_maps,
        "end": end,
    }
    maps = ", ".join(f'{{"step": {s}, "weights": {frame_json(m)}}}' for s, m in frames.items())
    return f'{json.dumps(summary)[:-1]}, "attention": [{maps}]}}'
