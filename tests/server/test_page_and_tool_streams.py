"""The server's page, tool calls and streaming:

- the page's seed field is left empty, so the server draws a fresh seed per request (it showed the schema's 0, so
  every Generate at temperature > 0 sent seed 0 and drew the same sample);
- a streamed answer that is only tool calls carries its logprobs and token details, as the full response does;
- ``parallel_tool_calls: false`` gives one call at most (it was dropped unread);
- side by side on the page, a side the server refuses ends the other side's request too (it streamed on, unseen,
  with Stop disabled).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from collections.abc import Sequence

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from test_server import metrics, wait_for  # noqa: E402  (the server tests' helpers, a module of this folder)

from verispec.server import create_app  # noqa: E402
from verispec.server.background import BackgroundServer  # noqa: E402
from verispec.server.page import page_html  # noqa: E402
from verispec.testing import ToyTokenizer, toy_engine  # noqa: E402

TIMEOUT = 60.0
CHROMIUM = os.environ.get("VERISPEC_CHROMIUM", "/usr/bin/chromium")
CALL = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}


def total(samples: dict, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(v for (n, lab), v in samples.items() if n == name and set(labels.items()) <= set(lab))


# ------------------------------------------------------------------------------------------- the page's seed


def test_page_leaves_the_seed_to_the_server():
    """The seed field starts empty (the server's default: a fresh seed per request), not at the schema's 0."""
    engine = toy_engine("model")
    html = page_html(create_app(engine, model_name="toy").openapi(), "toy")
    seed = re.search(r'<input id="f-seed"[^>]*>', html)
    assert seed is not None and 'value=""' in seed.group(0), seed
    assert re.search(r'<input id="f-temperature"[^>]*value="', html)  # other fields keep their defaults


# ------------------------------------------------------------------------------------------- forced calls


# ------------------------------------------------------------------------------------------- streamed tool calls


class _CallTokenizer(ToyTokenizer):
    """The toy tokenizer whose token 0 reads as one whole tool call, with a chat template that takes tools."""

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(CALL if int(i) == 0 else self.alphabet[int(i) % len(self.alphabet)] for i in ids)

    def apply_chat_template(self, messages, tools=None, add_generation_prompt: bool = True,  # type: ignore[override]
                            tokenize: bool = True):
        return super().apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=tokenize)


@pytest.fixture(scope="module")
def tool_server():
    """A toy server whose answers read token 0 as a tool call (``logit_bias`` makes it write token 0)."""
    engine = toy_engine("model", cache=False)
    engine.tokenizer = _CallTokenizer()
    with BackgroundServer(create_app(engine, model_name="toy")) as srv:
        yield srv


def tool_client(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)


#: two calls, nothing else: the toy writes token 0 twice
TWO_CALLS = dict(model="toy", messages=[{"role": "user", "content": "time?"}], tools=[TIME], temperature=0,
                 max_tokens=2, logit_bias={"0": 100})


def test_streamed_tool_calls_carry_their_logprobs_and_details(tool_server):
    """An answer of two calls only: the stream's tool_calls delta holds both calls, and its logprobs and token
    details equal the full response's (the stream dropped them)."""
    kw = dict(**TWO_CALLS, logprobs=True, top_logprobs=1, extra_body={"verification": {"token_details": 1}})
    client = tool_client(tool_server)
    full = client.chat.completions.create(**kw).choices[0]
    assert [c.function.name for c in full.message.tool_calls] == ["get_time", "get_time"]
    assert full.message.content is None and len(full.logprobs.content) == 2
    calls, logprobs, details, chunks = [], [], [], list(client.chat.completions.create(**kw, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    for chunk in chunks:
        for c in chunk.choices:
            calls += c.delta.tool_calls or []
            logprobs += (c.logprobs.content or []) if c.logprobs else []
            details += c.model_extra.get("token_details") or []
    assert [(c.index, c.function.name, json.loads(c.function.arguments)) for c in calls] == \
        [(0, "get_time", {"zone": "UTC"}), (1, "get_time", {"zone": "UTC"})]
    assert [e.model_dump() for e in logprobs] == [e.model_dump() for e in full.logprobs.content]
    assert details == full.model_extra["token_details"]
    assert chunks[-1].choices[0].finish_reason == "length"


def test_parallel_tool_calls_false_gives_one_call(tool_server):
    """``parallel_tool_calls: false``: one call at most, streamed or not (it was ignored: two calls came back);
    the other block stays text. A value that is not a boolean is refused, naming the field."""
    client = tool_client(tool_server)
    assert len(client.chat.completions.create(**TWO_CALLS).choices[0].message.tool_calls) == 2
    one = client.chat.completions.create(**TWO_CALLS, parallel_tool_calls=False).choices[0]
    assert [c.function.name for c in one.message.tool_calls] == ["get_time"]
    assert one.message.content == CALL
    calls, text = [], ""
    for chunk in client.chat.completions.create(**TWO_CALLS, parallel_tool_calls=False, stream=True):
        for c in chunk.choices:
            calls += c.delta.tool_calls or []
            text += c.delta.content or ""
    assert [c.index for c in calls] == [0] and text == CALL
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**TWO_CALLS, extra_body={"parallel_tool_calls": "no"})
    assert err.value.body["param"] == "parallel_tool_calls"
    # completions take no tools: the field is accepted there without effect, as before
    r = client.completions.create(model="toy", prompt="hi", max_tokens=2, extra_body={"parallel_tool_calls": False})
    assert r.choices[0].finish_reason == "length"


# ------------------------------------------------------------------------------------------- the page, side by side


@pytest.fixture()
def gated_server():
    """A toy server whose engine rounds wait on ``gate``."""
    engine = toy_engine("model", cache=False)
    gate = threading.Event()
    gate.set()
    step = engine.step

    def gated(rows):
        assert gate.wait(TIMEOUT), "gate never opened"
        return step(rows)

    engine.step = gated
    with BackgroundServer(create_app(engine, model_name="toy")) as srv:
        srv.gate = gate
        yield srv
        gate.set()


@pytest.mark.slow
def test_side_refused_ends_the_other_sides_request(gated_server):
    """Side by side, the second rule's parameter out of range: the server answers that side 400 at once while the
    first side's request waits on the engine. The page shows the error and hangs up the first side too, so the
    server ends that request (cancelled) instead of generating it for nobody."""
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        pytest.skip(f"no Chromium at {CHROMIUM}")
    sync_api = pytest.importorskip("playwright.sync_api")
    srv = gated_server
    before = metrics(srv)
    srv.gate.clear()
    try:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox",
                                                                         "--disable-gpu"])
            try:
                pg = browser.new_page()
                errors: list[str] = []
                pg.on("pageerror", lambda e: errors.append(str(e)))
                pg.goto(srv.url + "/")
                pg.wait_for_selector("body[data-ready]")
                pg.fill('[data-field="max_tokens"]', "8")
                pg.check("#compare")
                pg.select_option("#rule-b", "lenience")
                pg.fill("#param-b-lenience-l", "2")
                pg.click("#generate")
                pg.wait_for_selector('body[data-state="done"], body[data-state="error"]', timeout=TIMEOUT * 1000)
                assert pg.get_attribute("body", "data-state") == "error"
                assert "(field: verification.params)" in pg.inner_text("#error")
                assert not errors, errors
                # both requests answered: the refused one, and the other ended by the page while its round waits
                wait_for(lambda: total(metrics(srv), "verispec_requests_total", endpoint="/v1/chat/completions")
                         - total(before, "verispec_requests_total", endpoint="/v1/chat/completions") == 2,
                         timeout=10.0, what="the page to hang up the other side")
            finally:
                browser.close()
    finally:
        srv.gate.set()
    wait_for(lambda: total(metrics(srv), "verispec_requests_in_flight") == 0, what="the request to leave")
    after = metrics(srv)
    name = "verispec_requests_finished_total"
    assert total(after, name, finish_reason="length") == total(before, name, finish_reason="length")
