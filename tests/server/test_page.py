"""The page ``verispec serve`` answers a browser with, in a real browser: Debian's Chromium (``apt-get install
chromium``; ``bash scripts/install.sh test``) driven by Playwright for Python, against the default real pair served
by one server for the module. Skipped, with the reason, where Chromium, Playwright or the pair is missing.

``VERISPEC_PAGE_SCREENSHOTS=DIR`` saves a screenshot of each view there (the README's figure is one of them)."""

from __future__ import annotations

import json
import os
import re
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("uvicorn")
playwright = pytest.importorskip("playwright.sync_api", reason="playwright not installed: pip install playwright")

CHROMIUM = os.environ.get("VERISPEC_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
PROMPT = "Complete the function:\ndef add(a, b):\n    \"\"\"Return a + b.\"\"\""
MAX_TOKENS = 16
TIMEOUT_MS = 120_000
SHOTS = os.environ.get("VERISPEC_PAGE_SCREENSHOTS")

pytestmark = [pytest.mark.real, pytest.mark.slow]


@pytest.fixture(scope="module")
def server():
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install -y chromium (bash scripts/install.sh test)")
    from verispec import models
    from verispec.api import load_engine
    from verispec.server import create_app
    from verispec.server.background import BackgroundServer
    from verispec.testing import skip_unless_real_pair

    skip_unless_real_pair()
    engine = load_engine(cache=False)
    with BackgroundServer(create_app(engine, model_name=models.DEFAULT_TARGET), timeout_s=60) as srv:
        srv.model = models.DEFAULT_TARGET
        yield srv


@pytest.fixture(scope="module")
def browser(server):
    with playwright.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def open_page(browser, server):
    """A fresh page at ``/`` with its script ready, and the list its script errors go to."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.goto(server.url + "/")
    pg.wait_for_selector("body[data-ready]")
    return context, pg, errors


@pytest.fixture()
def page(browser, server):
    context, pg, errors = open_page(browser, server)
    yield pg
    context.close()
    assert not errors, f"the page's script raised: {errors}"


@pytest.fixture(scope="module")
def greedy_page(browser, server):
    """One greedy generation on the page, shared by the tests that read it."""
    context, pg, errors = open_page(browser, server)
    fill_greedy(pg)
    state = run(pg)
    yield pg, state
    context.close()
    assert not errors, f"the page's script raised: {errors}"


@pytest.fixture(scope="module")
def greedy_api(server) -> dict:
    """The API's greedy answer to the same request, with its token details."""
    status, body = api(server, {"model": server.model, "messages": [{"role": "user", "content": PROMPT}],
                                "max_tokens": MAX_TOKENS, "temperature": 0, "verification": {"token_details": 8}})
    assert status == 200
    return body


def api(server, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(server.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_MS / 1000) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def fill_greedy(pg) -> None:
    pg.fill("#prompt", PROMPT)
    pg.fill('[data-field="temperature"]', "0")
    pg.fill('[data-field="max_tokens"]', str(MAX_TOKENS))


def run(pg) -> str:
    pg.click("#generate")
    pg.wait_for_selector('body[data-state="done"], body[data-state="error"]', timeout=TIMEOUT_MS)
    return pg.get_attribute("body", "data-state")


def shot(pg, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        pg.screenshot(path=str(Path(SHOTS) / name), full_page=True)


def test_controls_are_there_before_any_script(browser, server):
    context = browser.new_context(java_script_enabled=False)
    pg = context.new_page()
    pg.goto(server.url + "/")
    select = pg.get_by_label("Rule").first
    assert select.is_visible() and "lenience" in select.inner_text()
    assert pg.locator('[data-field="temperature"]').is_visible()
    assert pg.get_by_role("button", name="Generate").is_visible()
    context.close()


def test_greedy_page_text_equals_the_api_and_tokens_carry_marks(greedy_page, greedy_api):
    page, state = greedy_page
    assert state == "done", page.inner_text("#error")
    shown = page.locator(".run .tokens").first.text_content()
    assert shown and shown == greedy_api["choices"][0]["message"]["content"]
    marks = page.locator(".run .tok[data-mark]").evaluate_all("els => els.map(e => e.dataset.mark)")
    assert marks == [d["mark"] for d in greedy_api["choices"][0]["token_details"]] or \
        len(marks) == greedy_api["usage"]["completion_tokens"]  # with gamma auto the rounds may differ
    assert set(marks) <= {"accepted", "correction", "bonus"}
    stats = page.locator(".run .stats").first.inner_text()
    assert re.search(r"block efficiency \d+\.\d\d", stats) and re.search(r"[1-9]\d* rounds", stats)


def test_clicking_a_token_shows_its_distributions(greedy_page, greedy_api):
    page, state = greedy_page
    assert state == "done", page.inner_text("#error")
    index = page.locator(".run .tok[data-index]").evaluate_all(
        "els => els.findIndex((e, i) => i > 0 && e.textContent.trim() !== '')")
    assert index > 0
    page.locator(f'.run .tok[data-index="{index}"]').first.click()
    detail = page.locator("#detail")
    assert detail.is_visible()
    assert detail.locator("svg rect.bar-p").count() >= 2 and detail.locator("svg rect.bar-law").count() >= 2
    entry = greedy_api["choices"][0]["token_details"][index]
    # at temperature 0 p is the untempered target, which depends on the tokens before only, not on the rounds
    assert detail.locator("dd").first.inner_text().strip() != ""
    assert float(detail.locator('[data-fact="tv"]').inner_text()) == pytest.approx(entry["tv"], abs=2e-4)
    shot(page, "page_token.png")


def test_side_by_side_two_rules_aligned(page):
    fill_greedy(page)
    page.fill('[data-field="max_tokens"]', str(MAX_TOKENS // 2))  # two answers: half as long each
    page.check("#compare")
    page.select_option("#rule-b", "lenience")
    page.fill("#param-b-lenience-l", "0.5")
    assert run(page) == "done", page.inner_text("#error")
    runs = page.locator(".run")
    assert runs.count() == 2
    for i in range(2):
        assert "block efficiency" in runs.nth(i).locator(".stats").inner_text()
    assert "lenience (l=0.5)" in runs.nth(1).inner_text()
    pairs = page.locator(".aligned .pair")
    n = max(runs.nth(i).locator(".tok[data-index]").count() for i in range(2))
    assert pairs.count() == n and pairs.first.locator(".tok").count() == 2
    shot(page, "page_side_by_side.png")


def test_a_bad_parameter_shows_the_servers_error(page, server):
    fill_greedy(page)
    page.select_option("#rule-a", "lenience")
    page.fill("#param-a-lenience-l", "2")
    assert run(page) == "error"
    status, body = api(server, {"model": server.model, "messages": [{"role": "user", "content": PROMPT}],
                                "verification": {"rule": "lenience", "params": {"l": 2}}})
    assert status == 400
    assert body["error"]["message"] in page.inner_text("#error")
    shot(page, "page_error.png")
