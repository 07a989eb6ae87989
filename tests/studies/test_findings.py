"""findings.json and FINDINGS.md's verdicts (``verispec.studies.findings``): on constructed runs whose answers are
known (a pair of settings, a gap in one run minus the same gap in another, a budget against the fixed frontier's
envelope and interpolation, a run still being extended), the generated FINDINGS.md cells, and the command on the
committed runs: findings.json and FINDINGS.md are what it generates, and every verdict is the verdict function's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from verispec.cli.main import main
from verispec.eval.report import compare_runs
from verispec.studies.findings import (
    BEGIN,
    END,
    FIELDS,
    Comparison,
    compute,
    summaries,
    update_findings_md,
)
from verispec.studies.verdict import verdict

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
N = 40  # problems, one seed
AI2 = "adaptive-interpolation(lam=0.2, realization=residual)"
AI6 = "adaptive-interpolation(lam=0.6, realization=residual)"
PATTERN = r"adaptive-interpolation\(lam=[0-9.]+, realization=residual\)"


def _units(label: str, be: float, passed: int, n: int = N, task: str = "t") -> list[dict]:
    """``n`` units of ``label``: BE exactly ``be`` (10 rounds each), the first ``passed`` problems pass."""
    return [{"task": task, "problem_id": f"P/{i}", "label": label, "accepted": int(round(be * 10)), "rounds": 10,
             "passed": i < passed} for i in range(n)]


def _write(root: Path, run: str, rows: list[dict]) -> None:
    (root / run).mkdir(parents=True)
    with open(root / run / "results.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps({
                "key": f"{r['task']}|{r['problem_id']}|{r['label']}|s0", "task": r["task"],
                "problem_id": r["problem_id"], "method": r["label"], "label": r["label"], "baseline": "lossless",
                "lossless": r["label"] == "lossless", "seed": 0, "params": {},
                "grade": {"passed": r["passed"], "score": 1.0}, "accepted": r["accepted"],
                "emitted_accepted": r["accepted"], "rounds": r["rounds"], "drafted": 5 * r["rounds"],
                "new_tokens": 40, "timings": {"total_s": 1.0}, "finish_reason": "stop", "text": "",
                "token_ids": []}) + "\n")


def _by(objs: list[dict], **match: object) -> dict:
    hits = [o for o in objs if all(o[k] == v for k, v in match.items())]
    assert len(hits) == 1, (match, hits)
    return hits[0]


def test_pairs_families_and_incomplete_settings(tmp_path):
    _write(tmp_path, "run", _units("lossless", 2.0, 20) + _units("x", 3.0, 30) + _units("y", 2.5, 20)
           + _units("late", 3.0, 10, n=25))  # "late" is still running: 25 of 40 problems
    spec = [Comparison("C", "t", "run", "x", "lossless", "pass@1", 25.0, "effect"),
            Comparison("C", "t", "run", "x", "lossless", "BE", 0.5, "effect"),
            Comparison("C", "t", "run", "y", "lossless", "pass@1", 0.1, "equivalence", 5.0),
            Comparison("C", "t", "run", "late", "lossless", "pass@1", -3.0, "effect"),
            Comparison("C", "t", "run", "y", "x", "pass@1", -0.4, "not testable here")]
    objs = compute(tmp_path, spec, n_boot=300)
    assert [list(o) for o in objs] == [list(FIELDS)] * len(spec)
    x = _by(objs, a="x", metric="pass@1")
    assert x["estimate"] == pytest.approx(25.0) and x["n_pairs"] == N
    assert x["ci"][0] <= 25.0 <= x["ci"][1]
    assert x["ci_adjusted"][0] <= x["ci"][0] and x["ci_adjusted"][1] >= x["ci"][1]  # 1 - 0.05/2 is wider
    assert x["family_size"] == 2 and x["verdict"] == "reproduced"  # the family: x and y; not late, not y - x
    assert _by(objs, a="x", metric="BE")["estimate"] == pytest.approx(1.0)
    assert _by(objs, a="x", metric="BE")["family_size"] == 1
    assert _by(objs, a="x", metric="BE")["verdict"] == "reproduced in direction"
    y = _by(objs, a="y", b="lossless")
    assert y["estimate"] == 0.0 and y["ci"] == [0.0, 0.0] and y["verdict"] == "reproduced"
    late = _by(objs, a="late")
    assert (late["estimate"], late["ci"], late["ci_adjusted"], late["family_size"], late["n_pairs"]) == (
        None, None, None, None, 0)
    assert late["verdict"] == "not testable here"
    nt = _by(objs, a="y", b="x")
    assert nt["estimate"] == pytest.approx(-25.0) and nt["ci"] is not None
    assert nt["ci_adjusted"] is None and nt["family_size"] is None and nt["verdict"] == "not testable here"
    # a held-out subset is a family of its own, computed on its problems only
    sub = compute(tmp_path, [*spec[:1], Comparison("C", "t", "run", "x", "lossless", "pass@1", 25.0, "effect",
                                                   problems=(20, 40))], n_boot=300)
    assert sub[1]["subset"] == "problems 20-39" and sub[1]["n_pairs"] == 20
    assert sub[1]["estimate"] == pytest.approx(100.0 * (10 - 0) / 20)
    assert sub[0]["family_size"] == sub[1]["family_size"] == 1


def test_gap_difference_across_runs(tmp_path):
    # tree: a - b = +20 pp, +1.0 BE on problems 0..39; chain: a - b = +5 pp, +0.5 BE on problems 0..19 only
    _write(tmp_path, "tree", _units("a", 4.0, 30) + _units("b", 3.0, 22))
    _write(tmp_path, "chain", _units("a", 3.5, 11, n=20) + _units("b", 3.0, 10, n=20))
    gap = "a - b"
    spec = [Comparison("G", "t", "tree", gap, gap, "BE", 0.5, "effect", run_b="chain", construction="gap"),
            Comparison("G", "t", "tree", gap, gap, "pass@1", 10.0, "effect", run_b="chain", construction="gap")]
    be, acc = compute(tmp_path, spec, n_boot=300)
    assert be["n_pairs"] == 20 and be["run_b"] == "chain" and be["a"] == be["b"] == gap
    assert be["estimate"] == pytest.approx(1.0 - 0.5)
    # on the 20 shared problems the tree's a passes 20, b 20; the chain's a 11, b 10
    assert acc["estimate"] == pytest.approx(0.0 - 5.0)


def test_budget_against_the_fixed_frontier(tmp_path):
    """Fixed (BE, pass@1): lossless (2, 65), lam 0.6 (3, 40), lam 0.2 (4, 50); budget at BE 2.5, 55%. The
    interpolation runs through the dip at lam 0.6 (52.5% at BE 2.5), the envelope skips it (the chord from
    lossless to lam 0.2: 61.25%). A fixed setting still running is left out until it completes."""
    _write(tmp_path, "fixed", _units("lossless", 2.0, 26) + _units(AI6, 3.0, 16) + _units(AI2, 4.0, 20)
           + _units("adaptive-interpolation(lam=0.4, realization=residual)", 3.5, 30, n=10))
    _write(tmp_path, "budget", _units("cos-we(budget tv=0.1)", 2.5, 22))
    spec = [Comparison("B", "t", "budget", "cos-we(budget tv=0.1)", c, "pass@1", None, "non-inferiority", 5.0,
                       run_b="fixed", construction=c, fixed_pattern=PATTERN) for c in ("envelope", "interpolation")]
    env, inter = compute(tmp_path, spec, n_boot=300)
    assert env["b"] == f"upper envelope of: lossless; {AI2}; {AI6}"  # lam 0.4 (still running) left out
    assert inter["b"] == f"interpolation of: lossless; {AI2}; {AI6}"
    assert inter["estimate"] == pytest.approx(55.0 - 52.5)
    assert env["estimate"] == pytest.approx(55.0 - 61.25)
    assert env["n_pairs"] == N and env["family_size"] == 2 and env["paper"] is None  # both constructions


def test_findings_md_cells_are_generated():
    objs = [{"claim": "Table 9: a claim", "task": "gsm", "run": "r", "a": "x", "b": "lossless", "run_b": None,
             "subset": None, "metric": "pass@1", "n_pairs": 300, "estimate": -9.0, "ci": [-16.0, -2.3],
             "ci_adjusted": [-17.0, -1.0], "family_size": 2, "paper": -14.4, "kind": "effect", "margin": None,
             "verdict": verdict(-9.0, -17.0, -1.0, -14.4, "effect")}]
    text = ("| claim | verdict | notes |\n|---|---|---|\n"
            "| **Table 9: a claim** (paper -14.4 pp) | **reproduced (borderline)** | a \\| b |\n"
            "| **Other** | kept | – |\n\n" + BEGIN + "\nSTALE\n" + END + "\n")
    out = update_findings_md(text, objs)
    cell = "**GSM, pass@1, vs lossless** (family of 2): reproduced"
    assert f"| **Table 9: a claim** (paper -14.4 pp) | {cell} | a \\| b |" in out
    assert "| **Other** | kept | – |" in out and "STALE" not in out
    assert ("| Table 9: a claim | GSM | pass@1 | x - lossless [r] | 300 | -9.0 [-16.0, -2.3] | [-17.0, -1.0] (of 2) |"
            in out)
    assert summaries(objs) == {"Table 9: a claim": cell}
    assert update_findings_md(out, objs) == out
    with pytest.raises(ValueError, match="no row"):
        update_findings_md(text.replace("Table 9", "Table 8"), objs)
    with pytest.raises(ValueError, match="markers"):
        update_findings_md(text.replace(END, ""), objs)


def test_the_committed_findings_are_what_the_command_generates():
    """`verispec bench findings docs/results --check`: findings.json and FINDINGS.md's verdict cells and table of
    comparisons equal what the committed runs give; each verdict is the verdict function's on the stored numbers;
    the intervals are `bench compare`'s."""
    res = CliRunner().invoke(main, ["bench", "findings", str(RESULTS), "--check"])
    assert res.exit_code == 0, res.output
    objs = json.loads((RESULTS / "findings.json").read_text())
    for o in objs:
        assert list(o) == list(FIELDS)
        lo, hi = o["ci_adjusted"] or (None, None)
        assert o["verdict"] == verdict(o["estimate"], lo, hi, o["paper"], o["kind"], o["margin"]), o
    o = _by(objs, run="be_claims", a="typical(epsilon=0.15)", metric="BE")
    table, _ = compare_runs(RESULTS / "be_claims", None, [("typical(epsilon=0.15)", "eta-sampling(epsilon=0.15)")])
    assert o["ci"] == pytest.approx([table["a_d_be_lo"][0], table["a_d_be_hi"][0]], abs=1e-6)


def test_a_directory_without_the_runs_is_refused(tmp_path):
    """A wrong directory gave 141 comparisons "not testable here" and exit 0 (and `--check`: up to date)."""
    with pytest.raises(ValueError, match="no run of the findings under"):
        compute(tmp_path)
    for extra in ([], ["--check"]):
        res = CliRunner().invoke(main, ["bench", "findings", str(tmp_path), *extra])
        assert res.exit_code == 1 and "no run of the findings under" in res.output, res.output
    assert list(tmp_path.iterdir()) == []
