"""The committed sweep configs: every one parses and expands to settings; a run that is compared unit by unit with
another (a budget against the fixed-parameter run it pairs with) shares every setting that decides a unit's tokens
apart from its method, so its units couple with the other run's (same seeds, sampling, models, backends,
numerics, tasks, coupling)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from verispec.eval.grid import load_config

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.toml"))
#: (budgeted run, the fixed-parameter run it is compared with)
PAIRED = [("budget.toml", "table1_power.toml"), ("budget_gsm.toml", "table1_gsm.toml")]
#: what may differ between paired runs: their names, methods and how baselines are paired
FREE = {"name", "methods", "pair_baselines", "raw_methods"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_config_parses(path):
    cfg = load_config(path)
    assert cfg.methods and cfg.tasks and cfg.seeds


@pytest.mark.parametrize(("budgeted", "fixed"), PAIRED)
def test_paired_runs_share_every_setting_but_their_methods(budgeted, fixed):
    root = CONFIGS[0].parent
    a, b = load_config(root / budgeted), load_config(root / fixed)
    for f in dataclasses.fields(a):
        if f.name not in FREE:
            assert getattr(a, f.name) == getattr(b, f.name), f.name
    assert all(m.budget for m in a.methods)
    assert any(m.rule == "lossless" for m in b.methods)
