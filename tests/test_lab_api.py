"""The lab's JSON API through FastAPI's TestClient: every endpoint's answer checked against qkv's
own computation or an independent formula, and every kind of bad input answered 4xx with a
message naming the field, the sizes or the limit (never a 500)."""

import json
import math
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

import qkv  # noqa: E402
from _lab_server import lab_server  # noqa: E402
from oracle import alibi_slopes, attention_oracle, causal_allowed, sliding_window_allowed  # noqa: E402
from qkv.lab.app import PAGES, create_app  # noqa: E402
from qkv.masks.spec import MASK_KINDS  # noqa: E402

MAX_N = 32
ENDLESS = 10**8
"""The app's step limit here, and the steps of a run no machine finishes within a test: only a stop
(or its client leaving) ends it, however fast the machine trains."""


@pytest.fixture(scope="module")
def client():
    try:
        import torch
    except ImportError:
        torch = None
    threads = torch.get_num_threads() if torch else None
    with TestClient(create_app(max_n=MAX_N, max_steps=ENDLESS)) as c:
        yield c
    if torch:
        torch.set_num_threads(threads)  # a training thread sets 1 for the whole process: give the suite its own back


def refused(response, status=422):
    assert response.status_code == status, response.text
    body = response.json()
    assert isinstance(body["message"], str) and body["message"]
    return body["message"]


# --------------------------------------------------------------------------- pages and assets


def test_pages_share_one_stylesheet_and_load_nothing_from_the_network(client):
    r = client.get("/", follow_redirects=False)
    assert r.status_code in (302, 307) and r.headers["location"] == "/explain"
    for page in PAGES:
        r = client.get(f"/{page}")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        html = r.text
        assert f'data-page="{page}"' in html and "/static/style.css" in html and "/static/common.js" in html
        for ref in [*html.split('src="')[1:], *html.split('href="')[1:]]:
            target = ref.split('"')[0]
            assert target.startswith(("/static/", "data:")), f"{page} loads {target}"
            if target.startswith("/static/"):
                assert client.get(target).status_code == 200
    for asset in ("common.js", "style.css", *(f"{p}.js" for p in PAGES)):
        text = client.get(f"/static/{asset}").text
        assert "https://" not in text and "http://" not in text.replace("http://www.w3.org/2000/svg", "")


def test_a_page_gives_the_browser_a_client_cookie():
    with TestClient(create_app()) as c:
        c.get("/heatmap")
        assert len(c.cookies.get("qkv_lab_client", "")) >= 12


def test_limits_and_mask_kinds(client):
    limits = client.get("/api/limits").json()
    assert limits["max_n"] == MAX_N and limits["max_steps"] >= 100
    masks = client.get("/api/masks").json()
    assert masks["kinds"] == list(MASK_KINDS)
    assert masks["params"]["sliding_window"]["window"]["type"] == "int"


# --------------------------------------------------------------------------- explain


def test_explain_without_inputs_is_the_worked_example(client):
    r = client.post("/api/explain", json={})
    assert r.status_code == 200
    assert r.json() == json.loads(json.dumps(qkv.explain().to_dict()))
    out = next(s for s in r.json()["steps"] if s["name"] == "O")["value"]
    np.testing.assert_allclose(out, [[0.5989, 1.0], [0.5989, 1.2033]], atol=1e-4)


def test_explain_matches_qkv_explain_and_the_oracle(client, rng):
    q, k, v = rng.standard_normal((3, 4)), rng.standard_normal((5, 4)), rng.standard_normal((5, 2))
    body = {"q": q.tolist(), "k": k.tolist(), "v": v.tolist(), "causal": True, "scale": 0.7, "grad": True}
    r = client.post("/api/explain", json=body)
    assert r.status_code == 200, r.text
    d = r.json()
    assert d == json.loads(json.dumps(qkv.explain(q, k, v, causal=True, scale=0.7, grad=True).to_dict()))
    steps = {s["name"]: s for s in d["steps"]}
    out, weights, _ = attention_oracle(q, k, v, allowed=causal_allowed(3, 5), scale=0.7)
    np.testing.assert_allclose(steps["O"]["value"], out, rtol=1e-12)
    np.testing.assert_allclose(steps["A"]["value"], weights, rtol=1e-12)
    assert "dQ" in steps and steps["A"]["shape"] == [3, 5]


def test_explain_with_a_mask_kind(client, rng):
    q, k, v = rng.standard_normal((6, 2)), rng.standard_normal((6, 2)), rng.standard_normal((6, 3))
    r = client.post(
        "/api/explain",
        json={
            "q": q.tolist(),
            "k": k.tolist(),
            "v": v.tolist(),
            "mask": "sliding_window",
            "mask_params": {"window": 2},
        },
    )
    assert r.status_code == 200, r.text
    a = next(s for s in r.json()["steps"] if s["name"] == "A")["value"]
    _, weights, _ = attention_oracle(q, k, v, allowed=sliding_window_allowed(6, 6, 2))
    np.testing.assert_allclose(a, weights, rtol=1e-12)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"q": [[1, 2], [3]], "k": [[1, 2]], "v": [[1]]}, ["q", "row 1 has 1", "row 0 has 2"]),
        ({"q": [[1, 2]], "k": [[1, 2, 3]], "v": [[1]]}, ["ShapeError", "d_k=3", "d_k=2"]),
        ({"q": [[1, 2]], "k": [[1, 2], [3, 4]], "v": [[1]]}, ["ShapeError", "v", "(1, 1)", "(2, 2)"]),
        ({"q": [[1, "x"]], "k": [[1, 2]], "v": [[1]]}, ["q.0.1", "number"]),
        ({"q": [[1, True]], "k": [[1, 2]], "v": [[1]]}, ["q.0.1", "number"]),
        ({"q": [], "k": [[1]], "v": [[1]]}, ["q", "non-empty"]),
        ({"q": [[1.0]]}, ["missing: k, v"]),
        (
            {"q": [[0.0]] * (MAX_N + 1), "k": [[0.0]], "v": [[0.0]]},
            ["q", f"{MAX_N + 1}", f"limit of {MAX_N}", "--max-n"],
        ),
        ({"mask": "triangle"}, ["mask", "'triangle'", *MASK_KINDS]),
        ({"mask": "sliding_window", "mask_params": {"size": 3}}, ["no parameter 'size'", "window"]),
        ({"scale": -1}, ["scale", "greater than 0"]),
        ({"colour": "red"}, ["colour", "xtra"]),
    ],
)
def test_explain_refuses_malformed_input(client, body, words):
    message = refused(client.post("/api/explain", json=body))
    for word in words:
        assert word in message, (word, message)


def test_explain_refuses_nan_and_infinity(client):
    for token in ("NaN", "Infinity"):
        r = client.post(
            "/api/explain",
            content=f'{{"q": [[1, {token}]], "k": [[1, 2]], "v": [[1]]}}',
            headers={"content-type": "application/json"},
        )
        message = refused(r)
        assert "q.0.1" in message and "finite" in message


# --------------------------------------------------------------------------- heatmap


def test_heatmap_weights_are_attention_of_the_seeded_inputs(client):
    body = {"n_q": 7, "n_k": 9, "d": 5, "heads": 3, "seed": 11, "temperature": 0.5, "mask": "causal", "mask_params": {}}
    r = client.post("/api/heatmap", json=body)
    assert r.status_code == 200, r.text
    d = r.json()
    rng = np.random.default_rng(11)  # the documented inputs: q, k, v drawn in that order
    q, k, v = rng.standard_normal((3, 7, 5)), rng.standard_normal((3, 9, 5)), rng.standard_normal((3, 9, 5))
    allowed = causal_allowed(7, 9)
    _, weights, _ = attention_oracle(q, k, v, allowed=allowed, scale=1 / math.sqrt(5) / 0.5)
    np.testing.assert_allclose(d["weights"], weights, atol=1e-6)
    assert np.array(d["allowed"], dtype=bool).tolist() == allowed.tolist()
    np.testing.assert_allclose(d["row_sums"], 1.0, atol=1e-5)
    w = weights
    nats = -np.where(w > 0, w * np.log(np.where(w > 0, w, 1)), 0).sum(-1)
    np.testing.assert_allclose(d["entropy"], nats, atol=1e-5)
    np.testing.assert_allclose(d["entropy_normalised"], nats / np.log(allowed.sum(-1)), atol=1e-5)
    assert d["scale"] == pytest.approx(1 / math.sqrt(5)) and d["mask_name"]


def test_heatmap_changes_with_each_control(client):
    base = {"n_q": 6, "d": 4, "heads": 1, "seed": 0}
    first = client.post("/api/heatmap", json=base).json()["weights"]
    for change in (
        {"seed": 1},
        {"temperature": 3.0},
        {"scale": 2.0},
        {"mask": "causal"},
        {"mask": "document", "mask_params": {"doc_lengths": "2+4"}},
    ):
        assert client.post("/api/heatmap", json={**base, **change}).json()["weights"] != first, change


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"n_q": MAX_N + 1}, ["n_q", f"{MAX_N + 1}", f"limit of {MAX_N}"]),
        ({"n_q": 4, "n_k": 1000}, ["n_k", "1000", f"limit of {MAX_N}"]),
        ({"heads": 99}, ["heads", "99", "limit of 16"]),
        ({"n_q": 0}, ["n_q", "greater than or equal to 1"]),
        ({"temperature": 0}, ["temperature", "greater than 0"]),
        ({"mask": "circle"}, ["unknown mask kind 'circle'", "sliding_window", "bigbird"]),
        ({"mask": "sliding_window", "mask_params": {"window": 0}}, ["ArgumentError", "window", ">= 1"]),
        ({"mask": "padding", "mask_params": {"kv_length": 99}}, ["kv_length", "1..12"]),
    ],
)
def test_heatmap_refuses_bad_input(client, body, words):
    message = refused(client.post("/api/heatmap", json={"n_q": 12, **body}))
    for word in words:
        assert word in message, (word, message)


# --------------------------------------------------------------------------- positional


def test_positional_sinusoidal_and_rope(client):
    r = client.post("/api/positional", json={"kind": "sinusoidal", "n": 10, "d": 6, "base": 100.0}).json()
    pos, i = np.arange(10)[:, None], np.arange(0, 6, 2)
    table = np.empty((10, 6))
    table[:, 0::2], table[:, 1::2] = np.sin(pos / 100.0 ** (i / 6)), np.cos(pos / 100.0 ** (i / 6))
    np.testing.assert_allclose(r["table"], table, atol=1e-6)
    np.testing.assert_allclose(r["similarity"], table @ table.T, atol=1e-5)

    r = client.post("/api/positional", json={"kind": "rope", "n": 12, "d": 8, "base": 50.0}).json()
    angles = np.arange(12)[:, None] * 50.0 ** (-np.arange(0, 8, 2) / 8)
    np.testing.assert_allclose(r["table"], angles, atol=1e-6)
    sim = np.array(r["similarity"])
    for offset in range(-11, 12):  # q·k depends on m - n only: every diagonal is constant
        diag = np.diagonal(sim, offset)
        np.testing.assert_allclose(diag, diag[0], atol=1e-5)
    assert np.ptp(np.diagonal(sim)) < 1e-5 and np.ptp(sim) > 0.1


def test_positional_alibi_biases(client):
    r = client.post("/api/positional", json={"kind": "alibi", "n": 5, "heads": 3}).json()
    slopes = alibi_slopes(3)
    np.testing.assert_allclose(r["slopes"], slopes, rtol=1e-6)
    i, j = np.arange(5)[:, None], np.arange(5)[None, :]
    for h in range(3):
        b = np.array(r["biases"][h], dtype=object)
        assert all(x is None for x in b[j > i])  # causal: hidden
        np.testing.assert_allclose(b[j <= i].astype(float), (-slopes[h] * (i - j))[j <= i], atol=1e-6)
    sym = client.post("/api/positional", json={"kind": "alibi", "n": 5, "heads": 2, "causal": False}).json()
    np.testing.assert_allclose(sym["biases"][0], -alibi_slopes(2)[0] * np.abs(i - j), atol=1e-6)


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"kind": "rope", "d": 7}, 422, ["even", "d=7"]),
        ({"kind": "sinusoidal", "n": MAX_N + 5}, 422, [f"limit of {MAX_N}"]),
        ({"kind": "xpos"}, 422, ["kind", "'sinusoidal'", "'learned'"]),
        ({"kind": "sinusoidal", "base": 0.5}, 422, ["base", "greater than 1"]),
        ({"kind": "learned"}, 409, ["train", "pos='learned'"]),
    ],
)
def test_positional_refuses_bad_input(body, status, words):
    with TestClient(create_app(max_n=MAX_N)) as fresh:  # a new client has trained nothing
        message = refused(fresh.post("/api/positional", json=body), status)
    for word in words:
        assert word in message, (word, message)


# --------------------------------------------------------------------------- complexity


def test_complexity_is_qkv_complexity_estimate(client):
    body = {
        "n": 2048,
        "d": 32,
        "heads": 8,
        "kv_heads": 2,
        "batch": 2,
        "dtype": "float16",
        "impl": "flash",
        "mask": "sliding_window",
        "mask_params": {"window": 128},
        "backward": True,
    }
    r = client.post("/api/complexity", json=body)
    assert r.status_code == 200, r.text
    d = r.json()
    want = qkv.complexity.estimate(
        2048,
        d_k=32,
        heads=8,
        kv_heads=2,
        batch=2,
        dtype="float16",
        impl="flash",
        mask=qkv.masks.sliding_window(128),
        backward=True,
    ).to_dict()
    assert d["estimate"] == json.loads(json.dumps(want))
    ns = [p["n"] for p in d["series"]]
    assert 2048 in ns and ns == sorted(ns) and len(ns) >= 5
    dense = client.post("/api/complexity", json={"n": 512, "d": 64}).json()
    assert dense["estimate"]["flops"] == 4 * 8 * 512 * 512 * 64  # 4·B·H·N²·D, dense, Dv = Dk
    flops = [p["flops"] for p in dense["series"]]
    assert all(b == a * 4 for a, b in zip(flops, flops[1:], strict=False) if a)  # N doubles: FLOPs x4


def test_the_complexity_curve_leaves_out_sizes_the_mask_parameters_do_not_fit(client):
    # prefix=100 is valid at N=128, not at the curve's N=16..64: those points are skipped, not the request
    r = client.post("/api/complexity", json={"n": 128, "d": 16, "mask": "prefix_lm", "mask_params": {"prefix": 100}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["skipped"] == [16, 32, 64] and [p["n"] for p in body["series"]][:2] == [128, 256]
    too_big = {"n": 64, "mask": "prefix_lm", "mask_params": {"prefix": 100}}  # at the asked N: refused
    assert "prefix" in refused(client.post("/api/complexity", json=too_big))


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"n": 10**6}, ["n", "1000000", "limit of 65536"]),
        ({"dtype": "int8"}, ["dtype", "'float32'", "'bfloat16'"]),
        ({"impl": "xformers"}, ["impl", "'reference'", "'flash'"]),
        ({"heads": 8, "kv_heads": 3}, ["ShapeError", "heads=8", "kv_heads=3"]),
        ({"batch": 0}, ["batch", "greater than or equal to 1"]),
    ],
)
def test_complexity_refuses_bad_input(client, body, words):
    message = refused(client.post("/api/complexity", json=body))
    for word in words:
        assert word in message, (word, message)


def test_measure_times_small_calls_and_refuses_big_ones(client):
    r = client.post("/api/complexity/measure", json={"n": 256, "d": 32, "heads": 2, "mask": "causal"})
    assert r.status_code == 200, r.text
    d = r.json()
    assert 0 < d["seconds"] < 5 and len(d["samples"]) == 3 and d["arrays"] == "numpy"
    assert d["flops"] == d["estimate"]["flops"] == 4 * 2 * 256 * 256 * 32
    r = client.post(
        "/api/complexity/measure",
        json={"n": 64, "d": 16, "heads": 2, "impl": "torch", "dtype": "bfloat16", "backward": True},
    )
    assert r.status_code == 200, r.text
    assert r.json()["arrays"] == "torch" and r.json()["estimate"]["backward"] is True
    message = refused(client.post("/api/complexity/measure", json={"n": 16384, "heads": 32}))
    assert "N <= 4096" in message and "N=16384" in message and "FLOPs" in message


# --------------------------------------------------------------------------- training


TINY = {
    "task": "copy",
    "steps": 6,
    "length": 3,
    "d_model": 16,
    "n_heads": 2,
    "n_layers": 1,
    "batch_size": 8,
    "record_every": 2,
    "pos": "learned",
}


def events(client, name):
    out = []
    with client.stream("GET", f"/api/train/events?client={name}") as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                out.append(json.loads(line[6:]))
    return out


def test_training_streams_events_and_ends(client):
    r = client.post("/api/train/start?client=alice", json=TINY)
    assert r.status_code == 200, r.text
    seen = events(client, "alice")  # returns: the stream ends with the run
    kinds = [e["type"] for e in seen]
    assert kinds[:2] == ["queued", "start"] and kinds[-1] == "done" and kinds.count("step") == 6
    steps = [e for e in seen if e["type"] == "step"]
    assert [e["step"] for e in steps] == [1, 2, 3, 4, 5, 6]
    assert [e["step"] for e in steps if "attention" in e] == [2, 4, 6]
    maps = np.array(steps[1]["attention"])  # (layers, H, T, T) of the probe, T = 2·3 + 1 - 1
    assert maps.shape == (1, 2, 6, 6)
    np.testing.assert_allclose(maps.sum(-1), 1.0, atol=1e-3)
    assert np.allclose(np.triu(maps[0, 0], 1), 0)
    assert all(math.isfinite(e["loss"]) for e in steps) and len(seen[-1]["probe"]) == 7
    history = client.get("/api/train/history?client=alice").json()
    assert history["status"] == "done" and len(history["loss"]) == 6 and len(history["attention"]) == 3
    # the finished run's learned positional table is now on the Positional page
    r = client.post("/api/positional?client=alice", json={"kind": "learned", "n": 32})
    assert r.status_code == 200 and np.array(r.json()["table"]).shape == (7, 16)
    assert np.allclose(np.diagonal(r.json()["similarity"]), 1.0, atol=1e-5)
    assert events(client, "alice")[-1]["type"] == "done"  # a finished run replays


def test_a_bfloat16_run_trains_in_bfloat16(client, monkeypatch):
    """``dtype="bfloat16"`` reaches ``qkv.train.train``: the run's attention computes in bfloat16."""
    from qkv.nn import attention as nn_attention

    real, dtypes = nn_attention.attention, set()

    def spy(q, k, v, **kw):
        dtypes.add(q.dtype)
        return real(q, k, v, **kw)

    monkeypatch.setattr(nn_attention, "attention", spy)
    r = client.post("/api/train/start?client=dora", json={**TINY, "dtype": "bfloat16"})
    assert r.status_code == 200, r.text
    seen = events(client, "dora")
    assert seen[-1]["type"] == "done" and all(math.isfinite(e["loss"]) for e in seen if e["type"] == "step")
    assert {str(d) for d in dtypes} == {"torch.bfloat16"}


def test_second_start_is_409_and_stop_ends_the_run(client):
    r = client.post("/api/train/start?client=bob", json={**TINY, "steps": ENDLESS})  # only the stop ends it
    assert r.status_code == 200, r.text
    message = refused(client.post("/api/train/start?client=bob", json=TINY), 409)
    assert "already going" in message and "stop" in message
    t0 = time.monotonic()
    assert client.post("/api/train/stop?client=bob").status_code == 200
    seen = events(client, "bob")
    assert seen[-1]["type"] == "stopped" and seen[-1]["steps"] < ENDLESS
    assert time.monotonic() - t0 < 10
    assert client.post("/api/train/start?client=bob", json=TINY).status_code == 200  # free again
    assert events(client, "bob")[-1]["type"] == "done"


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"task": "dance"}, ["task", "'copy'", "'recall'"]),
        ({"steps": ENDLESS + 1}, ["steps", f"limit of {ENDLESS}"]),
        ({"d_model": 30, "n_heads": 4}, ["d_model=30", "n_heads=4"]),
        ({"pos": "xpos"}, ["pos", "'rope'", "'learned'"]),
        ({"dtype": "float16"}, ["dtype", "'float32'", "'bfloat16'"]),
    ],
)
def test_training_refuses_bad_input(client, body, words):
    message = refused(client.post("/api/train/start?client=carol", json={**TINY, **body}))
    for word in words:
        assert word in message, (word, message)
    assert client.get("/api/train/history?client=carol").json()["status"] == "none"
    assert refused(client.post("/api/train/stop?client=carol"), 404)


def test_the_server_answers_while_training_and_closing_the_stream_stops_the_run():
    """Against a real server (``qkv lab --port 0 --json``): other requests answer while a run trains;
    a client that goes away ends its run (which asks for more steps than any machine trains in the
    test: only the client's leaving can stop it)."""
    steps = ENDLESS
    with lab_server("--max-steps", str(steps)) as url:
        request = urllib.request.Request(
            url + "api/train/start?client=dave",
            data=json.dumps({**TINY, "steps": steps}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as r:
            assert r.status == 200
        stream = urllib.request.urlopen(url + "api/train/events?client=dave", timeout=60)  # first step: torch warms up
        for raw in stream:
            if b'"type": "step"' in raw:
                break  # the run is going and we are watching ...
        # the server stays responsive while it trains: other pages' requests answer at once
        t0 = time.monotonic()
        request = urllib.request.Request(
            url + "api/heatmap",
            data=json.dumps({"n_q": 16, "n_k": 16}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as r:
            assert r.status == 200 and len(json.load(r)["weights"][0]) == 16
        with urllib.request.urlopen(url + "api/train/history?client=dave", timeout=5) as r:
            assert json.load(r)["status"] == "running"
        assert time.monotonic() - t0 < 10.0  # a blocked event loop would not answer until the run ends
        stream.close()  # ... and now we are not
        deadline = time.monotonic() + 10
        while True:
            with urllib.request.urlopen(url + "api/train/history?client=dave", timeout=5) as r:
                history = json.load(r)
            if history["status"] != "running" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert history["status"] == "stopped" and len(history["loss"]) < steps


# --------------------------------------------------------------------------- command line


def run(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


BLOCK = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("fastapi", "uvicorn", "starlette"):
            raise ImportError(name + " is blocked in this test")
sys.meta_path.insert(0, Block())
"""


def test_lab_help_and_import_qkv_need_no_fastapi():
    p = run(BLOCK + "import qkv, qkv.cli, qkv.lab\nsys.argv = ['qkv', 'lab', '--help']\nqkv.cli.main()")
    assert p.returncode == 0, p.stderr
    assert "--port" in p.stdout and "--max-n" in p.stdout and "--open" in p.stdout
    p = run("import sys, qkv, qkv.cli\nprint([m for m in sys.modules if m.split('.')[0] in ('fastapi', 'uvicorn')])")
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stdout + p.stderr


def test_lab_without_the_extra_says_how_to_install_it():
    p = run(BLOCK + "import qkv.cli\nsys.argv = ['qkv', 'lab', '--port', '0']\nqkv.cli.main()")
    assert p.returncode == 1
    assert p.stderr.strip() == "error: the lab needs the 'lab' extra: pip install 'qkv[lab]'"


def test_lab_on_a_busy_port_fails_with_one_line():
    with lab_server() as url:
        port = url.rstrip("/").rsplit(":", 1)[1]
        p = subprocess.run(
            [sys.executable, "-m", "qkv", "lab", "--port", port], capture_output=True, text=True, timeout=60
        )
    assert p.returncode == 1
    assert f"error: cannot serve at http://127.0.0.1:{port}/" in p.stderr and "--port 0" in p.stderr


# --------------------------------------------------------------------------- found by fuzzing (schemathesis + by hand)


def strict_json(text):
    """``json.loads`` that refuses NaN / Infinity, like the browser's ``JSON.parse``."""

    def refuse(token):
        raise AssertionError(f"non-strict JSON token {token} in {text[:200]}")

    return json.loads(text, parse_constant=refuse)


def test_refusals_are_declared_in_the_openapi_schema(client):
    spec = client.get("/api/openapi.json").json()
    declared = spec["paths"]["/api/heatmap"]["post"]["responses"]["422"]["content"]["application/json"]["schema"]
    assert declared["$ref"].endswith("/Refusal")
    detail = spec["components"]["schemas"]["Refusal"]["properties"]["detail"]
    assert {"type": "string"} in detail["anyOf"]  # a handler's refusal: detail is the message itself
    assert "409" in spec["paths"]["/api/train/start"]["post"]["responses"]
    assert "404" in spec["paths"]["/api/train/stop"]["post"]["responses"]


@pytest.mark.parametrize("path", ["/api/explain", "/api/heatmap", "/api/complexity"])
@pytest.mark.parametrize(
    "mask, params",
    [
        ("bigbird", {"seed": -1}),  # NumPy's seeds are non-negative
        ("bigbird", {"block": 2**64}),  # beyond int64 index arithmetic
        ("dilated", {"dilation": 2**64}),
    ],
)
def test_mask_parameters_out_of_range_are_refused_naming_the_mask(client, path, mask, params):
    message = refused(client.post(path, json={"mask": mask, "mask_params": params}))
    assert f"mask {mask!r}" in message and next(iter(params)) in message


@pytest.mark.parametrize("path", ["/api/explain", "/api/heatmap", "/api/complexity"])
@pytest.mark.parametrize(
    "mask, params",
    [
        ("longformer", {"global_tokens": []}),  # no global tokens: the sliding window alone
        ("causal", {"offset": 10**30}),  # beyond every key: every key visible
    ],
)
def test_mask_parameters_at_the_extremes_are_answered(client, path, mask, params):
    r = client.post(path, json={"mask": mask, "mask_params": params})
    assert r.status_code == 200, r.text
    strict_json(r.text)


@pytest.mark.parametrize(
    "path, body",
    [
        ("/api/explain", {"q": [[1e308]], "k": [[1e308]], "v": [[1.0]]}),
        ("/api/explain", {"q": [[1e200]], "k": [[1e200]], "v": [[1.0]], "grad": True}),
        ("/api/heatmap", {"scale": 1e308}),
        ("/api/heatmap", {"temperature": 1e-320}),
    ],
)
def test_scores_that_overflow_are_refused_not_nan(client, path, body):
    assert "overflow" in refused(client.post(path, json=body))


def test_extreme_but_representable_numbers_are_answered_in_strict_json(client):
    for body in [
        {"q": [[1e-320]], "k": [[1e-320]], "v": [[-0.0]]},
        {"q": [[-1e308]], "k": [[1e308]], "v": [[1e308]]},
        {"q": [[1.0]], "k": [[1.0]], "v": [[1.0]], "scale": 1e308, "grad": True},
    ]:
        r = client.post("/api/explain", json=body)
        assert r.status_code == 200, r.text
        strict_json(r.text)
    r = client.post("/api/heatmap", json={"scale": 1e-320, "n_q": 1, "d": 1, "heads": 1})
    assert r.status_code == 200 and strict_json(r.text)["weights"] == [[[1.0]]]


def test_body_too_deeply_nested_is_refused_with_a_message(client):
    deep = '{"q":' + "[" * 5000 + "]" * 5000 + "}"
    refused(client.post("/api/explain", content=deep, headers={"content-type": "application/json"}), 400)


def test_complexity_with_bigbird_has_its_own_limit(client):
    limit = client.get("/api/limits").json()["max_complexity_n_bigbird"]
    t = time.perf_counter()
    message = refused(client.post("/api/complexity", json={"n": limit * 2, "mask": "bigbird"}))
    assert str(limit) in message and "bigbird" in message and time.perf_counter() - t < 1.0
    r = client.post("/api/complexity", json={"n": 64, "mask": "bigbird"})
    assert r.status_code == 200 and max(p["n"] for p in r.json()["series"]) <= limit


def _finished_run(client, name, target):
    from qkv.lab.schemas import TrainRequest

    run = client.app.state.training.start(name, TrainRequest(steps=2, pos="sinusoidal"), target=target)
    run.thread.join(10)
    assert run.finished
    return run


def test_events_past_the_end_of_a_finished_run_end_the_stream(client):
    import threading

    def broken(*args, **kwargs):
        raise RuntimeError("no training here")

    _finished_run(client, "fuzz-past-end", broken)
    answers = []
    reader = threading.Thread(
        target=lambda: answers.append(client.get("/api/train/events?client=fuzz-past-end&since=1000")), daemon=True
    )
    reader.start()
    reader.join(5)
    assert answers and answers[0].status_code == 200, "the stream of a finished run never ended"
    assert "data:" not in answers[0].text


def test_a_diverged_run_is_reported_in_strict_json(client):
    from types import SimpleNamespace

    def diverging(task, steps, callback, **kwargs):
        callback({"step": 1, "loss": float("nan"), "accuracy": 0.5, "attention": [np.full((1, 2, 2), np.nan)]})
        return SimpleNamespace(loss=[float("nan")], model=None, probe=None, eval_accuracy=float("nan"), eval_exact=0.0)

    _finished_run(client, "fuzz-nan", diverging)
    history = strict_json(client.get("/api/train/history?client=fuzz-nan").text)
    assert history["status"] == "done" and history["loss"] == [None] and history["end"]["eval_accuracy"] is None
    assert history["attention"][0]["weights"] == [[[[None, None], [None, None]]]]  # (layers, H, T, T)
    for line in client.get("/api/train/events?client=fuzz-nan").text.splitlines():
        if line.startswith("data: "):
            strict_json(line[6:])


def test_random_bodies_are_answered_200_or_422_in_strict_json(client):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    number = st.one_of(
        st.floats(allow_nan=False, allow_infinity=False),
        st.integers(-3, 40),
        st.just(1e308),
        st.just(5e-324),
        st.booleans(),
        st.text(max_size=3),
        st.none(),
    )
    matrix = st.one_of(st.lists(st.lists(number, max_size=3), max_size=3), number)
    params = st.dictionaries(
        st.sampled_from(
            ["window", "causal", "offset", "seed", "block", "global_tokens", "doc_lengths", "n_docs", "prefix", "bogus"]
        ),
        st.one_of(number, st.lists(st.integers(-2, 20), max_size=3)),
        max_size=2,
    )
    common = {
        "mask": st.one_of(st.sampled_from(MASK_KINDS), st.text(max_size=4)),
        "mask_params": params,
        "scale": number,
        "extra": number,
    }
    explain = st.fixed_dictionaries(
        {}, optional={**common, "q": matrix, "k": matrix, "v": matrix, "causal": number, "grad": number}
    )
    heatmap = st.fixed_dictionaries(
        {},
        optional={
            **common,
            "n_q": number,
            "n_k": number,
            "d": number,
            "heads": number,
            "seed": number,
            "temperature": number,
        },
    )
    body = st.one_of(st.tuples(st.just("/api/explain"), explain), st.tuples(st.just("/api/heatmap"), heatmap))

    @settings(
        max_examples=150,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(body)
    def check(case):
        path, payload = case
        r = client.post(path, content=json.dumps(payload), headers={"content-type": "application/json"})
        assert r.status_code in (200, 422), (path, payload, r.status_code, r.text[:300])
        answer = strict_json(r.text)
        assert r.status_code == 200 or answer["message"]

    check()
