"""Offline estimator: log the target's and draft's processed distributions along reference trajectories once,
then compute for ANY rule and parameter, without decoding again, the expected acceptance per position, the
expected block efficiency and the per-token KL / TV of the rule's induced distribution to its matched
baseline.

Logging (:func:`log_distributions`). A trajectory is (prompt ids, continuation ids), e.g. an output the
engine produced (lossless SD output is distributed as the target's own sampling). One full forward of the
target and one of the draft over prompt + continuation give, at every continuation position t, the logits
conditioned on the reference prefix; they go through :func:`verispec.core.sampling.process` with the sampling
config of the run (penalties use the prefix's token counts), giving p_t and q_t exactly as the engine
computes them before the rule's draft transform.

What is stored (the approximation). With ``top_k=None`` the full distributions are stored (exact; use it on
small vocabularies). With ``top_k=k`` (default 64) each position keeps the union of the k most probable
tokens of p_t and of q_t (at most 2k ids, each with BOTH its p and q probability, float64), and one extra
"other" bin holding the rest of each distribution: P_other = 1 - sum of stored p, Q_other = 1 - sum of stored
q. Rules are then evaluated on these (stored + 1)-bin distributions, the "other" bin acting as one token.
Consequences, stated per quantity:

* acceptance alpha_t = sum_x q(x) h(x): the stored tokens' terms are exact whenever h on a stored token
  depends only on its own (p, q) and on quantities the stored tokens determine (lossless, lenience, CoS-WE,
  overshoot-ceiling, spec-cascade/min-p: the max is always stored); the other bin contributes
  Q_other * h(other) in [0, Q_other] instead of the true sum over the tail, which also lies in
  [0, Q_other]. So |alpha_est - alpha_exact| <= Q_other for those rules (for lossless, 0 <= error <= min(P_other,
  Q_other) since min(sum a, sum b) >= sum min(a, b)). Rules whose threshold depends on the whole distribution
  (eta-sampling / typical: entropy; CoS-CD: normalization of p / q^lam; lenience's Delta for the correction)
  see the lumped distribution's value instead (the entropy of the lumped p is a lower bound of H(p)).
* KL / TV to the matched baseline are computed on the lumped distributions (a coarse-graining: KL and TV of
  the lumped distributions are lower bounds of the full ones, by the data-processing inequality).

The per-position tail masses are kept, and :func:`estimate` reports their mean and maximum so the error
budget is visible.

Expected BE (:func:`be_trajectory`, :func:`be_iid`). Along a trajectory with per-position acceptances
alpha_t, a round starting at position t drafts g = min(gamma, L - t - 1) tokens and accepts k of them with
probability alpha_t ... alpha_{t+k-1} (1 - alpha_{t+k}); the next round starts at t + k + 1. A backward
recursion gives the expected rounds and accepted drafts to cover the trajectory; BE_traj = E[accepted] /
E[rounds], pooled over trajectories like the measured BE. This assumes the acceptances seen by the engine are
those along the reference trajectory (it ignores that a lossy rule's own outputs drift away from the
reference, and that the draft conditions on its own rejected guesses only within a round, where the
reference continues). The cruder i.i.d. approximation replaces every alpha_t by their mean a:
BE_iid = sum_{i=1..gamma} a^i.

Exact check (:func:`round_check`). On the engine's OWN output, the recursion is not an approximation for
acceptance: reaching block position j of a round means the j previous drafts were accepted, so they are the
output's tokens, so the draft's and target's distributions at that position are exactly the logged ones
along the output. Each reached position is therefore a Bernoulli(alpha_t) trial given the past, and
(accepted - sum alpha_t over reached positions) is a martingale with variance sum alpha_t (1 - alpha_t):
the z-score tests the estimator against measured acceptance with no approximation (tests/eval/test_estimator).
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from verispec.analysis import induced_distribution, kl, tv
from verispec.backends.base import ScoreRequest
from verispec.core.rules import Rule, get, matched_baseline
from verispec.core.sampling import History, SamplingConfig, process
from verispec.defaults import drafter_spec
from verispec.eval.grid import SweepConfig, expand
from verispec.eval.metrics import record_emitted_accepted
from verispec.eval.run import default_engine_factory, encode_problem, load_problems
from verispec.eval.store import read_results, replacing
from verispec.eval.tasks import get_task

__all__ = [
    "DistLog",
    "Trajectory",
    "be_iid",
    "be_trajectory",
    "estimate",
    "log_distributions",
    "position_stats",
    "round_check",
]


@dataclass
class Trajectory:
    """Logged distributions of one reference trajectory.

    ``p``/``q`` [L, S + 1] float64: stored columns then the "other" bin (zero in dense mode); ``index``
    [L, S] token ids of the stored columns (-1 for padding) or None when dense (column = token id).
    """

    key: str
    prompt_len: int
    tokens: list[int]
    p: torch.Tensor
    q: torch.Tensor
    index: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return len(self.tokens)


@dataclass
class DistLog:
    """A set of logged trajectories plus how they were logged."""

    trajectories: list[Trajectory] = field(default_factory=list)
    top_k: int | None = 64
    vocab_size: int = 0
    sampling: dict[str, Any] = field(default_factory=dict)

    def save(self, path: str | Path) -> None:
        """Written to a temporary file and renamed over ``path``: a kill mid-save leaves the last whole log."""
        with replacing(Path(path)) as tmp:
            torch.save({"top_k": self.top_k, "vocab_size": self.vocab_size, "sampling": self.sampling,
                        "trajectories": [t.__dict__ for t in self.trajectories]}, tmp)

    @classmethod
    def load(cls, path: str | Path) -> DistLog:
        """A saved log; ValueError naming the file where it is not one (damaged, cut short, or another file)."""
        try:
            d = torch.load(path, weights_only=False)
            return cls([Trajectory(**t) for t in d["trajectories"]], d["top_k"], d["vocab_size"], d["sampling"])
        except (RuntimeError, EOFError, KeyError, TypeError, pickle.UnpicklingError) as exc:
            raise ValueError(f"{path} is not a readable distribution log ({type(exc).__name__}: {str(exc)[:120]}): "
                             "delete it, and the estimator logs its trajectories again") from None

    def keys(self) -> set[str]:
        return {t.key for t in self.trajectories}


# ------------------------------------------------------------------------------------------------ logging


def _compress(p: torch.Tensor, q: torch.Tensor, k: int | None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """[c, V] -> stored columns + other bin; dense when k is None or >= V."""
    c, v = p.shape
    if k is None or 2 * k >= v:
        zero = torch.zeros(c, 1, dtype=p.dtype)
        return torch.cat([p, zero], -1), torch.cat([q, zero], -1), None
    idx = torch.cat([p.topk(k, -1).indices, q.topk(k, -1).indices], -1).sort(-1).values
    dup = torch.zeros_like(idx, dtype=torch.bool)
    dup[:, 1:] = idx[:, 1:] == idx[:, :-1]
    idx = torch.where(dup, torch.full_like(idx, v), idx).sort(-1).values  # duplicates -> sentinel v, at the end
    valid = idx < v
    safe = idx.clamp(max=v - 1)
    ps = torch.where(valid, p.gather(-1, safe), torch.zeros((), dtype=p.dtype))
    qs = torch.where(valid, q.gather(-1, safe), torch.zeros((), dtype=q.dtype))
    p_other = (1 - ps.sum(-1, keepdim=True)).clamp(min=0)
    q_other = (1 - qs.sum(-1, keepdim=True)).clamp(min=0)
    return torch.cat([ps, p_other], -1), torch.cat([qs, q_other], -1), torch.where(valid, idx, -1)


@torch.inference_mode()
def _logits(model: Any, ids: list[int], n: int) -> torch.Tensor:
    """float32 logits [n, V] predicting ids[-n:] (positions len-n-1 .. len-2).

    ``model``: an HF causal LM (one forward without a cache), or a :class:`~verispec.backends.base.Backend`
    such as :class:`~verispec.backends.llamacpp.LlamaCppBackend` (scored in a row of its own, removed after).
    """
    if not isinstance(model, torch.nn.Module):

        row = model.add_row()
        try:
            return model.score([ScoreRequest(row, list(ids[:-n]), list(ids[-n:]))])[0][:n].float().cpu()
        finally:
            model.remove_row(row)
    device = next(model.parameters()).device
    out = model(input_ids=torch.tensor([ids], dtype=torch.long, device=device), use_cache=False,
                logits_to_keep=n + 1)
    return out.logits[0, :n].float().cpu()


def log_distributions(
    target: Any,
    draft: Any,
    trajectories: Iterable[tuple[str, Sequence[int], Sequence[int]]],
    sampling: SamplingConfig,
    top_k: int | None = 64,
    chunk: int = 32,
    log: DistLog | None = None,
) -> DistLog:
    """Log p_t and q_t along each ``(key, prompt_ids, continuation_ids)`` (``target``/``draft``: HF causal LMs
    or backends, see :func:`_logits`).

    Appends to ``log`` when given (keys already present are skipped). See the module docstring for what a
    finite ``top_k`` stores.
    """
    out = log or DistLog(top_k=top_k, sampling=dict(sampling.__dict__))
    if log is not None and log.top_k != top_k:
        raise ValueError(f"the existing log stores top_k={log.top_k}, not {top_k}")
    have = out.keys()
    for key, prompt, cont in trajectories:
        if key in have or not cont:
            continue
        prompt, cont = [int(t) for t in prompt], [int(t) for t in cont]
        n = len(cont)
        lp = _logits(target, prompt + cont, n)
        lq = _logits(draft, prompt + cont, n)
        v = lp.shape[-1]
        out.vocab_size = v
        rows = None
        if sampling.uses_history:  # the engine's penalty histories (History: repetition over prompt + output,
            # frequency / presence over the output only), one per position of the continuation
            rows = History.of(prompt, [], v).prefixes(cont[:-1])  # position t conditions on cont[:t]
        ps, qs, idxs = [], [], []
        for i in range(0, n, chunk):
            r = None if rows is None else History(rows.all[i:i + chunk], rows.generated[i:i + chunk])
            p = process(lp[i:i + chunk], sampling, r)
            q = process(lq[i:i + chunk], sampling, r)
            a, b, ix = _compress(p, q, top_k)
            ps.append(a)
            qs.append(b)
            idxs.append(ix)
        index = None if idxs[0] is None else torch.cat(idxs).to(torch.int32)
        out.trajectories.append(Trajectory(key, len(prompt), cont, torch.cat(ps), torch.cat(qs), index))
        have.add(key)
    return out


# ---------------------------------------------------------------------------------------------- estimates


def position_stats(traj: Trajectory, rule: Rule | str) -> dict[str, torch.Tensor]:
    """Per position t: alpha (expected acceptance of a token drafted from the rule's q: sum_x q h, the rule's
    draft transform applied to q exactly as the engine applies it, e.g. none for a baseline with
    draft_truncation="none"), the tutorial's expected acceptance A = sum_x min(p, q) of the logged p and q
    (``expected_acceptance``: lossless SD's per-position acceptance, the same for every rule), KL and TV of the
    rule's induced distribution to its matched baseline's distribution, and the tail masses."""
    rule = get(rule) if isinstance(rule, str) else rule
    p = traj.p.to(torch.float64)
    q_logged = traj.q.to(torch.float64)
    q = rule.draft(q_logged)
    q = torch.nan_to_num(q)  # a draft transform leaving no mass cannot happen for stored rows; be safe
    h = rule.acceptance(p, q)
    alpha = (q * h).sum(-1).clamp(0, 1)
    induced = induced_distribution(rule, p, q)
    base = matched_baseline(rule).target(p)
    return {"alpha": alpha, "expected_acceptance": torch.minimum(p, q_logged).sum(-1).clamp(0, 1),
            "kl": kl(induced, base), "tv": tv(induced, base), "p_other": traj.p[:, -1], "q_other": traj.q[:, -1]}


def be_iid(alpha: float, gamma: int) -> float:
    """Expected accepted drafts per round when every position accepts with probability ``alpha``."""
    return sum(alpha ** i for i in range(1, gamma + 1))


def be_trajectory(alpha: Sequence[float] | torch.Tensor, gamma: int) -> tuple[float, float]:
    """(expected accepted drafts, expected rounds) to generate a trajectory with per-position acceptance
    ``alpha`` (length L), drafting g = min(gamma, L - t - 1) tokens in a round starting at position t."""
    a = [float(x) for x in alpha]
    n = len(a)
    acc = [0.0] * (n + 2)
    rounds = [0.0] * (n + 2)
    for t in range(n - 1, -1, -1):
        g = max(min(gamma, n - t - 1), 0)
        reach = 1.0  # probability that the first k drafts were accepted
        e_acc, e_rounds = 0.0, 1.0
        for k in range(g + 1):
            pk = reach * (1 - a[t + k]) if k < g else reach  # exactly k accepted
            nxt = min(t + k + 1, n)
            e_acc += pk * (k + acc[nxt])
            e_rounds += pk * rounds[nxt]
            if k < g:
                reach *= a[t + k]
        acc[t], rounds[t] = e_acc, e_rounds
    return acc[0], rounds[0]


def round_check(alpha: torch.Tensor, per_round: Sequence[Sequence[int]]) -> tuple[float, float, int, int]:
    """For the engine's own output: (expected accepted, variance, observed accepted, trials) over the reached
    draft positions of the rounds ``per_round`` = [(drafted, accepted), ...]; positions past the logged
    output (drafts accepted after an EOS, which the engine drops) are left out."""
    exp = var = 0.0
    obs = trials = 0
    start = 0
    a = alpha.tolist()
    for drafted, accepted in per_round:
        for j in range(min(accepted + 1, drafted)):
            if start + j >= len(a):
                break
            x = a[start + j]
            exp += x
            var += x * (1 - x)
            trials += 1
            obs += j < accepted
        start += accepted + 1
    return exp, var, obs, trials


def estimate(log: DistLog, rules_: Iterable[Rule | str], gamma: int, keys: Iterable[str] | None = None) -> list[dict]:
    """One dict per rule: mean alpha (the rule's expected acceptance of a drafted token), the tutorial's mean
    per-position expected acceptance A = sum_x min(p, q) (``expected_acceptance``), BE_traj, BE_iid, mean KL /
    TV to the matched baseline, tail masses.

    Averages are over all positions of the selected trajectories (``keys``; all by default).
    """
    wanted = None if keys is None else set(keys)
    trajs = [t for t in log.trajectories if wanted is None or t.key in wanted]
    rows = []
    for rule in rules_:
        r = get(rule) if isinstance(rule, str) else rule
        alphas, accs, kls, tvs, tails_p, tails_q = [], [], [], [], [], []
        e_acc = e_rounds = 0.0
        for t in trajs:
            s = position_stats(t, r)
            alphas.append(s["alpha"])
            accs.append(s["expected_acceptance"])
            kls.append(s["kl"])
            tvs.append(s["tv"])
            tails_p.append(s["p_other"])
            tails_q.append(s["q_other"])
            a, n = be_trajectory(s["alpha"], gamma)
            e_acc += a
            e_rounds += n
        if not trajs:
            continue
        alpha = torch.cat(alphas)
        klv = torch.cat(kls)
        rows.append({
            "rule": r.describe(),
            "alpha": float(alpha.mean()),
            "expected_acceptance": float(torch.cat(accs).mean()),
            "be_traj": e_acc / e_rounds if e_rounds else math.nan,
            "be_iid": be_iid(float(alpha.mean()), gamma),
            "kl": float(klv[torch.isfinite(klv)].mean()) if torch.isfinite(klv).any() else math.inf,
            "kl_inf_positions": int((~torch.isfinite(klv)).sum()),
            "tv": float(torch.cat(tvs).mean()),
            "p_other_mean": float(torch.cat(tails_p).mean()),
            "q_other_mean": float(torch.cat(tails_q).mean()),
            "q_other_max": float(torch.cat(tails_q).max()),
            "positions": int(alpha.numel()),
            "trajectories": len(trajs),
        })
    return rows


# --------------------------------------------------------------------------------------- on a run directory


def _models(engine: Any) -> tuple[Any, Any]:
    """(target, draft) to log with: HF models where the engine has them, else the draft's backend (llama.cpp)."""
    drafter = getattr(engine, "drafter", None)
    backend = getattr(drafter, "backend", None)
    if backend is None:
        raise ValueError("the offline estimator needs a draft model (drafter = \"model\" or \"llamacpp\")")
    return engine.target.model, getattr(backend, "model", backend)


def log_records(cfg: Any, recs: Sequence[dict], cache: str | Path, *, top_k: int | None = 64,
                engine_factory: Any = None, say: Any = None, save_every: int = 1) -> DistLog:
    """Log p and q along the outputs ``recs`` (result records of a sweep with config ``cfg``) into the
    :class:`DistLog` cached at ``cache`` (resumable: records already there are skipped; saved every
    ``save_every`` records and at the end); the models are built only if something is left to log."""

    say = say or (lambda s: None)
    cache = Path(cache)
    sampling = cfg.sampling_config()
    dist = DistLog.load(cache) if cache.exists() else DistLog(top_k=top_k, sampling=dict(sampling.__dict__))
    if dist.top_k != top_k:
        raise ValueError(f"{cache} was logged with top_k={dist.top_k}; delete it or pass top_k={dist.top_k}")
    todo = [r for r in recs if r["key"] not in dist.keys()]
    if not todo:
        return dist
    engine = (engine_factory or default_engine_factory)(cfg)
    target, draft = _models(engine)
    problems = {}
    for name in {r["task"] for r in todo}:
        problems.update({(name, p.id): p for p in get_task(name).load()})
    cache.parent.mkdir(parents=True, exist_ok=True)
    for i, r in enumerate(todo, 1):
        prompt = encode_problem(engine, problems[(r["task"], r["problem_id"])])
        log_distributions(target, draft, [(r["key"], prompt, r["token_ids"])], sampling, top_k, log=dist)
        say(f"logged {i}/{len(todo)}: {r['key']} ({len(r['token_ids'])} positions)")
        if i % save_every == 0 or i == len(todo):
            dist.save(cache)
    return dist


def estimate_run(run_dir: str | Path, *, engine_factory: Any = None, top_k: int | None = 64,
                 max_per_setting: int | None = None, log: Any = None) -> dict[str, Path]:
    """Log the distributions along a run's outputs (cached in ``RUN_DIR/estimator/dists.pt``), then write

    * ``selfcheck.csv``: per setting, the estimator's expected accepted drafts along that setting's OWN
      outputs vs the measured count (z-score of the martingale check, see the module docstring), and the
      predicted vs measured BE;
    * ``estimate.csv``: for every setting of the grid, alpha, BE_traj, BE_iid, KL and TV to the matched
      baseline predicted from the lossless outputs (reference trajectories ~ the target's own sampling),
      next to each setting's measured BE;
    * ``estimate.md``: both as Markdown (included by ``bench report``).

    ``max_per_setting=N`` keeps every setting's outputs on the first N (task, problem, seed) pairs of the grid's
    unit order that the run has.
    """
    import json

    import pandas as pd


    say = log or (lambda s: None)
    run_dir = Path(run_dir)
    out = run_dir / "estimator"
    out.mkdir(exist_ok=True)
    cfg = SweepConfig.from_json(json.loads((run_dir / "config.json").read_text()))
    if drafter_spec(cfg.drafter).proposes_trees:
        raise ValueError("the offline estimator models chain drafting (one draft per position); this is a tree run")
    recs = read_results(run_dir)
    if not recs:
        raise ValueError(f"{run_dir} has no results")
    if max_per_setting is not None:
        # the first N (task, problem, seed) groups, every setting's output on them: like for like across settings
        # in the grid's unit order (a batched run writes lines in completion order, not grid order)

        present = {(r["task"], r["problem_id"], r["seed"]) for r in recs}
        units = expand(cfg, {k: [p.id for p in v] for k, v in load_problems(cfg).items()})
        order = [g for g in dict.fromkeys((u.task, u.problem_id, u.seed) for u in units) if g in present]
        order += sorted(present - set(order))
        groups = order[:max_per_setting]
        keep = set(groups)
        recs = [r for r in recs if (r["task"], r["problem_id"], r["seed"]) in keep]
    dist = log_records(cfg, recs, out / "dists.pt", top_k=top_k, engine_factory=engine_factory, say=say,
                       save_every=5)
    by_key = {t.key: t for t in dist.trajectories}
    settings = {m.label: m for m in cfg.methods}

    check_rows = []
    for label in dict.fromkeys(r["label"] for r in recs):
        mine = [r for r in recs if r["label"] == label and r["key"] in by_key]
        rule = cfg.build(settings[label]) if label in settings else None
        if rule is None or not mine:
            continue
        e = v = 0.0
        o = n = 0
        pacc = prounds = 0.0
        for r in mine:
            alpha = position_stats(by_key[r["key"]], rule)["alpha"]
            a, b, c, d = round_check(alpha, r["per_round"])
            e, v, o, n = e + a, v + b, o + c, n + d
            x, y = be_trajectory(alpha, cfg.gamma)
            pacc, prounds = pacc + x, prounds + y
        check_rows.append({
            "setting": label, "units": len(mine), "trials": n, "accepted": o, "expected": e,
            "z": (o - e) / math.sqrt(v) if v > 0 else math.nan,
            "measured_rate": o / n if n else math.nan, "expected_rate": e / n if n else math.nan,
            "measured_be": sum(record_emitted_accepted(r) for r in mine) / max(sum(r["rounds"] for r in mine), 1),
            "be_traj_own": pacc / prounds if prounds else math.nan,
        })
    checks = pd.DataFrame(check_rows)
    checks.to_csv(out / "selfcheck.csv", index=False)

    ref_keys = [r["key"] for r in recs if r["method"] == "lossless" and r["key"] in by_key]
    pred_rows = []
    if ref_keys:
        for label, m in settings.items():
            est = estimate(dist, [cfg.build(m)], cfg.gamma, keys=ref_keys)[0]
            mine = [r for r in recs if r["label"] == label]
            measured = (sum(record_emitted_accepted(r) for r in mine) / max(sum(r["rounds"] for r in mine), 1)
                        if mine else math.nan)
            pred_rows.append({"setting": label, **{k: v for k, v in est.items() if k != "rule"},
                              "measured_be": measured, "measured_units": len(mine)})
    preds = pd.DataFrame(pred_rows)
    preds.to_csv(out / "estimate.csv", index=False)

    k_text = "full distributions (exact)" if top_k is None else (
        f"top-{top_k} of p and of q (union, both probabilities) + one lumped 'other' bin")
    lines = ["# Offline estimator", "",
             f"Distributions logged once along {len(by_key)} outputs of this run ({k_text}); gamma = {cfg.gamma}.",
             "", "Self-check on each setting's own outputs: expected accepted drafts (sum of alpha over the "
             "reached draft positions) vs measured; z = (measured - expected) / sqrt(sum alpha (1 - alpha)). "
             "Exact up to the top-k lumping and to the difference between the engine's cached forward and the "
             "logging forward (bf16 rounding differs between the two on the real pair).", ""]
    if not checks.empty:
        lines.append("| setting | units | trials | measured acc. rate | expected | z | measured BE | BE_traj (own) |")
        lines.append("|---|---|---|---|---|---|---|---|")
        for _, r in checks.iterrows():
            lines.append(f"| {r['setting']} | {r['units']} | {r['trials']} | {r['measured_rate']:.3f} | "
                         f"{r['expected_rate']:.3f} | {r['z']:+.2f} | {r['measured_be']:.2f} | "
                         f"{r['be_traj_own']:.2f} |")
    lines += ["", "Predictions for every setting from the lossless outputs only (no decoding with the rule): "
              "alpha = the rule's mean expected acceptance of a drafted token per position, A = the tutorial's "
              "mean per-position acceptance sum_x min(p, q) of target and draft (lossless SD's), BE_traj "
              "(per-position alphas along the trajectories), BE_iid (sum_i alpha^i), KL / TV of the induced "
              "distribution to the matched baseline (per token, mean), next to the measured BE (emitted accepted "
              "drafts per round).", ""]
    if not preds.empty:
        lines.append("| setting | alpha | A | BE_traj | BE_iid | measured BE | KL | TV | mean Q_other |")
        lines.append("|---|---|---|---|---|---|---|---|---|")
        for _, r in preds.iterrows():
            lines.append(f"| {r['setting']} | {r['alpha']:.3f} | {r['expected_acceptance']:.3f} | "
                         f"{r['be_traj']:.2f} | {r['be_iid']:.2f} | "
                         f"{r['measured_be']:.2f} | {r['kl']:.4f} | {r['tv']:.4f} | {r['q_other_mean']:.1e} |")
    else:
        lines.append("(no lossless outputs in this run to use as reference trajectories)")
    (out / "estimate.md").write_text("\n".join(lines) + "\n")
    return {"selfcheck": out / "selfcheck.csv", "estimate": out / "estimate.csv", "markdown": out / "estimate.md",
            "dists": out / "dists.pt"}
