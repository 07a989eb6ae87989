"""Tool calling on the chat endpoint: the request fields checked, calls read back from the model's text, the
forced-call grammar (exactly the permitted function, arguments valid under its schema), and the real pair through
the official client: a forced call parses and validates, streamed equals non-streamed, and a tool conversation
(assistant ``tool_calls`` + ``tool`` result) is rendered by the model's template and answered."""

from __future__ import annotations

import json

import pytest

from verispec.core.sampling import SamplingConfig
from verispec.server.tools import ToolError, parse_tool_calling, split_tool_calls, template_messages

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}


def test_tool_choice_readings():
    assert parse_tool_calling(None, None) is None and parse_tool_calling([], "auto") is None
    assert parse_tool_calling([WEATHER], "none") is None  # tools left out, nothing parsed
    auto = parse_tool_calling([WEATHER, TIME], None)
    assert auto.choice == "auto" and not auto.forced and auto.names == ("get_weather", "get_time")
    assert auto.response_format() is None
    assert parse_tool_calling([WEATHER, TIME], "required").forced
    named = parse_tool_calling([WEATHER, TIME], {"type": "function", "function": {"name": "get_time"}})
    assert named.choice == "get_time" and '"const": "get_time"' in named.response_format()["grammar"]
    assert "get_weather" not in named.response_format()["grammar"]
    for tools, choice, param in [([WEATHER, WEATHER], None, "tools"), ("x", None, "tools"),
                                 ([{"type": "function"}], None, "tools[0].function"),
                                 ([WEATHER], "sometimes", "tool_choice"), (None, "required", "tool_choice")]:
        with pytest.raises(ToolError) as err:
            parse_tool_calling(tools, choice)
        assert err.value.param == param


def test_calls_are_read_from_the_text():
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}\n'
            '</tool_call>\n<tool_call>\n{"name": "launch", "arguments": {}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}\n</tool_call>')  # unknown, malformed
    content, calls = split_tool_calls(text, ("get_weather", "get_time"))
    assert [c["function"]["name"] for c in calls] == ["get_weather"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo", "unit": "celsius"}
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")
    assert content.startswith("Let me check.") and "launch" in content and "get_weather" not in content
    assert split_tool_calls("no calls here", ("get_weather",)) == ("no calls here", [])
    only, calls = split_tool_calls('<tool_call>{"name": "get_time", "arguments": {"zone": "UTC"}}</tool_call>',
                                   ("get_time",))
    assert only is None and len(calls) == 1


def test_tool_conversation_messages_take_the_templates_form():
    msgs = [{"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather",
                                                              "arguments": '{"city": "Oslo", "unit": "celsius"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "3 C, snow"}]
    out = template_messages(msgs)
    assert out[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo", "unit": "celsius"}
    assert out[1]["content"] == "" and out[2] == msgs[2]
    with pytest.raises(ToolError) as err:
        template_messages([{"role": "user", "content": "x", "tool_calls": [{}]}])
    assert err.value.param == "messages[0].tool_calls"


# ------------------------------------------------------------------------------------------- the real pair


@pytest.fixture(scope="module")
def tokenizer():
    from verispec import models
    from verispec.testing import skip_unless_real_pair

    skip_unless_real_pair()
    return models.load_tokenizer(models.DEFAULT_TARGET)


@pytest.mark.real
def test_forced_call_arguments_are_always_an_object(tokenizer):
    """``parameters`` with properties but no ``type``: the forced-call grammar refuses non-object arguments (it
    admitted ``"arguments": 5``, which split_tool_calls does not read as a call) and still takes an object;
    ``parameters`` of another type are refused, naming the field."""
    from verispec.runtime.grammar import GrammarCompiler

    eos = 151645
    compiler = GrammarCompiler(tokenizer, 151936, [eos])
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"properties": {"a": {"type": "string"}}}}}]
    fmt = parse_tool_calling(tools, "required").response_format(compiler.literal)

    def accepted(arguments: str) -> bool:
        text = f'<tool_call>\n{{"name": "f", "arguments": {arguments}}}\n</tool_call>'
        ids = tokenizer.encode(text, add_special_tokens=False) + [eos]
        return compiler.constraint(fmt).valid_prefix(ids) == len(ids)

    assert not accepted("5") and not accepted('"a"')
    assert accepted('{"a": "x"}')
    assert split_tool_calls('<tool_call>{"name": "f", "arguments": {"a": "x"}}</tool_call>', ("f",))[1]
    bad = [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]
    with pytest.raises(ToolError) as err:
        parse_tool_calling(bad, "required")
    assert err.value.param == "tools[0].function.parameters"


@pytest.mark.real
def test_forced_call_grammar_admits_exactly_valid_calls(tokenizer):
    """The forced-call grammar on the real tokenizer: a valid call of the named function then the end token is
    accepted to the end; a wrong function name, a missing required argument or a value outside its enum is cut
    where it goes wrong."""
    from verispec.runtime.grammar import GrammarCompiler

    eos = 151645
    compiler = GrammarCompiler(tokenizer, 151936, [eos])
    fmt = parse_tool_calling([WEATHER, TIME], {"type": "function", "function": {"name": "get_weather"}}
                             ).response_format(compiler.literal)
    # the marker is its token where llguidance holds Qwen2.5's added token special (1.7.6 and 1.9.1 do), else text;
    # either way the tokenizer's own encoding of a call is accepted, checked below
    assert compiler.literal("<tool_call>") in ('"<tool_call>"', "<[151657]>")
    assert compiler.literal("plain text") == '"plain text"'

    def valid(body: str) -> tuple[int, int]:
        ids = tokenizer.encode(f"<tool_call>\n{body}\n</tool_call>", add_special_tokens=False) + [eos]
        return compiler.constraint(fmt).valid_prefix(ids), len(ids)

    n, total = valid('{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}')
    assert n == total
    for bad in ('{"name": "get_time", "arguments": {"zone": "CET"}}',
                '{"name": "get_weather", "arguments": {"city": "Oslo"}}',
                '{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "kelvin"}}'):
        n, total = valid(bad)
        assert n < total - 2, bad

    # speculative verification consumes each candidate prefix and rolls back over it, the marker token included:
    # after every prefix of a call has been scored on one row, the row still accepts the whole call, then takes it
    good = '{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}'
    ids = tokenizer.encode(f"<tool_call>\n{good}\n</tool_call>", add_special_tokens=False)
    row = compiler.constraint(fmt)
    for k in range(len(ids)):
        mask = row.allowed(ids[:k])
        assert mask is not None and bool(mask[ids[k]]) and not bool(mask[eos]), k
    assert row.valid_prefix(ids + [eos]) == len(ids) + 1
    row.commit(ids)
    assert bool(row.allowed([])[eos])


@pytest.mark.real
@pytest.mark.slow
def test_real_pair_forced_tool_call_through_the_client(real_engine_fast):
    """The real pair served (on the fastest backend installed), the official client: ``tool_choice`` naming a
    function gives exactly one call of it whose arguments validate against its schema, ``finish_reason``
    ``tool_calls``, no content; the streamed answer (tool_calls delta) equals the non-streamed one; a tool
    conversation is answered as text."""
    jsonschema = pytest.importorskip("jsonschema")
    openai = pytest.importorskip("openai")
    from verispec.server import create_app
    from verispec.server.background import BackgroundServer

    msgs = [{"role": "user", "content": "I am going to Oslo. Should I pack a coat?"}]
    kw = dict(model="m", messages=msgs, tools=[WEATHER, TIME], temperature=0, max_tokens=48,
              tool_choice={"type": "function", "function": {"name": "get_weather"}},
              extra_body={"speculative": {"gamma": 3}})
    with BackgroundServer(create_app(real_engine_fast, model_name="m")) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", timeout=300.0, max_retries=0)
        r = client.chat.completions.create(**kw)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (call,) = choice.message.tool_calls
        args = json.loads(call.function.arguments)
        assert call.function.name == "get_weather" and call.type == "function"
        jsonschema.validate(args, WEATHER["function"]["parameters"])
        assert r.model_extra["verispec"]["metrics"]["drafted"] > 0

        streamed, finish = {}, None
        for chunk in client.chat.completions.create(**kw, stream=True):
            for c in chunk.choices:
                for d in c.delta.tool_calls or []:
                    streamed[d.index] = (d.function.name, d.function.arguments)
                finish = c.finish_reason or finish
        assert streamed == {0: (call.function.name, call.function.arguments)} and finish == "tool_calls"

        followup = msgs + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                           {"role": "tool", "tool_call_id": call.id, "content": "-3 C, snow"}]
        r2 = client.chat.completions.create(model="m", messages=followup, tools=[WEATHER, TIME], temperature=0,
                                            max_tokens=8)
        answer = r2.choices[0]
        assert (answer.message.content or answer.message.tool_calls) and answer.finish_reason != "error"
    ref = real_engine_fast.generate("hi", chat=True, sampling=SamplingConfig(temperature=0), max_new_tokens=1)
    assert ref.token_ids  # the engine still serves after the server stopped
