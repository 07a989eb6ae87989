"""Metric naming and counting: accepted_fraction (formerly acceptance_rate), the tutorial's
expected acceptance A = sum_x min(p, q), and BE over EMITTED accepted drafts, recomputed for old result files."""

from __future__ import annotations

import json
import math

import pytest
import torch

from verispec import rules
from verispec.eval.estimator import DistLog, Trajectory, estimate, position_stats
from verispec.eval.metrics import emitted_accepted, record_accepted_fraction, record_emitted_accepted
from verispec.eval.report import load_frame, per_seed


def test_emitted_accepted_drops_drafts_after_the_cut():
    # two rounds of 5 accepted drafts (+ bonus each), EOS is the 8th output token: round 1 emits 6 tokens, round 2
    # only 2, both accepted drafts -> 7 emitted accepted drafts, not 10
    assert emitted_accepted([(5, 5), (5, 5)], 8) == 7
    assert emitted_accepted([(5, 5), (5, 5)], 12) == 10  # nothing cut: the bonus of round 2 is the 12th token
    assert emitted_accepted([(5, 2), (5, 0), (5, 3)], 8) == 5
    assert emitted_accepted([(0, 0), (0, 0)], 2) == 0
    assert emitted_accepted([], 0) == 0


def test_record_readers_are_defensive():
    old = {"accepted": 10, "drafted": 12, "acceptance_rate": 10 / 12, "per_round": [[6, 5], [6, 5]],
           "token_ids": list(range(8))}
    assert record_emitted_accepted(old) == 7
    assert record_accepted_fraction(old) == pytest.approx(10 / 12)
    new = {"accepted": 7, "drafted": 12, "accepted_fraction": 0.5, "emitted_accepted": 7}
    assert record_emitted_accepted(new) == 7 and record_accepted_fraction(new) == 0.5
    bare = {"accepted": 3, "drafted": 0}
    assert record_emitted_accepted(bare) == 3 and math.isnan(record_accepted_fraction(bare))


def _line(key, accepted, rounds, per_round, n_tokens, **extra):
    rec = {"key": key, "task": "toy", "problem_id": key, "method": "lossless", "label": "lossless",
           "baseline": "lossless", "lossless": True, "seed": 0, "params": {}, "grade": {"passed": True, "score": 1.0},
           "accepted": accepted, "rounds": rounds, "drafted": 5 * rounds, "new_tokens": n_tokens,
           "timings": {"total_s": 1.0}, "be": accepted / rounds, "finish_reason": "stop", "text": "x",
           "token_ids": list(range(n_tokens)), "per_round": per_round}
    rec.update(extra)
    return rec


def test_report_be_counts_emitted_accepted_drafts(tmp_path):
    """An old result line whose EOS lies inside an accepted block: the report's BE drops the uncommitted drafts;
    a new line's emitted_accepted is used as stored; accepted_fraction falls back to acceptance_rate."""
    lines = [_line("a", 10, 2, [[5, 5], [5, 5]], 8, acceptance_rate=1.0),
             _line("b", 4, 2, [[5, 2], [5, 2]], 6, accepted_fraction=0.4, emitted_accepted=4)]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    df = load_frame(tmp_path)
    a, b = df.set_index("key").loc["a"], df.set_index("key").loc["b"]
    assert a["accepted"] == 7 and a["accepted_all"] == 10 and a["be"] == 3.5
    assert a["accepted_fraction"] == 1.0 and b["accepted_fraction"] == 0.4
    assert b["accepted"] == 4 and b["be"] == 2.0
    seeds = per_seed(df)
    assert float(seeds["be"].iloc[0]) == pytest.approx(11 / 4)


def test_estimator_reports_the_tutorial_expected_acceptance():
    p = torch.tensor([[0.6, 0.3, 0.1, 0.0], [0.5, 0.5, 0.0, 0.0]], dtype=torch.float64)
    q = torch.tensor([[0.2, 0.5, 0.3, 0.0], [0.5, 0.25, 0.25, 0.0]], dtype=torch.float64)
    traj = Trajectory("k", 1, [0, 1], p, q)  # dense: the last column is the (empty) "other" bin
    log = DistLog([traj], top_k=None, vocab_size=3)
    a = position_stats(traj, "lossless")["expected_acceptance"]
    assert a.tolist() == pytest.approx([0.6, 0.75], abs=1e-15)
    rows = estimate(log, ["lossless", rules.get("cos-we", lam=0.5)], gamma=2)
    for row in rows:
        assert row["expected_acceptance"] == pytest.approx(0.675, abs=1e-15)  # the same for every rule
    assert rows[0]["alpha"] == pytest.approx(0.675, abs=1e-15)  # lossless: alpha is A
    assert rows[1]["alpha"] > rows[0]["alpha"]


def test_estimator_uses_the_untruncated_draft_for_baselines():
    p = torch.tensor([[0.6, 0.3, 0.1, 0.0]], dtype=torch.float64)
    q = torch.tensor([[0.2, 0.5, 0.3, 0.0]], dtype=torch.float64)
    traj = Trajectory("k", 1, [0], p, q)
    none = position_stats(traj, rules.get("minp-sampling", p_base=0.5))["alpha"]
    same = position_stats(traj, rules.get("minp-sampling", p_base=0.5, draft_truncation="same"))["alpha"]
    # p_Theta = [2/3, 1/3, 0, 0]: sum min(p_Theta, q) = 0.2 + 1/3 with q untouched; "same" truncates q to
    # [0, 5/8, 3/8, 0], giving 1/3
    assert float(none[0]) == pytest.approx(0.2 + 1 / 3, abs=1e-15)
    assert float(same[0]) == pytest.approx(1 / 3, abs=1e-15)
