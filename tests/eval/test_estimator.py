"""Offline estimator on tiny models (vocab 64, full distributions: no top-k approximation).

The check against measured acceptance is exact, not approximate: on the engine's own outputs, every reached
draft position is a Bernoulli(alpha_t) trial given the past, where alpha_t is the estimator's acceptance
computed from the distributions logged along that output (see ``verispec.eval.estimator``). So
Z = (accepted - sum alpha_t) / sqrt(sum alpha_t (1 - alpha_t)) is approximately standard normal (martingale
CLT, ~1000 trials per rule here); the tolerance is |Z| < 4 (two-sided false-alarm rate ~6e-5), with fixed seeds.
The same statistic computed with the WRONG rule must be far outside that band, so the test can fail.
"""

from __future__ import annotations

import math

import pytest
import torch

from verispec.analysis import acceptance_probability
from verispec.backends.hf import HFBackend
from verispec.core.rules import get
from verispec.core.sampling import SamplingConfig
from verispec.drafters import ModelDrafter
from verispec.eval.estimator import (
    DistLog,
    be_iid,
    be_trajectory,
    estimate,
    log_distributions,
    position_stats,
    round_check,
)
from verispec.runtime.engine import SpeculativeEngine
from verispec.testing import tiny_qwen

CFG = SamplingConfig(temperature=0.7)
RUNS, NEW, GAMMA = 30, 40, 3


@pytest.fixture(scope="module")
def pair():
    return tiny_qwen(1, vocab_size=64, logit_scale=3.0), tiny_qwen(2, vocab_size=64, logit_scale=3.0)


def _runs(pair, rule, n=RUNS):
    target, draft = pair
    eng = SpeculativeEngine(HFBackend(target), ModelDrafter(HFBackend(draft)))
    gen = torch.Generator().manual_seed(11)
    out = []
    for s in range(n):
        prompt = torch.randint(0, 64, (6,), generator=gen).tolist()
        out.append((f"run{s}", prompt, eng.generate(prompt, rule=rule, sampling=CFG, gamma=GAMMA,
                                                     max_new_tokens=NEW, seed=s)))
    return out


def _z(log, runs, rule):
    e = v = 0.0
    o = n = 0
    for (_, _, res), traj in zip(runs, log.trajectories, strict=True):
        a, b, c, d = round_check(position_stats(traj, rule)["alpha"], res.metrics.per_round)
        e, v, o, n = e + a, v + b, o + c, n + d
    assert n == sum(min(a + 1, d) for res in (r for _, _, r in runs) for d, a in res.metrics.per_round)
    return (o - e) / math.sqrt(v), n


@pytest.mark.parametrize("rule, wrong", [
    (get("lossless"), get("lenience", l=0.5)),
    (get("spec-cascade", p_base=0.3), get("lossless")),
])
def test_expected_acceptance_matches_engine(pair, rule, wrong):
    runs = _runs(pair, rule)
    log = log_distributions(*pair, [(k, p, r.token_ids) for k, p, r in runs], CFG, top_k=None)
    z, trials = _z(log, runs, rule)
    assert trials > 800
    assert abs(z) < 4, f"estimator vs measured acceptance: z = {z:.2f} over {trials} trials"
    z_wrong, _ = _z(log, runs, wrong)
    assert abs(z_wrong) > 6, f"the check has no power: the wrong rule gives z = {z_wrong:.2f}"


def test_log_contents_topk_and_roundtrip(pair, tmp_path):
    target, draft = pair
    prompt, cont = [1, 2, 3, 4], [5, 9, 13, 2, 7, 7, 30, 41]
    dense = log_distributions(target, draft, [("a", prompt, cont)], CFG, top_k=None)
    t = dense.trajectories[0]
    assert t.p.shape == (8, 65) and t.index is None
    assert torch.allclose(t.p.sum(-1), torch.ones(8, dtype=torch.float64))
    assert torch.all(t.p[:, -1] == 0)
    # the logged p at position i is the target's processed distribution given prompt + cont[:i]
    with torch.no_grad():
        logits = target(torch.tensor([prompt + cont[:3]])).logits[0, -1]
    ref = torch.softmax(logits.double() / 0.7, -1)
    assert torch.allclose(t.p[3, :64], ref, atol=1e-5)

    small = log_distributions(target, draft, [("a", prompt, cont)], CFG, top_k=4)
    s = small.trajectories[0]
    assert s.index.shape == (8, 8) and s.p.shape == (8, 9)
    assert torch.allclose(s.p.sum(-1), torch.ones(8, dtype=torch.float64))
    assert torch.allclose(s.q.sum(-1), torch.ones(8, dtype=torch.float64))
    # stored columns carry both exact probabilities; no id twice
    for row in range(8):
        ids = s.index[row][s.index[row] >= 0].long()
        assert len(set(ids.tolist())) == len(ids)
        assert torch.allclose(s.p[row, : len(ids)], t.p[row, ids])
        assert torch.allclose(s.q[row, : len(ids)], t.q[row, ids])
    # lossless acceptance with the lumped tail: error in [0, min(P_other, Q_other)]
    exact = acceptance_probability("lossless", t.p, t.q)
    approx = position_stats(s, "lossless")["alpha"]
    err = approx - exact
    assert torch.all(err >= -1e-12)
    assert torch.all(err <= torch.minimum(s.p[:, -1], s.q[:, -1]) + 1e-12)

    path = tmp_path / "d.pt"
    small.save(path)
    back = DistLog.load(path)
    assert back.top_k == 4 and back.keys() == {"a"} and torch.equal(back.trajectories[0].p, s.p)
    # logging again skips known keys
    assert len(log_distributions(target, draft, [("a", prompt, cont)], CFG, top_k=4, log=back).trajectories) == 1
    # saved through a temporary file (no leftovers); a damaged or empty log is an error naming the file, not a
    # traceback from torch (or click's bare "Aborted!" for an empty file's EOFError)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.pt"]
    for cut in (path.stat().st_size // 2, 0):
        bad = tmp_path / f"cut{cut}.pt"
        bad.write_bytes(path.read_bytes()[:cut])
        with pytest.raises(ValueError, match=f"{bad.name} is not a readable distribution log"):
            DistLog.load(bad)


def test_backend_draft_logs_what_the_model_logs(pair):
    """A draft given as a backend (the llama.cpp drafter's face) logs the same q as the model, in a row of its
    own that is removed after; a wrong backend (another model) gives a different q, so the check can fail."""
    target, draft = pair
    prompt, cont = [1, 2, 3, 4], [5, 9, 13, 2, 7, 7]
    ref = log_distributions(target, draft, [("a", prompt, cont)], CFG, top_k=None).trajectories[0]
    backend = HFBackend(draft)
    stale = backend.add_row()
    backend.forward_ids(stale, [3, 3])  # another row's cache content must not leak into the log
    via = log_distributions(target, backend, [("a", prompt, cont)], CFG, top_k=None).trajectories[0]
    assert backend.num_rows == 1 and backend.cached_tokens(stale) == [3, 3]
    assert torch.allclose(via.q, ref.q, atol=1e-5) and torch.equal(via.p, ref.p)
    other = log_distributions(target, HFBackend(target), [("a", prompt, cont)], CFG, top_k=None).trajectories[0]
    assert (other.q - ref.q).abs().max() > 1e-2

def test_be_formulas():
    assert be_iid(0.5, 3) == pytest.approx(0.5 + 0.25 + 0.125)
    # alpha = 1: rounds of gamma accepted + bonus until the end (L = 12, gamma = 5: 2 rounds, 10 accepted)
    assert be_trajectory([1.0] * 12, 5) == pytest.approx((10.0, 2.0))
    # alpha = 0: one token per round, nothing accepted
    assert be_trajectory([0.0] * 7, 4) == pytest.approx((0.0, 7.0))
    # constant alpha on a long trajectory: renewal reward -> the i.i.d. value
    acc, rounds = be_trajectory([0.6] * 3000, 4)
    assert acc / rounds == pytest.approx(be_iid(0.6, 4), rel=2e-3)


def test_estimate_rows_and_kl_to_matched_baseline(pair):
    runs = _runs(pair, get("lossless"), 5)
    log = log_distributions(*pair, [(k, p, r.token_ids) for k, p, r in runs], CFG, top_k=None)
    rows = estimate(log, ["lossless", get("minp-sampling", p_base=0.3), get("spec-cascade", p_base=0.3),
                          get("cos-we", lam=0.5)], GAMMA)
    by = {r["rule"].split("(")[0]: r for r in rows}
    assert by["lossless"]["kl"] == pytest.approx(0, abs=1e-12)
    assert by["minp-sampling"]["kl"] == pytest.approx(0, abs=1e-12)  # lossless w.r.t. its truncated target
    assert by["spec-cascade"]["kl"] > 1e-3 and by["cos-we"]["tv"] > 1e-3
    for r in rows:
        assert 0 <= r["alpha"] <= 1 and r["positions"] == 5 * NEW and r["q_other_max"] == 0


def test_estimate_run_end_to_end_on_a_toy_sweep(tmp_path):
    """A toy sweep, then the estimator on it: every setting checked on the SAME first 2 (problem, seed) pairs,
    the self-check z small, the tables written, and the logged distributions reused on a second call."""
    import pandas as pd

    from verispec.eval.estimator import estimate_run
    from verispec.eval.run import run_sweep

    cfg = tmp_path / "toy.toml"
    cfg.write_text('name = "est"\nseeds = [0]\ngamma = 3\nmax_new_tokens = 24\n[models]\ntarget = "toy"\n'
                   '[[tasks]]\nname = "toy"\nlimit = 3\n'
                   '[[methods]]\nrule = "lossless"\n[[methods]]\nrule = "spec-cascade"\nparams = { p_base = 0.3 }\n')
    run_dir = tmp_path / "run"
    # two shards: the merged results list p0 L, p0 S, p1 M, p2 L, p2 S (shard 0) then p0 M, p1 L, p1 S, p2 M,
    # so "the first 2 outputs of each setting" would mix problems; the estimator must take p0 and p1 for all
    run_sweep(cfg, run_dir, progress=False, shard=(0, 2))
    run_sweep(cfg, run_dir, progress=False, shard=(1, 2))
    files = estimate_run(run_dir, top_k=None, max_per_setting=2)
    checks = pd.read_csv(files["selfcheck"])
    assert set(checks["setting"]) == {"lossless", "minp-sampling(p_base=0.3)", "spec-cascade(p_base=0.3)"}
    assert (checks["units"] == 2).all() and (checks["trials"] > 0).all()
    # 2 outputs x 24 tokens, a few dozen trials per setting: |z| < 4 (false alarm ~6e-5; fixed seeds)
    assert (checks["z"].abs() < 4).all()
    from verispec.eval.estimator import DistLog

    logged = DistLog.load(run_dir / "estimator" / "dists.pt").keys()
    assert {k.split("|")[1] for k in logged} == {"toy/0", "toy/1"} and len(logged) == 6
    est = pd.read_csv(files["estimate"])
    assert list(est["measured_units"]) == [2, 2, 2]
    assert files["markdown"].read_text().startswith("# Offline estimator")
    # a second call reuses the log: no engine is built
    estimate_run(run_dir, top_k=None, max_per_setting=2,
                 engine_factory=lambda c: pytest.fail("the distributions are cached"))


def test_logged_p_uses_the_engines_penalty_history(pair):
    """With frequency and presence penalties the logged p_t equals the engine's: penalties over the
    generated tokens only (the prompt's tokens are not penalized by them)."""
    from verispec.core.sampling import History, SamplingConfig, process

    target, draft = pair
    cfg = SamplingConfig(temperature=1.0, frequency_penalty=0.7, presence_penalty=0.3)
    prompt, cont = [5, 5, 5, 9], [5, 1, 5, 2]
    log = log_distributions(target, draft, [("a", prompt, cont)], cfg, top_k=None).trajectories[0]
    with torch.no_grad():
        logits = target(torch.tensor([prompt + cont])).logits[0].float()
    for t in range(len(cont)):
        want = process(logits[len(prompt) - 1 + t], cfg, History.of(prompt, cont[:t], logits.shape[-1]))
        assert torch.allclose(log.p[t][: want.shape[-1]], want, atol=1e-6)  # (last column: lumped tail)
    # and not the old reading that counted the prompt's tokens too
    old = process(logits[len(prompt) - 1], cfg, History.of([], prompt, logits.shape[-1]))
    assert (log.p[0][: old.shape[-1]] - old).abs().max() > 1e-3
