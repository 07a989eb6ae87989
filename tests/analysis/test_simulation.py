"""The Figure-4 simulation of Lemma 1 (exact arithmetic on seeded random pairs; no statistical assertions)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from verispec import rules
from verispec.analysis import acceptance_probability, allowed_set, lemma1
from verispec.analysis.simulation import (
    COLUMNS,
    DEFAULT_TRIPLETS,
    ETA_PARAMS,
    MINP_PARAMS,
    category_counts,
    draw_pairs,
    save,
    simulate,
    simulate_pairs,
)

N_PAIRS = 100


@pytest.fixture(scope="module")
def per_pair() -> pd.DataFrame:
    return simulate_pairs(n_pairs=N_PAIRS, seed=1)


def test_lemma1_direct_equals_gain_minus_loss_on_every_pair(per_pair):
    n_rows = len(DEFAULT_TRIPLETS) * (len(MINP_PARAMS) + len(ETA_PARAMS)) * N_PAIRS
    assert len(per_pair) == n_rows
    gap = (per_pair["direct"] - (per_pair["gain"] - per_pair["loss"])).abs()
    assert float(gap.max()) < 1e-12
    assert np.allclose(per_pair["net"], per_pair["gain"] - per_pair["loss"], atol=0, rtol=0)
    assert (per_pair["gain"] >= -1e-15).all() and (per_pair["loss"] >= -1e-15).all()
    assert ((per_pair["kept_mass"] > 0) & (per_pair["kept_mass"] <= 1 + 1e-12)).all()
    assert (per_pair["allowed_size"] >= 1).all()


def test_direct_is_the_change_in_acceptance_of_the_rules():
    # Delta BE = acceptance(truncated target + lossless SD) - acceptance(lossless SD), through the rules' own h
    # and their own draft transform: the matched baseline as it runs by default (draft_truncation="none")
    p, q = draw_pairs(DEFAULT_TRIPLETS[1], 200, rng=5, q_tail=1.0)
    for strategy, param, rule in (
        ("minp", 0.3, rules.get("minp-sampling", p_base=0.3)),
        ("eta", 0.1, rules.get("eta-sampling", epsilon=0.1)),
    ):
        lem = lemma1(p, q, allowed_set(p, strategy, param))
        delta = acceptance_probability(rule, p, rule.draft(q)) - acceptance_probability("lossless", p, q)
        assert float((lem.direct - delta).abs().max()) < 1e-12
        assert float((lem.net - delta).abs().max()) < 1e-12
        # the old baseline (q truncated by the same strategy) is not what Lemma 1 describes
        same = rules.get(rule.name, **{**rule.params, "draft_truncation": "same"})
        old = acceptance_probability(same, p, same.draft(q)) - acceptance_probability("lossless", p, q)
        assert float((lem.net - old).abs().max()) > 1e-3


def test_simulation_records_the_baseline_it_ran():
    df = simulate_pairs(triplets=[DEFAULT_TRIPLETS[0]], n_pairs=50, seed=2, q_tail=1.0)
    assert set(df["draft_truncation"]) == {"none"}
    assert float((df["baseline_delta"] - df["direct"]).abs().max()) < 1e-12
    same = simulate_pairs(triplets=[DEFAULT_TRIPLETS[0]], n_pairs=50, seed=2, q_tail=1.0, draft_truncation="same")
    assert set(same["draft_truncation"]) == {"same"}
    assert float((same["baseline_delta"] - same["direct"]).abs().max()) > 1e-3
    pd.testing.assert_series_equal(same["net"], df["net"])  # Lemma 1 itself does not depend on the choice


def test_draw_pairs_structure():
    p, q, labels = draw_pairs((0.6, 0.2, 0.2), 300, vocab=50, k=10, rng=0, return_labels=True)
    assert p.shape == q.shape == labels.shape == (300, 50) and p.dtype == q.dtype == torch.float64
    for lab, count in zip((0, 1, 2, -1), (6, 2, 2, 40), strict=True):
        assert ((labels == lab).sum(-1) == count).all()
    cand = labels >= 0
    for x in (p, q):
        assert (x >= 0).all()
        assert torch.allclose(x.sum(-1), torch.ones(300, dtype=torch.float64), atol=1e-12, rtol=0)
    mass = torch.where(cand, p, torch.zeros_like(p)).sum(-1)
    assert ((mass >= 0.85 - 1e-12) & (mass <= 0.95 + 1e-12)).all()
    # q_tail = 0: q has no mass on p's tail except the unrelated tokens' destinations (at most 2 of them here)
    assert int(((q > 0) & ~cand).sum(-1).max()) <= 2
    assert int(((q > 0) & ~cand).sum(-1).min()) >= 1


def test_draw_pairs_categories():
    # all matching: q / p in [0.9, 1.1] up to q's normalization, on every candidate
    p, q, labels = draw_pairs((1, 0, 0), 100, rng=2, return_labels=True)
    ratio = (q / p)[labels >= 0].view(100, 10)
    spread = ratio.max(-1).values / ratio.min(-1).values
    assert (spread <= 1.1 / 0.9 + 1e-12).all()
    assert torch.allclose(q[labels < 0], torch.zeros(1, dtype=torch.float64))  # no unrelated: nothing outside
    # all partial: factors in [0.3, 3], so the spread is at most 10
    p, q, labels = draw_pairs((0, 1, 0), 100, rng=2, return_labels=True)
    ratio = (q / p)[labels >= 0].view(100, 10)
    assert (ratio.max(-1).values / ratio.min(-1).values <= 10 + 1e-9).all()
    # all unrelated: every candidate keeps at most 10 % of p(x); q's total before normalization is p's candidate
    # mass m >= 0.85 (q_tail = 0), so after it q / p <= 0.1 / 0.85
    p, q, labels = draw_pairs((0, 0, 1), 100, rng=3, return_labels=True)
    assert ((q / p)[labels >= 0] <= 0.1 / 0.85 + 1e-12).all()
    assert (torch.where(labels < 0, q, torch.zeros_like(q)).sum(-1) >= 0.8).all()
    # draft copies p's tail profile when q_tail = 1
    p, q = draw_pairs((1, 0, 0), 50, rng=4, q_tail=1.0)
    assert (q > 0).all()


def test_category_counts():
    assert category_counts((0.8, 0.1, 0.1), 10) == (8, 1, 1)
    assert category_counts((0.4, 0.3, 0.3), 10) == (4, 3, 3)
    assert category_counts((0.2, 0.4, 0.4), 10) == (2, 4, 4)
    assert sum(category_counts((1 / 3, 1 / 3, 1 / 3), 10)) == 10
    assert category_counts((2, 1, 1), 8) == (4, 2, 2)
    for bad in ((0.5, 0.5), (-0.1, 0.6, 0.5), (0, 0, 0), (float("nan"), 0.5, 0.5)):
        with pytest.raises(ValueError, match="triplet"):
            category_counts(bad, 10)
    with pytest.raises(ValueError, match="k"):
        draw_pairs((1, 0, 0), 3, vocab=10, k=10)
    with pytest.raises(ValueError, match="q_tail"):
        draw_pairs((1, 0, 0), 3, q_tail=-1.0)


def test_simulate_summary_and_seed():
    df = simulate(n_pairs=40, seed=7)
    assert list(df.columns) == COLUMNS
    assert len(df) == len(DEFAULT_TRIPLETS) * (len(MINP_PARAMS) + len(ETA_PARAMS))
    assert set(df["strategy"]) == {"minp", "eta"}
    assert sorted(df.loc[df["strategy"] == "minp", "param"].unique()) == list(MINP_PARAMS)
    assert sorted(df.loc[df["strategy"] == "eta", "param"].unique()) == list(ETA_PARAMS)
    assert set(df["triplet"]) == {"0.8/0.1/0.1", "0.6/0.2/0.2", "0.4/0.3/0.3", "0.2/0.4/0.4"}
    assert (df["n_pairs"] == 40).all()
    assert (df["max_abs_gap"] < 1e-12).all()
    assert np.allclose(df["net_mean"], df["gain_mean"] - df["loss_mean"], atol=1e-15)
    assert np.allclose(df["net_mean"], df["direct_mean"], atol=1e-12)
    assert (df[["gain_std", "loss_std", "net_std"]] >= 0).all().all()
    pd.testing.assert_frame_equal(df, simulate(n_pairs=40, seed=7))
    assert not simulate(n_pairs=40, seed=8)["net_mean"].equals(df["net_mean"])


def test_save_writes_csv_and_png(tmp_path):
    df = simulate(triplets=[(0.8, 0.1, 0.1), (0.2, 0.4, 0.4)], n_pairs=20, minp_params=[0.1, 0.5], eta_params=[0.1])
    csv_path, png_path = save(df, tmp_path / "out")
    assert csv_path.exists() and png_path.exists()
    back = pd.read_csv(csv_path)
    assert list(back.columns) == COLUMNS
    assert len(back) == 2 * 3
    assert np.allclose(back["net_mean"], df["net_mean"], rtol=1e-9, atol=1e-12)
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png_path.stat().st_size > 10_000
