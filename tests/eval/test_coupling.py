"""Coupled comparisons (``coupling = "common" | "independent"``): common random numbers make a lossy rule that
equals its baseline token-identical to it unit for unit; independent seeds do not; the option is recorded,
validated and refused on resume with the other value; the report gives the shared prefix of each pair."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from verispec.eval.grid import COUPLINGS, SweepConfig, expand, generation_seed, parse_config
from verispec.eval.report import shared_prefix, write_report
from verispec.eval.run import run_sweep
from verispec.eval.store import read_results


def _cfg(coupling: str | None, **over) -> SweepConfig:
    data = {
        "name": "coupling", "seeds": [0, 1], "gamma": 3, "max_new_tokens": 24, "models": {"target": "toy"},
        "tasks": [{"name": "toy", "limit": 3}],
        # lenience with l = 1 is lossless SD: h = min(1, p / q), residual [p - q]+ (Eq. 9)
        "methods": [{"rule": "lossless"}, {"rule": "lenience", "params": {"l": 1.0}}],
    }
    if coupling is not None:
        data["coupling"] = coupling
    data.update(over)
    return parse_config(data)


def _outputs(run_dir) -> dict[tuple[str, int], dict[str, list[int]]]:
    by: dict[tuple[str, int], dict[str, list[int]]] = {}
    for r in read_results(run_dir):
        by.setdefault((r["problem_id"], r["seed"]), {})[r["label"]] = r["token_ids"]
    return by


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for coupling in COUPLINGS:
        d = tmp_path_factory.mktemp(coupling)
        s = run_sweep(_cfg(coupling), d, progress=False, batch_size=3)
        assert s.completed == 3 * 2 * 2 and s.failed == 0
        out[coupling] = d
    return out


def test_config_default_validation_and_record():
    assert _cfg(None).coupling == "common"
    assert _cfg("independent").coupling == "independent"
    with pytest.raises(ValueError, match="coupling"):
        _cfg("paired")
    cfg = _cfg("independent")
    assert cfg.settings("toy")["coupling"] == "independent"
    assert SweepConfig.from_json(cfg.to_json()).coupling == "independent"
    assert SweepConfig.from_json({k: v for k, v in cfg.to_json().items() if k != "coupling"}).coupling == "common"


@pytest.mark.parametrize("coupling", COUPLINGS)
def test_generation_seeds(coupling):
    units = expand(_cfg(coupling), {"toy": ["toy/0", "toy/1"]})
    per_pair: dict[tuple[int, str], set[int]] = {}
    for u in units:
        per_pair.setdefault((u.seed, u.problem_id), set()).add(u.gen_seed)
        if coupling == "common":
            assert u.gen_seed == generation_seed(u.seed, u.task, u.problem_id)
        else:
            assert u.gen_seed == generation_seed(u.seed, u.task, u.problem_id, u.method.label)
            assert u.gen_seed != generation_seed(u.seed, u.task, u.problem_id)
    # common: one seed shared by both methods of a (seed, problem); independent: one per method
    assert {len(s) for s in per_pair.values()} == ({1} if coupling == "common" else {2})


def test_common_random_numbers_make_equal_rules_identical(runs):
    common = _outputs(runs["common"])
    assert len(common) == 6
    for outs in common.values():
        assert outs["lossless"] == outs["lenience(l=1.0)"]
    independent = _outputs(runs["independent"])
    differ = [outs["lossless"] != outs["lenience(l=1.0)"] for outs in independent.values()]
    assert sum(differ) >= 4, differ  # independent random numbers: the outputs are different draws
    # the settings of every result line say which coupling made it
    for name, d in runs.items():
        assert {r["settings"]["coupling"] for r in read_results(d)} == {name}


def test_resume_with_other_coupling_is_refused(runs, tmp_path):
    with pytest.raises(ValueError, match="coupling"):
        run_sweep(_cfg("common"), runs["independent"], progress=False)
    # a run directory made before the option existed (no "coupling" in config.json) counts as "common"
    d = tmp_path / "legacy"
    run_sweep(_cfg("common"), d, progress=False, max_units=1)
    cfg_json = json.loads((d / "config.json").read_text())
    del cfg_json["coupling"]
    (d / "config.json").write_text(json.dumps(cfg_json))
    run_sweep(_cfg("common"), d, progress=False, max_units=1)
    with pytest.raises(ValueError, match="coupling"):
        run_sweep(_cfg("independent"), d, progress=False)


def test_report_shared_prefix(runs):
    rows = {}
    for name, d in runs.items():
        write_report(d, n_boot=50)
        dt = pd.read_csv(d / "report" / "table_delta.csv")
        row = dt[dt["setting"] == "lenience(l=1.0)"].iloc[0]
        rows[name] = row
        assert "shared prefix" in (d / "report" / "report.md").read_text()
    # common: every pair identical, so the shared prefix is the whole output
    assert rows["common"]["identical"] == 1.0
    assert rows["common"]["shared_prefix"] == pytest.approx(rows["common"]["mean_tokens"])
    assert rows["independent"]["identical"] < 1.0
    assert rows["independent"]["shared_prefix"] < rows["common"]["shared_prefix"]


def test_shared_prefix_statistic():
    pairs = pd.DataFrame({"token_ids_l": [[1, 2, 3], [1, 2], [5, 6, 7, 8]],
                          "token_ids_b": [[1, 2, 3], [1, 2, 9, 9], [5, 0, 7, 8]]})
    res = shared_prefix(pairs)
    assert res["shared_prefix"] == pytest.approx((3 + 2 + 1) / 3)
    assert res["identical"] == pytest.approx(1 / 3)
    assert res["mean_tokens"] == pytest.approx((3 + 3 + 4) / 3)


def test_demo_configs_differ_only_in_coupling():
    from pathlib import Path

    from verispec.eval.grid import load_config

    repo = Path(__file__).resolve().parents[2]
    common = load_config(repo / "configs" / "coupling_demo.toml")
    independent = load_config(repo / "configs" / "coupling_demo_independent.toml")
    assert (common.coupling, independent.coupling) == ("common", "independent")
    a, b = common.to_json(), independent.to_json()
    assert {k for k in a if a[k] != b[k]} == {"name", "coupling"}
    assert [m.label for m in common.methods] == ["lossless", "minp-sampling(p_base=0.3)", "spec-cascade(p_base=0.3)"]
