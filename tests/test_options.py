"""The request schema (verispec.options): every front door is a view of it. A new option declared in the schema
alone appears in `verispec generate --help`, in `verispec.generate`'s signature, as a `Request` field and in the
server's OpenAPI schema; the CLI, the API and the server refuse the same bad values with the same words; defaults
are resolved once."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from click.testing import CliRunner

import verispec
from verispec.cli.main import main
from verispec.defaults import AUTO, DEFAULT_RULE, SERVING_GAMMA
from verispec.options import OPTIONS, OptionError, check
from verispec.runtime.types import Request

#: (option, bad value as the API and the server take it, the same value on the command line)
BAD = [
    ("temperature", -1, "-1"),
    ("temperature", 3, "3"),
    ("top_p", 0, "0"),
    ("top_k", 0, "0"),
    ("min_p", 2, "2"),
    ("repetition_penalty", 0, "0"),
    ("presence_penalty", 3, "3"),
    ("seed", -3, "-3"),
    ("max_new_tokens", 0, "0"),
    ("verifier", "blocky", "blocky"),
    ("logprobs_mode", "raw", "raw"),
    ("greedy_lossy", "maybe", "maybe"),
    ("gamma", 1000, "1000"),
    ("gamma", -1, "-1"),
]

#: what a new option declared in the schema alone looks like to each front door, read in a fresh interpreter
NEW_OPTION = """
import inspect, json, sys
import verispec.options as o
o.OPTIONS["draft_budget_ms"] = o.Option("draft_budget_ms", "int", None, "A new option, declared once.",
                                        nullable=True, ge=1, server="speculative.draft_budget_ms")
from click.testing import CliRunner
from verispec.cli.main import main
from verispec.api import generate
from verispec.runtime.types import Request
from verispec.server.protocol import CompletionRequest
help_text = CliRunner().invoke(main, ["generate", "--help"]).output
schema = CompletionRequest.model_json_schema()
spec = schema["$defs"]["Speculative"]["properties"]
print(json.dumps({"cli": "--draft-budget-ms" in help_text,
                  "api": "draft_budget_ms" in inspect.signature(generate).parameters,
                  "request": "draft_budget_ms" in Request.__dataclass_fields__, "server": spec.get("draft_budget_ms")}))
"""


def test_a_new_option_reaches_every_front_door():
    out = subprocess.run([sys.executable, "-c", NEW_OPTION], capture_output=True, text=True, check=True, timeout=120)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["cli"] and seen["api"] and seen["request"]
    assert seen["server"] is not None and seen["server"]["description"] == "A new option, declared once."
    assert {"type": "integer", "minimum": 1} in seen["server"]["anyOf"]


def test_every_option_is_at_every_front_door_it_declares():
    params = inspect.signature(verispec.generate).parameters
    help_text = CliRunner().invoke(main, ["generate", "--help"]).output
    from verispec.server.protocol import ChatCompletionRequest

    schema = ChatCompletionRequest.model_json_schema()
    for opt in OPTIONS.values():
        assert opt.name in params and params[opt.name].default == opt.default, opt.name
        assert opt.name in Request.__dataclass_fields__ or opt.group == "sampling", opt.name
        assert (opt.flag in help_text) == opt.cli, opt.name
        if opt.field:
            top, _, sub = opt.field.partition(".")
            props = schema["properties"] if not sub else schema["$defs"][top.capitalize()]["properties"]
            assert (sub or top) in props, opt.field


def _words(message: str, label: str) -> str:
    """A refusal with the field's name as the front door wrote it replaced by one placeholder."""
    return message.replace(label, "NAME", 1)


@pytest.mark.parametrize("name, value, text", BAD)
def test_the_api_and_the_cli_refuse_with_the_same_words(name, value, text):
    opt = OPTIONS[name]
    with pytest.raises(OptionError) as api:
        verispec.generate("hi", **{name: value})  # refused before any model loads
    res = CliRunner().invoke(main, ["generate", "hi", opt.flag, text])
    assert res.exit_code == 1 and "Traceback" not in res.output
    cli = res.output.strip().removeprefix("Error: ")
    assert _words(str(api.value), name) == _words(cli, opt.flag), (str(api.value), cli)


@pytest.fixture(scope="module")
def server():
    pytest.importorskip("fastapi")
    from verispec.server import create_app
    from verispec.server.background import BackgroundServer
    from verispec.testing import toy_engine

    with BackgroundServer(create_app(toy_engine("model", cache=False), model_name="toy")) as srv:
        yield srv


def _post(srv, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(srv.url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _body(field: str, value: object) -> dict:
    body: dict = {"model": "toy", "prompt": "hi", "max_tokens": 2}
    top, _, sub = field.partition(".")
    if sub:
        body[top] = {sub: value}
    else:
        body[top] = value
    return body


@pytest.mark.parametrize("name, value, text", BAD)
def test_the_server_refuses_with_the_same_words(server, name, value, text):
    field = OPTIONS[name].field
    status, body = _post(server, _body(field, value))
    assert status == 400 and body["error"]["param"] == field
    with pytest.raises(OptionError) as api:
        check(name, value)
    assert _words(body["error"]["message"], field) == _words(str(api.value), name)


def test_defaults_are_resolved_once():
    assert OPTIONS["gamma"].default == SERVING_GAMMA == AUTO
    assert Request([1]).gamma == AUTO and Request([1]).rule == DEFAULT_RULE
    assert inspect.signature(verispec.generate).parameters["gamma"].default == AUTO
    from verispec.runtime.engine import Engine

    assert inspect.signature(Engine.generate).parameters["gamma"].default == AUTO


def test_option_check_can_fail_and_normalizes():
    assert check("stop", "x") == ["x"]
    assert check("logit_bias", {3: 1}) == {3: 1.0}
    with pytest.raises(OptionError, match="keys must be token ids"):
        check("logit_bias", {"3": 1.0})  # a JSON object's key is read as an id only from a request body
    assert OPTIONS["logit_bias"].check({"3": 1.0}, json_body=True) == {3: 1.0}
    with pytest.raises(OptionError, match="must be a number"):
        check("temperature", True)


def test_every_registered_verifier_has_one_implementation_and_one_error():
    """The verifier registry's capabilities are data, and each non-token verifier has its chain implementation in
    the engine (and nothing else does); every registry refuses an unknown name with one message."""
    from verispec.core import rules
    from verispec.defaults import DRAFTERS, TARGET_BACKENDS, VERIFIERS
    from verispec.eval.tasks import TASKS
    from verispec.registry import UnknownName
    from verispec.runtime.engine import CHAIN_VERIFIERS

    assert set(CHAIN_VERIFIERS) == {name for name in VERIFIERS if name != "token"}
    assert all(VERIFIERS[name].lossless_only and VERIFIERS[name].chains_only for name in CHAIN_VERIFIERS)
    for registry, kind in ((rules.REGISTRY, "rule"), (DRAFTERS, "drafter"), (VERIFIERS, "verifier"),
                           (TARGET_BACKENDS, "target backend"), (TASKS, "task")):
        with pytest.raises(UnknownName, match=f"^unknown {kind} 'nope'; available: "):
            registry["nope"]
