"""A tiny-model sweep end to end (toy tasks, tiny random pair through an injected engine factory): tables,
plots and qualitative diffs; the paired bootstrap and the diff locator on their own."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from verispec.cli.bench import bench
from verispec.eval import run as runner
from verispec.eval.grid import parse_config
from verispec.eval.report import balanced, first_difference, load_frame, paired_delta, select_problems, write_report
from verispec.eval.run import run_sweep
from verispec.eval.store import read_results

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


def test_tables_of_means_use_problems_every_setting_and_seed_completed(run_dir, tmp_path):
    """A run extended for one setting only (here: the others lack toy problem 2 at seed 1): Table 2/4 average the
    same problems for every row and every seed (toy/2 leaves seed 0 too, else seed 0 would average 3 problems and
    seed 1 two), the per-setting table over all units is written next to them, Table 7 pairs every completed
    unit."""
    uneven = tmp_path / "uneven"
    uneven.mkdir()
    recs = [r for r in read_results(run_dir)
            if not (r["task"] == "toy" and r["problem_id"] == "toy/2" and r["seed"] == 1 and r["label"] != "lossless")]
    (uneven / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    files = write_report(uneven, n_boot=100)
    st, st_all = pd.read_csv(files["settings"]), pd.read_csv(files["settings_all"])
    toy, toy_all = st[st.task == "toy"], st_all[st_all.task == "toy"]
    assert (toy.n_units == 4).all() and (toy.n_problems == 2).all() and set(toy_all.n_units) == {5, 6}
    df = load_frame(uneven)
    sub = df[(df.task == "toy") & (df.label == "lossless") & (df.problem_id != "toy/2")]
    row = toy[toy.label == "lossless"].iloc[0]
    assert row.acc == pytest.approx(sub.groupby("seed").passed.mean().mean() * 100)
    be = sub.groupby("seed").apply(lambda g: g.accepted.sum() / g.rounds.sum(), include_groups=False)
    assert row.be == pytest.approx(be.mean()) and row.be_std == pytest.approx(be.std())
    md = files["report"].read_text()
    assert "Settings cover different" in md and "toy: 2 problems in each of 2 seeds" in md
    assert (st[st.task == "toy2"].n_units == st_all[st_all.task == "toy2"].n_units).all()  # toy2 untouched
    dt = pd.read_csv(files["delta"])
    assert (dt.n_pairs[(dt.task == "toy") & ~dt.setting.str.contains("all settings")] == 5).all()
    # a balanced run reports no such thing
    assert "settings_all" not in write_report(run_dir, out_dir=tmp_path / "even", n_boot=100)
    # and once the run is completed, a rebuild into the same folder removes the earlier report's stale table
    assert files["settings_all"].exists()
    (uneven / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in read_results(run_dir)))
    rebuilt = write_report(uneven, n_boot=100)
    assert "settings_all" not in rebuilt and not files["settings_all"].exists()


def test_balanced_falls_back_to_triples_then_to_all_units(run_dir):
    """No problem has every (setting, seed): the (problem, seed) triples every setting completed; none of those
    either: every unit. Each task on its own."""
    df = load_frame(run_dir)
    df = df[df.task == "toy"]
    # seed 0 keeps problems 0 and 1, seed 1 keeps problem 2: no problem in both seeds
    split = df[((df.seed == 0) & (df.problem_id != "toy/2")) | ((df.seed == 1) & (df.problem_id == "toy/2"))]
    # ... and one setting lacks problem 1 at seed 0
    lack = split[~((split.label == "lenience(l=0.5)") & (split.problem_id == "toy/1"))]
    got = balanced(lack)
    assert set(zip(got.problem_id, got.seed, strict=True)) == {("toy/0", 0), ("toy/2", 1)}
    assert len(got) == 2 * df.label.nunique()
    # every setting's units disjoint from the others': nothing is complete, every unit is kept
    labels = sorted(df.label.unique())
    disjoint = df[[lab == labels[(int(pid[-1]) + 3 * s) % len(labels)]
                   for lab, pid, s in zip(df.label, df.problem_id, df.seed, strict=True)]]
    assert len(balanced(disjoint)) == len(disjoint) > 0
    # each task falls back on its own: toy2 (complete) keeps every unit, toy its complete triples
    both = pd.concat([lack, load_frame(run_dir).query("task == 'toy2'")])
    got = balanced(both)
    assert len(got[got.task == "toy2"]) == len(both[both.task == "toy2"]) > 0
    assert set(zip(got[got.task == "toy"].problem_id, got[got.task == "toy"].seed, strict=True)) == \
        {("toy/0", 0), ("toy/2", 1)}


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
    # --method picks settings by label (their matched baselines come along); an unknown label names the choices
    toml = tmp_path / "grid.toml"
    toml.write_text('[models]\ntarget = "toy"\n[[tasks]]\nname = "toy"\nlimit = 2\n[[methods]]\nrule = "lenience"\n'
                    'params = { l = 0.5 }\n[[methods]]\nrule = "spec-cascade"\nparams = { p_base = [0.3, 0.5] }\n')
    res = CliRunner().invoke(bench, ["grid", str(toml), "--method", "spec-cascade(p_base=0.5)"])
    assert res.exit_code == 0, res.output
    assert "settings: minp-sampling(p_base=0.5), spec-cascade(p_base=0.5)\n" in res.output
    assert "= 3 seeds x 2 settings" in res.output
    res = CliRunner().invoke(bench, ["grid", str(toml), "--method", "lenience(l=0.123)"])
    assert res.exit_code == 1 and "'lenience(l=0.123)' not in the config" in res.output
    assert "lenience(l=0.5)" in res.output


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


def _frame(rng, n_problems, d_acc_p, be_l, label="lossy", seeds=3):
    """A load_frame-like frame: one lossy setting and its baseline per (problem, seed); the lossy unit passes
    with the baseline's outcome flipped to fail with probability d_acc_p; BE be_l vs 2.0."""
    rows = []
    for prob in range(n_problems):
        for seed in range(seeds):
            passed_b = bool(rng.random() < 0.7)
            passed_l = passed_b and not rng.random() < d_acc_p
            for lab, base, lossless, acc, passed in ((label, "base", False, be_l, passed_l),
                                                    ("base", "base", True, 2.0, passed_b)):
                rows.append({"task": "t", "problem_id": f"p{prob}", "seed": seed, "label": lab, "baseline": base,
                             "lossless": lossless, "accepted": 10 * acc, "rounds": 10, "passed": passed,
                             "new_tokens": 50, "total_s": 1.0, "token_ids": [1, 2]})
    return pd.DataFrame(rows)


def test_gap_difference_pairs_problems_across_runs(tmp_path):
    """A run compared with itself: difference exactly 0 with a zero-width interval (fails if the two runs'
    problems were resampled independently); two runs with known gaps: the difference is their difference, on the
    shared keys only (A's extra problems are dropped)."""
    from verispec.eval.report import gap_difference, matched_pairs

    rng = np.random.default_rng(3)
    a = _frame(rng, 40, 0.3, 3.0)
    same = gap_difference(a, a, "lossy", "base", n_boot=400)
    assert same["diff_d_acc"] == 0 and same["diff_d_acc_lo"] == 0 == same["diff_d_acc_hi"]
    assert same["a_d_acc_lo"] < same["a_d_acc"] < same["a_d_acc_hi"] < 0
    b = _frame(rng, 30, 0.0, 2.5)  # no accuracy gap, BE gap +0.5; A's problems 30..39 are not in B
    res = gap_difference(a, b, "lossy", "base", n_boot=400)
    assert res["n_problems"] == 30 and res["n_pairs"] == 90
    assert res["a_d_be"] == pytest.approx(1.0) and res["b_d_be"] == pytest.approx(0.5)
    assert res["diff_d_be"] == pytest.approx(0.5) and res["diff_d_be_lo"] == pytest.approx(0.5)
    shared_a = a[a.problem_id.isin({f"p{i}" for i in range(30)})]
    lossy_a, base_a = shared_a[shared_a.label == "lossy"], shared_a[shared_a.label == "base"]
    expect = 100 * (lossy_a.passed.mean() - base_a.passed.mean())
    assert res["a_d_acc"] == pytest.approx(expect) and res["b_d_acc"] == 0
    assert res["diff_d_acc"] == pytest.approx(expect) and res["diff_d_acc_hi"] < 0
    assert matched_pairs(a) == [("lossy", "base")]
    with pytest.raises(ValueError, match="completed in both runs"):
        gap_difference(a, b.assign(problem_id="other"), "lossy", "base")


def test_compare_cli(run_dir, tmp_path):
    """`bench compare` on a run and itself: every matched pair, zero differences, files written; bad input."""
    out = tmp_path / "cmp.md"
    res = CliRunner().invoke(bench, ["compare", str(run_dir), str(run_dir), "--out", str(out), "--n-boot", "50"])
    assert res.exit_code == 0, res.output
    table = pd.read_csv(out.with_suffix(".csv"))
    assert set(table.lossy) == {"spec-cascade(p_base=0.3)", "spec-cascade(p_base=0.5)", "lenience(l=0.5)",
                                "cos-we(lam=0.3)"}
    assert (table.diff_d_be == 0).all() and (table.diff_d_acc == 0).all() and "dBE A - B" in out.read_text()
    res = CliRunner().invoke(bench, ["compare", str(run_dir), str(run_dir), "--pair", "lenience(l=0.5)=lossless",
                                     "--pair", "spec-cascade(p_base=0.5)=minp-sampling(p_base=0.5)"])
    assert res.exit_code == 0, res.output
    assert res.output.count("| lenience(l=0.5) | lossless |") == 1 and res.output.count("| spec-cascade") == 1
    one = CliRunner().invoke(bench, ["compare", str(run_dir), "--pair", "cos-we(lam=0.3)=lossless", "--n-boot", "50"])
    assert one.exit_code == 0, one.output
    row = next(line for line in one.output.splitlines() if line.startswith("| cos-we(lam=0.3) | lossless |"))
    assert "A - B" not in one.output and row.count("|") == 6, row
    from verispec.eval.report import delta_table

    dt = delta_table(load_frame(run_dir), ["cos-we(lam=0.3)"], n_boot=50)
    d = dt[dt.task == "all"].iloc[0]  # the report's own gap, both tasks pooled
    assert row.split("|")[4].split()[0] == f"{d.d_be:+.3f}" and row.split("|")[5].split()[0] == f"{d.d_acc:+.1f}"
    # --problems A:B: only the problems numbered A..B-1 (toy/1, toy/2, toy2/1 here: 3 problems x 2 seeds)
    part = CliRunner().invoke(bench, ["compare", str(run_dir), "--pair", "cos-we(lam=0.3)=lossless", "--n-boot", "50",
                                      "--problems", "1:"])
    assert part.exit_code == 0, part.output
    row = next(line for line in part.output.splitlines() if line.startswith("| cos-we(lam=0.3) | lossless |"))
    df = load_frame(run_dir)
    sub = df[df.problem_id.isin(["toy/1", "toy/2", "toy2/1"])]
    d = delta_table(sub, ["cos-we(lam=0.3)"], n_boot=50)
    d = d[d.task == "all"].iloc[0]
    assert row.split("|")[3].strip() == "6 (3)" and row.split("|")[4].split()[0] == f"{d.d_be:+.3f}"
    for bad in ("2:1", "a:b", "3"):
        res = CliRunner().invoke(bench, ["compare", str(run_dir), "--pair", "cos-we(lam=0.3)=lossless",
                                         "--problems", bad])
        assert res.exit_code != 0 and "--problems" in res.output, bad
    with pytest.raises(ValueError, match="does not end in a number"):
        select_problems(pd.DataFrame({"problem_id": ["toy/1", "simple_x"]}), 0, 1)
    res = CliRunner().invoke(bench, ["compare", str(run_dir), str(run_dir), "--pair", "nonsense"])
    assert res.exit_code != 0 and "LOSSY=BASELINE" in res.output
    res = CliRunner().invoke(bench, ["compare", str(run_dir), str(run_dir), "--pair", "a=b"])
    assert res.exit_code == 1 and "completed in both runs" in res.output
