"""findings.json on a comparison that covers a single problem: every cluster resample is that problem, so there is no
interval (``bench compare`` prints none) and no verdict can rest on one."""

from __future__ import annotations

import json
from pathlib import Path

from verispec.eval.report import compare_runs
from verispec.studies.findings import Comparison, compute
from verispec.studies.verdict import EFFECT, NOT_TESTABLE


def _write(run: Path, problems: int) -> None:
    """Setting "A" at BE 0.3 and lossless at BE 0.5 on ``problems`` problems x 3 seeds, every unit passed."""
    run.mkdir(parents=True)
    lines = []
    for label, accepted in (("A", 3), ("lossless", 5)):
        for i in range(problems):
            for seed in range(3):
                lines.append({"key": f"t|P/{i}|{label}|s{seed}", "task": "t", "problem_id": f"P/{i}", "method": label,
                              "label": label, "baseline": "lossless", "lossless": label == "lossless", "seed": seed,
                              "params": {}, "grade": {"passed": True, "score": 1.0}, "accepted": accepted,
                              "emitted_accepted": accepted, "rounds": 10, "drafted": 50, "new_tokens": 40,
                              "timings": {"total_s": 1.0}, "finish_reason": "stop", "text": "", "token_ids": []})
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_a_single_problem_gives_no_interval_and_no_verdict(tmp_path):
    c = Comparison("claim", "t", "r", "A", "lossless", "BE", -0.2, EFFECT)
    _write(tmp_path / "r", problems=1)
    table, _ = compare_runs(tmp_path / "r", None, [("A", "lossless")], n_boot=200)
    assert table["a_d_be_lo"].isna().all()  # bench compare: no interval on one problem
    (obj,) = compute(tmp_path, [c], n_boot=200)
    assert obj["estimate"] == -0.2 and obj["n_pairs"] == 3
    assert obj["ci"] is None and obj["ci_adjusted"] is None and obj["family_size"] is None
    assert obj["verdict"] == NOT_TESTABLE  # not "reproduced" on a zero-width interval [-0.2, -0.2]
    _write(tmp_path / "two" / "r", problems=2)
    (obj,) = compute(tmp_path / "two", [c], n_boot=200)
    assert obj["ci"] is not None and obj["family_size"] == 1
