"""Per-token verification details (``token_details``): marks, p, q, the induced law, acceptance and TV, in the engine
and through the server; the rule registry's description and the page's form built from the server's schema."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
import torch

from verispec.analysis.exact import lenience_closed_form, tv
from verispec.core import rules
from verispec.core.sampling import SamplingConfig
from verispec.runtime.details import MARKS, round_details
from verispec.runtime.engine import Engine
from verispec.runtime.scheduler import Scheduler
from verispec.runtime.types import GenerationResult, Request
from verispec.testing import toy_engine

SAMPLED = SamplingConfig(temperature=1.0)


def generate(engine: Engine, prompt: str, **settings: object) -> GenerationResult:
    """One request through the Scheduler, as the server runs it."""
    sched = Scheduler(engine, max_batch=1)
    handle = sched.submit(Request(prompt, **settings))
    sched.run()
    return handle.result


def _dists(seed: int, n: int, vocab: int = 12) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(n, vocab, generator=g, dtype=torch.float64) * 2, -1)


def test_round_details_match_the_closed_form_and_name_the_marks():
    p, q = _dists(0, 3), _dists(1, 2)
    rule = rules.get("lenience", l=0.5)
    drafted = [int(q[0].argmax()), int(q[1].argmax())]
    # one draft accepted, the second rejected and corrected
    out = round_details([rule] * 3, p, q, drafted, [drafted[0], 7], accepted=1, top=12, round_index=4)
    assert [d.mark for d in out] == ["accepted", "correction"]
    assert [d.drafted for d in out] == drafted and all(d.round == 4 and d.gamma == 2 for d in out)
    for i, d in enumerate(out):
        law, _ = lenience_closed_form(p[i], q[i], 0.5)  # Eq. 10-11: an independent formula of the same law
        order = torch.tensor(d.top)
        assert sorted(d.top) == list(range(12))  # top 12 of 12 tokens: all of them
        assert torch.allclose(torch.tensor(d.law, dtype=torch.float64), law[order], atol=1e-12)
        assert torch.allclose(torch.tensor(d.p, dtype=torch.float64), p[i][order])
        assert d.tv == pytest.approx(float(tv(law, p[i])), abs=1e-12)
        assert d.accept_prob == pytest.approx(min(1.0, float(p[i, drafted[i]] / (0.5 * q[i, drafted[i]]))))
        assert d.acceptance == pytest.approx(float((q[i] * torch.clamp(p[i] / (0.5 * q[i]), max=1)).sum()))
    # every draft kept: the last token is the bonus, drawn from p (no q, TV 0 under lenience)
    full = round_details([rule] * 3, p, q, drafted, drafted + [3], accepted=2, top=3, round_index=0)
    assert [d.mark for d in full] == ["accepted", "accepted", "bonus"]
    bonus = full[-1]
    assert bonus.q is None and bonus.accept_prob is None and bonus.tv == 0.0 and 3 in bonus.top
    assert len(bonus.top) <= 4  # top 3 of the law and p (the same here), plus the emitted token


@pytest.fixture(scope="module")
def engine() -> Engine:
    return toy_engine("model", cache=False)


@pytest.mark.parametrize("rule", ["lossless", "lenience"])
def test_engine_details_agree_with_the_tokens_and_metrics(engine, rule):
    res = generate(engine, "hello world", rule=rule, sampling=SAMPLED, gamma=3, max_new_tokens=40, seed=5,
                          token_details=4)
    details = res.token_details
    assert [d.token for d in details] == res.token_ids
    assert {d.mark for d in details} <= set(MARKS) and "accepted" in {d.mark for d in details}
    assert sum(d.mark == "accepted" for d in details) == res.metrics.emitted_accepted
    assert len({d.round for d in details}) == res.metrics.rounds
    for d in details:
        assert d.token in d.top and len(d.p) == len(d.law) == len(d.top)
        if d.mark == "accepted":
            assert d.drafted == d.token and 0 < d.accept_prob <= 1
        if d.mark == "correction":
            assert d.drafted is not None and d.drafted != d.token or d.accept_prob < 1
        if rule == "lossless":
            assert d.tv == pytest.approx(0.0, abs=1e-9)  # a lossless rule induces p
    if rule == "lenience":
        assert max(d.tv for d in details) > 0.01  # lenience l = 0.5 moves away from p


def test_details_change_nothing_and_cost_nothing_when_not_asked(engine, monkeypatch):
    with_details = generate(engine, "abc abc abc", rule="lenience", sampling=SAMPLED, gamma=4, max_new_tokens=30,
                                   seed=9, token_details=2)

    def refuse(*_args, **_kwargs):
        raise AssertionError("details computed for a request that did not ask")

    monkeypatch.setattr(Engine, "_details", refuse)
    plain = generate(engine, "abc abc abc", rule="lenience", sampling=SAMPLED, gamma=4, max_new_tokens=30, seed=9)
    assert plain.token_details is None and "token_details" not in plain.to_dict()
    assert plain.token_ids == with_details.token_ids  # the same draws: the report takes no randomness


def test_describe_publishes_the_ranges_the_rules_enforce():
    described = rules.describe()
    assert list(described) == rules.names()
    checked = 0
    for name, rule in described.items():
        for pname, p in rule["params"].items():
            if p.get("enum"):
                with pytest.raises(ValueError):
                    rules.get(name, **{pname: "no-such-choice"})
                for choice in p["enum"]:
                    rules.get(name, **{pname: choice})
                continue
            lo = p.get("minimum", p.get("exclusiveMinimum"))
            hi = p.get("maximum", p.get("exclusiveMaximum"))
            for bad in (lo - 1e-9 if "minimum" in p else lo, hi + 1e-9 if "maximum" in p else hi):
                with pytest.raises(ValueError, match=pname):
                    rules.get(name, **{pname: bad})
            inside = (lo + hi) / 2 if not (name == "overshoot-ceiling" and pname == "lam") else 0.7
            rules.get(name, **{pname: inside})
            checked += 1
    assert checked >= 10


# ------------------------------------------------------------------------------------------- through the server


@pytest.fixture(scope="module")
def server():
    pytest.importorskip("uvicorn")
    from verispec.server import create_app
    from verispec.server.background import BackgroundServer

    # an engine of its own (the same toy pair): the worker thread owns it, the tests' references use ``engine``
    with BackgroundServer(create_app(toy_engine("model", cache=False), model_name="toy")) as srv:
        yield srv


def _post(srv, body: dict) -> tuple[int, bytes]:
    req = urllib.request.Request(srv.url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


BODY = {"model": "toy", "prompt": "hello world", "max_tokens": 24, "temperature": 1, "seed": 2,
        "verification": {"rule": "lenience", "params": {"l": 0.5}, "token_details": 3}, "speculative": {"gamma": 3}}


def test_server_streams_each_tokens_details_with_its_text(server, engine):
    status, raw = _post(server, {**BODY, "stream": True})
    assert status == 200
    chunks = [json.loads(line[6:]) for line in raw.decode().split("\n\n") if line.startswith("data: {")]
    text, details = "", []
    for ch in chunks:
        for c in ch["choices"]:
            text += c["text"]
            details += c.get("token_details") or []
            if c.get("token_details"):
                assert "".join(d["text"] for d in c["token_details"]) == c["text"]
    ref = generate(engine, "hello world", rule=rules.get("lenience", l=0.5), sampling=SAMPLED, gamma=3,
                          max_new_tokens=24, seed=2, token_details=3)
    assert text == ref.text and [d["token"] for d in details] == ref.token_ids
    assert [d["mark"] for d in details] == [d.mark for d in ref.token_details]
    assert [d["tv"] for d in details] == [d.tv for d in ref.token_details]
    assert all(len(d["top_text"]) == len(d["top"]) for d in details)
    status, raw = _post(server, BODY)  # not streamed: every entry in the choice
    choice = json.loads(raw)["choices"][0]
    assert "".join(d["text"] for d in choice["token_details"]) == choice["text"] == ref.text
    status, raw = _post(server, {**BODY, "verification": {"rule": "lossless"}})
    assert status == 200 and "token_details" not in json.loads(raw)["choices"][0]


def test_server_refuses_a_bad_token_details_naming_it(server):
    status, raw = _post(server, {**BODY, "verification": {"token_details": 21}})
    assert status == 400 and json.loads(raw)["error"]["param"] == "verification.token_details"


def test_page_form_comes_from_the_schema_and_the_registry(server):
    from verispec.server.page import form_spec

    with urllib.request.urlopen(server.url + "/", timeout=30) as resp:
        html = resp.read().decode()
    with urllib.request.urlopen(server.url + "/openapi.json", timeout=30) as resp:
        doc = json.loads(resp.read())
    assert '<label for="rule-a">Rule</label><select id="rule-a"' in html
    for name in rules.names():
        assert f'<option value="{name}"' in html
    assert 'id="param-a-lenience-l"' in html and "(0, 1]" in html
    spec = form_spec(doc)
    names = [f["name"] for f in spec["sampling"]]
    assert {"temperature", "top_p", "max_tokens", "seed"} <= set(names)
    for name in names:
        assert f'data-field="{name}"' in html
    # a field the schema gains is a field the form shows: no list of its own
    props = doc["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    props["novel_penalty"] = {"anyOf": [{"type": "number", "minimum": 0, "maximum": 3}, {"type": "null"}]}
    added = next(f for f in form_spec(doc)["sampling"] if f["name"] == "novel_penalty")
    assert added["range"] == "[0, 3]"
    for name in ("page.js", "page.css"):
        with urllib.request.urlopen(f"{server.url}/static/{name}", timeout=30) as resp:
            body = resp.read().decode()
        assert "http://" not in body.replace("http://www.w3.org/2000/svg", "") and "https://" not in body


def test_several_clients_at_once_each_get_their_own_details(server, engine):
    """Requests that share engine rounds (as several pages open at once do) get the details of their own tokens."""
    from concurrent.futures import ThreadPoolExecutor

    def streamed(seed: int) -> tuple[str, list[dict]]:
        status, raw = _post(server, {**BODY, "seed": seed, "stream": True})
        assert status == 200
        text, details = "", []
        for line in raw.decode().split("\n\n"):
            if line.startswith("data: {"):
                for c in json.loads(line[6:])["choices"]:
                    text += c["text"]
                    details += c.get("token_details") or []
        return text, details

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(streamed, range(10, 14)))
    for seed, (text, details) in zip(range(10, 14), got, strict=True):
        ref = generate(engine, "hello world", rule=rules.get("lenience", l=0.5), sampling=SAMPLED, gamma=3,
                       max_new_tokens=24, seed=seed, token_details=3)
        assert text == ref.text and [d["mark"] for d in details] == [d.mark for d in ref.token_details]


def test_a_deterministic_server_gives_every_page_the_same_details():
    """``verispec serve --deterministic`` (every row on backends of its own) with 4 seeded identical requests at once:
    the same text and the same per-token details for each, whatever else shares their rounds."""
    pytest.importorskip("uvicorn")
    from concurrent.futures import ThreadPoolExecutor

    from verispec.server import create_app
    from verispec.server.background import BackgroundServer

    with BackgroundServer(create_app(toy_engine("model", cache=False, deterministic=True), model_name="toy",
                                     max_batch=4)) as srv:
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(lambda _: _post(srv, BODY), range(4)))
    assert all(status == 200 for status, _ in got)
    choices = [json.loads(raw)["choices"][0] for _, raw in got]
    assert len({c["text"] for c in choices}) == 1 and choices[0]["text"]
    assert all(c["token_details"] == choices[0]["token_details"] for c in choices)
    assert {d["mark"] for d in choices[0]["token_details"]} <= set(MARKS)
