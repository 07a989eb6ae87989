"""The OpenAI-compatible server on the toy pair (tiny random Qwen2 models, character tokenizer), served by uvicorn
on 127.0.0.1 in this process: the official ``openai`` client streamed and not, per-request rules, 16 concurrent
clients, a client killed mid-stream, every refused input, limits, a failing round, and /metrics.

Every HTTP call has a timeout; every wait is bounded. Reference outputs come from a second toy engine built from
the same seeds (the served engine belongs to the server's worker thread)."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from verispec.core.rules import get  # noqa: E402
from verispec.core.sampling import SamplingConfig  # noqa: E402
from verispec.server import Limits, create_app  # noqa: E402
from verispec.server.background import BackgroundServer  # noqa: E402
from verispec.testing import toy_engine  # noqa: E402

MODEL = "toy"
TIMEOUT = 60.0
GREEDY = SamplingConfig(temperature=0)


@pytest.fixture(scope="module")
def server():
    engine = toy_engine("model", cache=False)
    batches: list[int] = []  # rows per engine round, to see that requests really share rounds
    step = engine.step

    def recording_step(rows):
        batches.append(sum(not r.done for r in rows))
        return step(rows)

    engine.step = recording_step
    app = create_app(engine, model_name=MODEL, max_batch=8, max_concurrency=32,
                     limits=Limits(max_prompt_tokens=200, max_tokens_limit=480))
    with BackgroundServer(app) as srv:
        srv.batches = batches
        yield srv


@pytest.fixture(scope="module")
def reference():
    return toy_engine("model", cache=False)


def client(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)


def post(srv, path: str, body: bytes | dict, timeout: float = TIMEOUT) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(srv.url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def get_json(srv, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(srv.url + path, timeout=TIMEOUT) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def metrics(srv) -> dict[tuple[str, tuple], float]:
    """Every sample of /metrics, parsed with prometheus-client's parser: (name, sorted labels) -> value."""
    with urllib.request.urlopen(srv.url + "/metrics", timeout=TIMEOUT) as resp:
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def metric(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def wait_for(predicate, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def collect_stream(stream) -> tuple[str, list, object]:
    """(text, chunks, last chunk) of an openai stream of completions or chat chunks."""
    chunks = list(stream)
    parts = []
    for ch in chunks:
        for c in ch.choices:
            parts.append(c.text if hasattr(c, "text") else (c.delta.content or ""))
    return "".join(parts), chunks, chunks[-1]


# ------------------------------------------------------------------------------------------- basic endpoints


def test_models_and_health(server):
    status, body = get_json(server, "/v1/models")
    assert status == 200 and [m["id"] for m in body["data"]] == [MODEL]
    assert [m.id for m in client(server).models.list().data] == [MODEL]
    status, body = get_json(server, "/health")
    assert status == 200 and body["status"] == "ok"


def test_completion_and_chat_non_streamed_equal_the_engine(server, reference):
    c = client(server)
    r = c.completions.create(model=MODEL, prompt="hello world", max_tokens=20, temperature=0, seed=1)
    ref = reference.generate("hello world", sampling=GREEDY, max_new_tokens=20, seed=1, gamma=5)
    assert r.choices[0].text == ref.text and len(ref.text) == 20
    assert r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (11, 20)
    vs = r.model_extra["verispec"]
    # no gamma asked for: the adaptive schedule (greedy text is the target's whatever the rounds)
    assert vs["rule"] == "lossless" and vs["gamma"] == "auto" and vs["metrics"]["schedule"]["alpha"] is not None
    assert set(vs["backends"]) == {"target_backend", "drafter", "draft_backend"} and vs["backends"]["drafter"]
    t = vs["timings"]  # the engine's clock: the first token comes within the request's time, phases within it too
    assert 0 < t["time_to_first_token_s"] <= t["total_s"] and 0 < t["target_s"] <= t["total_s"]
    r = c.completions.create(model=MODEL, prompt="hello world", max_tokens=20, temperature=0, seed=1,
                             extra_body={"speculative": {"gamma": 5}})
    assert r.choices[0].text == ref.text and r.model_extra["verispec"]["metrics"]["drafted"] == ref.metrics.drafted
    r = c.completions.create(model=MODEL, prompt="hello world", max_tokens=20, temperature=1.0, seed=3,
                             extra_body={"speculative": {"gamma": 3}, "verification": {"verifier": "block"}})
    ref = reference.generate("hello world", sampling=SamplingConfig(temperature=1.0), max_new_tokens=20, seed=3,
                             gamma=3, verifier="block")
    assert r.choices[0].text == ref.text and r.model_extra["verispec"]["verifier"] == "block"

    r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi there"}], max_tokens=24,
                                  temperature=0, seed=2)
    ref = reference.generate("hi there", sampling=GREEDY, max_new_tokens=24, seed=2, chat=True)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == ref.text
    assert r.usage.prompt_tokens == len(ref.prompt_ids)


@pytest.mark.parametrize("chat", [False, True])
def test_streamed_text_equals_non_streamed_text(server, chat):
    """Seeded greedy request: the streamed deltas add up to the non-streamed text; usage and the verispec block
    ride on the last chunk."""
    c = client(server)
    # a constant gamma: under the default adaptive schedule the rounds (and so the metrics) follow measured times
    kw = dict(model=MODEL, max_tokens=40, temperature=0, seed=5, extra_body={"speculative": {"gamma": 5}})
    if chat:
        msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "name a color"}]
        full = c.chat.completions.create(messages=msgs, **kw)
        stream = c.chat.completions.create(messages=msgs, stream=True, stream_options={"include_usage": True}, **kw)
        full_text = full.choices[0].message.content
    else:
        full = c.completions.create(prompt="def f", **kw)
        stream = c.completions.create(prompt="def f", stream=True, stream_options={"include_usage": True}, **kw)
        full_text = full.choices[0].text
    text, chunks, last = collect_stream(stream)
    assert text == full_text and len(text) == 40
    assert sum(1 for ch in chunks if ch.choices and (getattr(ch.choices[0], "text", None)
                                                      or getattr(getattr(ch.choices[0], "delta", None), "content",
                                                                 None))) > 1
    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finish == ["length"]
    assert last.choices == [] and last.usage.completion_tokens == 40
    assert last.usage.prompt_tokens == full.usage.prompt_tokens
    untimed = [{k: v for k, v in r.model_extra["verispec"].items() if k != "timings"} for r in (last, full)]
    assert untimed[0] == untimed[1]  # the same rounds and metrics; only the clock differs


def test_stop_string_is_never_streamed_past(server, reference):
    """A stop string taken from the middle of the greedy output: non-streamed and streamed text both end right
    before its first occurrence, finish_reason "stop"."""
    base = reference.generate("stop here", sampling=GREEDY, max_new_tokens=60, seed=0).text
    stop = base[20:23]
    cut = base[: base.find(stop)]
    c = client(server)
    kw = dict(model=MODEL, prompt="stop here", max_tokens=60, temperature=0, stop=[stop, "never occurs"])
    full = c.completions.create(**kw)
    text, chunks, _ = collect_stream(c.completions.create(stream=True, **kw))
    assert full.choices[0].text == cut == text
    assert full.choices[0].finish_reason == "stop"
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices[0].finish_reason] == ["stop"]


def _fresh_stop(text: str) -> str:
    """Two characters of ``text`` that first occur after its first few (a stop string that cuts it mid-way)."""
    return next(text[i : i + 2] for i in range(6, len(text) - 1) if text.find(text[i : i + 2]) == i)


def test_logprobs_end_where_the_text_stops(server, reference):
    """With a stop string and logprobs, the entries are those of the tokens the text keeps (their tokens join to the
    text), streamed and not, at both endpoints: none for the stop string's own tokens (speculation commits them in
    the round that finds the stop, gamma 3)."""
    c = client(server)
    spec = {"speculative": {"gamma": 3}}
    base = reference.generate("stop here", sampling=GREEDY, max_new_tokens=40, gamma=3).text
    stop = _fresh_stop(base)
    cut = base[: base.find(stop)]
    kw = dict(model=MODEL, prompt="stop here", max_tokens=40, temperature=0, stop=[stop], extra_body=spec)
    full = c.completions.create(logprobs=1, **kw)
    assert full.choices[0].text == cut and "".join(full.choices[0].logprobs.tokens) == cut
    streamed = [ch for ch in c.completions.create(logprobs=1, stream=True, **kw) if ch.choices]
    assert "".join(t for ch in streamed if ch.choices[0].logprobs for t in ch.choices[0].logprobs.tokens) == cut
    msgs = [{"role": "user", "content": "stop here"}]
    base = reference.generate("stop here", chat=True, sampling=GREEDY, max_new_tokens=40, gamma=3).text
    stop = _fresh_stop(base)
    cut = base[: base.find(stop)]
    kw = dict(model=MODEL, messages=msgs, max_tokens=40, temperature=0, stop=stop, logprobs=True, extra_body=spec)
    r = c.chat.completions.create(**kw)
    assert r.choices[0].message.content == cut == "".join(t.token for t in r.choices[0].logprobs.content)
    parts = [t.token for ch in c.chat.completions.create(stream=True, **kw) if ch.choices and ch.choices[0].logprobs
             for t in ch.choices[0].logprobs.content]
    assert "".join(parts) == cut


# ------------------------------------------------------------------------------------------- rules per request


def test_logit_bias_reaches_target_and_draft(server, reference):
    """logit_bias through the official client: the completion is the engine's own run with the same bias (greedy
    and sampled), and +100 on one token forces it."""
    c = client(server)
    bias = {"40": 4.0, "12": -100}
    for temperature, seed in ((0.0, 1), (1.0, 5)):
        r = c.completions.create(model=MODEL, prompt="hello world", max_tokens=16, temperature=temperature,
                                 seed=seed, logit_bias=bias, extra_body={"speculative": {"gamma": 3}})
        ref = reference.generate("hello world", max_new_tokens=16, seed=seed, gamma=3, sampling=SamplingConfig(
            temperature=temperature, logit_bias={40: 4.0, 12: -100.0}))
        plain = reference.generate("hello world", max_new_tokens=16, seed=seed, gamma=3,
                                   sampling=SamplingConfig(temperature=temperature))
        assert r.choices[0].text == ref.text != plain.text and 12 not in ref.token_ids
    r = c.completions.create(model=MODEL, prompt="hello world", max_tokens=6, temperature=0, logit_bias={"40": 100})
    assert r.choices[0].text == reference.decode([40] * 6)


def test_logprobs_non_streamed_and_streamed_equal_the_engine(server, reference):
    """logprobs through the official client: completions (3 alternatives) and chat (top 2), streamed and not, give
    the engine's own logprob entries for the same request (T = 1, seed, gamma 3): every token, in order, its text
    and the alternatives; a stream carries them chunk by chunk and they add up to the non-streamed ones."""
    c = client(server)
    cfg, spec = SamplingConfig(temperature=1.0), {"speculative": {"gamma": 3}}
    ref = reference.generate("hello world", sampling=cfg, max_new_tokens=16, seed=7, gamma=3, logprobs=3)
    r = c.completions.create(model=MODEL, prompt="hello world", max_tokens=16, temperature=1.0, seed=7, logprobs=3,
                             extra_body=spec)
    lp = r.choices[0].logprobs
    assert r.choices[0].text == ref.text and "".join(lp.tokens) == ref.text
    assert lp.token_logprobs == pytest.approx([e.logprob for e in ref.logprobs], abs=1e-9)
    # each entry: the 3 alternatives, and the chosen token too (up to logprobs + 1 entries, as OpenAI's)
    for d, e in zip(lp.top_logprobs, ref.logprobs, strict=True):
        want = {**{reference.decode([t]): v for t, v in e.top}, reference.decode([e.token]): e.logprob}
        assert d == pytest.approx(want) and 3 <= len(d) <= 4
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    streamed = c.completions.create(model=MODEL, prompt="hello world", max_tokens=16, temperature=1.0, seed=7,
                                    logprobs=3, extra_body=spec, stream=True)
    chunks = [ch.choices[0].logprobs for ch in streamed if ch.choices and ch.choices[0].logprobs is not None]
    assert len(chunks) > 1 and sum((ch.token_logprobs for ch in chunks), []) == lp.token_logprobs
    assert sum((ch.text_offset for ch in chunks), []) == lp.text_offset

    msgs = [{"role": "user", "content": "hi there"}]
    ref = reference.generate("hi there", chat=True, sampling=cfg, max_new_tokens=16, seed=8, gamma=3, logprobs=2)
    r = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=16, temperature=1.0, seed=8, logprobs=True,
                                  top_logprobs=2, extra_body=spec)
    content = r.choices[0].logprobs.content
    assert "".join(t.token for t in content) == r.choices[0].message.content == ref.text
    assert [t.logprob for t in content] == pytest.approx([e.logprob for e in ref.logprobs], abs=1e-9)
    assert all(len(t.top_logprobs) == 2 and t.bytes == list(t.token.encode()) for t in content)
    streamed = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=16, temperature=1.0, seed=8,
                                         logprobs=True, top_logprobs=2, extra_body=spec, stream=True)
    parts = [t for ch in streamed if ch.choices and ch.choices[0].logprobs for t in ch.choices[0].logprobs.content]
    assert [(t.token, t.logprob) for t in parts] == [(t.token, t.logprob) for t in content]
    plain = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=4, temperature=0)
    assert plain.choices[0].logprobs is None


def test_echo_with_logprobs_scores_the_prompt(server, reference):
    """The log-likelihood request of evaluation harnesses (echo, logprobs 1, max_tokens 1, temperature 0): the text
    is the prompt then the answer; the prompt's tokens come first in the logprobs, the first one null, each the
    target's own log-softmax after the tokens before it (one full forward of the reference model); streamed, the
    first chunk carries the prompt."""
    import torch

    c = client(server)
    r = c.completions.create(model=MODEL, prompt="hello world", max_tokens=1, temperature=0, logprobs=1, echo=True)
    ids = reference.encode("hello world")
    ref = reference.generate("hello world", sampling=GREEDY, max_new_tokens=1)
    lp = r.choices[0].logprobs
    assert r.choices[0].text == "hello world" + ref.text
    assert "".join(lp.tokens) == r.choices[0].text and len(lp.tokens) == len(ids) + 1
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    with torch.no_grad():
        want = torch.log_softmax(reference.target.model(torch.tensor([ids])).logits[0].double(), -1)
    assert lp.token_logprobs[1:len(ids)] == pytest.approx([float(want[j - 1, ids[j]]) for j in range(1, len(ids))],
                                                          abs=1e-4)
    # logprobs 1: the most likely token, and the prompt's own where it is another
    assert all(1 <= len(d) <= 2 and d[t] == v for d, t, v in zip(lp.top_logprobs[1:], lp.tokens[1:],
                                                                  lp.token_logprobs[1:], strict=True))
    assert any(len(d) == 2 for d in lp.top_logprobs[1:])
    plain = c.completions.create(model=MODEL, prompt="hello world", max_tokens=3, temperature=0, echo=True)
    assert plain.choices[0].text.startswith("hello world") and plain.choices[0].logprobs is None
    streamed = list(c.completions.create(model=MODEL, prompt="hello world", max_tokens=3, temperature=0, echo=True,
                                         logprobs=0, stream=True))
    assert streamed[0].choices[0].text.startswith("hello world")
    tokens = [t for ch in streamed if ch.choices and ch.choices[0].logprobs for t in ch.choices[0].logprobs.tokens]
    assert "".join(tokens) == "".join(ch.choices[0].text for ch in streamed if ch.choices)


def test_n_choices_are_rows_with_their_own_seeds(server, reference):
    """n = 3 at T = 1: choice i is the engine's own run with seed + i (so the choices differ), streamed or not;
    usage counts the prompt once and every choice's tokens; the verispec block has each choice's metrics."""
    c = client(server)
    spec = {"speculative": {"gamma": 3}}
    refs = [reference.generate("hello world", sampling=SamplingConfig(temperature=1.0), max_new_tokens=12, seed=5 + i,
                               gamma=3) for i in range(3)]
    assert len({r.text for r in refs}) > 1
    r = c.completions.create(model=MODEL, prompt="hello world", max_tokens=12, temperature=1.0, seed=5, n=3,
                             extra_body=spec)
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    assert [ch.text for ch in r.choices] == [x.text for x in refs]
    assert r.usage.completion_tokens == sum(len(x.token_ids) for x in refs) and r.usage.prompt_tokens == 11
    assert len(r.model_extra["verispec"]["per_choice"]) == 3
    msgs = [{"role": "user", "content": "hello world"}]
    chat_refs = [reference.generate("hello world", chat=True, sampling=SamplingConfig(temperature=1.0), gamma=3,
                                    max_new_tokens=12, seed=9 + i) for i in range(2)]
    stream = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, temperature=1.0, seed=9, n=2,
                                       stream=True, stream_options={"include_usage": True}, extra_body=spec)
    texts, finished = ["", ""], set()
    for ch in stream:
        for choice in ch.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finished.add(choice.index)
        if ch.usage is not None:
            assert ch.usage.completion_tokens == sum(len(x.token_ids) for x in chat_refs)
    assert texts == [x.text for x in chat_refs] and finished == {0, 1}
    # the largest seed: choice 1's seed wraps to 0 rather than leaving the seeds' range
    top = reference.generate("hello world", sampling=SamplingConfig(temperature=1.0), max_new_tokens=12, seed=0,
                             gamma=3)
    r = c.completions.create(model=MODEL, prompt="hello world", max_tokens=12, temperature=1.0, seed=2**63 - 1, n=2,
                             extra_body=spec)
    assert r.choices[1].text == top.text


def test_response_format_constrains_what_is_served(server, reference):
    """A regex response_format (the toy alphabet has no braces for JSON): chat and completions, streamed or not,
    serve the engine's own constrained output, which matches the regex."""
    import re

    c = client(server)
    fmt = {"type": "regex", "regex": "(ab|ba|cc)[abc]"}
    msgs = [{"role": "user", "content": "hello"}]
    for temperature, seed in ((0.0, 1), (1.0, 4)):
        cfg = SamplingConfig(temperature=temperature)
        ref = reference.generate("hello", chat=True, sampling=cfg, max_new_tokens=3, seed=seed, gamma=3,
                                 response_format=fmt)
        assert re.fullmatch(fmt["regex"], ref.text)
        r = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=3, temperature=temperature, seed=seed,
                                      response_format=fmt, extra_body={"speculative": {"gamma": 3}})
        assert r.choices[0].message.content == ref.text
        text, _, _ = collect_stream(c.chat.completions.create(
            model=MODEL, messages=msgs, max_tokens=3, temperature=temperature, seed=seed, response_format=fmt,
            stream=True, extra_body={"speculative": {"gamma": 3}}))
        assert text == ref.text
    r = c.completions.create(model=MODEL, prompt="hello", max_tokens=3, temperature=1.0, seed=2,
                             extra_body={"response_format": fmt})
    assert re.fullmatch(fmt["regex"], r.choices[0].text)


def test_per_request_rule_reaches_the_verifier(server, reference):
    """The rule sent in extra_body is the one that ran: the response names it, and its counters equal the engine's
    own run with that rule, which differ from lossless (greedy: CoS-WE accepts drafts lossless refuses; T = 1:
    lenience with a small l accepts more)."""
    c = client(server)
    msgs = [{"role": "user", "content": "hello world"}]

    def served(rule: str, params: dict, temperature: float):
        r = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=48, temperature=temperature, seed=3,
                                      extra_body={"verification": {"rule": rule, "params": params},
                                                  "speculative": {"gamma": 5}})
        return r.model_extra["verispec"]

    def direct(rule: str, params: dict, temperature: float):
        return reference.generate("hello world", chat=True, rule=get(rule, **params), gamma=5, seed=3,
                                  sampling=SamplingConfig(temperature=temperature), max_new_tokens=48).metrics

    for temperature, lossy, params in ((0.0, "cos-we", {"lam": 0.5}), (1.0, "lenience", {"l": 0.1})):
        base, other = served("lossless", {}, temperature), served(lossy, params, temperature)
        assert base["rule"] == "lossless" and base["lossless"] is True
        assert other["rule"] == lossy and other["rule_params"] == params and other["lossless"] is False
        assert other["gamma"] == 5
        for got, rule, p in ((base, "lossless", {}), (other, lossy, params)):
            ref = direct(rule, p, temperature)
            assert (got["metrics"]["accepted"], got["metrics"]["drafted"]) == (ref.accepted, ref.drafted)
            assert got["metrics"]["block_efficiency"] == pytest.approx(ref.block_efficiency)
        assert other["metrics"]["accepted_fraction"] > base["metrics"]["accepted_fraction"]


# ------------------------------------------------------------------------------------------- concurrency


def test_16_concurrent_clients_get_what_the_engine_gives_each_alone(server, reference):
    """16 threads, each its own prompt and length, half streamed, half chat: all complete (bounded time), each equal
    to the engine's greedy output for that request alone; the rounds batched several requests."""
    prompts = [f"prompt {i} " + "abc"[: i % 4] for i in range(16)]
    lengths = [8 + 3 * i for i in range(16)]
    before = len(server.batches)

    def one(i: int) -> str:
        c = client(server)
        kw = dict(model=MODEL, max_tokens=lengths[i], temperature=0, seed=i)
        stream = i % 2 == 1
        if i % 4 >= 2:
            r = c.chat.completions.create(messages=[{"role": "user", "content": prompts[i]}], stream=stream, **kw)
            return collect_stream(r)[0] if stream else r.choices[0].message.content
        r = c.completions.create(prompt=prompts[i], stream=stream, **kw)
        return collect_stream(r)[0] if stream else r.choices[0].text

    with ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(one, i) for i in range(16)]
        got = [f.result(timeout=120) for f in futures]
    for i in range(16):
        ref = reference.generate(prompts[i], sampling=GREEDY, max_new_tokens=lengths[i], seed=i, chat=i % 4 >= 2)
        assert got[i] == ref.text, i
    assert max(server.batches[before:]) > 1
    samples = metrics(server)
    assert metric(samples, "verispec_running") == 0 and metric(samples, "verispec_requests_in_flight") == 0


def test_client_killed_mid_stream_frees_its_slot(server):
    """Close the TCP connection after the first streamed chunk of a long request: the request is cancelled, the
    running gauge returns to 0 and the server keeps serving."""
    before = metrics(server)
    body = json.dumps({"model": MODEL, "prompt": "go on", "max_tokens": 480, "temperature": 0, "stream": True})
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT)
    sock.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
    received = b""
    while b"data: {" not in received:
        chunk = sock.recv(4096)
        assert chunk, "the server closed the stream before sending anything"
        received += chunk
    assert received.startswith(b"HTTP/1.1 200")
    sock.close()

    def settled() -> bool:
        s = metrics(server)
        cancelled = metric(s, "verispec_requests_finished_total", finish_reason="cancelled")
        return (cancelled == metric(before, "verispec_requests_finished_total", finish_reason="cancelled") + 1
                and metric(s, "verispec_running") == 0 and metric(s, "verispec_requests_in_flight") == 0)

    wait_for(settled, what="the cancelled request to leave the batch")
    after = metrics(server)
    done = metric(after, "verispec_completion_tokens_total") - metric(before, "verispec_completion_tokens_total")
    assert 0 < done < 480  # stopped early
    r = client(server).completions.create(model=MODEL, prompt="still there", max_tokens=5, temperature=0)
    assert len(r.choices[0].text) == 5


def test_budget_reaches_the_verifier(server, reference):
    """``verification.budget``: the response's verispec block reports the spent budget and each token's parameter
    and distance, equal to the engine's own run with that budget."""
    body = {**COMP, "prompt": "budget please", "max_tokens": 24, "temperature": 1.0, "seed": 5,
            "verification": {"rule": "lenience", "budget": {"tv": 0.05, "tv_total": 0.5}},
            "speculative": {"gamma": 4}}
    status, r = post(server, "/v1/completions", body)
    assert status == 200, r
    got = r["verispec"]["metrics"]["budget"]
    ref = reference.generate("budget please", rule="lenience", budget={"tv": 0.05, "tv_total": 0.5}, gamma=4,
                             seed=5, sampling=SamplingConfig(temperature=1.0), max_new_tokens=24)
    assert got["budget"] == {"tv": 0.05, "tv_total": 0.5} and got["param"] == "l"
    assert got["theta"] == pytest.approx(ref.metrics.budget["theta"]) and got["spent"] <= 0.5 + 1e-12
    assert len(got["tv"]) == r["usage"]["completion_tokens"] and max(got["tv"]) <= 0.05 + 1e-12


# ------------------------------------------------------------------------------------------- bad input

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
COMP = {"model": MODEL, "prompt": "hi", "max_tokens": 4}

BAD = [
    ("/v1/chat/completions", b'{"model": "toy", "messages": [', 400, "malformed JSON", None),
    ("/v1/completions", b"[1, 2]", 400, "must be a JSON object", None),
    ("/v1/chat/completions", {**CHAT, "verification": {"rule": "nope"}}, 400, "unknown rule 'nope'",
     "verification.rule"),
    ("/v1/chat/completions", {**CHAT, "verification": {"rule": "lenience", "params": {"l": 5}}}, 400,
     "l (lenience) must be in (0, 1]", "verification.params"),
    ("/v1/completions", {**COMP, "verification": {"rule": "cos-we", "params": {"beta": 1}}}, 400,
     "has no parameter(s) beta", "verification.params"),
    ("/v1/completions", {**COMP, "verification": {"rule": "lenience", "params": {"l": "x"}}}, 400,
     "l must be a finite number", "verification.params"),
    ("/v1/completions", {**COMP, "max_tokens": -1}, 400, "max_tokens", "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": 0}, 400, "max_completion_tokens",
     "max_completion_tokens"),
    ("/v1/completions", {**COMP, "max_tokens": 481}, 400, "limit of 480", "max_tokens"),
    ("/v1/completions", {**COMP, "prompt": "a" * 600}, 400, "context is 512 tokens", "prompt"),
    ("/v1/completions", {**COMP, "prompt": "a" * 300}, 400, "--max-prompt-tokens", "prompt"),
    ("/v1/completions", {**COMP, "prompt": "a" * 100, "max_tokens": 450}, 400, "over the model's context",
     "max_tokens"),
    ("/v1/completions", {**COMP, "prompt": ""}, 400, "empty prompt", "prompt"),
    ("/v1/completions", {**COMP, "prompt": ["a", "b"]}, 400, "one prompt per request", "prompt"),
    ("/v1/completions", {**COMP, "prompt": [1, 2, 999]}, 400, "vocabulary", "prompt"),
    ("/v1/completions", {**COMP, "temperature": -1}, 400, "temperature", "temperature"),
    ("/v1/completions", {**COMP, "top_p": 0}, 400, "top_p", "top_p"),
    ("/v1/completions", {**COMP, "stop": 7}, 400, "stop", "stop"),
    ("/v1/completions", {**COMP, "seed": -3}, 400, "seed", "seed"),
    ("/v1/completions", {**COMP, "verification": {"rule": "lenience", "params": {"l": 0.5}, "verifier": "block"}},
     400, "verifies the lossless law", "verification.verifier"),
    ("/v1/completions", {**COMP, "verification": {"verifier": "blocky"}}, 400, "unknown verifier 'blocky'",
     "verification.verifier"),
    ("/v1/completions", {**COMP, "verification": {"rule": "lossless", "budget": {"tv": 0.1}}}, 400,
     "rule 'lossless' has no budget", "verification.budget"),
    ("/v1/completions", {**COMP, "verification": {"rule": "lenience", "budget": {"tv": 1.5}}}, 400,
     "budget tv must be in [0, 1]", "verification.budget"),
    ("/v1/completions", {**COMP, "verification": {"rule": "cos-we", "budget": {"kl": 0.1}}}, 400,
     "unknown field(s) kl", "verification.budget"),
    ("/v1/completions", {**COMP, "verification": {"rule": "overshoot-ceiling", "budget": {"tv": 0.1}}}, 400,
     "needs realization='residual'", "verification.budget"),
    ("/v1/completions", {**COMP, "speculative": {"gamma": -1}}, 400, "speculative.gamma", "speculative.gamma"),
    ("/v1/completions", {**COMP, "speculative": {"gamma": 1000}}, 400, "speculative.gamma", "speculative.gamma"),
    ("/v1/completions", {**COMP, "speculative": {"gama": 3}}, 400, "unknown field 'speculative.gama'",
     "speculative.gama"),
    ("/v1/completions", {**COMP, "stop": ""}, 400, "stop must be non-empty strings", "stop"),
    ("/v1/chat/completions", {**CHAT, "stop": ["\n", ""]}, 400, "stop must be non-empty strings", "stop"),
    ("/v1/completions", {**COMP, "n": 17}, 400, "less than or equal to 16", "n"),
    ("/v1/completions", {**COMP, "n": 0}, 400, "greater than or equal to 1", "n"),
    ("/v1/completions", {**COMP, "best_of": 3}, 400, "best_of is not supported", "best_of"),
    ("/v1/completions", {**COMP, "logprobs": 21}, 400, "less than or equal to 20", "logprobs"),
    ("/v1/completions", {**COMP, "logprobs": True}, 400, "logprobs", "logprobs"),
    ("/v1/chat/completions", {**CHAT, "top_logprobs": 2}, 400, "top_logprobs needs logprobs: true", "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 21}, 400, "less than or equal to 20",
     "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "logprobs": True, "verification": {"logprobs_mode": "raw"}}, 400,
     "verification.logprobs_mode", "verification.logprobs_mode"),
    ("/v1/chat/completions", {**CHAT, "echo": True}, 400, "echo is not supported", "echo"),
    ("/v1/completions", {**COMP, "echo": "yes"}, 400, "echo", "echo"),
    # the toy's chat template takes no tools (the real pair's does: tests/server/test_tools.py)
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400,
     "chat template takes no tools", "tools"),
    ("/v1/completions", {**COMP, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400,
     "tools is not supported", "tools"),
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "code_interpreter"}]}, 400, 'tools[0].type must be',
     "tools[0].type"),
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {"name": "a b"}}]}, 400,
     "tools[0].function.name", "tools[0].function.name"),
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]},
     400, "JSON Schema object", "tools[0].function.parameters"),
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}],
                              "tool_choice": {"type": "function", "function": {"name": "g"}}}, 400,
     "not among the tools", "tool_choice"),
    ("/v1/chat/completions", {**CHAT, "tool_choice": "required"}, 400, "tool_choice needs tools", "tool_choice"),
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}],
                              "tool_choice": "required", "response_format": {"type": "json_object"}}, 400,
     "forces to be a tool call", "response_format"),
    ("/v1/chat/completions", {**CHAT, "messages": [
        {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                              "function": {"name": "f", "arguments": "{oops"}}]}]}, 400,
     "arguments is not JSON", "messages[0].tool_calls[0].function.arguments"),
    ("/v1/chat/completions", {**CHAT, "logit_bias": {"five": 1}}, 400, "keys must be token ids", "logit_bias"),
    ("/v1/chat/completions", {**CHAT, "logit_bias": {"5": 101}}, 400, "must be a number in [-100, 100]",
     "logit_bias"),
    ("/v1/chat/completions", {**CHAT, "logit_bias": {"-2": 1}}, 400, "integers >= 0", "logit_bias"),
    ("/v1/chat/completions", {**CHAT, "logit_bias": {"\u00b2": 1}}, 400, "keys must be token ids", "logit_bias"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 4, "max_completion_tokens": 6}, 400, "disagree",
     "max_completion_tokens"),
    ("/v1/completions", {**COMP, "stop": [f"s{i}" for i in range(65)]}, 400, "over this server's limit of 64",
     "stop"),
    ("/v1/completions", {**COMP, "logit_bias": {"1": 1, "01": 2}}, 400, "token 1 is given twice", "logit_bias"),
    ("/v1/completions", {**COMP, "repetition_penalty": 1e-39}, 400, "greater than or equal to 0.1",
     "repetition_penalty"),
    ("/v1/completions", {**COMP, "logit_bias": {"64": 1}}, 400, "token 64 is outside the vocabulary [0, 64)",
     "logit_bias"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "xml"}}, 400,
     "response_format.type must be one of", "response_format"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "regex", "regex": "(ab"}}, 400,
     "the grammar does not compile", "response_format"),
    ("/v1/completions", {**COMP, "response_format": {"type": "regex", "regex": "[^\\s\\S]"}}, 400,
     "no text matches it", "response_format"),
    ("/v1/completions", {**COMP, "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 3}}}},
     400, "response_format", "response_format"),
    ("/v1/chat/completions", {**CHAT, "frobnicate": 1}, 400, "unknown field 'frobnicate'", "frobnicate"),
    ("/v1/chat/completions", {**CHAT, "messages": []}, 400, "messages", "messages"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "robot", "content": "x"}]}, 400,
     "messages[0].role", "messages[0].role"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "only text content parts", "messages[0].content"),
    ("/v1/chat/completions", {k: v for k, v in CHAT.items() if k != "messages"}, 400, "messages: Field required",
     "messages"),
    ("/v1/chat/completions", {**CHAT, "model": "gpt-4o"}, 404, "model 'gpt-4o' does not exist", "model"),
    ("/v1/nothing", {}, 404, "Not Found", None),
]


def test_every_bad_input_gets_its_4xx_and_disturbs_nobody(server, reference):
    """Each refused input: its status, an OpenAI error body whose message names the problem (and ``param``); a
    streamed request running meanwhile completes unchanged, and the server still serves afterwards."""
    ref = reference.generate("steady", sampling=GREEDY, max_new_tokens=120, seed=0).text
    out: dict[str, str] = {}

    def good() -> None:
        r = client(server).completions.create(model=MODEL, prompt="steady", max_tokens=120, temperature=0,
                                              seed=0, stream=True)
        out["text"] = collect_stream(r)[0]

    t = threading.Thread(target=good)
    t.start()
    for path, body, status, message, param in BAD:
        for stream in (False, True):
            if stream and isinstance(body, dict) and path != "/v1/nothing":
                body = {**body, "stream": True}
            got_status, got = post(server, path, body)
            assert got_status == status, (path, body, got)
            err = got["error"]
            assert set(err) == {"message", "type", "param", "code"}
            assert message in err["message"], (message, err)
            assert err["param"] == param, (param, err)
            assert err["type"] == "invalid_request_error"
    t.join(TIMEOUT)
    assert not t.is_alive() and out["text"] == ref
    with pytest.raises(openai.BadRequestError, match="unknown rule"):
        client(server).completions.create(model=MODEL, prompt="x", extra_body={"verification": {"rule": "zzz"}})
    assert get_json(server, "/health") == (200, {"status": "ok"})
    status, body = post(server, "/v1/completions", {**COMP, "max_tokens": 3})
    assert status == 200 and len(body["choices"][0]["text"]) == 3


# ------------------------------------------------------------------------------------------- limits, failures


@pytest.fixture()
def gated():
    """A server over its own engine (4 rows per round, 8 requests admitted) whose rounds wait on ``gate`` (``entered``
    is set once a round has begun), raise while ``fail`` is set, and record how many rows the engine holds."""
    engine = toy_engine("model", cache=False)
    gate, fail, entered = threading.Event(), threading.Event(), threading.Event()
    gate.set()
    rows_held: list[int] = []
    step = engine.step

    def controlled(rows):
        entered.set()
        assert gate.wait(TIMEOUT), "gate never opened"
        rows_held.append(engine.target.num_rows)
        if fail.is_set():
            fail.clear()
            raise RuntimeError("injected failure")
        return step(rows)

    engine.step = controlled
    app = create_app(engine, model_name=MODEL, max_batch=4, max_concurrency=8)
    with BackgroundServer(app) as srv:
        srv.gate, srv.fail, srv.rows_held, srv.entered = gate, fail, rows_held, entered
        yield srv
        gate.set()


def test_over_max_concurrency_gets_429_and_waiting_requests_hold_no_rows(gated):
    """8 requests admitted (4 run, 4 wait) while the first round is held: the 9th gets 429. Once released, all 8
    complete; the engine never held more rows than the batch (waiting requests stay out of the engine)."""
    gated.gate.clear()
    results: list = []
    threads = [threading.Thread(target=lambda i=i: results.append(post(gated, "/v1/completions",
                                                                       {**COMP, "max_tokens": 6 + i})))
               for i in range(8)]
    for t in threads:
        t.start()
    wait_for(lambda: metric(metrics(gated), "verispec_requests_in_flight") == 8, what="8 admitted requests")
    status, body = post(gated, "/v1/completions", COMP)
    assert status == 429 and "limit of 8 concurrent requests" in body["error"]["message"]
    assert body["error"]["type"] == "rate_limit_error"
    gated.gate.set()
    for t in threads:
        t.join(TIMEOUT)
    assert sorted(len(r[1]["choices"][0]["text"]) for r in results if r[0] == 200) == list(range(6, 14))
    assert max(gated.rows_held) == 4
    assert post(gated, "/v1/completions", COMP)[0] == 200  # slots are free again
    # more choices than the server has slots could never run: a 400 naming n, not a 429 to retry
    status, body = post(gated, "/v1/completions", {**COMP, "n": 9})
    assert status == 400 and body["error"]["param"] == "n" and "--max-concurrency" in body["error"]["message"]


def test_rows_of_a_round_in_progress_count_as_running_not_waiting(gated):
    """A request of n = 4 choices reaching an idle server: its 4 rows are admitted and their first round runs (held
    here). Meanwhile /metrics counts them as running, not as queued: the gauges were read before admission, so a
    long first round once showed queue_depth 4 (8 for two such requests), running 0, as if the scheduler had stopped
    admitting."""
    gated.gate.clear()
    result: list = []
    client_thread = threading.Thread(target=lambda: result.append(
        post(gated, "/v1/completions", {**COMP, "max_tokens": 2, "n": 4, "seed": 5, "logprobs": 1})))
    client_thread.start()
    try:
        assert gated.entered.wait(TIMEOUT), "no round began"
        wait_for(lambda: metric(metrics(gated), "verispec_running") == 4, timeout=10.0,
                 what="the 4 rows of the round in progress counted as running")
        s = metrics(gated)
        assert metric(s, "verispec_queue_depth") == 0
        assert metric(s, "verispec_requests_in_flight") == 4
    finally:
        gated.gate.set()
        client_thread.join(TIMEOUT)
    assert not client_thread.is_alive() and result[0][0] == 200 and len(result[0][1]["choices"]) == 4
    wait_for(lambda: metric(metrics(gated), "verispec_running") == 0, what="the finished rows leaving the gauge")


def test_a_failing_round_fails_only_its_requests(gated):
    """An engine round that raises: its request gets a 500 naming the error (streamed: an error event), the
    worker goes on and the next request is served."""
    gated.fail.set()
    status, body = post(gated, "/v1/completions", COMP)
    assert status == 500 and "RuntimeError: injected failure" in body["error"]["message"]
    assert body["error"]["type"] == "server_error"
    gated.fail.set()
    req = urllib.request.Request(gated.url + "/v1/completions", data=json.dumps({**COMP, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=TIMEOUT) as resp:
        events = [line for line in resp.read().decode().split("\n\n") if line]
    assert "injected failure" in json.loads(events[-2][len("data: "):])["error"]["message"]
    assert events[-1] == "data: [DONE]"
    status, body = post(gated, "/v1/completions", COMP)
    assert status == 200 and len(body["choices"][0]["text"]) == 4
    s = metrics(gated)
    assert metric(s, "verispec_engine_round_failures_total") == 2
    assert metric(s, "verispec_requests_finished_total", finish_reason="error") == 2
    assert get_json(gated, "/health")[0] == 200


# ------------------------------------------------------------------------------------------- metrics


def test_metrics_parse_and_count_what_was_served(server):
    before = metrics(server)
    c = client(server)
    c.completions.create(model=MODEL, prompt="count me", max_tokens=10, temperature=0)
    _, _, last = collect_stream(c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "me too"}], max_tokens=7, temperature=0.7, seed=1,
        stream=True, stream_options={"include_usage": True},
        extra_body={"verification": {"rule": "lenience", "params": {"l": 0.5}}, "speculative": {"gamma": 5}}))
    post(server, "/v1/completions", {**COMP, "n": 0})
    after = metrics(server)

    def delta(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert delta("verispec_requests_total", endpoint="/v1/completions", status="200") == 1
    assert delta("verispec_requests_total", endpoint="/v1/completions", status="400") == 1
    assert delta("verispec_requests_total", endpoint="/v1/chat/completions", status="200") == 1
    assert delta("verispec_completion_tokens_total") == 17
    assert delta("verispec_prompt_tokens_total") == 8 + last.usage.prompt_tokens
    assert delta("verispec_requests_finished_total", finish_reason="length") == 2
    assert delta("verispec_block_efficiency_count", rule="lossless") == 1
    assert delta("verispec_block_efficiency_count", rule="lenience") == 1
    assert delta("verispec_acceptance_fraction_count", rule="lenience") == 1
    vs = last.model_extra["verispec"]["metrics"]
    assert delta("verispec_drafted_tokens_total", rule="lenience") == vs["drafted"] > 0
    assert delta("verispec_accepted_tokens_total", rule="lenience") == vs["accepted"]
    assert delta("verispec_time_to_first_token_seconds_count") == 2
    assert delta("verispec_request_latency_seconds_count") == 2
    # the gauges are set by the worker after its round, which may end just after the client got its last byte
    wait_for(lambda: (m := metrics(server)) and metric(m, "verispec_queue_depth") == 0
             and metric(m, "verispec_running") == 0, what="the queue and running gauges to return to 0")


# ------------------------------------------------------------------------------------------- the real pair


@pytest.mark.real
@pytest.mark.slow
def test_real_pair_streamed_chat(real_engine_fast):
    """The real pair with its draft model (on the fastest backend installed): one streamed chat request of 16
    tokens through the official client, the same text as the engine's own greedy decode."""
    from verispec import models

    engine = real_engine_fast
    with BackgroundServer(create_app(engine, model_name=models.DEFAULT_TARGET)) as srv:
        stream = client(srv).chat.completions.create(
            model=models.DEFAULT_TARGET, messages=[{"role": "user", "content": "Write a haiku about caches."}],
            max_tokens=16, temperature=0, stream=True, stream_options={"include_usage": True})
        text, chunks, last = collect_stream(stream)
    assert text.strip() and last.usage.completion_tokens <= 16
    vs = last.model_extra["verispec"]
    assert vs["rule"] == "lossless" and vs["metrics"]["drafted"] > 0
    ref = engine.generate("Write a haiku about caches.", chat=True, sampling=GREEDY, max_new_tokens=16)
    assert text == ref.text
