"""The budget-vs-fixed frontier (``verispec.studies.budget``) on constructed units whose answer is known: two fixed
settings at BE 2 (60% pass) and BE 4 (30%), a budget at BE 3 with 55% pass; the fixed frontier interpolates to 45%
at BE 3, so the budget is +10 pp at matched BE; one budget outside the fixed range gets no matched value; with the
baseline (BE 1, 65%) on the frontier as its lossless end, a budget at BE 1.5 with 65% is matched to 62.5%. Also the
command end to end on two run directories written as a sweep would."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from verispec.cli.main import main
from verispec.studies.budget import _short, frontier_frame, matched_difference

N = 40  # problems, one seed


def _units(label: str, be: float, passed: int, lossless: bool = False) -> list[dict]:
    rounds = 10
    return [{"task": "t", "problem_id": f"P/{i}", "seed": 0, "label": label, "lossless": lossless,
             "accepted": int(be * rounds), "rounds": rounds, "passed": i < passed} for i in range(N)]


def _frame() -> pd.DataFrame:
    rows = (_units("fixed-a", 2.0, 24) + _units("fixed-b", 4.0, 12) + _units("budget-mid", 3.0, 22)
            + _units("budget-far", 5.0, 10) + _units("lossless", 1.0, 26, True))
    return pd.DataFrame(rows)


def test_matched_difference_interpolates_the_fixed_frontier():
    t = frontier_frame(_frame(), ["budget-far", "budget-mid"], ["fixed-b", "fixed-a"], n_boot=300)
    assert list(t["setting"]) == ["lossless", "fixed-a", "fixed-b", "budget-mid", "budget-far"]  # grouped, BE order
    t = t.set_index("setting")
    assert t.loc["fixed-a", "be"] == 2.0 and t.loc["fixed-b", "acc"] == 30.0
    assert t.loc["budget-mid", "vs_fixed"] == pytest.approx(55.0 - 45.0)
    assert t.loc["budget-mid", "vs_baseline"] == pytest.approx(55.0 - 65.0)
    assert t.loc["budget-mid", "vs_fixed_lo"] <= 10.0 <= t.loc["budget-mid", "vs_fixed_hi"]
    assert math.isnan(t.loc["budget-far", "vs_fixed"])
    with pytest.raises(ValueError, match="at least two"):
        frontier_frame(_frame(), ["budget-mid"], ["fixed-a"])
    with pytest.raises(ValueError, match="no results for nope"):
        frontier_frame(_frame(), ["nope"], ["fixed-a", "fixed-b"])


def test_the_baseline_can_end_the_frontier():
    low = pd.concat([_frame(), pd.DataFrame(_units("budget-low", 1.5, 26))], ignore_index=True)
    alone = frontier_frame(low, ["budget-low"], ["fixed-a", "fixed-b"], n_boot=200).set_index("setting")
    assert math.isnan(alone.loc["budget-low", "vs_fixed"])
    t = frontier_frame(low, ["budget-low"], ["lossless", "fixed-a", "fixed-b"], n_boot=200).set_index("setting")
    assert t.loc["budget-low", "vs_fixed"] == pytest.approx(65.0 - 62.5)
    assert t.loc["budget-low", "vs_baseline"] == pytest.approx(0.0)
    assert t.loc["lossless", "kind"] == "baseline" and bool(t.loc["lossless", "frontier"])
    assert len(t) == 4  # the baseline once
    assert _short("adaptive-interpolation(lam=0.2, realization=residual)") == "lam=0.2"
    assert _short("cos-we(budget tv=0.1)") == "budget tv=0.1" and _short("lossless") == "lossless"


def _write_run(path, rows: list[dict]) -> None:
    path.mkdir()
    with open(path / "results.jsonl", "w") as f:
        for r in rows:
            line = {"key": f"{r['task']}|{r['problem_id']}|{r['label']}|s0", "task": r["task"],
                    "problem_id": r["problem_id"], "method": r["label"], "label": r["label"], "baseline": "lossless",
                    "lossless": r["lossless"], "seed": 0, "params": {}, "grade": {"passed": r["passed"], "score": 1.0},
                    "accepted": r["accepted"], "emitted_accepted": r["accepted"], "rounds": r["rounds"],
                    "drafted": 5 * r["rounds"], "new_tokens": 40, "timings": {"total_s": 1.0},
                    "finish_reason": "stop", "text": "", "token_ids": []}
            f.write(json.dumps(line) + "\n")


def test_command_writes_the_frontier(tmp_path):
    df = _frame()
    _write_run(tmp_path / "budget", df[df["label"].str.startswith("budget")].to_dict("records"))
    _write_run(tmp_path / "fixed", df[~df["label"].str.startswith("budget")].to_dict("records"))
    res = CliRunner().invoke(main, ["bench", "budget", str(tmp_path / "budget"), "--fixed-run", str(tmp_path / "fixed"),
                                    "--fixed", "fixed-a", "--fixed", "fixed-b", "--n-boot", "200"])
    assert res.exit_code == 0, res.output
    assert "+10.0" in res.output and "outside the fixed range" in res.output
    res = CliRunner().invoke(main, ["bench", "budget", str(tmp_path / "budget"), "--fixed-run", str(tmp_path / "fixed"),
                                    "--fixed", "lossless", "--fixed", "fixed-a", "--fixed", "fixed-b",
                                    "--n-boot", "200"])
    assert res.exit_code == 0, res.output
    assert "| lossless | baseline, fixed |" in res.output
    assert (tmp_path / "budget" / "frontier" / "frontier.png").exists()


def test_the_upper_envelope_skips_a_dip():
    """Fixed points (BE, pass@1) lossless (1, 65), a (2, 60), dip (3, 40), b (4, 30): interpolating between the
    BE-adjacent settings puts the frontier at 50% at BE 2.5, the envelope (the least concave majorant: lossless,
    a, b; the dip lies below the chord from a to b, 45% at BE 3) at 52.5%; a budget there at 55% is +5 against
    the first, +2.5 against the second. At BE 3 they differ by the dip (40 vs 45); at a vertex's own BE they agree;
    outside the fixed range neither is defined."""
    rows = (_units("lossless", 1.0, 26, True) + _units("fixed-a", 2.0, 24) + _units("dip", 3.0, 16)
            + _units("fixed-b", 4.0, 12) + _units("budget-mid", 2.5, 22) + _units("budget-far", 5.0, 10))
    t = frontier_frame(pd.DataFrame(rows), ["budget-mid", "budget-far"], ["lossless", "fixed-a", "dip", "fixed-b"],
                       n_boot=200).set_index("setting")
    assert t.loc["budget-mid", "vs_fixed"] == pytest.approx(55.0 - 50.0)
    assert t.loc["budget-mid", "vs_envelope"] == pytest.approx(55.0 - 52.5)
    assert t.loc["budget-mid", "vs_envelope_lo"] <= 2.5 <= t.loc["budget-mid", "vs_envelope_hi"]
    assert math.isnan(t.loc["budget-far", "vs_envelope"])
    be = np.array([[1.0, 2.0, 3.0, 4.0, 3.0, 2.0]])
    acc = np.array([[65.0, 60.0, 40.0, 30.0, 45.0, 61.0]])
    assert matched_difference(be, acc, [0, 1, 2, 3], 4, "interpolation")[0] == pytest.approx(45.0 - 40.0)
    assert matched_difference(be, acc, [0, 1, 2, 3], 4, "envelope")[0] == pytest.approx(45.0 - 45.0)
    assert matched_difference(be, acc, [0, 1, 2, 3], 5, "envelope")[0] == pytest.approx(61.0 - 60.0)
    with pytest.raises(ValueError, match="construction"):
        matched_difference(be, acc, [0, 1], 4, "hull")
