"""verispec.studies.be_curves on hand-made DistLogs (no models): BE_traj, alpha, TV, paired differences and the
trajectory bootstrap checked against closed forms.

Closed forms of be_trajectory with a constant acceptance a and gamma >= 2 (enumerate the rounds by hand):
* L = 2: the first round drafts 1 token; accepted (a): done, 1 accepted, 1 round; rejected: a second round
  drafting nothing. E[accepted] = a, E[rounds] = 2 - a.
* L = 3: the first round drafts 2; k = 0 (1 - a) leaves the L = 2 case, k = 1 (a (1 - a)) leaves one position
  (one round, nothing drafted), k = 2 (a^2) ends. E[accepted] = 2a, E[rounds] = 3 - 2a.
"""

from __future__ import annotations

import math

import pytest
import torch
from click.testing import CliRunner

from verispec.eval.estimator import DistLog, Trajectory, estimate
from verispec.eval.grid import setting
from verispec.studies.be_curves import Contrast, Curve, be_curves, paper_contrasts, paper_grid, shapes

torch.set_num_threads(1)

# pair X: p = (0.8, 0.2), q = (0.6, 0.4): lossless alpha = sum min = 0.8, TV 0.2
# pair Y: p = (0.5, 0.5), q = (0.9, 0.1): lossless alpha = 0.6, TV 0.4
PX, QX = [0.8, 0.2, 0.0], [0.6, 0.4, 0.0]  # last column: the "other" bin (empty: dense log)
PY, QY = [0.5, 0.5, 0.0], [0.9, 0.1, 0.0]


def _traj(key: str, p: list[float], q: list[float], n: int) -> Trajectory:
    return Trajectory(key, 1, [0] * n, torch.tensor([p] * n, dtype=torch.float64),
                      torch.tensor([q] * n, dtype=torch.float64), None)


def _log() -> DistLog:
    """Task x: one trajectory of length 3 on pair X; task y: one of length 2 on pair Y."""
    return DistLog([_traj("x|0", PX, QX, 3), _traj("y|0", PY, QY, 2)], top_k=None, vocab_size=2,
                   sampling={"temperature": 1.0})


def _len3(a: float) -> tuple[float, float]:
    return 2 * a, 3 - 2 * a


def _len2(a: float) -> tuple[float, float]:
    return a, 2 - a


def _row(res, label: str, task: str):
    t = res.table
    rows = t[(t["label"] == label) & (t["task"] == task)]
    assert len(rows) == 1, (label, task, len(rows))
    return rows.iloc[0]


# lenience l: alpha = sum min(q, p / l). X, l = 0.8: 0.6 + 0.25 = 0.85; Y: 0.625 + 0.1 = 0.725. l = 0.5: 1 and 1.
ALPHA = {("lossless", "x"): 0.8, ("lossless", "y"): 0.6, ("lenience(l=0.8)", "x"): 0.85,
         ("lenience(l=0.8)", "y"): 0.725, ("lenience(l=0.5)", "x"): 1.0, ("lenience(l=0.5)", "y"): 1.0}


def _expected_be(label: str) -> dict[str, float]:
    ax, bx = _len3(ALPHA[(label, "x")])
    ay, by = _len2(ALPHA[(label, "y")])
    return {"x": ax / bx, "y": ay / by, "all": (ax + ay) / (bx + by)}


def test_be_alpha_and_differences_match_the_closed_forms():
    res = be_curves(_log(), [Curve("lenience", "l", (0.5, 0.8))], gamma=5)
    assert set(res.table["task"]) == {"all", "x", "y"}
    for label in ("lossless", "lenience(l=0.5)", "lenience(l=0.8)"):
        exp = _expected_be(label)
        for task in ("all", "x", "y"):
            r = _row(res, label, task)
            assert r["be"] == pytest.approx(exp[task], abs=1e-12), (label, task)
        alpha = (3 * ALPHA[(label, "x")] + 2 * ALPHA[(label, "y")]) / 5
        assert _row(res, label, "all")["alpha"] == pytest.approx(alpha, abs=1e-12)
        assert _row(res, label, "all")["positions"] == 5 and _row(res, label, "all")["trajectories"] == 2
    lossless, l5, l8 = (_expected_be(x) for x in ("lossless", "lenience(l=0.5)", "lenience(l=0.8)"))
    for task in ("all", "x", "y"):
        r = _row(res, "lenience(l=0.8)", task)
        assert r["ref"] == "lossless"  # a collaborative rule's matched baseline
        assert r["d_ref"] == pytest.approx(l8[task] - lossless[task], abs=1e-12)
        assert r["d_lossless"] == pytest.approx(r["d_ref"], abs=1e-15)
        assert r["d_prev"] == pytest.approx(l8[task] - l5[task], abs=1e-12)  # 0.8 minus the previous l, 0.5
        assert math.isnan(_row(res, "lenience(l=0.5)", task)["d_prev"])  # the first value has no previous
        assert math.isnan(_row(res, "lossless", task)["d_ref"])


def test_bootstrap_interval_is_the_exact_percentile_of_the_three_resamples():
    """With two trajectories a resample is {x, x} (1/4), {x, y} (1/2) or {y, y} (1/4), so its BE is BE_x, the
    pooled BE or BE_y; the 2.5 % / 97.5 % percentiles of 2000 resamples are the smallest / largest of the three.
    A one-trajectory task resamples to itself: a zero-width interval at the point."""
    res = be_curves(_log(), [Curve("lenience", "l", (0.8,))], gamma=5, n_boot=2000, seed=0)
    lossless, l8 = _expected_be("lossless"), _expected_be("lenience(l=0.8)")
    for label, exp in (("lossless", lossless), ("lenience(l=0.8)", l8)):
        r = _row(res, label, "all")
        assert r["be_lo"] == pytest.approx(min(exp.values()), abs=1e-12)
        assert r["be_hi"] == pytest.approx(max(exp.values()), abs=1e-12)
        assert r["be_lo"] < r["be"] < r["be_hi"]
        for task in ("x", "y"):
            t = _row(res, label, task)
            assert t["be_lo"] == pytest.approx(t["be"], abs=1e-12) and t["be_hi"] == pytest.approx(t["be"], abs=1e-12)
    d = {k: l8[k] - lossless[k] for k in l8}  # the paired difference, resampled jointly
    r = _row(res, "lenience(l=0.8)", "all")
    assert r["d_ref_lo"] == pytest.approx(min(d.values()), abs=1e-12)
    assert r["d_ref_hi"] == pytest.approx(max(d.values()), abs=1e-12)
    assert r["d_ref_lo"] <= r["d_ref"] <= r["d_ref_hi"]
    # the contrast API gives the same interval for the same difference, and a relative one as a ratio
    assert res.contrast(Contrast("", ("lenience(l=0.8)",), ("lossless",))) == pytest.approx(
        (r["d_ref"], r["d_ref_lo"], r["d_ref_hi"]), abs=1e-12)
    rel = res.contrast(Contrast("", ("lenience(l=0.8)",), ("lossless",), relative=True), "x")
    assert rel[0] == pytest.approx(l8["x"] / lossless["x"] - 1, abs=1e-12)


def test_bootstrap_is_seeded_and_covers_the_point_on_many_trajectories():
    g = torch.Generator().manual_seed(3)
    trajs = []
    for i in range(12):
        n = int(torch.randint(4, 30, (1,), generator=g))
        p = torch.softmax(3 * torch.randn(n, 4, generator=g, dtype=torch.float64), -1)
        q = torch.softmax(p.log() + torch.randn(n, 4, generator=g, dtype=torch.float64), -1)
        zero = torch.zeros(n, 1, dtype=torch.float64)
        trajs.append(Trajectory(f"{'ab'[i % 2]}|{i}", 1, [0] * n, torch.cat([p, zero], -1),
                                torch.cat([q, zero], -1), None))
    log = DistLog(trajs, top_k=None, vocab_size=4)
    grid = [Curve("spec-cascade", "p_base", (0.1, 0.5)), Curve("cos-we", "lam", (0.3, 0.7))]
    a = be_curves(log, grid, gamma=3, n_boot=500, seed=7)
    b = be_curves(log, grid, gamma=3, n_boot=500, seed=7)
    c = be_curves(log, grid, gamma=3, n_boot=500, seed=8)
    assert a.table["be_lo"].equals(b.table["be_lo"]) and not a.table["be_lo"].equals(c.table["be_lo"])
    t = a.table
    assert ((t["be_lo"] <= t["be"] + 1e-12) & (t["be"] <= t["be_hi"] + 1e-12)).all()
    assert (t["be_hi"] - t["be_lo"] > 1e-6).all()  # 6 trajectories or more per group: a real spread
    d = t.dropna(subset=["d_ref"])
    assert ((d["d_ref_lo"] <= d["d_ref"] + 1e-12) & (d["d_ref"] <= d["d_ref_hi"] + 1e-12)).all()
    sc = t[(t["rule"] == "spec-cascade") & (t["task"] == "all")]
    assert list(sc["ref"]) == ["minp-sampling(p_base=0.1)", "minp-sampling(p_base=0.5)"]  # matched baselines
    # the references the grid lacks are rows too, and a truncation baseline's own reference is lossless
    mp = t[(t["label"] == "minp-sampling(p_base=0.1)") & (t["task"] == "all")].iloc[0]
    assert mp["curve"] == "reference" and mp["ref"] == "lossless"
    # the pooled numbers are the estimator's own (estimate(): same position_stats / be_trajectory)
    built = [x.rule_at(v) for x in grid for v in x.values]
    for rule, row in zip(built, estimate(log, built, 3), strict=True):
        mine = _row(a, setting(rule).label, "all")
        for k in ("be_traj", "alpha", "kl", "tv", "be_iid"):
            assert mine["be" if k == "be_traj" else k] == pytest.approx(row[k], abs=1e-12), k


def test_tv_to_the_matched_baseline_and_cos_we_paper_parameter():
    """CoS-WE(lam) induces lam p + (1 - lam) q: TV to p is (1 - lam) TV(p, q) = 0.5 * 0.2 on X, 0.5 * 0.4 on Y;
    its x is Table 4's t = 1 - lam."""
    curve = Curve("cos-we", "lam", (0.5, 0.8))
    res = be_curves(_log(), [curve], gamma=5)
    r = _row(res, "cos-we(lam=0.5)", "all")
    assert r["tv"] == pytest.approx((3 * 0.1 + 2 * 0.2) / 5, abs=1e-12)
    assert r["alpha"] == pytest.approx((3 * 0.9 + 2 * 0.8) / 5, abs=1e-12)  # 1 - lam TV(p, q)
    assert r["x_name"] == "t" and r["x"] == pytest.approx(0.5)
    assert _row(res, "cos-we(lam=0.8)", "all")["x"] == pytest.approx(0.2)
    # sorted by t, the previous value of lam 0.5 (t 0.5) is lam 0.8 (t 0.2)
    assert r["d_prev"] == pytest.approx(r["be"] - _row(res, "cos-we(lam=0.8)", "all")["be"], abs=1e-12)


def test_paper_grid_and_every_paper_claim_resolve():
    grid = paper_grid()
    names = {c.name for c in grid}
    assert {"minp-sampling", "spec-cascade", "typical", "eta-sampling", "minp-cap(p_base=0.5)",
            "adaptive-interpolation(realization=residual)", "minp-sampling(draft_truncation=same)"} <= names
    fine = {c.name: c for c in paper_grid(fine=True)}
    for c in grid:  # the fine axes contain the paper's values
        assert set(c.values) <= set(fine[c.name].values) and len(fine[c.name].values) > len(c.values)
    assert fine["spec-cascade"].values[:3] == (0.05, 0.1, 0.15)
    res = be_curves(_log(), grid, gamma=5, n_boot=50)
    missing = [c.name for c in paper_contrasts() if not res.has(c.plus + c.minus)]
    assert not missing
    sh = shapes(res)
    assert set(sh["curve"]) == names and set(sh["task"]) == {"all", "x", "y"}


def test_cli_writes_the_files(tmp_path):
    from verispec.cli.bench import bench

    path = tmp_path / "dists.pt"
    _log().save(path)
    out = tmp_path / "out"
    r = CliRunner().invoke(bench, ["be-curves", str(path), "--out", str(out), "--n-boot", "50"])
    assert r.exit_code == 0, r.output
    for name in ("be_curves.csv", "be_curves.md", "be_curves.png", "be_deltas.png", "be_shapes.csv",
                 "be_claims.csv"):
        assert (out / name).stat().st_size > 0, name
    md = (out / "be_curves.md").read_text()
    assert "Table 7: SpecCascade - min-p sampling" in md and "## min-p (Fig. 5 top)" in md
    bad = CliRunner().invoke(bench, ["be-curves", str(out / "be_curves.csv"), "--out", str(out)])
    assert bad.exit_code != 0
