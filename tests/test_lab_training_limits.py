"""Training runs of a lab left running: what a run records is compact and bounded (maps as 2-byte
numbers, thinned to a budget; runs forgotten least recently used first and after a while), event
streams are bounded per run and in all, a replay leaves other requests answered, and a run stops
only when its last viewer has gone. The memory and the streams are checked against a real
``qkv lab`` in a subprocess (its RSS read from ``/proc``)."""

import http.client
import json
import math
import statistics
import threading
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("torch")

from _lab_server import lab_process, lab_server  # noqa: E402
from qkv.lab.schemas import LabError, Limits, TrainRequest  # noqa: E402
from qkv.lab.training import Frames, TrainingManager, frame_json, quantize  # noqa: E402

LIMITS = Limits()


@pytest.fixture(autouse=True)
def _torch_threads():
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)  # a training thread sets 1 for the whole process


# --------------------------------------------------------------------------- what a run keeps


def softmax_rows(rng, shape):
    x = np.exp(rng.standard_normal(shape) * 3)
    return x / x.sum(-1, keepdims=True)


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (1, 2, 6, 6), (2, 4, 16, 16), (4, 8, 64, 64)])
def test_a_recorded_map_is_sent_to_four_decimals(shape, rng):
    w = softmax_rows(rng, shape)
    w[0, 0, 0, 0] = np.nan  # a diverged run
    sent = json.loads(frame_json(quantize(list(w))), parse_constant=lambda c: pytest.fail(f"{c} in strict JSON"))
    want = np.round(w, 4).astype(object)
    want[np.isnan(w)] = None
    assert sent == want.tolist()
    assert quantize(list(w)).dtype == np.uint16 and quantize(list(w)).nbytes == 2 * w.size


def recorded(frames, n, values=72):
    for step in range(1, n + 1):
        frames.add(step, np.zeros(values, dtype=np.uint16))
    return list(frames.snapshot())


@pytest.mark.parametrize(
    ("max_frames", "max_values", "values", "n", "kept"),
    [
        (4, 1 << 20, 72, 3, [1, 2, 3]),
        (4, 1 << 20, 72, 10, [1, 5, 9, 10]),  # every 4th recorded map and the newest
        (64, 1 << 20, 72, 64, list(range(1, 65))),
        (64, 1 << 20, 72, 65, [*range(1, 65, 2), 65]),
        (64, 1 << 20, 131072, 100, [1, 17, 33, 49, 65, 81, 97, 100]),  # the largest model: 8 maps fit
        (64, 1 << 10, 131072, 5, [1, 5]),  # never fewer than the first and the newest
    ],
)
def test_a_run_keeps_every_kth_recorded_map_and_the_newest(max_frames, max_values, values, n, kept):
    assert recorded(Frames(max_frames, max_values), n, values) == kept


@pytest.mark.parametrize("n", [1, 2, 7, 100, 3000])
def test_kept_maps_stay_within_the_budget_and_evenly_spaced(n):
    frames = Frames(LIMITS.max_frames_per_run, LIMITS.max_frame_values_per_run)
    steps = recorded(frames, n, values=2 * 4 * 16 * 16)
    assert len(steps) <= LIMITS.max_frames_per_run and steps[0] == 1 and steps[-1] == n
    gaps = {b - a for a, b in zip(steps[:-1], steps[1:-1], strict=False)}
    assert len(gaps) <= 1 and all(g & (g - 1) == 0 for g in gaps)  # one stride, a power of two


def fake_train(steps=None, shape=(1, 2, 4, 4), gate=None):
    """A stand-in for ``qkv.train.train``: ``steps`` steps, maps of ``shape`` at recorded steps."""

    def target(task, n, *, callback, record_every, keep_attention, **kwargs):
        assert keep_attention is False  # the lab never lets train keep its own copy
        done = 0
        for step in range(1, (steps or n) + 1):
            if gate is not None:
                gate.wait(30)
            info = {"step": step, "loss": 1 / step, "accuracy": 0.5}
            if step % record_every == 0:
                info["attention"] = [np.full(shape[1:], 1 / shape[-1], dtype=np.float32)] * shape[0]
            done = step
            if callback(info) is False:
                break
        return SimpleNamespace(loss=[0.0] * done, model=None, probe=np.arange(5), eval_accuracy=1.0, eval_exact=1.0)

    return target


def finish(manager, client, target, **req):
    run = manager.start(client, TrainRequest(**{"steps": 10, "record_every": 1, "pos": "sinusoidal", **req}), target)
    run.thread.join(30)
    assert run.finished
    return run


def test_finished_runs_are_forgotten_least_recently_used_first():
    manager = TrainingManager(Limits(max_clients=3))
    for name in "abc":
        finish(manager, name, fake_train())
    assert manager.get("a") is not None  # a is used again: b is now the least recently used
    finish(manager, "d", fake_train())
    assert manager.clients() == ["c", "a", "d"] and manager.get("b") is None


def test_finished_runs_are_forgotten_after_their_time():
    manager = TrainingManager(Limits(run_ttl_seconds=0.3))
    finish(manager, "a", fake_train())
    assert manager.get("a") is not None
    time.sleep(0.5)
    assert manager.get("a") is None and manager.clients() == []


def test_recorded_bytes_stay_within_the_budget():
    shape = (2, 4, 32, 32)  # 16 KiB a map; 64 kept: about 1 MiB a run
    manager = TrainingManager(Limits(max_recorded_bytes=3 << 20))
    for i in range(8):
        finish(manager, f"c{i}", fake_train(shape=shape), steps=200)
        assert manager.recorded_bytes() <= 3 << 20
    assert 2 <= len(manager.clients()) <= 3 and manager.clients()[-1] == "c7"


def test_a_running_run_is_never_forgotten_and_a_full_lab_says_429():
    gate = threading.Event()
    manager = TrainingManager(Limits(max_clients=2, max_runs=3, run_ttl_seconds=1.0))
    runs = [manager.start(n, TrainRequest(steps=5, pos="sinusoidal"), fake_train(gate=gate)) for n in "ab"]
    time.sleep(1.5)  # unused for longer than their time, but running
    with pytest.raises(LabError) as refused:
        manager.start("c", TrainRequest(steps=5, pos="sinusoidal"), fake_train())
    assert refused.value.status == 429 and "max_clients=2" in refused.value.message
    assert manager.clients() == ["a", "b"]
    gate.set()
    for run in runs:
        run.thread.join(30)
    finish(manager, "c", fake_train())
    assert manager.clients() == ["c"]  # a and b, finished, were past their time


def test_a_diverged_run_records_null():
    manager = TrainingManager()

    def diverging(task, n, callback, **kwargs):
        callback({"step": 1, "loss": math.nan, "accuracy": math.inf, "attention": [np.full((1, 2, 2), np.nan)]})
        return SimpleNamespace(loss=[math.nan], model=None, probe=None, eval_accuracy=math.nan, eval_exact=0.0)

    run = finish(manager, "nan", diverging)
    summary = json.loads(run.summary_json(), parse_constant=lambda c: pytest.fail(c))
    assert summary["loss"] == [None] and summary["accuracy"] == [None]
    assert summary["attention"] == [{"step": 1, "weights": [[[[None, None], [None, None]]]]}]


# --------------------------------------------------------------------------- event streams


def parse_events(text):
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def test_a_replay_is_written_in_large_chunks():
    manager = TrainingManager()
    run = finish(manager, "replay", fake_train(shape=(2, 4, 16, 16)), steps=2000)
    chunks, index, ended = [], 0, False
    while not ended:
        text, index, ended = run.sse_chunk(index, 1 << 18)
        chunks.append(text)
    events = parse_events("".join(chunks))
    assert [e["index"] for e in events] == list(range(2003)) and events[-1]["type"] == "done"
    assert [e["step"] for e in events if e["type"] == "step"] == list(range(1, 2001))
    assert sum("attention" in e for e in events) <= LIMITS.max_frames_per_run
    assert len(chunks) <= len("".join(chunks)) // (1 << 18) + 2  # a few writes, not one per event
    assert run.sse_chunk(index, 1 << 18) == ("", index, True)  # past the end of a finished run


def test_streams_are_bounded_per_run_and_in_all():
    limits = Limits(max_streams_per_run=2, max_streams=3)
    manager = TrainingManager(limits)
    for name in "abc":
        finish(manager, name, fake_train())
    with pytest.raises(LabError) as e:
        manager.open_stream("nobody")
    assert e.value.status == 404
    releases = [manager.open_stream("a")[1], manager.open_stream("a")[1]]
    with pytest.raises(LabError) as e:
        manager.open_stream("a")
    assert e.value.status == 429 and "max_streams_per_run=2" in e.value.message
    releases.append(manager.open_stream("b")[1])
    with pytest.raises(LabError) as e:
        manager.open_stream("c")
    assert e.value.status == 429 and "max_streams=3" in e.value.message
    releases[0]()
    releases[0]()  # releasing twice counts once
    assert manager.streams() == 2
    manager.open_stream("c")
    assert manager.streams() == 3


def rss_mb(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def post(url, body, timeout=30):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as r:
        return json.load(r)


def history(url, client):
    with urllib.request.urlopen(f"{url}api/train/history?client={client}", timeout=30) as r:
        raw = r.read()
    return raw, json.loads(raw)


def wait_for(predicate, timeout, every=0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every)


LARGEST = {  # the largest model and probe the lab trains: 4 layers x 8 heads of 64 x 64 maps a step
    "task": "recall",
    "length": 16,
    "d_model": 128,
    "n_heads": 8,
    "n_layers": 4,
    "batch_size": 1,
    "record_every": 1,
    "pos": "learned",
}


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmRSS from /proc")
def test_memory_stays_bounded_over_a_long_recorded_run():
    """Every step of the largest model recorded: 128 Ki numbers a step (5-8 MB a step as Python
    lists before). The server's RSS grows by far less than one recorded map per step would, and
    the history stays a few MB."""
    steps = 120
    with lab_process() as (url, proc):
        post(url + "api/train/start?client=big", {**LARGEST, "steps": steps})
        assert wait_for(lambda: len(history(url, "big")[1]["loss"]) >= 20, 120)
        before = rss_mb(proc.pid)
        peak = before
        while True:
            raw, h = history(url, "big")
            peak = max(peak, rss_mb(proc.pid))
            if h["status"] != "running":
                break
            time.sleep(0.5)
        assert h["status"] == "done" and len(h["loss"]) == steps and h["recorded_maps"] == steps
        kept = LIMITS.max_frame_values_per_run // (4 * 8 * 64 * 64)
        assert 2 <= len(h["attention"]) <= kept and h["attention"][-1]["step"] == steps
        assert np.array(h["attention"][-1]["weights"]).shape == (4, 8, 64, 64)
        assert len(raw) < 8e6, len(raw)
        growth = peak - before
        assert growth < 100, f"RSS grew {growth:.0f} MB over {steps} recorded steps (from {before:.0f} MB)"


def timed_heatmap(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    t0 = time.monotonic()
    conn.request("POST", "/api/heatmap", body=json.dumps({"n_q": 8}), headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200 and len(json.loads(response.read())["weights"]) == 2
    conn.close()
    return time.monotonic() - t0


def test_many_streams_at_once_are_bounded_and_other_requests_still_answer():
    """100 event streams opened at once on two runs that have recorded 150 steps or more: each run
    serves ``max_streams_per_run`` of them (the rest are told 429 at once), each served stream
    replays the run from its start, and a small request meanwhile answers within 2 s of its idle
    time (measured while the same two runs train)."""
    steps = 10**8  # more than any machine trains within the test: the runs are still going when the streams open
    body = {"task": "reverse", "steps": steps, "d_model": 32, "n_heads": 4, "n_layers": 2, "batch_size": 4}
    with lab_server("--max-steps", str(steps)) as url:
        port = int(url.rstrip("/").rsplit(":", 1)[1])
        for client in ("r1", "r2"):
            post(f"{url}api/train/start?client={client}", {**body, "record_every": 1, "pos": "sinusoidal"})
        for client in ("r1", "r2"):
            assert wait_for(lambda c=client: len(history(url, c)[1]["loss"]) >= 150, 120, every=0.5)
        idle = statistics.median(timed_heatmap(port) for _ in range(5))
        conns = []
        for i in range(100):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            conn.request("GET", f"/api/train/events?client=r{1 + i % 2}")
            conns.append(conn)
        busy = timed_heatmap(port)
        answers = [conn.getresponse() for conn in conns]
        busy = max(busy, timed_heatmap(port))
        statuses = [a.status for a in answers]
        assert set(statuses) == {200, 429} and statuses.count(200) == 2 * LIMITS.max_streams_per_run, statuses
        refusal = json.loads(next(a for a in answers if a.status == 429).read())
        assert f"max_streams_per_run={LIMITS.max_streams_per_run}" in refusal["message"]
        for client in ("r1", "r2"):
            post(f"{url}api/train/stop?client={client}", {})
        for answer in (a for a in answers if a.status == 200):
            events = parse_events(answer.read().decode())
            assert [e["index"] for e in events] == list(range(len(events))) and events[-1]["type"] == "stopped"
            steps = [e["step"] for e in events if e["type"] == "step"]
            assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 150
            assert 1 <= sum("attention" in e for e in events) <= len(steps)
        for conn in conns:
            conn.close()
        assert busy < idle + 2.0, f"a small request took {busy:.2f} s with 100 streams opening (idle {idle:.3f} s)"


def open_stream(port, client):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", f"/api/train/events?client={client}")
    response = conn.getresponse()
    assert response.status == 200
    for line in response:
        if line.startswith(b"data: ") and b'"type": "step"' in line:
            return conn, response
    raise AssertionError("the stream ended before a step")


def steps_of(url, client):
    _, h = history(url, client)
    return h["status"], len(h["loss"])


def test_a_run_watched_twice_stops_only_when_its_last_viewer_leaves():
    """States, not timings: the run asks for more steps than any machine finishes within the test
    (a server started with --max-steps far above the default), so only the viewers can stop it."""
    grace, steps = LIMITS.orphan_grace_seconds, 10**8
    tiny = {"task": "copy", "steps": steps, "length": 3, "d_model": 16, "n_heads": 2, "n_layers": 1, "batch_size": 8}
    with lab_server("--max-steps", str(steps)) as url:
        port = int(url.rstrip("/").rsplit(":", 1)[1])
        post(url + "api/train/start?client=pair", tiny)
        first, second = open_stream(port, "pair"), open_stream(port, "pair")
        first[0].close()  # one viewer leaves ...
        time.sleep(grace + 1.5)
        status, done = steps_of(url, "pair")
        assert status == "running", "the run stopped while a viewer was still watching"
        assert wait_for(lambda: steps_of(url, "pair")[1] > done, 10)  # ... and it still trains
        second[0].close()  # the last one leaves: the run stops after the grace time
        t0 = time.monotonic()
        assert wait_for(lambda: steps_of(url, "pair")[0] != "running", grace + 10)
        status, done = steps_of(url, "pair")
        assert status == "stopped" and done < steps and time.monotonic() - t0 >= grace - 0.5
