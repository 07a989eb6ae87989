"""The sweep key ``[models] target_backend``: parsed, validated, recorded in every unit's settings, round-tripped
through config.json, and passed to ``load_engine`` by the default engine factory."""

from __future__ import annotations

import pytest

from verispec.eval import run as runner
from verispec.eval.grid import SweepConfig, parse_config


def _cfg(**models):
    return parse_config({
        "name": "t",
        "seeds": [0],
        "tasks": [{"name": "toy", "limit": 1}],
        "methods": [{"rule": "lossless"}],
        "models": {"target": "qwen2.5-coder-1.5b-instruct", **models},
    })


def test_default_is_hf_and_llamacpp_is_recorded():
    assert _cfg().target_backend == "hf" and _cfg().settings()["target_backend"] == "hf"
    cfg = _cfg(target_backend="llamacpp", drafter="ngram")
    assert cfg.settings()["target_backend"] == "llamacpp"
    back = SweepConfig.from_json(cfg.to_json())
    assert back.target_backend == "llamacpp" and back == cfg
    old = cfg.to_json()
    old.pop("target_backend")  # a config.json written before the key existed
    assert SweepConfig.from_json(old).target_backend == "hf"


def test_bad_target_backend_is_refused():
    with pytest.raises(ValueError, match="target_backend must be one of hf, llamacpp"):
        _cfg(target_backend="vllm")
    with pytest.raises(ValueError, match="tree attention"):
        _cfg(target_backend="llamacpp", drafter="tree")


def test_engine_factory_passes_it(monkeypatch):
    seen = {}

    def fake_load_engine(*args, **kwargs):
        seen.update(args=args, kwargs=kwargs)
        return "engine"

    monkeypatch.setattr("verispec.api.load_engine", fake_load_engine)
    assert runner.default_engine_factory(_cfg(target_backend="llamacpp", drafter="ngram")) == "engine"
    assert seen["kwargs"]["target_backend"] == "llamacpp" and seen["args"][2] == "ngram"


def test_resuming_with_another_target_backend_is_refused(tmp_path):
    """A run directory made with the transformers target (or before the key existed) is not resumed with the
    llama.cpp target: the results would mix two targets' numerics."""
    import json

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    old = _cfg().to_json()
    old.pop("target_backend")
    (run_dir / "config.json").write_text(json.dumps(old))
    runner._check_settings(run_dir, _cfg())  # same (hf) target: fine
    with pytest.raises(ValueError, match="target_backend"):
        runner._check_settings(run_dir, _cfg(target_backend="llamacpp", drafter="ngram"))
