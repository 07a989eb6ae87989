"""The "auto" target backend and drafter: llama.cpp when it is installed and the models run on the CPU, else
transformers; what ran is named in --json and the server's verispec object."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import verispec.api
import verispec.defaults as defaults
from verispec.cli.main import main
from verispec.defaults import resolve_backends
from verispec.testing import toy_engine


@pytest.mark.parametrize(
    ("installed", "target", "drafter", "device", "expected"),
    [
        (False, "auto", "auto", "cpu", ("hf", "model")),
        (True, "auto", "auto", "cpu", ("llamacpp", "ngram")),
        (True, "auto", "auto", "cuda", ("hf", "model")),  # llama.cpp runs on the CPU here
        (True, "auto", "tree", "cpu", ("hf", "tree")),  # trees need tree attention
        (True, "auto", "model", "cpu", ("hf", "model")),  # a transformers draft keeps the pairing
        (True, "auto", "ngram", "cpu", ("llamacpp", "ngram")),
        (True, "auto", "llamacpp", "cpu", ("llamacpp", "llamacpp")),
        (False, "auto", "llamacpp", "cpu", ("hf", "llamacpp")),
        (True, "hf", "auto", "cpu", ("hf", "model")),
        (False, "llamacpp", "auto", "cpu", ("llamacpp", "ngram")),  # asked for: loading says what's missing
    ],
)
def test_auto_resolves_by_what_is_installed(monkeypatch, installed, target, drafter, device, expected):
    monkeypatch.setattr(defaults, "llamacpp_installed", lambda: installed)
    assert resolve_backends(target, drafter, device) == expected


def test_unknown_names_are_refused():
    with pytest.raises(ValueError, match="unknown target backend 'gpu'"):
        resolve_backends("gpu", "auto")
    with pytest.raises(ValueError, match="unknown drafter 'fast'"):
        resolve_backends("auto", "fast")


@pytest.mark.parametrize("installed", [False, True])
def test_generate_loads_the_resolved_backends_and_names_them(monkeypatch, installed):
    monkeypatch.setattr(defaults, "llamacpp_installed", lambda: installed)
    seen = {}
    engine = toy_engine("model")

    def fake_load(target, draft, drafter, dtype, threads=None, **kw):
        seen.update(draft=draft, drafter=drafter, target_backend=kw.get("target_backend"))
        return engine

    monkeypatch.setattr(verispec.api, "load_engine", fake_load)
    res = CliRunner().invoke(main, ["generate", "hello", "--temperature", "0", "--max-new-tokens", "8", "--json"])
    assert res.exit_code == 0, res.output
    want = ("llamacpp", "ngram") if installed else ("hf", "model")
    assert (seen["target_backend"], seen["drafter"]) == want
    assert (seen["draft"] is None) == installed  # prompt lookup loads no draft model
    out = json.loads(res.stdout)
    assert out["backends"] == engine.backends and out["backends"]["drafter"] == engine.drafter.name
    assert out["metrics"]["schedule"] is not None  # the default gamma is the adaptive schedule
