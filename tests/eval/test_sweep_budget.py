"""A sweep's budgeted methods: ``budget = {tv = [...]}`` in a ``[[methods]]`` entry makes one setting per budget
(labelled with it, the family's parameter left to the engine, paired with the lossless baseline), survives the
run directory's config.json, and each unit's line reports the spent budget and per-token parameters and
distances, equal to the engine's own run of that unit."""

from __future__ import annotations

import pytest

from verispec.eval.grid import SweepConfig, parse_config
from verispec.eval.run import encode_problem, load_problems, run_sweep
from verispec.eval.store import read_results
from verispec.testing import toy_engine


def _cfg(methods) -> SweepConfig:
    return parse_config({"name": "budget", "seeds": [0], "gamma": 3, "max_new_tokens": 12, "temperature": 1.0,
                         "models": {"target": "toy"}, "tasks": [{"name": "toy", "limit": 2}], "methods": methods})


def test_budget_methods_expand_and_round_trip():
    cfg = _cfg([{"rule": "lenience", "budget": {"tv": [0.02, 0.1]}}, {"rule": "cos-we", "budget": {"tv_total": 1}}])
    labels = [m.label for m in cfg.methods]
    assert labels == ["lossless", "lenience(budget tv=0.02)", "lenience(budget tv=0.1)", "cos-we(budget tv_total=1.0)"]
    assert SweepConfig.from_json(cfg.to_json()).methods == cfg.methods
    cap = _cfg([{"rule": "minp-cap", "params": {"p_base": 0.2, "realization": "residual"}, "budget": {"tv": 0.05}}])
    assert cap.methods[1].params == (("p_base", 0.2), ("realization", "residual"))
    for bad, match in (([{"rule": "lossless", "budget": {"tv": 0.1}}], "budget: rule 'lossless' has no budget"),
                       ([{"rule": "lenience", "params": {"l": 0.3}, "budget": {"tv": 0.1}}], "both set the parameter"),
                       ([{"rule": "lenience", "budget": {"tv": 3}}], r"tv must be in \[0, 1\]"),
                       ([{"rule": "lenience", "budget": 0.1}], "must be a table"),
                       ([{"rule": "overshoot-ceiling", "budget": {"tv": 0.1}}], "needs realization='residual'")):
        with pytest.raises(ValueError, match=match):
            _cfg(bad)


def test_budget_units_report_their_spending(tmp_path):
    cfg = _cfg([{"rule": "lenience", "budget": {"tv": 0.05}}])
    summary = run_sweep(cfg, tmp_path / "run", progress=False, batch_size=2)
    assert summary.completed == 4 and summary.failed == 0
    engine = toy_engine("model")
    prompts = {p.id: encode_problem(engine, p) for p in load_problems(cfg)["toy"]}
    budgeted = [r for r in read_results(tmp_path / "run") if "budget" in r]
    assert len(budgeted) == 2
    for r in budgeted:
        rep = r["budget"]
        assert rep["budget"] == {"tv": 0.05} and rep["param"] == "l"
        assert len(rep["theta"]) == len(rep["tv"]) == len(r["token_ids"]) and max(rep["tv"]) <= 0.05 + 1e-9
        own = engine.generate(prompts[r["problem_id"]], rule="lenience", budget={"tv": 0.05}, gamma=3,
                              max_new_tokens=12, seed=r["gen_seed"], sampling=cfg.sampling_config())
        assert own.token_ids == r["token_ids"]
        assert rep["spent"] == pytest.approx(own.metrics.budget["spent"])
    assert any(t < 1 for r in budgeted for t in r["budget"]["theta"])  # it relaxed somewhere
