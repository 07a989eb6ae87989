"""A tiny-model sweep end to end (toy tasks, tiny random pair through an injected engine factory): tables,
plots and qualitative diffs; the paired bootstrap and the diff locator on their own."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from verispec.bench_cli import bench
from verispec.eval import runner
from verispec.eval.report import first_difference, load_frame, paired_delta, write_report
from verispec.eval.runner import read_results, run_sweep
from verispec.eval.sweep import parse_config

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    cfg = parse_config({
        "name": "e2e", "seeds": [0, 1], "gamma": 3, "max_new_tokens": 16,
        "models": {"target": "toy"},
        "tasks": [{"name": "toy", "limit": 3}, {"name": "toy2", "limit": 2, "max_new_tokens": 10}],
        "methods": [{"rule": "lossless"}, {"rule": "spec-cascade", "params": {"p_base": [0.3, 0.5]}},
                    {"rule": "lenience", "params": {"l": 0.5}}, {"rule": "cos-we", "params": {"lam": 0.3}}],
    })
    out = tmp_path_factory.mktemp("e2e")
    made = []

    def factory(c):
        made.append(c)
        return runner.toy_engine(c)

    s = run_sweep(cfg, out, engine_factory=factory, progress=False)
    assert len(made) == 1 and s.completed == 2 * 5 * 7 and s.failed == 0
    return out


def test_results_schema(run_dir):
    recs = read_results(run_dir)
    r = recs[0]
    for k in ("key", "method", "params", "label", "baseline", "seed", "gen_seed", "task", "problem_id", "text",
              "token_ids", "grade", "be", "tokens_per_round", "ds", "new_tokens", "rounds", "drafted", "accepted",
              "per_round", "timings", "finish_reason", "settings"):
        assert k in r, k
    assert set(r["grade"]) == {"passed", "score", "extracted", "detail"}
    for r in recs:
        assert sum(a for _, a in r["per_round"]) == r["accepted"] and len(r["per_round"]) == r["rounds"]
        assert r["be"] == pytest.approx(r["accepted"] / r["rounds"])
        limit = 10 if r["task"] == "toy2" else 16  # per-task max_new_tokens
        assert r["new_tokens"] == len(r["token_ids"]) <= limit and r["settings"]["max_new_tokens"] == limit
    sc = next(r for r in recs if r["label"] == "spec-cascade(p_base=0.3)")
    assert sc["baseline"] == "minp-sampling(p_base=0.3)" and sc["params"] == {"p_base": 0.3}


def test_report_tables_plots_and_diffs(run_dir):
    files = write_report(run_dir, n_boot=300)
    for key in ("tradeoff", "be_vs_param"):
        data = files[key].read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000
    md = files["report"].read_text()
    for label in ("lossless", "spec-cascade", "minp-sampling", "lenience", "cos-we", "p_base=0.3", "l=0.5"):
        assert label in md
    assert "like Table 2" in md and "like Table 4" in md and "like Table 7" in md and "bootstrap" in md

    # Table 4 numbers are the pooled BE / accuracy of the raw results, mean over the two seeds
    df = load_frame(run_dir)
    st = pd.read_csv(files["settings"])
    sub = df[(df.task == "toy") & (df.label == "spec-cascade(p_base=0.5)")]
    per_seed = sub.groupby("seed").apply(lambda g: g.accepted.sum() / g.rounds.sum(), include_groups=False)
    acc = sub.groupby("seed").passed.mean() * 100
    row = st[(st.task == "toy") & (st.label == "spec-cascade(p_base=0.5)")].iloc[0]
    assert row.be == pytest.approx(per_seed.mean()) and row.be_std == pytest.approx(per_seed.std())
    assert row.acc == pytest.approx(acc.mean()) and row.n_seeds == 2 and row.n_problems == 3

    # Table 7: every lossy setting against the right matched baseline, per task and overall
    dt = pd.read_csv(files["delta"])
    pairs = set(zip(dt.setting, dt.baseline, strict=True))
    assert ("spec-cascade(p_base=0.3)", "minp-sampling(p_base=0.3)") in pairs
    assert ("spec-cascade(p_base=0.5)", "minp-sampling(p_base=0.5)") in pairs
    assert ("lenience(l=0.5)", "lossless") in pairs and ("cos-we(lam=0.3)", "lossless") in pairs
    assert set(dt.task) == {"toy", "toy2", "all"}
    single = ~dt.setting.str.contains("all settings")
    assert (dt.n_pairs[single & (dt.task == "toy")] == 6).all()
    assert (dt.n_pairs[single & (dt.task == "all")] == 10).all()
    avg = dt[(dt.setting == "spec-cascade (all settings)") & (dt.task == "all")].iloc[0]
    per = dt[dt.setting.str.startswith("spec-cascade(") & (dt.task == "all")]
    assert avg.n_pairs == 20 and avg.d_be == pytest.approx(per.d_be.mean())
    r = dt[(dt.setting == "lenience(l=0.5)") & (dt.task == "all")].iloc[0]
    be_l = df[df.label == "lenience(l=0.5)"]
    be_b = df[df.label == "lossless"]
    assert r.d_be == pytest.approx(be_l.accepted.sum() / be_l.rounds.sum() - be_b.accepted.sum() / be_b.rounds.sum())
    assert r.d_be_lo <= r.d_be <= r.d_be_hi

    # Appendix F: each diff is a pass/fail disagreement at the same seed, located at the first differing char
    dd = pd.read_csv(files["diffs_csv"], keep_default_na=False)
    assert len(dd) > 0
    texts = {(x.label, x.problem_id, x.seed): x.text for x in df.itertuples()}
    for x in dd.itertuples():
        assert x.lossy_passed != x.baseline_passed
        a, b = texts[(x.setting, x.problem_id, x.seed)], texts[(x.baseline, x.problem_id, x.seed)]
        assert a[: x.char_offset] == b[: x.char_offset] and a[x.char_offset:x.char_offset + 1] != \
            b[x.char_offset:x.char_offset + 1]
    assert "First difference at character" in files["diffs"].read_text()


def test_cli_report_and_errors(run_dir, tmp_path):
    res = CliRunner().invoke(bench, ["report", str(run_dir), "--out", str(tmp_path / "rep")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "rep" / "report.md").exists()
    bad = tmp_path / "bad.toml"
    bad.write_text('[[tasks]]\nname = "toy"\n[[methods]]\nrule = "nope"\n')
    res = CliRunner().invoke(bench, ["run", str(bad), "--out", str(tmp_path / "x")])
    assert res.exit_code == 1 and "unknown rule" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(bench, ["report", str(tmp_path)])
    assert res.exit_code == 1 and "no results" in res.output
    res = CliRunner().invoke(bench, ["grid", str(run_dir / "config.json")])
    assert res.exit_code == 1  # not TOML


def test_paired_delta_and_first_difference():
    rng = np.random.default_rng(1)
    rows = []
    for prob in range(30):
        for _seed in range(3):
            passed_b = rng.random() < 0.6
            rows.append({"setting": "s", "cluster": f"p{prob}", "accepted_l": 30, "rounds_l": 10, "passed_l": 1.0,
                         "accepted_b": 20, "rounds_b": 10, "passed_b": float(passed_b),
                         "new_tokens_l": 40, "total_s_l": 2.0, "new_tokens_b": 30, "total_s_b": 2.0})
    df = pd.DataFrame(rows)
    res = paired_delta(df, n_boot=500)
    assert res["d_be"] == pytest.approx(1.0) and res["d_be_lo"] == pytest.approx(1.0)
    expected = 100 * (1 - df.passed_b.mean())
    assert res["d_acc"] == pytest.approx(expected) and res["d_acc_lo"] < expected < res["d_acc_hi"]
    assert res["d_acc_lo"] > 0 and res["n_problems"] == 30 and res["n_pairs"] == 90
    assert res["d_ds"] == pytest.approx(5.0)
    assert first_difference("abcX", "abcY") == 3 and first_difference("abc", "abcdef") == 3
    assert first_difference("", "x") == 0 and first_difference("same", "same") == 4
    assert json.loads(json.dumps(res))
