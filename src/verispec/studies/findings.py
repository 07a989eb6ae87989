"""docs/results/findings.json and the verdicts of docs/results/FINDINGS.md, computed from the committed runs.

Every comparison a row of FINDINGS.md rests on is listed here (:data:`SPEC`, built by :func:`comparisons`): the
claim (the row's key, the bold text its first cell starts with), the task, the run directory (under the results
folder) and the two settings by their labels in the result lines, the metric, the paper's value and the kind of
claim (:mod:`verispec.studies.verdict`). :func:`compute` turns each into one object of findings.json:

- ``estimate`` = metric(a) - metric(b) on the (task, problem, seed) keys both completed: pass@1 in percentage
  points (100 x (passed_a - passed_b) / pairs), BE as the difference of the two settings' ratios of sums
  (emitted accepted drafts / rounds, :func:`verispec.eval.report.load_frame`).
- ``ci``: the 95% percentile interval of the paired cluster bootstrap over problems (all seeds and both settings
  of a problem resampled together; :func:`verispec.eval.stats.cluster_weights`, 2000 resamples, seed 0: the
  draws of `verispec bench compare`, so the intervals equal its).
- ``ci_adjusted``: the same resamples' Bonferroni interval over the comparison's family, at level
  1 - 0.05 / family_size. A family is every comparison of one claim on one task, one metric and one problem set
  (all problems, or a held-out subset, a replication of its own) whose kind is not "not testable here" and whose
  units are complete; ``family_size`` counts them. A comparison on a single problem has no interval (every
  resample is that problem: `bench compare` prints none either), is in no family and is "not testable here".
- ``verdict``: :func:`verispec.studies.verdict.verdict` on ``estimate`` and ``ci_adjusted`` (rounded to 6
  decimals, as stored), the paper's value, the kind and the margin.

Completeness: a comparison is computed only when both of its settings hold every (problem, seed) key of its design,
the keys any setting of its run (of each run, intersected, when it spans two) holds on its task and subset. Until
then its estimate and intervals are null, ``n_pairs`` is 0 (nothing rests on the pairs so far) and its verdict is
"not testable here". A run being extended (new settings appended) thus changes nothing in findings.json until the
new settings are complete, and then gives their verdicts when the command runs again.

Three constructions besides a plain pair of settings:

- gap difference (Table 7's amplification): ``a`` = "X - Y" in ``run``, ``b`` = "X - Y" in ``run_b``, on the keys
  all four units share, the same problems resampled for both gaps (:func:`verispec.eval.report.gap_difference`).
- the fixed frontier at a budget's block efficiency (:mod:`verispec.studies.budget`): ``b`` names the construction
  and the labels it is built from, "upper envelope of: L1; L2; ..." or "interpolation of: L1; ...". Its
  fixed settings are lossless and every adaptive-interpolation setting of the residual realization (= CoS-WE) that
  ``run_b`` holds complete; a fixed setting still running joins when it completes.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from verispec.eval.report import load_frame, md_table, select_problems
from verispec.eval.stats import BOOT_SEED, N_BOOT, cluster_weights, percentile_interval
from verispec.eval.store import results_files
from verispec.studies.budget import frontier_resamples, matched_difference
from verispec.studies.verdict import (
    EFFECT,
    EQUIVALENCE,
    NON_INFERIORITY,
    NOT_TESTABLE,
    summarize,
    verdict,
)

__all__ = ["FIELDS", "MARGIN_PP", "SPEC", "Comparison", "comparisons", "compute", "findings_markdown",
           "summaries", "update_findings_md", "write_findings"]

#: the fields of one object of findings.json, in order
FIELDS = ("claim", "task", "run", "a", "b", "run_b", "subset", "metric", "n_pairs", "estimate", "ci", "ci_adjusted",
          "family_size", "paper", "kind", "margin", "verdict")
#: the equivalence and non-inferiority margin for pass@1, in percentage points: the finest the power plan made
#: testable before the runs (docs/results/POWER.md C4c: +-5 pp needs about 355 pairs, HumanEval holds 492;
#: +-2 pp needs about 2,200, more than any installed benchmark holds per task)
MARGIN_PP = 5.0
LEVEL = 0.95
DIGITS = 6

LOSSLESS = "lossless"
LAMS = (0.2, 0.4, 0.6, 0.8)


@dataclass(frozen=True)
class Comparison:
    """One comparison of findings.json before it is computed. ``construction``: "pair" (a in ``run``, b in
    ``run_b`` or ``run``), "gap" (the gap ``a`` - ``b`` in ``run`` minus the same gap in ``run_b``), "envelope"
    or "interpolation" (budget ``a`` in ``run`` against the fixed frontier of ``run_b``). ``problems``: only the
    problems numbered in [start, stop) (the held-out ones)."""

    claim: str
    task: str
    run: str
    a: str
    b: str
    metric: str
    paper: float | None
    kind: str
    margin: float | None = None
    run_b: str | None = None
    problems: tuple[int, int] | None = None
    construction: str = "pair"
    fixed_pattern: str = field(default="", compare=False)

    @property
    def subset(self) -> str | None:
        if self.problems is None:
            return None
        return f"problems {self.problems[0]}-{self.problems[1] - 1}"


# --------------------------------------------------------------------------------------------- the claims

T1 = "Table 1: adaptive interpolation degrades accuracy"
T1_OC = "Table 1: the overshoot ceiling keeps accuracy"
C3 = "Contribution 3: controlling overshoot keeps collaborative verification accurate"
T4 = "Table 4 / Figure 3: CoS degrades as its parameter grows"
LEN = "Table 6: lenience keeps accuracy"
T6 = "Table 6: the min-p cap gains the most BE at lossless accuracy"
C2 = "Contribution 2 / Table 2 / Table 7, single draft: truncation-based verification loses accuracy"
T7 = "Table 7 per benchmark, single draft"
TREE = "Table 7, EAGLE-3: trees amplify the accuracy gap"
BUDGET_ENV = "Budget: no more loss than the fixed frontier's upper envelope at equal BE"
BUDGET_INT = "Budget: no more loss than the fixed frontier interpolated at equal BE"

#: the row keys in FINDINGS.md order
CLAIMS = (T1, T1_OC, C3, T4, LEN, T6, C2, T7, TREE, BUDGET_ENV, BUDGET_INT)


def _ai(lam: float, residual: bool) -> str:
    return f"adaptive-interpolation(lam={lam}" + (", realization=residual)" if residual else ")")


def _oc(lam: float) -> str:
    return f"overshoot-ceiling(lam={lam})"


# the paper's MBPP+ numbers (Table 1, and Table 2's standard SD as Table 1's lossless: BE 5.47, Pass@1 75.84)
_T1_AI = {0.2: (9.15, 50.26), 0.4: (7.93, 56.61), 0.6: (6.80, 60.85), 0.8: (5.95, 66.14)}
_T1_OC = {0.2: (5.59, 75.93), 0.4: (5.57, 75.13), 0.6: (5.54, 75.66), 0.8: (5.54, 75.13)}
_T1_LOSSLESS = (5.47, 75.84)
# Table 4, CoS at t = 0.2 / 0.4 / 0.6 / 0.8: (BE, accuracy) on MBPP+ and on MATH (GSM's counterpart)
_T4_MBPP = {0.2: (6.05, 71.43), 0.4: (7.14, 61.20), 0.6: (7.86, 59.44), 0.8: (9.26, 54.06)}
_T4_MATH = {0.2: (8.33, 71.53), 0.4: (8.80, 60.40), 0.6: (9.42, 54.80), 0.8: (10.14, 46.00)}
_T4_MBPP_LOSSLESS_ACC = 75.84
# Table 6 (MBPP+, averaged over l): (BE, Pass@1) per rule
_T6 = {LOSSLESS: (5.42, 75.66), "spec-cascade(p_base=0.5)": (5.51, 74.87), "lenience(l=0.4)": (5.53, 75.22),
       "ceiling(l=0.4)": (5.58, 75.33), "minp-cap(p_base=0.5, l=0.4)": (5.62, 75.66)}
# Table 7: (dBE, dAcc) per matched pair, single draft and EAGLE-3, per benchmark
_SC, _MINP = "spec-cascade(p_base=0.3)", "minp-sampling(p_base=0.3)"
_TY, _ETA = "typical(epsilon=0.15)", "eta-sampling(epsilon=0.15)"
_T7_SINGLE = {"MATH": {_SC: (0.22, -0.88), _TY: (0.41, -0.59)}, "INCLUDE": {_SC: (0.14, -0.97), _TY: (0.22, -1.39)},
              "BFCL": {_SC: (0.01, 0.33), _TY: (0.09, 0.76)}, "Avg.": {_SC: (0.09, -0.38), _TY: (0.21, -0.32)}}
_T7_TREE = {"MATH": {_SC: (0.24, -0.72), _TY: (0.68, -6.28)}, "Avg.": {_SC: (0.14, -1.68), _TY: (0.40, -6.32)}}
_BASE = {_SC: _MINP, _TY: _ETA}
#: per task, the paper's benchmark it is compared with in Table 7
_T7_BENCH = {"gsm": "MATH", "mgsm": "INCLUDE", "bfcl": "BFCL", "humaneval": "Avg.", "all": "Avg."}
#: claims whose accuracy effect needs more pairs than exist offline (POWER.md, pairs x design effect against the
#: available pairs): single draft C1 (120k > 9.7k), C1b (18k > 5.1k), C2 (169k); tree C3a (6.1k > 792); the tree
#: amplification C3c (21k) and C3d (964 > 792 per framework)
_RESIDUAL_PATTERN = r"adaptive-interpolation\(lam=[0-9.]+, realization=residual\)"


def _r(x: float) -> float:
    return round(x, 2)


def comparisons() -> list[Comparison]:
    """Every comparison of findings.json, in FINDINGS.md's row order."""
    out: list[Comparison] = []
    add = out.append
    runs = (("humaneval", "table1_power"), ("gsm", "table1_gsm"))
    # Table 1: adaptive interpolation vs lossless, both realizations, every lam, both tasks; held-out HumanEval
    for task, run in runs:
        for residual in (True, False):
            for lam in LAMS:
                be, acc = _T1_AI[lam]
                add(Comparison(T1, task, run, _ai(lam, residual), LOSSLESS, "pass@1", _r(acc - _T1_LOSSLESS[1]),
                               EFFECT))
                add(Comparison(T1, task, run, _ai(lam, residual), LOSSLESS, "BE", _r(be - _T1_LOSSLESS[0]), EFFECT))
        if task == "humaneval":
            for lam in LAMS:
                add(Comparison(T1, task, run, _ai(lam, True), LOSSLESS, "pass@1",
                               _r(_T1_AI[lam][1] - _T1_LOSSLESS[1]), EFFECT, problems=(64, 164)))
    # Table 1: the overshoot ceiling keeps accuracy (equivalence) and gains BE
    for task, run in runs:
        for lam in LAMS:
            be, acc = _T1_OC[lam]
            add(Comparison(T1_OC, task, run, _oc(lam), LOSSLESS, "pass@1", _r(acc - _T1_LOSSLESS[1]), EQUIVALENCE,
                           MARGIN_PP))
            add(Comparison(T1_OC, task, run, _oc(lam), LOSSLESS, "BE", _r(be - _T1_LOSSLESS[0]), EFFECT))
    # Contribution 3: adaptive interpolation - overshoot ceiling at equal lam, both realizations, every lam
    for task, run in runs:
        for residual in (True, False):
            for lam in LAMS:
                add(Comparison(C3, task, run, _ai(lam, residual), _oc(lam), "pass@1",
                               _r(_T1_AI[lam][1] - _T1_OC[lam][1]), EFFECT))
    # Table 4: CoS-WE at t = 1 - lam (residual adaptive interpolation), t 0.8 vs 0.2 (and vs 0.4 on GSM)
    for task, run, tab in (("humaneval", "table1_power", _T4_MBPP), ("gsm", "table1_gsm", _T4_MATH)):
        pairs = [(0.2, 0.8)] + ([(0.2, 0.6)] if task == "gsm" else [])
        for lam_a, lam_b in pairs:  # CoS t = 1 - lam: t = 0.8 minus t = 1 - lam_b
            t_a, t_b = round(1 - lam_a, 1), round(1 - lam_b, 1)
            add(Comparison(T4, task, run, _ai(lam_a, True), _ai(lam_b, True), "pass@1",
                           _r(tab[t_a][1] - tab[t_b][1]), EFFECT))
            add(Comparison(T4, task, run, _ai(lam_a, True), _ai(lam_b, True), "BE",
                           _r(tab[t_a][0] - tab[t_b][0]), EFFECT))
    add(Comparison(T4, "humaneval", "be_claims", "cos-we(lam=0.2)", "cos-we(lam=0.8)", "pass@1",
                   _r(_T4_MBPP[0.8][1] - _T4_MBPP[0.2][1]), EFFECT))
    add(Comparison(T4, "humaneval", "be_claims", "cos-we(lam=0.2)", "cos-we(lam=0.8)", "BE",
                   _r(_T4_MBPP[0.8][0] - _T4_MBPP[0.2][0]), EFFECT))
    add(Comparison(T4, "humaneval", "be_claims", "cos-we(lam=0.8)", LOSSLESS, "pass@1",
                   _r(_T4_MBPP[0.2][1] - _T4_MBPP_LOSSLESS_ACC), EFFECT))
    # lenience keeps accuracy (Table 6's lenience row: -0.44 pp), equivalence
    paper_len = _r(_T6["lenience(l=0.4)"][1] - _T6[LOSSLESS][1])
    add(Comparison(LEN, "humaneval", "table1_power", "lenience(l=0.4)", LOSSLESS, "pass@1", paper_len, EQUIVALENCE,
                   MARGIN_PP))
    for task in ("humaneval", "gsm"):
        add(Comparison(LEN, task, "paper_small", "lenience(l=0.5)", LOSSLESS, "pass@1", paper_len, EQUIVALENCE,
                       MARGIN_PP))
    # Table 6: BE gains and the accuracy of each row (equivalence with lossless and between rows)
    for lab in ("spec-cascade(p_base=0.5)", "lenience(l=0.4)", "ceiling(l=0.4)", "minp-cap(p_base=0.5, l=0.4)"):
        add(Comparison(T6, "humaneval", "table1_power", lab, LOSSLESS, "BE", _r(_T6[lab][0] - _T6[LOSSLESS][0]),
                       EFFECT))
    add(Comparison(T6, "humaneval", "table1_power", "minp-cap(p_base=0.5, l=0.4)", "ceiling(l=0.4)", "BE",
                   _r(_T6["minp-cap(p_base=0.5, l=0.4)"][0] - _T6["ceiling(l=0.4)"][0]), EFFECT))
    for lab, base in (("spec-cascade(p_base=0.5)", LOSSLESS), ("lenience(l=0.4)", LOSSLESS),
                      ("ceiling(l=0.4)", LOSSLESS), ("minp-cap(p_base=0.5, l=0.4)", LOSSLESS),
                      ("minp-cap(p_base=0.5, l=0.4)", "spec-cascade(p_base=0.5)"),
                      ("minp-cap(p_base=0.5, l=0.4)", "lenience(l=0.4)")):
        add(Comparison(T6, "humaneval", "table1_power", lab, base, "pass@1", _r(_T6[lab][1] - _T6[base][1]),
                       EQUIVALENCE, MARGIN_PP))
    # Contribution 2 / Table 7 single draft: BE gaps (effect), accuracy gaps (not testable: C1, C2)
    for run, task in (("be_claims", "humaneval"), ("paper_small", "all")):
        for lossy in (_SC, _TY):
            if run == "paper_small" and lossy == _TY:
                continue  # paper_small has no typical / eta
            dbe, dacc = _T7_SINGLE["Avg."][lossy]
            add(Comparison(C2, task, run, lossy, _BASE[lossy], "BE", dbe, EFFECT))
            add(Comparison(C2, task, run, lossy, _BASE[lossy], "pass@1", dacc, NOT_TESTABLE))
    # Table 7 per benchmark (GSM8K for MATH, MGSM for INCLUDE, BFCL)
    for task in ("gsm", "bfcl", "mgsm"):
        for lossy in (_SC, _TY):
            dbe, dacc = _T7_SINGLE[_T7_BENCH[task]][lossy]
            add(Comparison(T7, task, "table7_tasks", lossy, _BASE[lossy], "BE", dbe, EFFECT))
            add(Comparison(T7, task, "table7_tasks", lossy, _BASE[lossy], "pass@1", dacc, NOT_TESTABLE))
    # Table 7 with trees: the tree gaps and tree minus chain, on every task the tree run measured
    for task, chain_run in (("humaneval", "be_claims"), ("gsm", "table7_tasks")):
        bench = _T7_BENCH[task]
        for lossy in (_SC, _TY):
            tbe, tacc = _T7_TREE[bench][lossy]
            sbe, sacc = _T7_SINGLE[bench][lossy]
            acc_kind = EFFECT if lossy == _TY else NOT_TESTABLE  # C3b testable (435 pairs), C3a not (6.1k)
            add(Comparison(TREE, task, "table7_tree", lossy, _BASE[lossy], "BE", tbe, EFFECT))
            add(Comparison(TREE, task, "table7_tree", lossy, _BASE[lossy], "pass@1", tacc, acc_kind))
            gap = f"{lossy} - {_BASE[lossy]}"
            add(Comparison(TREE, task, "table7_tree", gap, gap, "BE", _r(tbe - sbe), EFFECT, run_b=chain_run,
                           construction="gap"))
            add(Comparison(TREE, task, "table7_tree", gap, gap, "pass@1", _r(tacc - sacc), NOT_TESTABLE,
                           run_b=chain_run, construction="gap"))
    # the budget against the fixed frontier: upper envelope and linear interpolation (non-inferiority)
    for claim, construction in ((BUDGET_ENV, "envelope"), (BUDGET_INT, "interpolation")):
        for task, run, run_b in (("humaneval", "budget", "table1_power"), ("gsm", "budget_gsm", "table1_gsm")):
            for tv in (0.02, 0.05, 0.1, 0.2):
                add(Comparison(claim, task, run, f"cos-we(budget tv={tv})", construction, "pass@1", None,
                               NON_INFERIORITY, MARGIN_PP, run_b=run_b, construction=construction,
                               fixed_pattern=_RESIDUAL_PATTERN))
    return out


SPEC: tuple[Comparison, ...] = tuple(comparisons())


# ----------------------------------------------------------------------------------------------- compute


class _Scope:
    """One run's units on one task (or "all") and problem set: the frame, each setting's rows and (task, problem,
    seed) keys, and the keys any setting holds (the run's design there)."""

    def __init__(self, df: pd.DataFrame) -> None:
        df = df.copy()
        df["key"] = df["task"].astype(str) + "\x00" + df["problem_id"].astype(str) + "\x00" + df["seed"].astype(str)
        self.df = df
        self.rows = {lab: g for lab, g in df.groupby("label", sort=False)}
        self.keys = {lab: set(g["key"]) for lab, g in self.rows.items()}
        self.design = set(df["key"])

    def covers(self, label: str, design: set[str]) -> bool:
        return bool(design) and design <= self.keys.get(label, set())


class _Frames:
    """Result frames per run (only the columns the statistics need) and their scopes, each built once; the
    resample weights per number of clusters, drawn once."""

    def __init__(self, root: Path, n_boot: int, seed: int) -> None:
        self.root, self.n_boot, self.seed = root, n_boot, seed
        self._runs: dict[str, pd.DataFrame] = {}
        self._scopes: dict[tuple, _Scope] = {}
        self._weights: dict[int, np.ndarray] = {}

    def run(self, run: str) -> pd.DataFrame:
        if run not in self._runs:
            df = load_frame(self.root / run)
            df = df[["task", "problem_id", "seed", "label", "accepted", "rounds", "passed"]].copy()
            df["passed"] = df["passed"].astype(float)
            self._runs[run] = df
        return self._runs[run]

    def scope(self, run: str, task: str, problems: tuple[int, int] | None) -> _Scope:
        key = (run, task, problems)
        if key not in self._scopes:
            df = self.run(run)
            df = df if task == "all" else df[df["task"] == task]
            self._scopes[key] = _Scope(select_problems(df, *problems) if problems is not None else df)
        return self._scopes[key]

    def weights(self, n_clusters: int) -> np.ndarray:
        """Row 0 the point estimate (every cluster once), then the resamples of
        :func:`verispec.eval.stats.cluster_weights`."""
        if n_clusters not in self._weights:
            self._weights[n_clusters] = np.vstack([np.ones((1, n_clusters)),
                                                   cluster_weights(n_clusters, self.n_boot, self.seed)])
        return self._weights[n_clusters]


def _pair_sums(a: pd.DataFrame, b: pd.DataFrame) -> tuple[dict[str, np.ndarray], int, list[str]]:
    """Per-cluster sums of a paired frame (a merged with b on (task, problem, seed), a's order), the pairs and the
    clusters in order of first appearance (the order `bench compare` draws them in)."""
    m = a.merge(b, on=["task", "problem_id", "seed"], suffixes=("_a", "_b"))
    cluster = (m["task"] + "|" + m["problem_id"]).to_numpy()
    order = list(dict.fromkeys(cluster))
    pos = {k: i for i, k in enumerate(order)}
    idx = np.array([pos[k] for k in cluster], dtype=int)
    sums = {}
    for col in ("accepted_a", "rounds_a", "passed_a", "accepted_b", "rounds_b", "passed_b", "one"):
        v = np.ones(len(m)) if col == "one" else m[col].to_numpy(dtype=float)
        sums[col] = np.bincount(idx, weights=v, minlength=len(order))
    return sums, len(m), order


def _stat(sums: dict[str, np.ndarray], w: np.ndarray, metric: str) -> np.ndarray:
    s = {k: w @ v for k, v in sums.items()}
    with np.errstate(invalid="ignore", divide="ignore"):
        if metric == "BE":
            return s["accepted_a"] / s["rounds_a"] - s["accepted_b"] / s["rounds_b"]
        return 100.0 * (s["passed_a"] - s["passed_b"]) / s["one"]


def _pair(c: Comparison, frames: _Frames) -> tuple[np.ndarray | None, int, int]:
    """metric(a) - metric(b) ([1 + n_boot]; None while a unit is missing), the pairs and the problems."""
    sa = frames.scope(c.run, c.task, c.problems)
    sb = frames.scope(c.run_b, c.task, c.problems) if c.run_b else sa
    design = sa.design & sb.design
    if not (sa.covers(c.a, design) and sb.covers(c.b, design)):
        return None, 0, 0
    sums, n, order = _pair_sums(sa.rows[c.a], sb.rows[c.b])
    return _stat(sums, frames.weights(len(order)), c.metric), n, len(order)


def _gap(c: Comparison, frames: _Frames) -> tuple[np.ndarray | None, int, int]:
    """(lossy - base in run) - (lossy - base in run_b) on the keys both runs hold, one draw of problems for both."""
    lossy, base = c.a.split(" - ")
    sa, sb = frames.scope(c.run, c.task, c.problems), frames.scope(c.run_b, c.task, c.problems)
    design = sa.design & sb.design
    if not all(s.covers(lab, design) for s in (sa, sb) for lab in (lossy, base)):
        return None, 0, 0

    def rows(scope: _Scope, label: str) -> pd.DataFrame:
        r = scope.rows[label]
        return r[r["key"].isin(design)]

    ma, n, ca = _pair_sums(rows(sa, lossy), rows(sa, base))
    mb, _, cb = _pair_sums(rows(sb, lossy), rows(sb, base))
    pos = {k: i for i, k in enumerate(cb)}  # run B's sums in run A's cluster order
    mb = {k: v[[pos[x] for x in ca]] for k, v in mb.items()}
    w = frames.weights(len(ca))
    return _stat(ma, w, c.metric) - _stat(mb, w, c.metric), n, len(ca)


def _frontier(c: Comparison, frames: _Frames, cache: dict) -> tuple[np.ndarray | None, int, int, list[str]]:
    """acc(budget) - the fixed frontier at its BE ([1 + n_boot]; None while units are missing), the pairs, the
    problems, and the fixed labels the frontier is built from (lossless and every complete setting matching
    ``fixed_pattern``)."""
    sa, sb = frames.scope(c.run, c.task, c.problems), frames.scope(c.run_b, c.task, c.problems)
    design = sa.design & sb.design
    budgets = [lab for lab in sa.rows if sa.covers(lab, design)]
    fixed = sorted((lab for lab in sb.rows if (lab == LOSSLESS or re.fullmatch(c.fixed_pattern, lab))
                    and sb.covers(lab, design)), key=lambda lab: (lab != LOSSLESS, lab))  # lossless first
    if not (c.a in budgets and LOSSLESS in fixed and len(fixed) >= 2):
        return None, 0, 0, fixed
    key = (c.run, c.run_b, c.task, c.problems)
    if key not in cache:
        df = pd.concat([sa.df[sa.df["label"].isin(budgets)], sb.df[sb.df["label"].isin(fixed)]], ignore_index=True)
        cache[key] = frontier_resamples(df, budgets, fixed, LOSSLESS, frames.n_boot, frames.seed)
    labels, be, acc, mats = cache[key]
    d = matched_difference(be, acc, [labels.index(lab) for lab in fixed], labels.index(c.a), c.construction)
    return d, int(mats["one"][:, labels.index(c.a)].sum()), mats["one"].shape[0], fixed


def _fixed_name(construction: str, fixed: Sequence[str]) -> str:
    what = "upper envelope" if construction == "envelope" else "interpolation"
    return f"{what} of: {'; '.join(fixed)}"


def _round(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), DIGITS)


def _family_key(c: Comparison) -> tuple:
    return c.claim, c.task, c.metric, c.subset


def compute(results_dir: str | Path, spec: Iterable[Comparison] = SPEC, n_boot: int = N_BOOT,
            seed: int = BOOT_SEED) -> list[dict]:
    """One findings.json object per comparison of ``spec`` (fields :data:`FIELDS`), from the runs under
    ``results_dir``."""
    spec = list(spec)
    runs = sorted({r for c in spec for r in (c.run, c.run_b) if r is not None})
    if not any(results_files(Path(results_dir) / r) for r in runs):  # a wrong directory: no comparison is testable
        raise ValueError(f"no run of the findings under {results_dir} (it should hold run directories such as "
                         f"{', '.join(runs[:3])}, each with its results)")
    frames = _Frames(Path(results_dir), n_boot, seed)
    cache: dict = {}
    staged = []
    for c in spec:
        b = c.b
        if c.construction == "pair":
            boot, n, problems = _pair(c, frames)
        elif c.construction == "gap":
            boot, n, problems = _gap(c, frames)
        else:
            boot, n, problems, fixed = _frontier(c, frames, cache)
            b = _fixed_name(c.construction, fixed)
        if boot is not None and not math.isfinite(boot[0]):
            boot = None  # a budget outside the fixed settings' BE range: no matched value
        if boot is None:
            n = 0
        # one problem resampled is always the same problem: no interval (as `bench compare`), so no verdict
        staged.append((c, b, boot, n, boot is not None and problems >= 2))
    # families: per (claim, task, metric, subset), the comparisons that decide something
    family: dict[tuple, int] = {}
    for c, _, _, _, has_ci in staged:
        if has_ci and c.kind != NOT_TESTABLE:
            family[_family_key(c)] = family.get(_family_key(c), 0) + 1
    out = []
    for c, b, boot, n, has_ci in staged:
        size = family.get(_family_key(c)) if has_ci and c.kind != NOT_TESTABLE else None
        est = ci = ci_adj = None
        if boot is not None:
            est = _round(boot[0])
        if has_ci and boot is not None:
            ci = [_round(x) for x in percentile_interval(boot[1:], LEVEL, finite_only=True)]
            if size:
                ci_adj = [_round(x) for x in percentile_interval(boot[1:], 1 - (1 - LEVEL) / size, finite_only=True)]
        lo, hi = ci_adj if ci_adj else (None, None)
        obj = {"claim": c.claim, "task": c.task, "run": c.run, "a": c.a, "b": b, "run_b": c.run_b,
               "subset": c.subset, "metric": c.metric, "n_pairs": n, "estimate": est, "ci": ci,
               "ci_adjusted": ci_adj, "family_size": size, "paper": c.paper, "kind": c.kind, "margin": c.margin,
               "verdict": verdict(est, lo, hi, c.paper, c.kind, c.margin)}
        out.append({k: obj[k] for k in FIELDS})
    return out


# ------------------------------------------------------------------------------------------------ writing

_TASK_NAMES = {"humaneval": "HumanEval", "gsm": "GSM", "mgsm": "MGSM", "bfcl": "BFCL", "all": "HumanEval + GSM"}
_SHORT = ((", realization=residual)", " res)"), ("adaptive-interpolation(", "AI("), ("overshoot-ceiling(", "OC("),
          ("spec-cascade(", "SpecCascade("), ("minp-sampling(", "min-p("), ("eta-sampling(", "eta("),
          ("minp-cap(", "min-p cap("), ("p_base=", ""), ("epsilon=", ""), ("lam=", "lam "), ("cos-we(budget ", "("))


def _short(label: str) -> str:
    for old, new in _SHORT:
        label = label.replace(old, new)
    return label


def _name(obj: dict, run: bool = True) -> str:
    """A comparison's short name in FINDINGS.md: 'AI(lam 0.2 res) - lossless [table1_power]' (``run``: with the
    run), 'SpecCascade(0.3) - min-p(0.3) in table7_tree minus in be_claims' (a gap in one run minus the same in
    another),
    'tv=0.1' (a budget against the fixed frontier)."""
    if obj["b"].startswith(("upper envelope of:", "interpolation of:")):
        name = obj["a"].removeprefix("cos-we(budget ").removesuffix(")")
    elif obj["run_b"] and obj["a"] == obj["b"]:
        name = f"{_short(obj['a'])} in {obj['run']} minus in {obj['run_b']}"
    else:
        name = f"{_short(obj['a'])} - {_short(obj['b'])}" + (f" [{obj['run']}]" if run else "")
    if obj["subset"]:
        name += f" [{obj['subset']}]"
    return name


def _families(objs: Sequence[dict]) -> dict[str, dict[tuple, list[dict]]]:
    """{claim: {(task, metric, subset): members}} in file order."""
    out: dict[str, dict[tuple, list[dict]]] = {}
    for o in objs:
        out.setdefault(o["claim"], {}).setdefault((o["task"], o["metric"], o["subset"]), []).append(o)
    return out


def summaries(objs: Sequence[dict]) -> dict[str, str]:
    """Per claim, its verdict cell in FINDINGS.md: per task, metric and problem set, the family's verdicts
    (:func:`verispec.studies.verdict.summarize`, every verdict on the family-adjusted interval)."""
    out = {}
    for claim, fams in _families(objs).items():
        parts = []
        for (task, metric, subset), members in fams.items():
            decided = max((o["family_size"] or 0) for o in members)
            size = f"family of {decided}" if decided else "no family"
            several = len({o["run"] for o in members}) > 1
            names = [_name(o, several).replace(f" [{subset}]", "") for o in members]
            against = None
            common = {o["b"] for o in members}
            if len(common) == 1 and all(o["run_b"] is None for o in members):
                against = f"vs {_short(common.pop())}"  # every member against one setting: say it once
                names = [n.replace(f" - {_short(o['b'])}", "", 1) for n, o in zip(names, members, strict=True)]
            text = summarize([o["verdict"] for o in members], names)
            where = ", ".join(x for x in (_TASK_NAMES.get(task, task), metric, subset, against) if x)
            parts.append(f"**{where}** ({size}): {text}")
        out[claim] = "<br>".join(parts)
    return out


def _num(x: float | None, metric: str) -> str:
    if x is None:
        return "–"
    return f"{x:+.1f}" if metric == "pass@1" else f"{x:+.3f}"


def _interval(ci: list | None, metric: str) -> str:
    return "–" if not ci else f"[{_num(ci[0], metric)}, {_num(ci[1], metric)}]"


def findings_markdown(objs: Sequence[dict]) -> str:
    """The table of every comparison, grouped by claim, task and metric (FINDINGS.md's generated section)."""
    rows = []
    for claim, fams in _families(objs).items():
        for (task, metric, _), members in fams.items():
            for o in members:
                kind = o["kind"] + (f" (m = {o['margin']:g} pp)" if o["margin"] is not None else "")
                est = "–" if o["estimate"] is None else f"{_num(o['estimate'], metric)} {_interval(o['ci'], metric)}"
                name = _name(o)
                if o["b"].startswith(("upper envelope of:", "interpolation of:")):  # findings.json lists the labels
                    name = f"{o['a']} - the fixed frontier's {o['b'].split(' of:')[0]} [{o['run']} vs {o['run_b']}]"
                rows.append([claim, _TASK_NAMES.get(task, task), metric, name, str(o["n_pairs"]), est,
                             _interval(o["ci_adjusted"], metric) + (f" (of {o['family_size']})"
                                                                   if o["family_size"] else ""),
                             "–" if o["paper"] is None else f"{o['paper']:+g}", kind, o["verdict"]])
    return md_table(["claim", "task", "metric", "comparison", "pairs", "estimate [95% CI]",
                     "family-adjusted CI (family size)", "paper", "kind", "verdict"], rows)


BEGIN, END = "<!-- findings.json: begin (generated) -->", "<!-- findings.json: end -->"
_CELL = re.compile(r"(?<!\\)\|")


def update_findings_md(text: str, objs: Sequence[dict]) -> str:
    """FINDINGS.md with its verdict cells and its table of comparisons regenerated from ``objs``: in every table
    row whose first cell starts with a claim's bold key, the second cell becomes the claim's summary; the text
    between :data:`BEGIN` and :data:`END` becomes :func:`findings_markdown`. ValueError when a claim of ``objs`` has
    no row or the markers are missing."""
    summ = summaries(objs)
    seen = set()
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if not line.startswith("| **"):
            continue
        cells = _CELL.split(line)
        m = re.match(r"\s*\*\*(.+?)\*\*", cells[1])
        if m and m.group(1) in summ:
            cells[2] = f" {summ[m.group(1)]} "
            lines[i] = "|".join(cells)
            seen.add(m.group(1))
    missing = [c for c in summ if c not in seen]
    if missing:
        raise ValueError(f"no row in FINDINGS.md for: {'; '.join(missing)}")
    out = "\n".join(lines)
    if BEGIN not in out or END not in out:
        raise ValueError("FINDINGS.md lacks the generated section's markers")
    head, rest = out.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{findings_markdown(objs)}\n{END}{tail}"


def write_findings(results_dir: str | Path, out: str | Path | None = None, findings_md: str | Path | None = None,
                   n_boot: int = N_BOOT, seed: int = BOOT_SEED, check: bool = False) -> tuple[list[dict], list[Path]]:
    """Compute every comparison from the runs under ``results_dir`` and write findings.json (default
    ``results_dir/findings.json``) and FINDINGS.md's generated parts (default ``results_dir/FINDINGS.md``).
    ``check``: write nothing, return the files that would change."""
    root = Path(results_dir)
    objs = compute(root, n_boot=n_boot, seed=seed)
    json_path = Path(out) if out is not None else root / "findings.json"
    md_path = Path(findings_md) if findings_md is not None else root / "FINDINGS.md"
    new = {json_path: json.dumps(objs, indent=1, ensure_ascii=False) + "\n"}
    if md_path.exists():
        new[md_path] = update_findings_md(md_path.read_text(), objs)
    changed = [p for p, t in new.items() if not p.exists() or p.read_text() != t]
    if not check:
        for p in changed:
            p.write_text(new[p])
    return objs, changed
