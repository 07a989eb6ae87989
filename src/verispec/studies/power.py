"""Statistical power of paired comparisons (docs/results/POWER.md) and the coupled-vs-independent variance
comparison (docs/results/coupling/README.md), computed from committed run directories.

A paired comparison of a lossy setting with its matched baseline has one difference per (task, problem, seed):
accuracy in percentage points (100 * (passed_lossy - passed_baseline), so -100, 0 or +100) and BE of the unit
(emitted accepted drafts / rounds of the lossy unit minus the baseline unit's). With the sample standard
deviation ``sd`` of those differences, detecting a true mean difference ``delta`` with a two-sided test at
level ``alpha`` and power ``1 - beta`` needs about

    n = ((z_{1 - alpha/2} + z_{1 - beta}) * sd / delta)^2

pairs (normal approximation of the paired t-test; the t-test needs slightly more for small n). It treats the
pairs as independent; seeds of one problem are correlated, so :func:`paired_summary` also reports the design
effect 1 + (m - 1) * rho (m seeds per problem, rho the intraclass correlation of the differences within a
problem, one-way ANOVA estimate clipped at 0): the clustered requirement is n times that.

The functions take run directories and return pandas frames; ``python -m verispec.studies.power table RUN_DIR``
and ``python -m verispec.studies.power coupling COMMON_DIR INDEPENDENT_DIR`` print the Markdown tables the docs
quote (they are the same functions; nothing here is hard-coded but the paper's reported effects in
:data:`CLAIMS`, quoted with their table or figure).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pandas as pd

from verispec.defaults import N_BOOT
from verispec.eval.report import load_frame, md_table
from verispec.eval.stats import percentile_interval, resample_indices
from verispec.eval.store import read_results

__all__ = ["CLAIMS", "AVAILABLE_PAIRS", "Claim", "coupling_table", "design_effect", "n_for_halfwidth", "n_required",
           "paired_differences", "paired_summary", "plan_markdown", "power_markdown", "power_table", "ratio_ci",
           "throughput"]

ALPHA = 0.05
POWER = 0.80
#: (problem, seed) pairs available offline with 3 seeds (README "Real benchmark data"; BFCL: the four
#: non-live categories, 400 + 200 + 200 + 200 problems; the paper used parallel_multiple, 200)
AVAILABLE_PAIRS = {"humaneval": 164 * 3, "gsm": 100 * 3, "mgsm": 17 * 100 * 3, "champ": 270 * 3,
                   "bfcl": 1000 * 3, "bfcl parallel_multiple": 200 * 3}


def n_required(delta: float, sd: float, alpha: float = ALPHA, power: float = POWER) -> float:
    """Pairs needed to detect a mean paired difference ``delta`` (two-sided level ``alpha``, power ``power``):
    ((z_{1-alpha/2} + z_{power}) * sd / delta)^2, not rounded; inf for delta = 0."""
    if delta == 0:
        return math.inf
    z = NormalDist().inv_cdf
    return ((z(1 - alpha / 2) + z(power)) * sd / delta) ** 2


def n_for_halfwidth(halfwidth: float, sd: float, alpha: float = ALPHA) -> float:
    """Pairs for a (1 - alpha) confidence interval of the mean difference of half-width ``halfwidth``
    (what an equivalence claim such as 'matches lossless' needs): (z_{1-alpha/2} * sd / halfwidth)^2."""
    return (NormalDist().inv_cdf(1 - alpha / 2) * sd / halfwidth) ** 2


def paired_differences(df: pd.DataFrame, lossy: str, baseline: str, tasks: Sequence[str] | None = None
                       ) -> pd.DataFrame:
    """One row per (task, problem, seed) both settings completed: ``d_acc`` (pp), ``d_be`` (per-unit BE)."""
    keep = ["task", "problem_id", "seed", "passed", "be"]
    sel = df if tasks is None else df[df["task"].isin(list(tasks))]
    a = sel[sel["label"] == lossy][keep]
    b = sel[sel["label"] == baseline][keep]
    m = a.merge(b, on=["task", "problem_id", "seed"], suffixes=("_l", "_b"))
    m["d_acc"] = 100.0 * (m["passed_l"].astype(float) - m["passed_b"].astype(float))
    m["d_be"] = m["be_l"] - m["be_b"]
    return m


def design_effect(d: pd.DataFrame, col: str) -> float:
    """1 + (m - 1) rho for the column ``col`` of :func:`paired_differences`, clustered by (task, problem); m the
    mean number of seeds per problem, rho the one-way ANOVA intraclass correlation (clipped to [0, 1])."""
    groups = [g[col].to_numpy(float) for _, g in d.groupby(["task", "problem_id"])]
    k, n = len(groups), sum(len(g) for g in groups)
    if k < 2 or n <= k:
        return math.nan
    m = n / k
    grand = np.concatenate(groups).mean()
    msb = sum(len(g) * (g.mean() - grand) ** 2 for g in groups) / (k - 1)
    msw = sum(((g - g.mean()) ** 2).sum() for g in groups) / (n - k)
    var_b = max((msb - msw) / m, 0.0)
    rho = var_b / (var_b + msw) if var_b + msw > 0 else 0.0
    return 1 + (m - 1) * rho


def paired_summary(d: pd.DataFrame) -> dict:
    """N pairs and problems, mean and sample sd (ddof 1) of d_acc and d_be, their design effects, and the
    fraction of pairs with discordant pass/fail."""
    return {"n_pairs": len(d), "n_problems": d[["task", "problem_id"]].drop_duplicates().shape[0],
            "mean_acc": float(d["d_acc"].mean()), "sd_acc": float(d["d_acc"].std(ddof=1)),
            "mean_be": float(d["d_be"].mean()), "sd_be": float(d["d_be"].std(ddof=1)),
            "deff_acc": design_effect(d, "d_acc"), "deff_be": design_effect(d, "d_be"),
            "discordant": float((d["d_acc"] != 0).mean())}


@dataclass(frozen=True)
class Claim:
    """One claim of the paper: the effect it reports and the measured pair used for the paired sd."""

    key: str
    claim: str
    source: str  # where the paper reports it
    delta_acc: float | None  # pp, the effect to detect (None: no accuracy effect claimed)
    delta_be: float | None  # BE (accepted drafts per target call)
    analogue: tuple[str, str] | None  # (lossy label, baseline label) measured here
    tasks: tuple[str, ...]  # tasks of the analogue pooled for the sd
    note: str = ""
    kind: str = "difference"  # "difference": detect delta; "equivalence": CI half-width; "interaction": 2 tasks
    offline: tuple[str, ...] = ("humaneval", "gsm")  # offline tasks (AVAILABLE_PAIRS) that could hold the test
    across_tasks: bool = False  # interaction between two tasks (each set of pairs on one task), not frameworks

    @property
    def available(self) -> int:
        """(problem, seed) pairs offline on the tasks that could hold the test; for an interaction between two
        tasks, those of the smaller task (each set of pairs lives on one task)."""
        counts = [AVAILABLE_PAIRS[t] for t in self.offline]
        return min(counts) if self.across_tasks else sum(counts)


SC, MP = "spec-cascade(p_base=0.3)", "minp-sampling(p_base=0.3)"
LEN, COS, LL = "lenience(l=0.5)", "cos-we(lam=0.5)", "lossless"
#: the paper's claims this project tests, with the paper's numbers (arXiv 2607.26627v1)
CLAIMS: tuple[Claim, ...] = (
    Claim("C1", "single-draft SpecCascade vs min-p sampling", "Table 7, single-draft SD, Avg.: "
          "dBE +0.09, dAcc -0.38 pp (MATH -0.88, MBPP+ +0.01, INCLUDE -0.97, BFCL +0.33)",
          -0.38, 0.09, (SC, MP), ("humaneval", "gsm"), offline=("humaneval", "gsm", "mgsm", "champ", "bfcl")),
    Claim("C1b", "single-draft SpecCascade vs min-p, largest benchmark gap", "Table 7, INCLUDE: dAcc -0.97 pp",
          -0.97, None, (SC, MP), ("humaneval", "gsm"), "MGSM stands in for INCLUDE", offline=("mgsm",)),
    Claim("C2", "single-draft typical acceptance vs eta sampling", "Table 7, single-draft SD, Avg.: "
          "dBE +0.21, dAcc -0.32 pp", -0.32, 0.21, (SC, MP), ("humaneval", "gsm"),
          "no typical/eta run here: sd of SpecCascade - min-p used",
          offline=("humaneval", "gsm", "mgsm", "champ", "bfcl")),
    Claim("C3a", "tree (EAGLE-3) gap, SpecCascade vs min-p", "Table 7, EAGLE-3, Avg.: dBE +0.14, dAcc -1.68 pp",
          -1.68, 0.14, (SC, MP), ("humaneval", "gsm"), "no tree run here: chain sd used"),
    Claim("C3b", "tree (EAGLE-3) gap, typical vs eta", "Table 7, EAGLE-3, Avg.: dBE +0.40, dAcc -6.32 pp",
          -6.32, 0.40, (SC, MP), ("humaneval", "gsm"), "no tree or typical run here: chain SpecCascade sd used"),
    Claim("C3c", "tree amplification, SpecCascade (tree gap - chain gap)", "Table 7: -1.68 vs -0.38 pp "
          "('roughly 4x'): difference -1.30 pp", -1.30, None, (SC, MP), ("humaneval", "gsm"),
          "difference of two paired differences on the same problems: sd x sqrt(2) (chain and tree pairs "
          "taken as independent); n per framework", "interaction", ("humaneval", "gsm")),
    Claim("C3d", "tree amplification, typical (tree gap - chain gap)", "Table 7: -6.32 vs -0.32 pp "
          "('roughly 20x'): difference -6.00 pp", -6.00, None, (SC, MP), ("humaneval", "gsm"),
          "as C3c", "interaction", ("humaneval", "gsm")),
    Claim("C4a", "Table 1: adaptive interpolation degrades (lam = 0.8, its mildest setting)",
          "Table 1 MBPP+ Pass@1 66.14 vs lossless SD 75.84 (Table 4): -9.70 pp; BE 5.95 vs 5.47: +0.48",
          -9.70, 0.48, (COS, LL), ("humaneval",), "cos-we(0.5) - lossless on HumanEval (adaptive interpolation is "
          "a collaborative rule; its residual realization is CoS-WE, docs/paper_notes.md 1)",
          offline=("humaneval",)),
    Claim("C4b", "Table 1: overshoot ceiling matches lossless (95% CI within +-2 pp)",
          "Table 1 MBPP+ Pass@1 75.13..75.93 vs 75.84 (-0.71..+0.09 pp); BE 5.54..5.59 vs 5.47: +0.07..+0.12",
          2.0, 0.07, (LEN, LL), ("humaneval",), "lenience(0.5) - lossless on HumanEval (the closest rule run); "
          "accuracy: pairs for a 95% CI of half-width 2 pp; BE: detect +0.07", "equivalence", ("humaneval",)),
    Claim("C4c", "Table 1: overshoot ceiling matches lossless (95% CI within +-5 pp)", "as C4b",
          5.0, None, (LEN, LL), ("humaneval",), "as C4b, half-width 5 pp", "equivalence", ("humaneval",)),
    Claim("C5a", "Table 6: min-p cap BE gain over lossless", "Table 6 MBPP+: 5.62 vs 5.42 (+3.7%): +0.20; "
          "Pass@1 75.66 vs 75.66", None, 0.20, (LEN, LL), ("humaneval",), "lenience(0.5) - lossless sd",
          offline=("humaneval",)),
    Claim("C5b", "Table 6: accuracy differences between the five rows", "Table 6 MBPP+: -0.79, -0.44, -0.33, "
          "0.00 pp vs lossless", -0.44, 0.09, (LEN, LL), ("humaneval",),
          "middle of the reported accuracy gaps; BE: smallest gap (+0.09, SpecCascade row)", offline=("humaneval",)),
    Claim("C6a", "CoS degrades with its parameter (Fig. 3 / Table 4), mildest setting", "Table 4 MBPP+ CoS t=0.2: "
          "71.43 vs 75.84: -4.41 pp; BE 6.05 vs 5.47: +0.58", -4.41, 0.58, (COS, LL), ("humaneval",),
          offline=("humaneval", "gsm")),
    Claim("C6b", "CoS trend across its range (t = 0.2 vs 0.8)", "Table 4 MBPP+ CoS 71.43 -> 54.06: -17.37 pp; "
          "BE 6.05 -> 9.26", -17.37, 3.21, (COS, LL), ("humaneval",), "sd of cos-we(0.5) - lossless as the sd of "
          "a difference between two CoS settings", offline=("humaneval", "gsm")),
    Claim("C6c", "CoS trend, smallest adjacent step", "Table 4 MBPP+ CoS t=0.4 -> 0.6: 61.20 -> 59.44: -1.76 pp",
          -1.76, None, (COS, LL), ("humaneval",), offline=("humaneval", "gsm")),
    Claim("C7a", "BE vs p_base, SpecCascade (Fig. 5)", "Table 4 MBPP+ SpecCascade BE 5.64 (0.1) -> 5.41 (0.9): "
          "-0.23; adjacent steps -0.03..-0.08", None, -0.05, (MP, LL), ("humaneval", "gsm"),
          "per-unit BE sd of min-p(0.3) - lossless (two settings lossless for their own target) for a 0.05 step"),
    Claim("C7b", "BE vs p_base, min-p rises then falls / eta rises (Fig. 5)", "Table 4 MBPP+ min-p BE "
          "5.42, 5.56, 5.45, 5.59, 5.62; eta 5.42..5.57: steps of 0.03..0.14", None, -0.03, (MP, LL),
          ("humaneval", "gsm"), "smallest step 0.03"),
    Claim("C8", "difficulty trend of Figure 1 (gap grows with difficulty)", "Figure 1: min-p - SpecCascade gap "
          "+0.38 pp on GSM8K, +6.67 pp on AIME: interaction 6.29 pp", -6.29, None, (SC, MP), ("gsm",),
          "GSM vs CHAMP here; the sd of GSM pairs stands in for both tasks (sd x sqrt(2)); n per task; assumes "
          "CHAMP behaves like AIME, which the paper does not report", "interaction", ("gsm", "champ"), True),
)


def _n_row(c: Claim, s: dict) -> dict:
    inflate = math.sqrt(2) if c.kind == "interaction" else 1.0
    row = {"claim": c.key, "what": c.claim, "paper": c.source, "analogue": " - ".join(c.analogue or ()),
           "tasks": ",".join(c.tasks), **s, "note": c.note}
    if c.delta_acc is None:
        row["n_acc"] = math.nan
    elif c.kind == "equivalence":
        row["n_acc"] = n_for_halfwidth(c.delta_acc, s["sd_acc"])
    else:
        row["n_acc"] = n_required(c.delta_acc, inflate * s["sd_acc"])
    row["n_be"] = math.nan if c.delta_be is None else n_required(c.delta_be, inflate * s["sd_be"])
    row["delta_acc"], row["delta_be"], row["kind"] = c.delta_acc, c.delta_be, c.kind
    row["available"] = c.available
    # clustered requirement (seeds of a problem are correlated) and the units it costs: lossy + baseline per pair,
    # twice that for an interaction (two tasks or frameworks, n pairs each)
    for m in ("acc", "be"):
        n = row[f"n_{m}"]
        row[f"n_{m}_clustered"] = math.ceil(n * row[f"deff_{m}"]) if np.isfinite(n) else n
        row[f"units_{m}"] = (4 if c.kind == "interaction" else 2) * row[f"n_{m}_clustered"]
    return row


def power_table(run_dir: str | Path, claims: Sequence[Claim] = CLAIMS, alpha: float = ALPHA,
                power: float = POWER) -> pd.DataFrame:
    """One row per claim: the paper's effect, the measured paired sd of its analogue in ``run_dir``, the pairs
    needed (per task for interactions) to detect it at level ``alpha`` with ``power``."""
    df = load_frame(run_dir)
    rows = []
    for c in claims:
        d = paired_differences(df, *c.analogue, tasks=c.tasks)
        if alpha != ALPHA or power != POWER:
            raise ValueError("power_table uses alpha 0.05 and power 0.8; call n_required for others")
        rows.append(_n_row(c, paired_summary(d)))
    return pd.DataFrame(rows)


def throughput(run_dir: str | Path) -> dict:
    """Units, wall hours from the first to the last ``finished_at`` and units per hour of a run directory, plus
    the sum of per-unit decoding seconds (one process's view)."""

    recs = read_results(run_dir)
    times = sorted(pd.Timestamp(r["finished_at"]) for r in recs)
    hours = (times[-1] - times[0]).total_seconds() / 3600 if len(times) > 1 else math.nan
    return {"units": len(recs), "hours": hours, "units_per_hour": len(recs) / hours if hours else math.nan,
            "unit_s_mean": float(np.mean([r["timings"]["total_s"] for r in recs]))}


def ratio_ci(common: pd.DataFrame, independent: pd.DataFrame, col: str, n_boot: int = N_BOOT, seed: int = 0
             ) -> tuple[float, float]:
    """95% percentile interval of var(independent) / var(common) of ``col``: problems resampled with
    replacement in each run on its own (the two runs are independent; seeds of a problem move together)."""
    rng = np.random.default_rng(seed)

    def groups(d: pd.DataFrame) -> list[np.ndarray]:
        return [g[col].to_numpy(float) for _, g in d.groupby(["task", "problem_id"])]

    gc, gi = groups(common), groups(independent)
    if len(gc) < 2 or len(gi) < 2:
        return math.nan, math.nan
    ratios = np.empty(n_boot)
    with np.errstate(divide="ignore", invalid="ignore"):
        for b in range(n_boot):
            vc = np.concatenate([gc[j] for j in resample_indices(rng, len(gc))]).var(ddof=1)
            vi = np.concatenate([gi[j] for j in resample_indices(rng, len(gi))]).var(ddof=1)
            ratios[b] = vi / vc if vc > 0 else (math.inf if vi > 0 else math.nan)
    if np.isnan(ratios).all():  # 0 / 0 in every resample: both runs' differences are all equal
        return math.nan, math.nan
    return percentile_interval(ratios, method="inverted_cdf")  # no interpolation: ratios may be inf


def coupling_table(common_dir: str | Path, independent_dir: str | Path) -> pd.DataFrame:
    """For every (lossy, baseline) pair of the two runs (and min-p vs lossless where both exist), the paired
    variance of d_acc and d_be under each coupling, the ratio independent / common and its 95% bootstrap
    interval (:func:`ratio_ci`)."""
    frames = {"common": load_frame(common_dir), "independent": load_frame(independent_dir)}
    pairs = []
    for lab, base in frames["common"].drop_duplicates("label")[["label", "baseline"]].itertuples(index=False):
        if lab != base:
            pairs.append((lab, base))
    labels = set(frames["common"]["label"])
    pairs += [(lab, "lossless") for lab in sorted(labels) if lab.startswith("minp-sampling") and "lossless" in labels]
    rows = []
    for lab, base in pairs:
        row = {"lossy": lab, "baseline": base}
        diffs = {name: paired_differences(df, lab, base) for name, df in frames.items()}
        for name, d in diffs.items():
            s = paired_summary(d)
            row.update({f"n_{name}": s["n_pairs"], f"mean_acc_{name}": s["mean_acc"],
                        f"var_acc_{name}": s["sd_acc"] ** 2, f"mean_be_{name}": s["mean_be"],
                        f"var_be_{name}": s["sd_be"] ** 2, f"discordant_{name}": s["discordant"]})
        for m in ("acc", "be"):
            c = row[f"var_{m}_common"]
            v = row[f"var_{m}_independent"]
            row[f"ratio_{m}"] = v / c if c > 0 else (math.inf if v > 0 else math.nan)
            row[f"ratio_{m}_lo"], row[f"ratio_{m}_hi"] = ratio_ci(diffs["common"], diffs["independent"], f"d_{m}")
        rows.append(row)
    return pd.DataFrame(rows)


def _fmt(x: object, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, float):
        return "inf" if math.isinf(x) else f"{x:.{digits}f}"
    return str(x)


def power_markdown(table: pd.DataFrame) -> str:
    header = ["claim", "paper effect (dAcc pp / dBE)", "analogue (tasks)", "pairs", "sd dAcc pp", "sd d(unit BE)",
              "deff acc / BE", "n pairs acc", "n pairs BE"]
    rows = []
    for _, r in table.iterrows():
        eff = f"{_fmt(r['delta_acc'])} / {_fmt(r['delta_be'])}"
        if r["kind"] == "equivalence":
            eff = f"±{_fmt(r['delta_acc'])} (CI half-width) / {_fmt(r['delta_be'])}"
        rows.append([f"{r['claim']} {r['what']}", eff, f"{r['analogue']} ({r['tasks']})", str(r["n_pairs"]),
                     _fmt(r["sd_acc"], 1), _fmt(r["sd_be"], 3), f"{_fmt(r['deff_acc'])} / {_fmt(r['deff_be'])}",
                     _fmt(math.ceil(r["n_acc"]) if np.isfinite(r["n_acc"]) else r["n_acc"], 0),
                     _fmt(math.ceil(r["n_be"]) if np.isfinite(r["n_be"]) else r["n_be"], 0)])
    return md_table(header, rows)


def plan_markdown(table: pd.DataFrame, units_per_hour: float) -> str:
    """Per claim: pairs needed with the design effect (per task / framework for interactions), pairs available
    offline, units and hours at ``units_per_hour`` and at three times that."""
    header = ["claim", "n acc (x deff)", "n BE (x deff)", "available pairs", "units acc / BE",
              f"hours at {units_per_hour:.0f} / {3 * units_per_hour:.0f} units/h (acc; BE)"]
    rows = []

    def h(units: float, rate: float) -> str:
        return _fmt(units / rate, 1) if np.isfinite(units) else "–"

    for _, r in table.iterrows():
        ua, ub = r["units_acc"], r["units_be"]
        rows.append([r["claim"], _fmt(r["n_acc_clustered"], 0), _fmt(r["n_be_clustered"], 0), str(r["available"]),
                     f"{_fmt(ua, 0)} / {_fmt(ub, 0)}",
                     f"{h(ua, units_per_hour)} / {h(ua, 3 * units_per_hour)}; "
                     f"{h(ub, units_per_hour)} / {h(ub, 3 * units_per_hour)}"])
    return md_table(header, rows)


def coupling_markdown(table: pd.DataFrame) -> str:
    header = ["lossy", "baseline", "pairs (common / indep.)", "mean dAcc pp (c / i)", "var dAcc (c / i)",
              "ratio acc [95% CI]", "mean d(unit BE) (c / i)", "var d(unit BE) (c / i)", "ratio BE [95% CI]",
              "discordant pass/fail (c / i)"]
    rows = [[r["lossy"], r["baseline"], f"{r['n_common']} / {r['n_independent']}",
             f"{_fmt(r['mean_acc_common'], 1)} / {_fmt(r['mean_acc_independent'], 1)}",
             f"{_fmt(r['var_acc_common'], 0)} / {_fmt(r['var_acc_independent'], 0)}",
             f"{_fmt(r['ratio_acc'])} [{_fmt(r['ratio_acc_lo'])}, {_fmt(r['ratio_acc_hi'])}]",
             f"{_fmt(r['mean_be_common'], 3)} / {_fmt(r['mean_be_independent'], 3)}",
             f"{_fmt(r['var_be_common'], 4)} / {_fmt(r['var_be_independent'], 4)}",
             f"{_fmt(r['ratio_be'])} [{_fmt(r['ratio_be_lo'])}, {_fmt(r['ratio_be_hi'])}]",
             f"{100 * r['discordant_common']:.0f}% / {100 * r['discordant_independent']:.0f}%"]
            for _, r in table.iterrows()]
    return md_table(header, rows)
