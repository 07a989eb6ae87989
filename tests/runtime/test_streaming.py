"""Incremental detokenization (TextStream) and the streaming ``verispec generate`` / ``verispec serve`` commands
(on the toy pair: the CLI's model loading is replaced by the toy engine)."""

from __future__ import annotations

import json
import random

import click
import pytest
from click.testing import CliRunner

import verispec.api
from verispec.cli.main import main
from verispec.runtime.text import TextStream
from verispec.testing import toy_engine

TEXT = "héllo wörld: 1 € = 2 ∑, naïve 🙂 done"


def byte_decode(ids):
    """A byte-level tokenizer's decode: one token per UTF-8 byte, partial characters as U+FFFD."""
    return bytes(ids).decode("utf-8", errors="replace")


def stream_all(stop, chunks):
    ts = TextStream(byte_decode, stop)
    deltas = [ts.push(c) for c in chunks]
    deltas.append(ts.finish())
    return deltas


def chunked(ids, seed):
    rng, out, i = random.Random(seed), [], 0
    while i < len(ids):
        n = rng.randint(1, 4)
        out.append(ids[i : i + n])
        i += n
    return out


@pytest.mark.parametrize("seed", range(5))
def test_multibyte_characters_are_never_split(seed):
    ids = list(TEXT.encode())
    deltas = stream_all([], chunked(ids, seed))
    assert "".join(deltas) == TEXT
    assert not any("\ufffd" in d for d in deltas)
    assert sum(bool(d) for d in deltas) > 5  # it streamed


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("stop,expected", [("wör", "héllo "), ("€", "héllo wörld: 1 "), ("done", TEXT[:-4]),
                                           ("wörx", TEXT), ("🙂", "héllo wörld: 1 € = 2 ∑, naïve ")])
def test_nothing_is_released_past_a_stop_string(seed, stop, expected):
    """The released text is the full text cut before the stop string's first occurrence (as the engine cuts it),
    and no prefix released on the way ever goes beyond it; a stop string that never completes holds back only
    until it is ruled out."""
    ids = list(TEXT.encode())
    deltas = stream_all([stop, "zzz"], chunked(ids, seed))
    out = ""
    for d in deltas:
        out += d
        assert expected.startswith(out)
    assert out == expected


def test_pushes_after_a_stop_release_nothing():
    ts = TextStream(byte_decode, ["b"])
    assert ts.push(list(b"ab")) == "a"
    assert ts.stopped and ts.push(list(b"cd")) == "" and ts.finish() == ""


# ------------------------------------------------------------------------------------------- the CLI


@pytest.fixture()
def toy(monkeypatch):
    engines = {"model": toy_engine("model"), "none": toy_engine("none")}
    chosen = {"drafter": "model"}
    monkeypatch.setattr(verispec.api, "load_engine", lambda *a, **k: engines[chosen["drafter"]])
    return chosen


def run(args):
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, (res.stdout, res.stderr)
    return res


def test_generate_streams_the_same_text_it_returns(toy, monkeypatch):
    base = ["generate", "hello", "--temperature", "0", "--max-new-tokens", "40"]
    as_json = json.loads(run([*base, "--json"]).stdout)
    waited = run([*base, "--no-stream"])
    writes: list[str] = []
    echo = click.echo

    def recording_echo(message=None, *args, **kwargs):
        if kwargs.get("nl") is False:
            writes.append(message)
        return echo(message, *args, **kwargs)

    monkeypatch.setattr(click, "echo", recording_echo)
    streamed = run(base)
    assert streamed.stdout == waited.stdout == as_json["text"] + "\n"
    assert len(writes) > 1 and "".join(writes) == as_json["text"]  # printed piece by piece
    assert "[length: reached --max-new-tokens 40" in streamed.stderr


def test_generate_stops_at_a_stop_string_and_says_why(toy):
    res = run(["generate", "hello", "--temperature", "0", "--max-new-tokens", "60", "--json"])
    text = json.loads(res.stdout)["text"]
    stop = text[25:28]
    res = run(["generate", "hello", "--temperature", "0", "--max-new-tokens", "60", "--stop", stop])
    assert res.stdout == text[: text.find(stop)] + "\n"
    assert "[stop: stop string]" in res.stderr


def test_generate_chat_default_leaves_room_for_an_answer(toy):
    toy["drafter"] = "none"
    plain = json.loads(run(["generate", "hello", "--temperature", "0", "--json"]).stdout)
    chat = json.loads(run(["generate", "hello", "--chat", "--temperature", "0", "--json"]).stdout)
    assert len(plain["token_ids"]) == 128
    assert len(chat["token_ids"]) > 128  # 512 by default; the toy model's context (512) ends it first


def test_serve_builds_the_app_with_its_options(toy, monkeypatch):
    import verispec.server

    seen = {}

    def fake_serve(engine, **kwargs):
        seen.update(kwargs)
        verispec.server.create_app(engine, **{k: v for k, v in kwargs.items()
                                              if k not in ("host", "port", "log_level")})

    monkeypatch.setattr(verispec.server, "serve", fake_serve)
    run(["serve", "--port", "8123", "--max-batch", "3", "--max-concurrency", "5", "--max-prompt-tokens", "100",
         "--max-tokens-limit", "50", "--served-model-name", "m"])
    assert seen["host"] == "127.0.0.1" and seen["port"] == 8123 and seen["model_name"] == "m"
    assert (seen["max_batch"], seen["max_concurrency"]) == (3, 5)
    assert (seen["limits"].max_prompt_tokens, seen["limits"].max_tokens_limit) == (100, 50)
