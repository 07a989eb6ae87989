"""The page `verispec serve` answers at `/`, measured against its own API, and the engine with and without the
per-token analysis (``verification.token_details``). Not a test: numbers for docs/results/page.md.

1. First token: the page (Debian's Chromium driven by Playwright; the time from the request leaving the page's
   script to the first token drawn in the page) against the API for the same request (a streamed chat request
   over HTTP from Python: the time to the first chunk with text), with and without ``token_details``, alternated.
2. The engine: greedy generation with ``token_details`` off and on (tokens per second, alternated), and what the
   feature adds to a round when it is off: the two checks ``row.details is not None`` per row and round, timed
   and set against the measured round time.
3. ``--screenshots DIR``: one screenshot of each view (a token's distributions, two rules side by side, an error);
   ``--screenshots-only``: only them.

    python3 benchmarks/page.py --repeats 3 --out docs/results/page.md
    python3 benchmarks/page.py --screenshots docs/figures --screenshots-only
"""

from __future__ import annotations

import argparse
import http.client
import json
import platform
import statistics
import subprocess
import time
import timeit
from pathlib import Path

from playwright.sync_api import sync_playwright

from verispec import models
from verispec.api import load_engine
from verispec.core.sampling import SamplingConfig
from verispec.runtime.scheduler import Scheduler
from verispec.runtime.types import Request
from verispec.server import create_app
from verispec.server.background import BackgroundServer

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
PROMPT = "Write a Python function that checks whether a number is prime."
CODE_PROMPT = ("Add type hints to this function and return the whole function:\n\ndef mean(xs):\n    total = 0\n"
               "    for x in xs:\n        total += x\n    return total / len(xs)\n")


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        name = next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), "?")
        flags = next((ln.split(":", 1)[1] for ln in out.splitlines() if ln.startswith("Flags")), "")
        ext = [f for f in ("avx2", "avx512f", "amx_tile") if f in flags.split()]
        cores = next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("CPU(s)")), "?")
        return f"{name}, {cores} cores, {'/'.join(ext) or 'no AVX2'}"
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor() or "unknown CPU"


def api_ttft(url: str, body: dict) -> float:
    """Seconds from sending a streamed request to the first chunk with text; the rest of the stream is read."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    first, buf = None, b""
    while True:
        chunk = resp.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            if first is None and event.startswith(b"data: {"):
                choices = json.loads(event[6:]).get("choices") or []
                if any((c.get("delta") or {}).get("content") for c in choices):
                    first = time.perf_counter() - t0
    conn.close()
    assert first is not None, "no text streamed"
    return first


def page_ttft(page, max_tokens: int) -> float:
    page.fill("#prompt", PROMPT)
    page.fill('[data-field="temperature"]', "0")
    page.fill('[data-field="max_tokens"]', str(max_tokens))
    page.evaluate("delete document.body.dataset.firstTokenMs")
    page.click("#generate")
    page.wait_for_selector('body[data-state="done"]', timeout=600_000)
    return float(page.get_attribute("body", "data-first-token-ms")) / 1000


def first_token(srv, browser, repeats: int, max_tokens: int) -> dict[str, list[float]]:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(srv.url + "/")
    page.wait_for_selector("body[data-ready]")
    base = {"model": models.DEFAULT_TARGET, "messages": [{"role": "user", "content": PROMPT}], "stream": True,
            "max_tokens": max_tokens, "temperature": 0, "speculative": {"gamma": "auto"}}
    detailed = {**base, "verification": {"rule": "lossless", "verifier": "token", "token_details": 8}}
    out: dict[str, list[float]] = {"page": [], "api_same_request": [], "api_plain": []}
    api_ttft(srv.url, base)  # warm-up
    for i in range(repeats):
        order = ["page", "api_same_request", "api_plain"]
        for kind in order if i % 2 == 0 else order[::-1]:
            if kind == "page":
                out[kind].append(page_ttft(page, max_tokens))
            else:
                out[kind].append(api_ttft(srv.url, detailed if kind == "api_same_request" else base))
    page.close()
    return out


def screenshots(srv, browser, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(srv.url + "/")
    page.wait_for_selector("body[data-ready]")
    page.fill("#prompt", CODE_PROMPT)
    page.fill('[data-field="temperature"]', "0.7")
    page.fill('[data-field="seed"]', "1")
    page.fill('[data-field="max_tokens"]', "48")
    page.fill("#gamma", "4")
    page.click("#generate")
    page.wait_for_selector('body[data-state="done"]', timeout=600_000)
    marks = page.locator(".run .tok[data-index]").evaluate_all("els => els.map(e => e.dataset.mark)")
    pick = next((i for i, m in enumerate(marks) if m == "correction" and i >= 2), None)  # past the opening
    pick = pick if pick is not None else next((i for i, m in enumerate(marks) if m == "accepted"), 1)
    page.locator(f'.run .tok[data-index="{pick}"]').first.click()
    page.screenshot(path=str(out_dir / "page_token.png"), full_page=True)
    page.check("#compare")
    page.select_option("#rule-b", "lenience")
    page.fill("#param-b-lenience-l", "0.5")
    page.click("#generate")
    page.wait_for_selector('body[data-state="done"]', timeout=600_000)
    page.screenshot(path=str(out_dir / "page_side_by_side.png"), full_page=True)
    page.uncheck("#compare")
    page.select_option("#rule-a", "lenience")
    page.fill("#param-a-lenience-l", "2")
    page.click("#generate")
    page.wait_for_selector('body[data-state="error"]', timeout=600_000)
    page.screenshot(path=str(out_dir / "page_error.png"), full_page=True)
    page.close()


def engine_cost(engine, repeats: int, max_tokens: int) -> dict:
    greedy = SamplingConfig(temperature=0)
    runs: dict[str, list[float]] = {"off": [], "on": []}
    rounds: list[float] = []
    engine.generate(PROMPT, chat=True, sampling=greedy, max_new_tokens=8)  # warm-up
    for i in range(repeats):
        for kind in ("off", "on") if i % 2 == 0 else ("on", "off"):
            sched = Scheduler(engine, max_batch=1)
            handle = sched.submit(Request(PROMPT, chat=True, sampling=greedy, max_new_tokens=max_tokens, gamma="auto",
                                          token_details=8 if kind == "on" else None))
            sched.run()
            res = handle.result
            runs[kind].append(res.metrics.tokens_per_s)
            if kind == "off":
                rounds.append(res.metrics.total_s / res.metrics.rounds)
    row = engine.start(Request(PROMPT, max_new_tokens=4))
    try:
        n = 1_000_000
        check_s = timeit.timeit("row.details is not None", globals={"row": row}, number=n) / n
    finally:
        engine.release(row)
    return {"tokens_per_s": runs, "round_s": rounds, "check_s": check_s}


def report(cpu: str, ttft: dict, cost: dict, repeats: int, max_tokens: int) -> str:
    med = {k: statistics.median(v) for k, v in ttft.items()}
    tps = {k: statistics.median(v) for k, v in cost["tokens_per_s"].items()}
    round_s = statistics.median(cost["round_s"])
    added = 2 * cost["check_s"]
    lines = [
        "# The page at `/`: first token and the cost of the per-token analysis",
        "",
        f"`python3 benchmarks/page.py --repeats {repeats}` on {cpu}; the default pair with this machine's serving "
        "defaults (llama.cpp target, prompt lookup, gamma auto), greedy, the README's chat prompt, "
        f"{max_tokens} new tokens for the first token, {4 * max_tokens} for the engine; runs alternated. The page "
        "runs in Debian's Chromium (headless, Playwright).",
        "",
        "| first token | median (s) | runs (s) |",
        "|---|---|---|",
    ]
    names = {"page": "page (request sent by the page's script -> first token drawn)",
             "api_same_request": "API, the page's request (with `token_details`)",
             "api_plain": "API, without `token_details`"}
    for k in ("page", "api_same_request", "api_plain"):
        lines.append(f"| {names[k]} | {med[k]:.3f} | {', '.join(f'{x:.3f}' for x in ttft[k])} |")
    lines += [
        "",
        f"Page / API for the same request: {med['page'] / med['api_same_request']:.2f}x (goal: within 1.5x); "
        f"page / API without the details: {med['page'] / med['api_plain']:.2f}x.",
        "",
        "| engine, greedy | tokens/s median | runs |",
        "|---|---|---|",
        f"| `token_details` off | {tps['off']:.2f} | {', '.join(f'{x:.2f}' for x in cost['tokens_per_s']['off'])} |",
        f"| `token_details` 8 | {tps['on']:.2f} | {', '.join(f'{x:.2f}' for x in cost['tokens_per_s']['on'])} |",
        "",
        "Off, the feature adds two checks per row and round (`row.details is not None`, before and after the "
        f"commit): {added * 1e9:.0f} ns against a median round of {round_s * 1e3:.1f} ms, "
        f"{added / round_s:.1e} of it; nothing else runs (tests/runtime/test_token_details.py replaces the analysis "
        "with one that raises and generates without it).",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=8,
                    help="new tokens of the first-token requests (the engine runs generate 4x as many)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--screenshots", type=Path, default=None)
    ap.add_argument("--screenshots-only", action="store_true", help="take the screenshots, measure nothing")
    args = ap.parse_args()
    cpu = cpu_model()
    engine = load_engine(cache=False)
    with BackgroundServer(create_app(engine, model_name=models.DEFAULT_TARGET), timeout_s=60) as srv, \
            sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        if args.screenshots is not None:
            screenshots(srv, browser, args.screenshots)
        if args.screenshots_only:
            return
        ttft = first_token(srv, browser, args.repeats, args.max_tokens)
        browser.close()
    if args.out is not None:  # the first part kept, should the second not finish
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps({"cpu": cpu, "ttft": ttft}, indent=1))
    cost = engine_cost(engine, args.repeats, args.max_tokens * 4)
    text = report(cpu, ttft, cost, args.repeats, args.max_tokens)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        (args.out.with_suffix(".json")).write_text(json.dumps({"cpu": cpu, "ttft": ttft, **cost}, indent=1))


if __name__ == "__main__":
    main()
