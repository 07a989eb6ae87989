"""Sweep-side fidelity choices: the CoS lambda mapping of the Table 4 preset and the matched
baselines' draft_truncation (default "none", recorded in every result line, legacy runs read as "same")."""

from __future__ import annotations

import pytest

from verispec import rules
from verispec.eval.grid import PAPER_PARAM_MAPS, PRESETS, SweepConfig, parse_config, record_rule


def _cfg(**over):
    base = {"name": "t", "seeds": [0], "tasks": [{"name": "toy", "limit": 1}],
            "methods": [{"rule": "spec-cascade", "params": {"p_base": 0.3}}, {"rule": "typical"}],
            "models": {"target": "toy"}}
    base.update(over)
    return parse_config(base)


def test_cos_we_paper_preset_maps_table4_direction():
    """Table 4's CoS parameter t weights the draft: lam = 1 - t for t = 0.2, 0.4, 0.6, 0.8 (in that order), so
    the preset's first setting is the most target-like one, as Table 4's first CoS row is."""
    assert PRESETS["cos-we"]["lam"] == [0.8, 0.6, 0.4, 0.2]
    assert PAPER_PARAM_MAPS["cos-we"][0] == "lam"
    cfg = _cfg(methods=[{"rule": "cos-we", "params": "paper"}])
    lams = [m.param_dict()["lam"] for m in cfg.methods if m.rule == "cos-we"]
    assert lams == [0.8, 0.6, 0.4, 0.2]
    # Table 1 (ablations) keeps Eq. 2's direction
    assert PRESETS["adaptive-interpolation"]["lam"] == [0.2, 0.4, 0.6, 0.8]
    assert PRESETS["ceiling"]["l"] == [0.2, 0.4, 0.6, 0.8]


def test_baselines_default_to_the_untruncated_draft_and_record_it():
    cfg = _cfg()
    base = next(m for m in cfg.methods if m.rule == "minp-sampling")
    assert base.label == "minp-sampling(p_base=0.3)"
    assert cfg.build(base).draft_truncation == "none"
    assert cfg.settings("toy")["baseline_draft_truncation"] == "none"
    rec = {"method": "minp-sampling", "params": base.param_dict(), "settings": cfg.settings("toy")}
    assert record_rule(rec).draft_truncation == "none"
    assert SweepConfig.from_json(cfg.to_json()).baseline_draft_truncation == "none"


def test_same_truncation_sweep_and_legacy_runs():
    cfg = _cfg(baseline_draft_truncation="same")
    labels = [m.label for m in cfg.methods]
    assert "minp-sampling(p_base=0.3, draft_truncation=same)" in labels
    assert "eta-sampling(epsilon=0.1, draft_truncation=same)" in labels
    sc = next(m for m in cfg.methods if m.rule == "spec-cascade")
    assert cfg.baseline_of(sc).label == "minp-sampling(p_base=0.3, draft_truncation=same)"
    assert all(cfg.build(m).draft_truncation == "same" for m in cfg.methods if m.rule.endswith("-sampling"))
    # result files and configs written before the option existed ran with the truncated draft
    legacy = _cfg().to_json()
    legacy.pop("baseline_draft_truncation")
    old = SweepConfig.from_json(legacy)
    assert old.build(next(m for m in old.methods if m.rule == "minp-sampling")).draft_truncation == "same"
    legacy_rec = {"method": "minp-sampling", "params": {"p_base": 0.3}, "settings": {}}
    assert record_rule(legacy_rec).draft_truncation == "same"
    assert record_rule({"method": "spec-cascade", "params": {"p_base": 0.3}}) == rules.get("spec-cascade", p_base=0.3)
    with pytest.raises(ValueError, match="baseline_draft_truncation"):
        _cfg(baseline_draft_truncation="partial")
