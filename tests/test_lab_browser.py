"""The lab end to end in a real browser: Playwright (sync API) driving Debian's Chromium against
``qkv lab`` started on a free port. Each page loads without console errors, moving a control
redraws (the drawn numbers' digest changes), training shows progress and finishes, and every
page is photographed (1280x800) into a temporary directory and, with QKV_LAB_SCREENSHOTS=DIR,
into DIR (``scripts/lab_screenshots`` regenerates docs/gallery this way).

Without /usr/bin/chromium the tests skip, unless QKV_REQUIRE_BROWSER=1 (CI), where they fail.
Never ``playwright install``: the browser is the system's.
"""

import json
import os
import re
import time
import urllib.request
from pathlib import Path

import pytest

from _lab_server import lab_server

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
VIEWPORT = {"width": 1280, "height": 800}
REQUIRED = os.environ.get("QKV_REQUIRE_BROWSER") == "1"


def _unavailable(reason):
    if REQUIRED:
        pytest.fail(f"QKV_REQUIRE_BROWSER=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        _unavailable(f"{CHROMIUM} is not installed (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright (Python) is not installed")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield b
        b.close()


ENDLESS = 10**8
"""Steps of a run that no machine finishes within a test: only closing its page can stop it."""


@pytest.fixture(scope="module")
def lab():
    with lab_server("--max-steps", str(ENDLESS)) as url:
        yield url


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    dirs = [tmp_path_factory.mktemp("lab-screenshots")]
    if os.environ.get("QKV_LAB_SCREENSHOTS"):
        dirs.append(Path(os.environ["QKV_LAB_SCREENSHOTS"]))
        dirs[-1].mkdir(parents=True, exist_ok=True)

    def shoot(page, name):
        for d in dirs:
            page.screenshot(path=str(d / f"lab-{name}.png"))
        assert (dirs[0] / f"lab-{name}.png").stat().st_size > 10_000

    return shoot


class Console:
    """Console errors and uncaught exceptions of a page; ``allowed`` patterns are expected ones."""

    def __init__(self, page):
        self.errors, self.allowed = [], []
        page.on(
            "console",
            lambda m: self.errors.append(f"console.{m.type}: {m.text}") if m.type in ("error", "warning") else None,
        )
        page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))

    def unexpected(self):
        return [e for e in self.errors if not any(re.search(p, e) for p in self.allowed)]


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport=VIEWPORT)
    pg = context.new_page()
    pg.set_default_timeout(15_000)
    pg.console = Console(pg)
    yield pg
    context.close()
    assert pg.console.unexpected() == [], "console errors"


def digest(page, selector):
    return page.get_attribute(selector, "data-digest")


def redraws(page, selector, action):
    """Run ``action`` and wait until the drawing under ``selector`` shows other numbers."""
    page.wait_for_selector(f"{selector}[data-digest]")
    before = digest(page, selector)
    action()
    page.wait_for_function(
        "([sel, old]) => document.querySelector(sel).dataset.digest !== old", arg=[selector, before], timeout=10_000
    )
    return digest(page, selector)


def set_range(page, name, value):
    page.eval_on_selector(
        f"[name={name}]",
        "(el, v) => { el.value = v; el.dispatchEvent(new Event('input', {bubbles: true})); }",
        str(value),
    )


def open_page(page, lab, name):
    page.goto(lab + name)
    page.wait_for_selector("header.top nav a.active")
    assert page.inner_text("header.top nav a.active").lower().startswith(name[:5])
    assert page.locator("header.top nav a").count() == 6


def test_explain_page(page, lab, shots):
    open_page(page, lab, "explain")
    page.wait_for_selector("#steps[data-digest]")
    import qkv

    assert page.locator(".card").count() == len(qkv.explain())  # a card per step of the trace
    assert "0.4011" in page.inner_text(".card[data-step=A]")
    assert "1.2033" in page.inner_text(".card[data-step=O]")
    assert f'would run impl="{qkv.explain().options["dispatch"]["impl"]}"' in page.inner_text("#summary")
    shots(page, "explain")
    redraws(page, "#steps", lambda: page.check("[name=causal]"))
    assert "0" in page.inner_text(".card[data-step=A]")
    redraws(page, "#steps", lambda: page.fill("[name=q]", "2 0\n0 3\n1 1"))
    assert "(3, 3)" in page.inner_text(".card[data-step=A]")
    page.console.allowed.append(r"status of 422")  # the refusal below is expected
    page.fill("[name=q]", "1 0\n0")
    page.wait_for_selector("#error.shown")
    assert "row 1 has 1" in page.inner_text("#error")


def test_heatmap_page(page, lab, shots):
    open_page(page, lab, "heatmap")
    page.wait_for_selector("#figure[data-digest]")
    shots(page, "heatmap")
    assert "causal" in page.inner_text("#summary")
    page.fill("[name=seed]", "7")
    page.wait_for_function("document.querySelector('#figure').dataset.digest !== undefined")
    redraws(page, "#figure", lambda: page.fill("[name=seed]", "3"))
    redraws(page, "#figure", lambda: set_range(page, "temperature", -0.8))
    redraws(page, "#figure", lambda: page.select_option("[name=mask]", "sliding_window"))
    redraws(page, "#figure", lambda: set_range(page, "n_q", 24))
    redraws(page, "#figure", lambda: page.select_option("[name=head]", "all"))
    assert page.locator("#figure .figure").count() == 2


def test_positional_page(page, lab, shots):
    open_page(page, lab, "positional")
    page.wait_for_selector("#figure[data-digest]")
    shots(page, "positional")
    redraws(page, "#figure", lambda: set_range(page, "base", 2))
    redraws(page, "#figure", lambda: page.select_option("[name=kind]", "rope"))
    redraws(page, "#figure", lambda: set_range(page, "d", 16))
    redraws(page, "#figure", lambda: page.select_option("[name=kind]", "alibi"))
    assert page.locator("#figure .figure").count() == 4
    redraws(page, "#figure", lambda: set_range(page, "heads", 8))
    assert page.locator("#figure .figure").count() == 8


def test_complexity_page(page, lab, shots):
    open_page(page, lab, "complexity")
    page.wait_for_selector("#charts[data-digest]")
    flops = page.get_attribute("#table", "data-flops")
    assert int(flops) > 0
    redraws(page, "#charts", lambda: page.fill("[name=n]", "1024"))
    assert page.get_attribute("#table", "data-flops") != flops
    redraws(page, "#charts", lambda: page.select_option("[name=impl]", "flash"))
    page.fill("[name=heads]", "2")
    page.click("#measure")
    page.wait_for_selector("#measured[data-seconds]", timeout=20_000)
    assert "ms per call" in page.inner_text("#measured")
    shots(page, "complexity")


def test_training_page_shows_progress_and_finishes(page, lab, shots):
    open_page(page, lab, "training")
    page.wait_for_selector("#status[data-status=idle]")
    page.select_option("[name=task]", "reverse")
    page.fill("[name=steps]", "150")
    page.click("#start")
    page.wait_for_selector("#status[data-status=running]", timeout=10_000)
    page.wait_for_function("document.querySelector('#status').textContent.includes('step')")
    page.wait_for_selector("#status[data-status=done]", timeout=40_000)
    assert "done after 150 steps" in page.inner_text("#status")
    assert page.eval_on_selector("#bar", "el => el.style.width") == "100%"
    assert page.get_attribute("#maps", "data-step") == "150"
    assert page.locator("#maps .figure").count() == 8  # 2 layers x 4 heads
    page.wait_for_timeout(200)
    shots(page, "training")
    redraws(page, "#maps", lambda: set_range_id(page, "scrub", 0))  # the scrubber replays a recorded step
    assert page.get_attribute("#maps", "data-step") == "6"
    # the trained model's learned positions, on the Positional page
    open_page(page, lab, "positional")
    page.wait_for_selector("#figure[data-digest]")
    redraws(page, "#figure", lambda: page.select_option("[name=kind]", "learned"))
    assert "trained" in page.inner_text("#figure")


def set_range_id(page, element_id, value):
    page.eval_on_selector(
        f"#{element_id}",
        "(el, v) => { el.value = v; el.dispatchEvent(new Event('input', {bubbles: true})); }",
        str(value),
    )


def test_closing_the_training_page_stops_the_run(browser, lab):
    context = browser.new_context(viewport=VIEWPORT)
    pg = context.new_page()
    pg.goto(lab + "training")
    pg.wait_for_selector("#status[data-status=idle]")
    pg.fill("[name=steps]", str(ENDLESS))
    pg.click("#start")
    pg.wait_for_function("document.querySelector('#status').textContent.includes('step 5')", timeout=20_000)
    client = next(c["value"] for c in context.cookies() if c["name"] == "qkv_lab_client")
    pg.close()
    deadline = time.monotonic() + 10
    while True:
        with urllib.request.urlopen(f"{lab}api/train/history?client={client}", timeout=5) as r:
            history = json.load(r)
        if history["status"] != "running" or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    context.close()
    assert history["status"] == "stopped" and len(history["loss"]) < ENDLESS


def test_reloading_the_training_page_keeps_the_run_going(browser, lab):
    """A run stops only when the last page watching it has been gone for a few seconds: a reload
    (which closes the page's event stream and opens another) keeps it going."""
    context = browser.new_context(viewport=VIEWPORT)
    pg = context.new_page()
    pg.set_default_timeout(15_000)
    pg.console = Console(pg)
    pg.goto(lab + "training")
    pg.wait_for_selector("#status[data-status=idle]")
    pg.fill("[name=steps]", str(ENDLESS))
    pg.click("#start")
    pg.wait_for_function("document.querySelector('#status').textContent.includes('step 5')", timeout=20_000)
    pg.reload()
    pg.wait_for_selector("#status[data-status=running]")
    client = next(c["value"] for c in context.cookies() if c["name"] == "qkv_lab_client")
    with urllib.request.urlopen(f"{lab}api/limits", timeout=5) as r:
        grace = json.load(r)["orphan_grace_seconds"]
    pg.wait_for_timeout(1000 * (grace + 1.5))
    with urllib.request.urlopen(f"{lab}api/train/history?client={client}", timeout=5) as r:
        before = json.load(r)
    assert before["status"] == "running", "the reload stopped the run"
    shown = int(re.search(r"step (\d+)", pg.inner_text("#status"))[1])
    pg.wait_for_function(f"Number(/step (\\d+)/.exec(document.querySelector('#status').textContent)[1]) > {shown}")
    pg.click("#stop")
    pg.wait_for_selector("#status[data-status=stopped]")
    assert pg.console.unexpected() == [], "console errors"
    context.close()
