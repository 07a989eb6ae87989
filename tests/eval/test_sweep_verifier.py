"""A sweep's ``verifier``: every unit of a ``verifier = "block"`` run is verified block-wise (its outputs are the
engine's own block-verified ones, unit for unit), the setting is recorded and compared on resume, and a lossy
method under block verification is refused when the config is read."""

from __future__ import annotations

import pytest

from verispec.eval.grid import SweepConfig, parse_config
from verispec.eval.run import encode_problem, load_problems, run_sweep
from verispec.eval.store import read_results
from verispec.testing import toy_engine


def _cfg(verifier: str | None, methods=None) -> SweepConfig:
    data = {"name": "verifier", "seeds": [0, 1], "gamma": 3, "max_new_tokens": 16, "temperature": 1.0,
            "models": {"target": "toy"}, "tasks": [{"name": "toy", "limit": 3}],
            "methods": methods or [{"rule": "lossless"}]}
    if verifier is not None:
        data["verifier"] = verifier
    return parse_config(data)


def test_config_records_the_verifier_and_refuses_lossy_block():
    assert _cfg(None).verifier == "token" and "verifier" not in _cfg(None).settings("toy")
    cfg = _cfg("block")
    assert cfg.settings("toy")["verifier"] == "block"
    assert SweepConfig.from_json(cfg.to_json()).verifier == "block"
    with pytest.raises(ValueError, match=r"verifier: .*lossless rule.*lenience"):
        _cfg("block", [{"rule": "lenience", "params": {"l": 0.5}}])
    with pytest.raises(ValueError, match="unknown verifier 'hsdx'"):
        _cfg("hsdx")


def test_block_run_units_are_the_engines_block_outputs(tmp_path):
    cfg = _cfg("block")
    summary = run_sweep(cfg, tmp_path / "block", progress=False, batch_size=2)
    assert summary.completed == 6 and summary.failed == 0
    results = read_results(tmp_path / "block")
    assert {r["settings"]["verifier"] for r in results} == {"block"}
    engine = toy_engine("model")
    prompts = {p.id: encode_problem(engine, p) for p in load_problems(cfg)["toy"]}
    differs = 0
    for r in results:
        prompt = prompts[r["problem_id"]]
        kw = dict(sampling=cfg.sampling_config(), gamma=3, max_new_tokens=16, seed=r["gen_seed"])
        block = engine.generate(prompt, verifier="block", **kw)
        assert r["token_ids"] == block.token_ids
        differs += engine.generate(prompt, verifier="token", **kw).token_ids != block.token_ids
    assert differs > 0  # the two verifiers really ran differently somewhere
    with pytest.raises(ValueError, match="verifier"):
        run_sweep(_cfg("token"), tmp_path / "block", progress=False)
