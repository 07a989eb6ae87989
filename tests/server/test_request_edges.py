"""Requests at the edges of what clients send, on a toy server through the official client and raw bodies:

- ``GET /v1/models/{id}`` (the client's ``models.retrieve``): the card, or 404 ``model_not_found``;
- a body JSON's parser itself refuses (nested too deeply, an integer over Python's 4300 digits) is a 400
  ``invalid_json``, not a 500;
- a lone UTF-16 surrogate escape (no text: it cannot be written back as UTF-8) is a 400 naming its field, where
  an echoed prompt holding one was a 500;
- ``null`` for ``stream``, ``echo`` and ``stream_options.include_usage`` reads as false, as OpenAI's schema allows;
- logprobs asked for and no token kept (a stop string matched at once): an empty list, not null.
"""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from test_server import MODEL, client, metric, metrics, post  # noqa: E402  (the server tests' helpers)

from verispec.server import Limits, create_app  # noqa: E402
from verispec.server.background import BackgroundServer  # noqa: E402
from verispec.testing import toy_engine  # noqa: E402


@pytest.fixture(scope="module")
def server():
    app = create_app(toy_engine("model", cache=False), model_name=MODEL, max_batch=8, max_concurrency=8,
                     limits=Limits(max_prompt_tokens=200, max_tokens_limit=64))
    with BackgroundServer(app) as srv:
        yield srv


def test_a_model_is_retrieved_by_id(server):
    card = client(server).models.retrieve(MODEL)
    assert card.id == MODEL and card.object == "model"
    with pytest.raises(openai.NotFoundError) as err:
        client(server).models.retrieve("gpt-4")
    assert err.value.body["code"] == "model_not_found" and err.value.body["param"] == "model"
    # counted under the route, whatever the id
    counts = metrics(server)
    for status in ("200", "404"):
        assert metric(counts, "verispec_requests_total", endpoint="/v1/models/{model}", status=status) == 1


@pytest.mark.parametrize("raw", [
    b'{"model": "toy", "prompt": "hi", "metadata": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"model": "toy", "prompt": "hi", "seed": ' + b"9" * 5000 + b"}",
], ids=["nested", "long-integer"])
def test_a_body_the_json_parser_refuses_is_a_400(server, raw):
    status, body = post(server, "/v1/completions", raw)
    assert status == 400 and body["error"]["code"] == "invalid_json", body


@pytest.mark.parametrize(("path", "raw", "param"), [
    ("/v1/completions", b'{"model": "toy", "prompt": "hi\\ud800", "echo": true, "max_tokens": 2}', "prompt"),
    ("/v1/chat/completions", b'{"model": "toy", "messages": [{"role": "user", "content": "a\\udc00"}]}',
     "messages[0].content"),
    ("/v1/completions", b'{"model": "toy", "prompt": "hi", "metadata": {"k\\ud800": 1}}', "metadata.k\\ud800"),
])
def test_a_lone_surrogate_is_a_400_naming_its_field(server, path, raw, param):
    status, body = post(server, path, raw)
    assert status == 400 and body["error"]["param"] == param and "surrogate" in body["error"]["message"], body


def test_null_flags_read_as_false(server):
    status, body = post(server, "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 3,
                                                    "temperature": 0, "stream": None, "echo": None,
                                                    "stream_options": {"include_usage": None}})
    assert status == 200 and body["object"] == "text_completion" and body["usage"]["completion_tokens"] == 3
    status, body = post(server, "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user",
                        "content": "hi"}], "max_tokens": 3, "temperature": 0, "stream": None})
    assert status == 200 and body["object"] == "chat.completion"


def test_logprobs_of_an_empty_answer_are_an_empty_list(server):
    """A stop string that the first token's text starts: the answer is "", and the logprobs asked for list no
    token (null made clients that read ``logprobs.content`` fail)."""
    c = client(server)
    first = c.completions.create(model=MODEL, prompt="hello", max_tokens=4, temperature=0).choices[0].text
    r = c.completions.create(model=MODEL, prompt="hello", max_tokens=4, temperature=0, stop=[first[0]], logprobs=1)
    assert r.choices[0].text == "" and r.choices[0].finish_reason == "stop"
    assert r.choices[0].logprobs.tokens == [] and r.choices[0].logprobs.token_logprobs == []
    msgs = [{"role": "user", "content": "hello"}]
    first = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=4, temperature=0)
    stop = first.choices[0].message.content[0]
    r = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=4, temperature=0, stop=stop, logprobs=True,
                                  top_logprobs=2)
    assert r.choices[0].message.content == "" and r.choices[0].logprobs.content == []
    status, body = post(server, "/v1/chat/completions", {"model": MODEL, "messages": msgs, "max_tokens": 4,
                                                         "temperature": 0, "stop": stop, "logprobs": True})
    assert status == 200 and body["choices"][0]["logprobs"] == {"content": []}
