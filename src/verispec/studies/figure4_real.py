"""Figure 4 on real distributions: Lemma 1's gain, loss and net Delta BE on (p, q) pairs logged from a real pair.

The Figure-4 simulation (:mod:`verispec.analysis.simulation`) draws synthetic pairs. This module evaluates the
very same per-pair quantities (:func:`~verispec.analysis.simulation.pair_terms`: Lemma 1 with the allowed set
of min-p / eta on p, and the change in acceptance of the matched baseline as run) on the target's and draft's
processed distributions logged by the offline estimator (:class:`~verispec.eval.estimator.DistLog`) along
reference trajectories of a run, one pair per logged position, and sets them next to the simulation.

* :func:`select_reference` / :func:`log_reference`: pick the lossless outputs of a run directory (the first
  ``per_task`` problems of every task, one seed; lossless SD output is distributed as the target's own
  sampling) and log p_t, q_t along them with :func:`~verispec.eval.estimator.log_distributions` (top-k
  compression + one lumped "other" bin, see the estimator's docstring). Needs the models.
* :func:`log_pairs`: the logged positions as one batch of (p, q) rows (zero-padded to a common width; a zero
  column is in no allowed set and adds nothing to any term).
* :func:`real_pairs` / :func:`real_summary`: per position / averaged, for the min-p and eta grids, overall
  and per task; ``be_traj_*``: block efficiency of lossless SD and of the matched baseline predicted along
  the trajectories (:func:`~verispec.eval.estimator.be_trajectory`, gamma 5), to compare with measured BE.
* :func:`pair_stats`: shape of pairs (entropy and max of p, TV(p, q), |A_min-p(p)|, overlap of A_min-p(p) and
  A_min-p(q), ...), for real and simulated pairs alike; :func:`generator_ablation`: the simulation's net Delta
  BE as its generator's knobs move toward the real pairs.

Command line (the models are needed for ``log`` only)::

    python3 -m verispec.studies.figure4_real log docs/results/paper_small --out PATH/dists.pt --per-task 8
    python3 -m verispec.studies.figure4_real report PATH/dists.pt --out docs/results/figure4_real
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from verispec.analysis.exact import tv
from verispec.analysis.simulation import (
    DEFAULT_TRIPLETS,
    ETA_PARAMS,
    MINP_PARAMS,
    draw_pairs,
    pair_terms,
    simulate,
    summarize,
)
from verispec.core.sampling import entropy, minp_mask
from verispec.eval.estimator import DistLog, _models, be_trajectory, estimate, log_distributions, log_records
from verispec.eval.grid import SweepConfig, record_rule
from verispec.eval.metrics import record_emitted_accepted
from verispec.eval.run import default_engine_factory, encode_problem, load_problems
from verispec.eval.store import read_results
from verispec.eval.tasks import get_task

__all__ = [
    "ablation_variants",
    "cluster_se",
    "dense_check",
    "generator_ablation",
    "log_pairs",
    "log_reference",
    "pair_stats",
    "plot_ablation",
    "plot_side_by_side",
    "real_pairs",
    "real_summary",
    "report",
    "select_reference",
    "stats_table",
    "trajectory_effect",
]

GAMMA = 5


# ------------------------------------------------------------------------------------------------ logging


def select_reference(run_dir: str | Path, per_task: int = 8, seed: int = 0, method: str = "lossless") -> list[dict]:
    """The result lines of ``method`` (default lossless) with ``seed`` on the first ``per_task`` problems of every
    task of the run, in the config's problem order."""

    run_dir = Path(run_dir)
    cfg = SweepConfig.from_json(json.loads((run_dir / "config.json").read_text()))
    recs = {(r["task"], r["problem_id"]): r for r in read_results(run_dir)
            if r["method"] == method and r["seed"] == seed}
    out = []
    for task, problems in load_problems(cfg).items():
        mine = [recs[(task, p.id)] for p in problems if (task, p.id) in recs]
        out += mine[:per_task]
    if not out:
        raise ValueError(f"{run_dir} has no {method!r} results with seed {seed}")
    return out


def log_reference(run_dir: str | Path, out_path: str | Path, *, per_task: int = 8, seed: int = 0,
                  method: str = "lossless", top_k: int | None = 64, threads: int | None = 1, engine_factory: Any = None,
                  say: Callable[[str], None] | None = None) -> Any:
    """Log p, q along :func:`select_reference`'s outputs (``method``'s, lossless by default) with the run's own
    models and sampling settings (resumable: trajectories already in ``out_path`` are kept); returns the
    :class:`DistLog`."""

    run_dir = Path(run_dir)
    cfg = SweepConfig.from_json(json.loads((run_dir / "config.json").read_text()))
    if threads is not None:
        cfg = dataclasses.replace(cfg, threads=threads)
        torch.set_num_threads(threads)
    recs = select_reference(run_dir, per_task, seed, method)
    dist = log_records(cfg, recs, out_path, top_k=top_k, engine_factory=engine_factory, say=say)
    return dist


def log_pairs(log: Any, keys: Sequence[str] | None = None) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """All logged positions as (p, q) [N, W] float64 (each row a position: stored columns, the "other" bin,
    zero padding to the widest row) and the key of each row's trajectory."""
    trajs = [t for t in log.trajectories if keys is None or t.key in set(keys)]
    if not trajs:
        raise ValueError("no logged trajectories selected")
    width = max(t.p.shape[-1] for t in trajs)

    def pad(x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.float64)
        return torch.nn.functional.pad(x, (0, width - x.shape[-1]))

    p = torch.cat([pad(t.p) for t in trajs])
    q = torch.cat([pad(t.q) for t in trajs])
    rows = [t.key for t in trajs for _ in range(t.p.shape[0])]
    return p, q, rows


# ---------------------------------------------------------------------------------------------- analysis


def _task(key: str) -> str:
    return key.split("|", 1)[0]


def real_pairs(p: torch.Tensor, q: torch.Tensor, keys: Sequence[str] | None = None, *,
               minp_params: Sequence[float] = MINP_PARAMS, eta_params: Sequence[float] = ETA_PARAMS,
               draft_truncation: str = "same") -> pd.DataFrame:
    """One row per (strategy, parameter, position) with :func:`pair_terms`'s columns, ``key`` (the trajectory)
    and ``task``. ``triplet`` is "real"; the simulation's generator columns are NaN. ``draft_truncation`` is that
    of ``baseline_delta`` (Lemma 1's terms do not depend on it; "same" is how paper_small's baseline ran)."""
    keys = list(keys) if keys is not None else ["real|-"] * p.shape[0]
    if len(keys) != p.shape[0]:
        raise ValueError(f"{len(keys)} keys for {p.shape[0]} positions")
    frames = []
    for strategy, params in (("minp", minp_params), ("eta", eta_params)):
        for param in params:
            frames.append(pd.DataFrame({
                "strategy": strategy, "param": float(param), "triplet": "real", "match": math.nan,
                "partial": math.nan, "unrelated": math.nan, "q_tail": math.nan, "draft_truncation": draft_truncation,
                "pair": np.arange(p.shape[0]), "key": keys, "task": [_task(k) for k in keys],
                **pair_terms(p, q, strategy, float(param), draft_truncation),
            }))
    return pd.concat(frames, ignore_index=True)


def _be(per_pos: pd.DataFrame, column: str, gamma: int) -> float:
    """Pooled BE_traj (expected accepted drafts / expected rounds) over the trajectories of ``per_pos``, with
    the per-position acceptance in ``column``."""

    acc = rounds = 0.0
    for _, g in per_pos.groupby("key", sort=False):
        a, n = be_trajectory(g.sort_values("pair")[column].clip(0, 1).to_numpy(), gamma)
        acc, rounds = acc + a, rounds + n
    return acc / rounds if rounds else math.nan


def cluster_se(values: pd.Series, clusters: pd.Series) -> float:
    """Standard error of the mean of ``values`` with positions clustered by trajectory (``clusters``): positions
    of one trajectory are not independent. sqrt(sum_j (sum_{i in j} (v_i - mean))^2) / N, times
    sqrt(J / (J - 1)); NaN with fewer than 2 clusters."""
    v = values.to_numpy(dtype=np.float64)
    resid = pd.Series(v - v.mean()).groupby(clusters.to_numpy()).sum().to_numpy()
    j = len(resid)
    if j < 2:
        return math.nan
    return float(np.sqrt((resid**2).sum() * j / (j - 1)) / len(v))


def real_summary(per_pos: pd.DataFrame, gamma: int = GAMMA) -> pd.DataFrame:
    """:func:`~verispec.analysis.simulation.summarize` of :func:`real_pairs`' rows, once over all positions
    (``triplet`` "real") and once per task ("real:<task>"), plus ``net_se`` and ``baseline_delta_se`` (standard
    errors with positions clustered by trajectory, :func:`cluster_se`), ``lossless_acc_mean``,
    ``be_traj_lossless``, ``be_traj_lemma1`` (baseline with the untruncated draft: lossless acceptance + Lemma
    1's direct difference per position) and ``be_traj_baseline`` (the baseline as run, ``draft_truncation``)
    along the logged trajectories (gamma ``gamma``), and ``n_trajectories``."""
    parts = [per_pos.assign(triplet="real")]
    tasks = list(dict.fromkeys(per_pos["task"]))
    if len(tasks) > 1:
        parts += [per_pos[per_pos["task"] == t].assign(triplet=f"real:{t}") for t in tasks]
    rows = []
    for part in parts:
        s = summarize(part)
        extra = []
        for (strategy, param), g in part.groupby(["strategy", "param"], sort=False):
            g = g.assign(lemma1_acc=g["lossless_acc"] + g["direct"], base_acc=g["lossless_acc"] + g["baseline_delta"])
            extra.append({"strategy": strategy, "param": param, "n_trajectories": g["key"].nunique(),
                          "net_se": cluster_se(g["net"], g["key"]),
                          "baseline_delta_se": cluster_se(g["baseline_delta"], g["key"]),
                          "lossless_acc_mean": g["lossless_acc"].mean(),
                          "be_traj_lossless": _be(g, "lossless_acc", gamma),
                          "be_traj_lemma1": _be(g, "lemma1_acc", gamma),
                          "be_traj_baseline": _be(g, "base_acc", gamma)})
        rows.append(s.merge(pd.DataFrame(extra), on=["strategy", "param"]))
    return pd.concat(rows, ignore_index=True)


def pair_stats(p: torch.Tensor, q: torch.Tensor, p_base: float = 0.3) -> pd.DataFrame:
    """Shape of each (p, q) pair: entropy of p (nats), max p, max q, whether argmax p = argmax q, TV(p, q),
    lossless acceptance sum min(p, q), |A(p)| and |A(q)| of min-p at ``p_base``, their Jaccard overlap, q's mass
    on A(p), p's mass outside A(p) (what truncation discards), whether that exceeds 1e-3 (``affected``) and q's
    mass where q > p on A(p)."""
    ap, aq = minp_mask(p, p_base), minp_mask(q, p_base)
    inter, union = (ap & aq).sum(-1), (ap | aq).sum(-1)
    zero = torch.zeros_like(p)
    return pd.DataFrame({
        "entropy_p": entropy(p).numpy(),
        "max_p": p.amax(-1).numpy(),
        "max_q": q.amax(-1).numpy(),
        "same_argmax": (p.argmax(-1) == q.argmax(-1)).numpy(),
        "tv": tv(p, q).numpy(),
        "lossless_acc": torch.minimum(p, q).sum(-1).numpy(),
        "allowed_p": ap.sum(-1).numpy(),
        "allowed_q": aq.sum(-1).numpy(),
        "jaccard": (inter / union).numpy(),
        "q_on_allowed_p": torch.where(ap, q, zero).sum(-1).numpy(),
        "p_discarded": torch.where(ap, zero, p).sum(-1).numpy(),
        "affected": (torch.where(ap, zero, p).sum(-1) > 1e-3).numpy(),
        "overshoot_on_allowed_p": torch.where(ap, (q - p).clamp(min=0), zero).sum(-1).numpy(),
    })


STAT_COLUMNS = ["entropy_p", "max_p", "max_q", "same_argmax", "tv", "lossless_acc", "allowed_p", "allowed_q",
                "jaccard", "q_on_allowed_p", "p_discarded", "affected", "overshoot_on_allowed_p"]


def stats_table(sources: dict[str, tuple[torch.Tensor, torch.Tensor]], p_base: float = 0.3) -> pd.DataFrame:
    """Mean of :func:`pair_stats` per source (and the median of entropy and max p), one row per source."""
    rows = []
    for name, (p, q) in sources.items():
        s = pair_stats(p, q, p_base)
        row = {"source": name, "n_pairs": len(s), "p_base": p_base}
        row.update({c: float(s[c].mean()) for c in STAT_COLUMNS})
        row["entropy_p_median"] = float(s["entropy_p"].median())
        row["max_p_median"] = float(s["max_p"].median())
        rows.append(row)
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------- the simulation's generator


def ablation_variants() -> list[dict[str, Any]]:
    """Generator settings of the simulation, from its defaults toward the real pairs, one knob at a time."""
    return [
        {"variant": "default (alpha 1, vocab 50, k 10, q_tail 0)"},
        {"variant": "q_tail 1 (draft copies p's tail)", "q_tail": 1.0},
        {"variant": "alpha 0.1 (peaked candidates)", "alpha": 0.1},
        {"variant": "alpha 0.03 (near one-hot candidates)", "alpha": 0.03},
        {"variant": "alpha 0.03, q_tail 1", "alpha": 0.03, "q_tail": 1.0},
        {"variant": "vocab 1000, k 10", "vocab": 1000},
        {"variant": "k 2 (two candidates)", "k": 2},
    ]


def generator_ablation(n_pairs: int = 300, seed: int = 0, triplets: Sequence[Sequence[float]] = DEFAULT_TRIPLETS,
                       minp_params: Sequence[float] = MINP_PARAMS,
                       eta_params: Sequence[float] = ETA_PARAMS) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(net Delta BE per variant, parameter and triplet; the variants' pair shapes at p_base 0.3 pooled over the
    triplets), for :func:`ablation_variants`."""
    nets, shapes = [], {}
    for v in ablation_variants():
        kw = {k: v[k] for k in ("q_tail", "alpha", "vocab", "k") if k in v}
        df = simulate(triplets, n_pairs=n_pairs, seed=seed, minp_params=minp_params, eta_params=eta_params, **kw)
        nets.append(df.assign(variant=v["variant"]))
        gen = {k: v[k] for k in ("q_tail", "alpha") if k in v}
        pairs = [draw_pairs(t, n_pairs, v.get("vocab", 50), v.get("k", 10), rng=seed, **gen) for t in triplets]
        shapes[v["variant"]] = (torch.cat([a for a, _ in pairs]), torch.cat([b for _, b in pairs]))
    return pd.concat(nets, ignore_index=True), stats_table(shapes)


# --------------------------------------------------------------------------------------- the lumping check


def dense_check(run_dir: str | Path, keys: Sequence[str], *, top_k: int = 64, threads: int | None = 1,
                minp_params: Sequence[float] = MINP_PARAMS, eta_params: Sequence[float] = ETA_PARAMS,
                engine_factory: Any = None) -> pd.DataFrame:
    """Log the trajectories ``keys`` of the run twice, full (dense, exact) and top-``top_k`` compressed, and
    compare the position means of gain, loss and net: one row per (strategy, parameter) with both and their
    difference. Measures the error the "other" bin adds to the figure (dense rows cost V floats each: use short
    trajectories)."""

    run_dir = Path(run_dir)
    cfg = SweepConfig.from_json(json.loads((run_dir / "config.json").read_text()))
    if threads is not None:
        cfg = dataclasses.replace(cfg, threads=threads)
        torch.set_num_threads(threads)
    recs = {r["key"]: r for r in read_results(run_dir)}
    missing = [k for k in keys if k not in recs]
    if missing:
        raise ValueError(f"{run_dir} has no result lines {missing}")
    engine = (engine_factory or default_engine_factory)(cfg)
    target, draft = _models(engine)
    sampling = cfg.sampling_config()
    rows = []
    for key in keys:
        r = recs[key]
        problem = {p.id: p for p in get_task(r["task"]).load()}[r["problem_id"]]
        item = [(key, encode_problem(engine, problem), r["token_ids"])]
        out = {}
        for name, k in (("dense", None), ("topk", top_k)):
            log = log_distributions(target, draft, item, sampling, k, log=DistLog(top_k=k))
            p, q, ks = log_pairs(log)
            per = real_pairs(p, q, ks, minp_params=minp_params, eta_params=eta_params)
            out[name] = per.groupby(["strategy", "param"], sort=False)[["gain", "loss", "net"]].mean()
            if name == "dense":
                ent = entropy(p)
            else:
                ent_lumped = entropy(p)
                other = (float(p[:, -1].mean()), float(p[:, -1].max()), float(q[:, -1].mean()), float(q[:, -1].max()))
            del p, q, log
        both = out["dense"].join(out["topk"], lsuffix="_dense", rsuffix="_topk").reset_index()
        for c in ("gain", "loss", "net"):
            both[f"{c}_diff"] = both[f"{c}_topk"] - both[f"{c}_dense"]
        rows.append(both.assign(key=key, positions=len(r["token_ids"]), top_k=top_k,
                                entropy_gap_max=float((ent - ent_lumped).max()), p_other_mean=other[0],
                                p_other_max=other[1], q_other_mean=other[2], q_other_max=other[3]))
    return pd.concat(rows, ignore_index=True)


# ------------------------------------------------------------------------------------ whose trajectories


def trajectory_effect(logs: dict[str, Any], rules_: Sequence[Any], gamma: int = GAMMA,
                      run_dir: str | Path | None = None) -> pd.DataFrame:
    """Per-position acceptance vs the prefixes it is measured on: for each log (label -> :class:`DistLog`, e.g.
    the lossless outputs and the min-p baseline's own outputs of the same problems and seed) and each rule,
    :func:`~verispec.eval.estimator.estimate`'s mean alpha and BE_traj along those trajectories; with ``run_dir``
    also the measured BE of the logged units (emitted accepted drafts per round, pooled)."""

    recs = {r["key"]: r for r in read_results(run_dir)} if run_dir is not None else {}
    rows = []
    for label, log in logs.items():
        mine = [recs[k] for k in log.keys() if k in recs]
        measured = (sum(record_emitted_accepted(r) for r in mine) / max(sum(r["rounds"] for r in mine), 1)
                    if mine else math.nan)
        for est in estimate(log, rules_, gamma):
            rows.append({"outputs": label, "rule": est["rule"], "alpha": est["alpha"], "be_traj": est["be_traj"],
                         "positions": est["positions"], "trajectories": est["trajectories"],
                         "measured_be_of_these_outputs": measured, "measured_units": len(mine)})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------ figure, report


def plot_side_by_side(real: pd.DataFrame, sim: pd.DataFrame, path: str | Path) -> Path:
    """Rows: min-p (vs p_base), eta (vs epsilon). Left: the simulation (net per triplet, mean +- 1 sd shaded,
    gain dashed, loss dotted). Right: the real pairs (net, gain, loss over all positions, net per task thin, and
    the baseline as run), on their own y scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    fig, axes = plt.subplots(2, 2, figsize=(13, 9.5))
    cmap = plt.get_cmap("viridis")
    triplets = list(dict.fromkeys(sim["triplet"]))
    labels = {"minp": ("min-p", "$p_{base}$"), "eta": ("eta", r"$\epsilon$ ($\delta = \epsilon$)")}
    for row, strategy in enumerate(("minp", "eta")):
        name, xlabel = labels[strategy]
        ax = axes[row][0]
        sub = sim[sim["strategy"] == strategy]
        for i, trip in enumerate(triplets):
            t = sub[sub["triplet"] == trip].sort_values("param")
            c = cmap(i / max(len(triplets) - 1, 1) * 0.85)
            x = t["param"].to_numpy()
            ax.plot(x, t["net_mean"], "-o", color=c, lw=2, ms=4, label=f"net, triplet {trip}")
            ax.fill_between(x, t["net_mean"] - t["net_std"], t["net_mean"] + t["net_std"], color=c, alpha=0.12)
            ax.plot(x, t["gain_mean"], "--", color=c, lw=1)
            ax.plot(x, t["loss_mean"], ":", color=c, lw=1.3)
        n = int(sub["n_pairs"].iloc[0])
        ax.set_title(f"{name}: simulation ({n} pairs per triplet; gain --, loss :)")
        ax = axes[row][1]
        sub = real[real["strategy"] == strategy]
        t = sub[sub["triplet"] == "real"].sort_values("param")
        x = t["param"].to_numpy()
        ax.plot(x, t["net_mean"], "-o", color="black", lw=2, ms=4, label=r"net $\Delta$BE = gain $-$ loss ($\pm$2 se)")
        ax.fill_between(x, t["net_mean"] - 2 * t["net_se"], t["net_mean"] + 2 * t["net_se"], color="gray", alpha=0.2)
        ax.plot(x, t["gain_mean"], "--", color="tab:green", lw=1.5, label="gain")
        ax.plot(x, t["loss_mean"], ":", color="tab:red", lw=1.8, label="loss")
        ax.plot(x, t["baseline_delta_mean"], "-s", color="tab:purple", lw=1, ms=3,
                label=f"baseline as run (draft truncation '{t['draft_truncation'].iloc[0]}')")
        for trip, color in (("real:humaneval", "tab:blue"), ("real:gsm", "tab:orange")):
            u = sub[sub["triplet"] == trip].sort_values("param")
            if len(u):
                ax.plot(u["param"], u["net_mean"], "-", color=color, lw=1, label=f"net, {trip[5:]} only")
        npos, ntraj = int(t["n_pairs"].iloc[0]), int(t["n_trajectories"].iloc[0])
        ax.set_title(f"{name}: real pair ({npos} positions, {ntraj} trajectories)")
        for ax in axes[row]:
            ax.axhline(0.0, color="black", lw=0.8)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(r"$\Delta$BE (change in acceptance probability)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7.5, loc="best")
    fig.suptitle("Lemma 1 on simulated pairs (left) and on the real Qwen2.5-Coder 1.5B/0.5B pair at T = 0.7 "
                 "(right; note the y scales)")
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_ablation(nets: pd.DataFrame, real: pd.DataFrame, path: str | Path) -> Path:
    """Net Delta BE (mean over the triplets) per generator variant of :func:`generator_ablation`, and the real
    pairs' (black), one panel per strategy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2))
    variants = list(dict.fromkeys(nets["variant"]))
    cmap = plt.get_cmap("tab10")
    for ax, strategy in zip(axes, ("minp", "eta"), strict=True):
        sub = nets[nets["strategy"] == strategy].groupby(["variant", "param"], sort=False)["net_mean"].mean()
        for i, v in enumerate(variants):
            t = sub.loc[v]
            ax.plot(t.index, t.to_numpy(), "-o", ms=3, lw=1.3, color=cmap(i), label=f"simulation: {v}")
        r = real[(real["strategy"] == strategy) & (real["triplet"] == "real")].sort_values("param")
        ax.plot(r["param"], r["net_mean"], "-o", color="black", lw=2.2, ms=4, label="real pair")
        ax.axhline(0.0, color="black", lw=0.8)
        ax.set_xlabel("$p_{base}$" if strategy == "minp" else r"$\epsilon$ ($\delta = \epsilon$)")
        ax.set_ylabel(r"net $\Delta$BE (mean over the 4 triplets)")
        ax.set_title("min-p" if strategy == "minp" else "eta")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7.5, loc="lower left")
    fig.suptitle("The simulation's net Delta BE as its generator moves toward the real pairs, one knob at a time")
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def report(log_path: str | Path, out_dir: str | Path, *, n_pairs: int = 500, seed: int = 0,
           draft_truncation: str = "same", ablation: bool = True, other_log: str | Path | None = None,
           run_dir: str | Path | None = None) -> dict[str, Path]:
    """Everything under ``out_dir`` from a saved :class:`DistLog`: ``figure4_real.csv`` (real rows, all positions
    and per task, and the default simulation's rows, ``source`` column), ``figure4_real.png``,
    ``pair_stats.csv`` (shapes of real and simulated pairs), with ``ablation`` ``ablation.csv`` and
    ``ablation.png``, and with ``other_log`` (the min-p baseline's own outputs, logged the same way)
    ``trajectory_effect.csv`` (lossless and the baseline as run along both sets of outputs, measured BE from
    ``run_dir``)."""

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    log = DistLog.load(log_path)
    p, q, keys = log_pairs(log)
    per = real_pairs(p, q, keys, draft_truncation=draft_truncation)
    real = real_summary(per)
    sim = simulate(n_pairs=n_pairs, seed=seed)
    table = pd.concat([real.assign(source="real"), sim.assign(source="simulation")], ignore_index=True)
    table = table[["source"] + [c for c in table.columns if c != "source"]]
    paths = {"csv": out_dir / "figure4_real.csv", "png": out_dir / "figure4_real.png",
             "stats": out_dir / "pair_stats.csv"}
    table.to_csv(paths["csv"], index=False, float_format="%.10g")
    plot_side_by_side(real, sim, paths["png"])

    tasks = np.array([_task(k) for k in keys])
    sources = {"real": (p, q)}
    for t in dict.fromkeys(tasks):
        m = torch.from_numpy(tasks == t)
        sources[f"real:{t}"] = (p[m], q[m])
    for q_tail in (0.0, 1.0):
        pairs = [draw_pairs(t, n_pairs, rng=seed, q_tail=q_tail) for t in DEFAULT_TRIPLETS]
        sources[f"simulation q_tail {q_tail:g}"] = (torch.cat([a for a, _ in pairs]), torch.cat([b for _, b in pairs]))
    stats = [stats_table(sources, b) for b in (0.1, 0.3, 0.9)]
    if ablation:
        nets, shapes = generator_ablation(seed=seed)
        nets.to_csv(out_dir / "ablation.csv", index=False, float_format="%.10g")
        paths["ablation"] = out_dir / "ablation.csv"
        paths["ablation_png"] = plot_ablation(nets, real, out_dir / "ablation.png")
        stats.append(shapes.assign(source="ablation: " + shapes["source"]))
    pd.concat(stats, ignore_index=True).to_csv(paths["stats"], index=False, float_format="%.6g")
    if other_log is not None:

        if run_dir is None:
            raise ValueError("other_log needs run_dir (the rules the logged outputs ran with)")
        other = DistLog.load(other_log)
        recs = {r["key"]: r for r in read_results(run_dir)}
        ran = list(dict.fromkeys(record_rule(recs[k]) for k in sorted(other.keys())))
        label = "+".join(r.describe() for r in ran)
        eff = trajectory_effect({"lossless": log, label: other}, ["lossless", *ran], run_dir=run_dir)
        paths["trajectory_effect"] = out_dir / "trajectory_effect.csv"
        eff.to_csv(paths["trajectory_effect"], index=False, float_format="%.6g")
    return paths
