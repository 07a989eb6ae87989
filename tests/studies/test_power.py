"""Power arithmetic (docs/results/POWER.md) and the coupled-vs-independent variance table, on toy sweeps."""

from __future__ import annotations

import math
from statistics import NormalDist

import pandas as pd
import pytest

from verispec.eval.grid import parse_config
from verispec.eval.report import load_frame
from verispec.eval.run import run_sweep
from verispec.studies.power import (
    CLAIMS,
    coupling_table,
    design_effect,
    n_for_halfwidth,
    n_required,
    paired_differences,
    paired_summary,
    power_table,
)


def test_n_required_formula():
    z = NormalDist().inv_cdf
    # delta = sd: (z_0.975 + z_0.8)^2 = 7.85 pairs
    assert n_required(1.0, 1.0) == pytest.approx((z(0.975) + z(0.8)) ** 2)
    assert n_required(1.0, 1.0) == pytest.approx(7.849, abs=1e-3)
    # quadratic in sd / delta, sign of delta irrelevant, other levels
    assert n_required(-0.5, 2.0) == pytest.approx(16 * n_required(1.0, 1.0))
    assert n_required(1.0, 1.0, alpha=0.01, power=0.9) == pytest.approx((z(0.995) + z(0.9)) ** 2)
    assert math.isinf(n_required(0.0, 1.0))
    assert n_for_halfwidth(2.0, 40.0) == pytest.approx((z(0.975) * 20) ** 2)


def test_design_effect_and_differences():
    # 4 problems x 3 seeds; differences constant within a problem: rho = 1, deff = m = 3
    rows = [{"task": "t", "problem_id": f"p{i}", "seed": s, "d": float(i % 2)} for i in range(4) for s in range(3)]
    d = pd.DataFrame(rows)
    assert design_effect(d, "d") == pytest.approx(3.0)
    # no between-problem variation: deff = 1
    d2 = d.assign(d=[float(s % 2) for s in d["seed"]])
    assert design_effect(d2, "d") == pytest.approx(1.0)
    df = pd.DataFrame({
        "task": ["t"] * 4, "problem_id": ["a", "a", "b", "b"], "seed": [0, 0, 0, 0],
        "label": ["x", "y", "x", "y"], "passed": [True, False, True, True], "be": [3.0, 2.5, 4.0, 4.5]})
    pd_ = paired_differences(df, "x", "y")
    assert pd_["d_acc"].tolist() == [100.0, 0.0] and pd_["d_be"].tolist() == [0.5, -0.5]
    s = paired_summary(pd_)
    assert s["n_pairs"] == 2 and s["mean_acc"] == 50.0 and s["discordant"] == 0.5
    assert s["sd_be"] == pytest.approx(math.sqrt(0.5))


@pytest.fixture(scope="module")
def toy_runs(tmp_path_factory):
    out = {}
    for coupling in ("common", "independent"):
        cfg = parse_config({
            "name": "p", "seeds": [0, 1], "gamma": 3, "max_new_tokens": 20, "coupling": coupling,
            "models": {"target": "toy"}, "tasks": [{"name": "toy", "limit": 4}],
            "methods": [{"rule": "lenience", "params": {"l": 1.0}},
                        {"rule": "spec-cascade", "params": {"p_base": 0.3}}],
        })
        d = tmp_path_factory.mktemp(coupling)
        run_sweep(cfg, d, progress=False, batch_size=4)
        out[coupling] = d
    return out


def test_coupling_table_on_toy_runs(toy_runs):
    tab = coupling_table(toy_runs["common"], toy_runs["independent"]).set_index("lossy")
    assert set(tab.index) == {"lenience(l=1.0)", "spec-cascade(p_base=0.3)", "minp-sampling(p_base=0.3)"}
    row = tab.loc["lenience(l=1.0)"]
    # l = 1 is lossless SD: common random numbers make every pair identical, so the paired variance is 0
    assert row["n_common"] == row["n_independent"] == 8
    assert row["var_be_common"] == 0.0 and row["var_acc_common"] == 0.0
    assert row["var_be_independent"] > 0 and math.isinf(row["ratio_be"])
    assert row["ratio_be_lo"] > 1  # every bootstrap resample: var common 0, var independent > 0
    assert tab.loc["minp-sampling(p_base=0.3)", "baseline"] == "lossless"


def test_power_table_uses_measured_sd(toy_runs):
    from dataclasses import replace

    claim = replace(CLAIMS[0], analogue=("spec-cascade(p_base=0.3)", "minp-sampling(p_base=0.3)"), tasks=("toy",))
    tab = power_table(toy_runs["common"], claims=[claim])
    r = tab.iloc[0]
    d = paired_differences(load_frame(toy_runs["common"]), *claim.analogue)
    assert r["n_pairs"] == len(d) == 8
    assert r["sd_be"] == pytest.approx(d["d_be"].std(ddof=1))
    assert r["n_be"] == pytest.approx(n_required(claim.delta_be, r["sd_be"]))


def test_bench_power_commands(toy_runs, tmp_path):
    from click.testing import CliRunner

    from verispec.cli.bench import bench

    csv = tmp_path / "coupling.csv"
    res = CliRunner().invoke(bench, ["power", "coupling", str(toy_runs["common"]), str(toy_runs["independent"]),
                                     "--csv", str(csv)])
    assert res.exit_code == 0, res.output
    assert "lenience(l=1.0)" in res.output and csv.exists()
    res = CliRunner().invoke(bench, ["power", "table", str(tmp_path / "missing")])
    assert res.exit_code != 0 and "missing" in res.output
