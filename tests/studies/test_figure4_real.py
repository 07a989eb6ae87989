"""Figure 4 on logged real pairs (verispec.studies.figure4_real) and the shared per-pair terms: exact values on
hand-made (p, q) whose gain, loss and net are computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner

from verispec.analysis.simulation import COLUMNS, pair_terms, simulate
from verispec.cli.main import main
from verispec.eval.estimator import DistLog, Trajectory, be_trajectory
from verispec.studies.figure4_real import (
    cluster_se,
    generator_ablation,
    log_pairs,
    pair_stats,
    real_pairs,
    real_summary,
    report,
)

T = 1e-12


def t64(*rows: tuple[float, ...]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


# (p, q) worked by hand. Pair A: min-p 0.4 keeps {0, 1} (threshold 0.24), z = 0.9; gain = min(0.2, (1/z - 1) 0.6,
# 0.6 / z) = 0.6 / 9 = 1/15 on token 0 and 0 on token 1 (q < p); loss = min(0.1, 0.1) = 1/10; net = -1/30.
# Check: p_A = (2/3, 1/3, 0), sum min(p_A, q) = 2/3 + 0.1 = 23/30 vs sum min(p, q) = 0.8 = 24/30.
# Pair B: min-p 0.4 keeps {0, 1} (threshold 0.2), z = 0.9; gain = min(0.2, 0.5 / 9, .) = 1/18; the draft has no
# mass on token 2, loss = 0; net = +1/18.
P = t64((0.6, 0.3, 0.1), (0.5, 0.4, 0.1))
Q = t64((0.8, 0.1, 0.1), (0.7, 0.3, 0.0))


def test_pair_terms_by_hand_minp():
    out = pair_terms(P, Q, "minp", 0.4, "none")
    assert np.allclose(out["gain"], [1 / 15, 1 / 18], atol=T, rtol=0)
    assert np.allclose(out["loss"], [1 / 10, 0.0], atol=T, rtol=0)
    assert np.allclose(out["net"], [-1 / 30, 1 / 18], atol=T, rtol=0)
    assert np.allclose(out["direct"], out["net"], atol=T, rtol=0)
    assert np.allclose(out["baseline_delta"], out["net"], atol=T, rtol=0)  # untruncated draft: Lemma 1 itself
    assert np.allclose(out["lossless_acc"], [0.8, 0.8], atol=T, rtol=0)
    assert np.allclose(out["kept_mass"], [0.9, 0.9], atol=T, rtol=0)
    assert list(out["allowed_size"]) == [2, 2]
    # the baseline as paper_small ran it truncates q too: pair A's q keeps {0} (threshold 0.32), q' = (1, 0, 0),
    # acceptance sum min(p_A, q') = 2/3 vs 0.8; pair B's q keeps {0, 1} (0.28), q' = (0.7, 0.3, 0): unchanged
    same = pair_terms(P, Q, "minp", 0.4, "same")
    assert np.allclose(same["baseline_delta"], [2 / 3 - 0.8, 1 / 18], atol=T, rtol=0)
    assert np.allclose(same["net"], out["net"], atol=0, rtol=0)


def test_pair_terms_by_hand_eta():
    # pair A: H(p) = 0.8979 nats, threshold min(0.25, 0.25 e^-H) = 0.1019 > 0.1: the same A = {0, 1} as above
    h = -sum(x * math.log(x) for x in (0.6, 0.3, 0.1))
    assert 0.1 < 0.25 * math.exp(-h) < 0.3
    out = pair_terms(P[:1], Q[:1], "eta", 0.25)
    assert abs(float(out["net"][0]) + 1 / 30) < T and abs(float(out["gain"][0]) - 1 / 15) < T
    # epsilon 0.05: threshold 0.0204 keeps everything: no gain, no loss
    out = pair_terms(P[:1], Q[:1], "eta", 0.05)
    assert abs(float(out["gain"][0])) < T and abs(float(out["loss"][0])) < T and list(out["allowed_size"]) == [3]


def _log() -> DistLog:
    """Two trajectories of different widths: pair A alone (2 stored columns + other bin), then A and B padded
    (3 stored columns + other bin); the zero columns must change nothing."""
    a = Trajectory("humaneval|x|lossless|s0", 4, [1], t64((0.6, 0.3, 0.1)), t64((0.8, 0.1, 0.1)),
                   torch.tensor([[5, 7]], dtype=torch.int32))
    b = Trajectory("gsm|y|lossless|s0", 4, [1, 2], t64((0.6, 0.3, 0.0, 0.1), (0.5, 0.4, 0.1, 0.0)),
                   t64((0.8, 0.1, 0.0, 0.1), (0.7, 0.3, 0.0, 0.0)),
                   torch.tensor([[1, 2, 3], [1, 2, 3]], dtype=torch.int32))
    return DistLog([a, b], top_k=2, vocab_size=10)


def test_log_pairs_pads_and_keys():
    p, q, keys = log_pairs(_log())
    assert p.shape == q.shape == (3, 4) and p.dtype == torch.float64
    assert keys == ["humaneval|x|lossless|s0", "gsm|y|lossless|s0", "gsm|y|lossless|s0"]
    assert torch.equal(p[0], t64((0.6, 0.3, 0.1, 0.0))[0])
    p2, _, keys2 = log_pairs(_log(), keys=["gsm|y|lossless|s0"])
    assert p2.shape == (2, 4) and set(keys2) == {"gsm|y|lossless|s0"}
    with pytest.raises(ValueError, match="no logged"):
        log_pairs(_log(), keys=["nope"])


def test_real_pairs_and_summary_by_hand():
    p, q, keys = log_pairs(_log())
    per = real_pairs(p, q, keys, minp_params=[0.4], eta_params=[0.25], draft_truncation="none")
    mp = per[per["strategy"] == "minp"]
    assert np.allclose(mp["net"], [-1 / 30, -1 / 30, 1 / 18], atol=T, rtol=0)  # padding changed nothing
    assert list(mp["task"]) == ["humaneval", "gsm", "gsm"]
    s = real_summary(per)
    assert set(s["triplet"]) == {"real", "real:humaneval", "real:gsm"}
    row = s[(s["triplet"] == "real") & (s["strategy"] == "minp")].iloc[0]
    assert abs(row["net_mean"] - (-1 / 30 - 1 / 30 + 1 / 18) / 3) < T
    assert abs(row["gain_mean"] - (1 / 15 + 1 / 15 + 1 / 18) / 3) < T
    assert abs(row["loss_mean"] - 0.2 / 3) < T
    assert row["n_pairs"] == 3 and row["n_trajectories"] == 2
    gsm = s[(s["triplet"] == "real:gsm") & (s["strategy"] == "minp")].iloc[0]
    assert abs(gsm["net_mean"] - (-1 / 30 + 1 / 18) / 2) < T and gsm["n_pairs"] == 2
    # BE_traj along the trajectories, gamma 5: lossless acceptance 0.8 everywhere; with the truncated target
    # 0.8 - 1/30 at A-positions and 0.8 + 1/18 at the B-position
    acc, rounds = be_trajectory([0.8], 5)
    acc2, rounds2 = be_trajectory([0.8, 0.8], 5)
    assert abs(row["be_traj_lossless"] - (acc + acc2) / (rounds + rounds2)) < T
    a1, r1 = be_trajectory([0.8 - 1 / 30], 5)
    a2, r2 = be_trajectory([0.8 - 1 / 30, 0.8 + 1 / 18], 5)
    assert abs(row["be_traj_lemma1"] - (a1 + a2) / (r1 + r2)) < T
    assert abs(row["be_traj_baseline"] - row["be_traj_lemma1"]) < T  # draft_truncation "none"


def test_cluster_se_by_hand():
    # mean 3; cluster residual sums -3 and +3: sqrt(18 * 2 / 1) / 4 = 1.5
    assert abs(cluster_se(pd.Series([1.0, 2.0, 3.0, 6.0]), pd.Series(list("aabb"))) - 1.5) < T
    assert math.isnan(cluster_se(pd.Series([1.0, 2.0]), pd.Series(["a", "a"])))


def test_pair_stats_by_hand():
    s = pair_stats(P[:1], Q[:1], p_base=0.4).iloc[0]
    h = -sum(x * math.log(x) for x in (0.6, 0.3, 0.1))
    assert abs(s["entropy_p"] - h) < T and abs(s["max_p"] - 0.6) < T and abs(s["max_q"] - 0.8) < T
    assert bool(s["same_argmax"]) and abs(s["tv"] - 0.2) < T and abs(s["lossless_acc"] - 0.8) < T
    assert s["allowed_p"] == 2 and s["allowed_q"] == 1 and abs(s["jaccard"] - 0.5) < T
    assert abs(s["q_on_allowed_p"] - 0.9) < T and abs(s["p_discarded"] - 0.1) < T and bool(s["affected"])
    assert not bool(pair_stats(P[:1], Q[:1], p_base=0.1).iloc[0]["affected"])  # 0.1 keeps all three tokens
    assert abs(s["overshoot_on_allowed_p"] - 0.2) < T


def test_generator_ablation_default_is_the_simulation():
    nets, shapes = generator_ablation(n_pairs=20, triplets=[(0.8, 0.1, 0.1)], minp_params=[0.3], eta_params=[0.1])
    default = nets[nets["variant"] == nets["variant"].iloc[0]].drop(columns="variant").reset_index(drop=True)
    pd.testing.assert_frame_equal(default, simulate([(0.8, 0.1, 0.1)], n_pairs=20, minp_params=[0.3], eta_params=[0.1]))
    assert len(shapes) == nets["variant"].nunique() and (shapes["n_pairs"] == 20).all()
    peaked = shapes[shapes["source"].str.startswith("alpha 0.03")]["max_p"].iloc[0]
    assert peaked > shapes["max_p"].iloc[0]  # a smaller concentration gives a more peaked p


def test_report_and_cli(tmp_path):
    path = tmp_path / "dists.pt"
    _log().save(path)
    paths = report(path, tmp_path / "a", n_pairs=5, ablation=False)
    df = pd.read_csv(paths["csv"])
    assert set(df["source"]) == {"real", "simulation"}
    assert set(COLUMNS) <= set(df.columns)
    row = df[(df["source"] == "real") & (df["triplet"] == "real") & (df["strategy"] == "minp") & (df["param"] == 0.4)]
    assert abs(float(row["net_mean"].iloc[0]) - (-1 / 30 - 1 / 30 + 1 / 18) / 3) < 1e-9
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    stats = pd.read_csv(paths["stats"])
    assert {"real", "real:humaneval", "real:gsm", "simulation q_tail 0", "simulation q_tail 1"} <= set(stats["source"])
    res = CliRunner().invoke(main, ["simulate", "--out", str(tmp_path / "b"), "--pairs", "5", "--from-log", str(path)])
    assert res.exit_code == 0, res.output
    assert "figure4_real.csv" in res.output and (tmp_path / "b" / "ablation.png").exists()
    back = pd.read_csv(tmp_path / "b" / "figure4_real.csv")
    pd.testing.assert_frame_equal(back[back["source"] == "real"].reset_index(drop=True),
                                  df[df["source"] == "real"].reset_index(drop=True))
    res = CliRunner().invoke(main, ["simulate", "--out", str(tmp_path / "c"), "--other-log", str(path)])
    assert res.exit_code == 1 and "--other-log needs --from-log" in res.output
