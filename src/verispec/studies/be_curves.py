"""BE vs parameter for every rule (Figure 5, the BE parts of Tables 1, 4, 6 and 7) from a :class:`DistLog`.

The offline estimator (:mod:`verispec.eval.estimator`) gives, for any rule, the expected acceptance alpha_t at
every logged position (:func:`~verispec.eval.estimator.position_stats`) and the expected accepted drafts and
rounds along each trajectory (:func:`~verispec.eval.estimator.be_trajectory`). :func:`be_curves` evaluates a
grid of (rule, parameter) settings on a log with exactly those functions and aggregates them the way
:func:`~verispec.eval.estimator.estimate` does (BE_traj = sum of expected accepted / sum of expected rounds over
the trajectories; alpha, KL, TV = means over positions), per task (the key's prefix before the first "|", e.g.
``humaneval|HumanEval/0|lossless|s0`` -> humaneval, as in :mod:`verispec.studies.figure4_real`) and pooled.

What the numbers are: expected BE (emitted accepted drafts per target call, gamma drafts per round) of each
rule along the LOGGED trajectories. With a log of lossless outputs these are the target's own samples, so the
numbers are exact for lossless SD and for the truncation baselines' acceptance on those prefixes, but a lossy
rule's own outputs drift away from them (docs/results/figure4_real/README.md measured such a trajectory effect
for min-p); the numbers hold the prefixes fixed and isolate the per-position effect of the rule.

Uncertainty: a trajectory-clustered bootstrap (trajectories resampled with replacement within the task group,
``n_boot`` resamples, numpy ``default_rng(seed)``, percentile interval). The same resampled weights serve every
setting, so paired differences (a setting minus its reference, a parameter value minus the previous one,
averages over a grid) are bootstrapped jointly. The spread is over trajectories only: the estimator's numbers
are expectations, there is no sampling noise within a trajectory.

References of a setting (``ref``): a lossy rule's matched baseline (:func:`verispec.core.rules.matched_baseline`,
``draft_truncation="none"`` as in the sweeps: spec-cascade -> minp-sampling with the same p_base, typical ->
eta-sampling with the same epsilon, every collaborative rule -> lossless); a truncation baseline's reference is
plain lossless SD (the dashed line of Figure 5). ``d_lossless`` is every setting minus lossless.

The grid (:func:`paper_grid`): the paper's parameter grids (:data:`verispec.eval.grid.PRESETS`; Table 4's CoS
t is lam = 1 - t, ``x`` reports t) plus the ``realization="residual"`` variants of the four rules whose paper
reference is not a distribution (docs/paper_notes.md section 1); ``fine=True`` refines the axes (p_base step
0.05, epsilon step 0.025, lam / l step 0.1), keeping every paper value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from verispec.core import rules as _rules
from verispec.core.rules import Rule, matched_baseline
from verispec.defaults import N_BOOT
from verispec.eval.estimator import DistLog, be_iid, be_trajectory, position_stats
from verispec.eval.grid import PAPER_PARAM_MAPS, PRESETS, setting
from verispec.eval.report import md_table
from verispec.eval.stats import cluster_weights, format_ci, percentile_interval

__all__ = [
    "BECurves",
    "Contrast",
    "Curve",
    "FAMILIES",
    "be_curves",
    "paper_contrasts",
    "paper_grid",
    "shapes",
    "task_of",
    "write_be_curves",
]

BOOT_SEED = 0

#: panels of the figure, in order: family -> rules (truncation baselines next to their lossy rule)
FAMILIES: dict[str, tuple[str, ...]] = {
    "min-p (Fig. 5 top)": ("minp-sampling", "spec-cascade"),
    "eta (Fig. 5 bottom)": ("eta-sampling", "typical"),
    "lenience / ceiling (Tables 4, 6)": ("lenience", "ceiling", "minp-cap"),
    "Table 1 ablations": ("adaptive-interpolation", "overshoot-ceiling"),
    "CoS (Table 4)": ("cos-we", "cos-cd"),
}
#: rules whose paper reference P is not a distribution: the grid also runs them with realization="residual"
UNNORMALIZED = ("adaptive-interpolation", "overshoot-ceiling", "ceiling", "minp-cap")
#: the paper's printed parameter as a function of verispec's (PAPER_PARAM_MAPS: Table 4's CoS t = 1 - lam)
_PAPER_X: dict[str, tuple[str, Callable[[float], float]]] = {"cos-we": ("t", lambda v: round(1 - v, 10))}
assert set(_PAPER_X) == set(PAPER_PARAM_MAPS)  # a new mapping needs its function here
_FINE = {"p_base": [round(0.05 * i, 10) for i in range(1, 20)],
         "epsilon": [round(0.025 * i, 10) for i in range(1, 13)],
         "lam": [round(0.1 * i, 10) for i in range(1, 10)],
         "l": [round(0.1 * i, 10) for i in range(1, 10)]}


def task_of(key: str) -> str:
    """The task of a trajectory key (the part before the first "|")."""
    return key.split("|", 1)[0]


def _family(rule: str) -> str:
    for fam, members in FAMILIES.items():
        if rule in members:
            return fam
    return "other"


@dataclass(frozen=True)
class Curve:
    """One line of the figure: ``rule`` with ``param`` swept over ``values`` and the ``fixed`` parameters."""

    rule: str
    param: str
    values: tuple[float, ...]
    fixed: tuple[tuple[str, object], ...] = ()

    @property
    def name(self) -> str:
        return self.rule + (f"({', '.join(f'{k}={v}' for k, v in self.fixed)})" if self.fixed else "")

    @property
    def family(self) -> str:
        return _family(self.rule)

    @property
    def x_name(self) -> str:
        return _PAPER_X[self.rule][0] if self.rule in _PAPER_X else self.param

    def x(self, value: float) -> float:
        """The paper's printed parameter for ``value`` (t = 1 - lam for cos-we, else the value itself)."""
        return _PAPER_X[self.rule][1](value) if self.rule in _PAPER_X else value

    def rule_at(self, value: float) -> Rule:
        return _rules.get(self.rule, **dict(self.fixed), **{self.param: value})


def paper_grid(fine: bool = False, residual: bool = True, draft_same: bool = True) -> list[Curve]:
    """The paper's grids (PRESETS, every rule but lossless), plus the residual realization of the
    :data:`UNNORMALIZED` rules when ``residual``, and the truncation baselines with ``draft_truncation="same"``
    (q truncated too, as a warper on both models does; docs/paper_notes.md section 3) when ``draft_same``;
    ``fine`` replaces each swept axis by a finer one that contains the paper's values."""
    out = []
    for rule, params in PRESETS.items():
        if not params:
            continue
        swept = [k for k, v in params.items() if len(v) > 1] or list(params)[:1]
        (param,) = swept
        fixed = tuple((k, v[0]) for k, v in params.items() if k != param)
        values = params[param]
        if fine:
            assert set(values) <= set(_FINE[param]), (rule, param)
            values = _FINE[param]
        values = tuple(sorted(values))
        out.append(Curve(rule, param, values, fixed))
        if residual and rule in UNNORMALIZED:
            out.append(Curve(rule, param, values, fixed + (("realization", "residual"),)))
        if draft_same and "draft_truncation" in _rules.REGISTRY[rule].param_names:
            out.append(Curve(rule, param, values, fixed + (("draft_truncation", "same"),)))
    order = [r for members in FAMILIES.values() for r in members]
    return sorted(out, key=lambda c: (order.index(c.rule) if c.rule in order else len(order), c.name))


def _variant(curve: Curve) -> bool:
    """A non-default realization of a rule (residual realization, baseline truncating q too)."""
    fixed = dict(curve.fixed)
    return fixed.get("realization") == "residual" or fixed.get("draft_truncation") == "same"


def _label(rule: Rule) -> str:
    return setting(rule).label


def _reference(rule: Rule) -> Rule | None:
    """A lossy rule's matched baseline; plain lossless for a truncation baseline; None for lossless."""
    if not rule.lossless:
        return matched_baseline(rule, draft_truncation="none")
    if rule.name == "lossless":
        return None
    return _rules.get("lossless")


@dataclass
class _Stats:
    """Per-trajectory sums of one setting (arrays over the log's trajectories)."""

    acc: np.ndarray
    rounds: np.ndarray
    alpha: np.ndarray
    positions: np.ndarray
    kl: np.ndarray
    kl_finite: np.ndarray
    tv: np.ndarray


def _stats(log: DistLog, rule: Rule, gamma: int) -> _Stats:
    cols: dict[str, list[float]] = {k: [] for k in ("acc", "rounds", "alpha", "positions", "kl", "kl_finite", "tv")}
    for traj in log.trajectories:
        s = position_stats(traj, rule)
        a, n = be_trajectory(s["alpha"], gamma)
        fin = torch.isfinite(s["kl"])
        for k, v in (("acc", a), ("rounds", n), ("alpha", float(s["alpha"].sum())),
                     ("positions", s["alpha"].numel()), ("kl", float(s["kl"][fin].sum())),
                     ("kl_finite", int(fin.sum())), ("tv", float(s["tv"].sum()))):
            cols[k].append(v)
    return _Stats(**{k: np.asarray(v, dtype=float) for k, v in cols.items()})


@dataclass(frozen=True)
class Contrast:
    """A named statistic: mean BE of ``plus`` minus mean BE of ``minus`` (labels), or with ``relative`` the
    ratio of the two means minus 1 (a fraction). ``paper``: the paper's value as text, for the tables."""

    name: str
    plus: tuple[str, ...]
    minus: tuple[str, ...] = ()
    relative: bool = False
    paper: str = ""


@dataclass
class BECurves:
    """What :func:`be_curves` returns: ``table`` (one row per setting and task group, see :func:`be_curves`)
    and the bootstrap state, so that any :class:`Contrast` can be evaluated with a joint interval."""

    table: pd.DataFrame
    curves: list[Curve]
    gamma: int
    n_boot: int
    seed: int
    level: float
    tasks: list[str]
    log_info: dict = field(default_factory=dict)
    _col: dict[str, int] = field(default_factory=dict, repr=False)
    _be: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict, repr=False)

    def _interval(self, boot: np.ndarray) -> tuple[float, float]:
        return percentile_interval(boot, self.level, finite_only=True)

    def contrast(self, c: Contrast, task: str = "all") -> tuple[float, float, float]:
        """(point, lo, hi) of the contrast on a task group ("all" or a task)."""
        point, boot = self._be[task]
        with np.errstate(invalid="ignore", divide="ignore"):
            def stat(m: np.ndarray) -> np.ndarray:
                a = m[..., [self._col[x] for x in c.plus]].mean(-1)
                if not c.minus:
                    return a
                b = m[..., [self._col[x] for x in c.minus]].mean(-1)
                return a / b - 1 if c.relative else a - b
            return (float(stat(point)), *self._interval(stat(boot)))

    def has(self, labels: Iterable[str]) -> bool:
        return all(x in self._col for x in labels)


def be_curves(log: DistLog, grid: Sequence[Curve] | None = None, gamma: int = 5, *, fine: bool = False,
              n_boot: int = N_BOOT, seed: int = BOOT_SEED, level: float = 0.95) -> BECurves:
    """Expected BE and acceptance of every setting of ``grid`` (default :func:`paper_grid` (``fine``)) along the
    log's trajectories, per task and pooled (task "all"), with bootstrap intervals.

    ``table`` columns: family, curve, rule, param, value, x_name, x (the paper's parameter), label, task,
    be (BE_traj) with be_lo / be_hi, be_iid, alpha (mean expected acceptance), kl (mean over positions with
    a finite KL, as :func:`~verispec.eval.estimator.estimate`), kl_inf_positions, tv (to the matched baseline),
    ref (the reference label, see the module docstring) with d_ref / d_ref_lo / d_ref_hi, d_lossless with
    lo / hi, d_prev with lo / hi (this value minus the previous x of the same curve; blank on the first),
    positions, trajectories. Rows: lossless (curve "lossless") first, then the grid in order, then the references
    the grid lacks (curve "reference"), for every task group.
    """
    grid = list(paper_grid(fine) if grid is None else grid)
    if not log.trajectories:
        raise ValueError("the log has no trajectories")
    # settings: (label, rule, curve, value); references added where the grid lacks them
    entries: list[tuple[str, Rule, Curve | None, float | None]] = []
    seen: set[str] = set()

    def add(rule: Rule, curve: Curve | None, value: float | None) -> str:
        lab = _label(rule)
        if lab not in seen:
            seen.add(lab)
            entries.append((lab, rule, curve, value))
        return lab

    add(_rules.get("lossless"), None, None)
    for curve in grid:
        for v in sorted(curve.values, key=curve.x):  # in the paper's parameter: d_prev steps along x
            add(curve.rule_at(v), curve, v)
    refs: dict[str, str | None] = {}
    for lab, r, _, _ in list(entries):  # references the grid lacks are appended (curve "reference")
        ref = _reference(r)
        refs[lab] = None if ref is None else add(ref, None, None)
    for lab, r, _, _ in entries[len(refs):]:
        ref = _reference(r)
        refs[lab] = None if ref is None else _label(ref)

    stats = {lab: _stats(log, r, gamma) for lab, r, _, _ in entries}
    col = {lab: i for i, (lab, _, _, _) in enumerate(entries)}
    keys = [t.key for t in log.trajectories]
    tasks = list(dict.fromkeys(task_of(k) for k in keys))
    groups = {"all": np.arange(len(keys))}
    if len(tasks) > 1:
        groups.update({t: np.array([i for i, k in enumerate(keys) if task_of(k) == t]) for t in tasks})
    acc = np.stack([stats[lab].acc for lab in col], 1)  # [n_traj, S]
    rounds = np.stack([stats[lab].rounds for lab in col], 1)
    res = BECurves(pd.DataFrame(), grid, gamma, n_boot, seed, level, tasks, _col=col)
    lossless_label = _label(_rules.get("lossless"))

    rows = []
    for task, idx in groups.items():
        w = cluster_weights(len(idx), n_boot, seed)
        w = w.astype(float)
        with np.errstate(invalid="ignore", divide="ignore"):
            point = acc[idx].sum(0) / rounds[idx].sum(0)
            boot = (w @ acc[idx]) / (w @ rounds[idx])  # [B, S]
        res._be[task] = (point, boot)

        def diff(a: str, b: str | None, point=point, boot=boot) -> tuple[float, float, float]:
            if b is None:
                return math.nan, math.nan, math.nan
            i, j = col[a], col[b]
            return (float(point[i] - point[j]), *res._interval(boot[:, i] - boot[:, j]))

        prev: dict[Curve, str] = {}
        for lab, r, curve, value in entries:
            s = stats[lab]
            i = col[lab]
            alpha = s.alpha[idx].sum() / s.positions[idx].sum()
            nfin = s.kl_finite[idx].sum()
            be_lo, be_hi = res._interval(boot[:, i])
            ref = refs[lab]
            d_prev_ref = None
            if curve is not None:
                d_prev_ref = prev.get(curve)
                prev[curve] = lab
            d_ref, d_ref_lo, d_ref_hi = diff(lab, ref)
            d_l, d_l_lo, d_l_hi = diff(lab, lossless_label if lab != lossless_label else None)
            d_p, d_p_lo, d_p_hi = diff(lab, d_prev_ref)
            rows.append({
                "family": curve.family if curve else _family(r.name),
                "curve": curve.name if curve else ("lossless" if r.name == "lossless" else "reference"),
                "rule": r.name, "param": curve.param if curve else "", "value": value,
                "x_name": curve.x_name if curve else "", "x": curve.x(value) if curve else math.nan,
                "label": lab, "task": task,
                "be": float(point[i]), "be_lo": be_lo, "be_hi": be_hi, "be_iid": be_iid(float(alpha), gamma),
                "alpha": float(alpha), "kl": float(s.kl[idx].sum() / nfin) if nfin else math.inf,
                "kl_inf_positions": int(s.positions[idx].sum() - nfin), "tv": float(s.tv[idx].sum()
                                                                                    / s.positions[idx].sum()),
                "ref": ref or "", "d_ref": d_ref, "d_ref_lo": d_ref_lo, "d_ref_hi": d_ref_hi,
                "d_lossless": d_l, "d_lossless_lo": d_l_lo, "d_lossless_hi": d_l_hi,
                "d_prev": d_p, "d_prev_lo": d_p_lo, "d_prev_hi": d_p_hi,
                "positions": int(s.positions[idx].sum()), "trajectories": len(idx),
            })
    res.table = pd.DataFrame(rows)
    res.log_info = {"trajectories": len(keys), "positions": int(sum(t.length for t in log.trajectories)),
                    "per_task": {t: (len(g), int(sum(log.trajectories[i].length for i in g)))
                                 for t, g in groups.items() if t != "all"},
                    "top_k": log.top_k, "sampling": dict(log.sampling)}
    return res


# --------------------------------------------------------------------------------------- paper's claims

# The paper's BE numbers (arXiv 2607.26627): Table 7 single-draft Delta BE (lossy - matched baseline, average of
# MATH, MBPP+, INCLUDE, BFCL over each grid), Table 6 (MBPP+, averages over l = 0.2..0.8, lossless 5.42),
# Table 1 (MBPP+, lam = 0.2..0.8; relative to Table 6's lossless 5.42), Table 4 MBPP+ (relative to its SD baseline
# 5.47; "Cascade" = SpecCascade, "Medusa" = typical acceptance, CoS t = 1 - lam of cos-we).
_T6_LOSSLESS = 5.42
_T4_BASE = 5.47


def _pct(be: float, base: float) -> str:
    return f"{100 * (be / base - 1):+.1f}% ({be:.2f})"


def paper_contrasts() -> list[Contrast]:
    """The paper's BE claims as contrasts on the paper grid (labels as :func:`be_curves` writes them)."""
    def lab(rule: str, **kw: object) -> str:
        return _label(_rules.get(rule, **kw))

    pb, eps, lam = PRESETS["spec-cascade"]["p_base"], PRESETS["typical"]["epsilon"], PRESETS["lenience"]["l"]
    lossless = (lab("lossless"),)
    out = [
        Contrast("Table 7: SpecCascade - min-p sampling, mean over p_base 0.1..0.9", tuple(
            lab("spec-cascade", p_base=p) for p in pb), tuple(lab("minp-sampling", p_base=p) for p in pb),
            paper="+0.09 (MATH +0.22, MBPP+ +0.00, INCLUDE +0.14, BFCL +0.01)"),
        Contrast("Table 7: typical - eta sampling, mean over epsilon 0.05..0.25", tuple(
            lab("typical", epsilon=e) for e in eps), tuple(lab("eta-sampling", epsilon=e) for e in eps),
            paper="+0.21 (MATH +0.41, MBPP+ +0.12, INCLUDE +0.22, BFCL +0.09)"),
        Contrast("Table 7 (relative): SpecCascade / min-p sampling - 1", tuple(
            lab("spec-cascade", p_base=p) for p in pb), tuple(lab("minp-sampling", p_base=p) for p in pb), True,
            paper="+1.4% (+0.09 on Table 2's mean min-p BE 6.46)"),
        Contrast("Table 7 (relative): typical / eta sampling - 1", tuple(
            lab("typical", epsilon=e) for e in eps), tuple(lab("eta-sampling", epsilon=e) for e in eps), True,
            paper="+3.3% (+0.21 on Table 2's mean eta BE 6.41)"),
        Contrast("Table 6: lossless BE", lossless, paper=f"{_T6_LOSSLESS:.2f}"),
        Contrast("Table 6: SpecCascade(p_base 0.5) vs lossless", (lab("spec-cascade", p_base=0.5),), lossless,
                 True, paper=_pct(5.51, _T6_LOSSLESS)),
        Contrast("Table 6: lenience, mean over l 0.2..0.8, vs lossless",
                 tuple(lab("lenience", l=x) for x in lam), lossless, True, paper=_pct(5.53, _T6_LOSSLESS)),
    ]
    for real in ("normalized", "residual"):
        out += [
            Contrast(f"Table 6: ceiling ({real}), mean over l, vs lossless",
                     tuple(lab("ceiling", l=x, realization=real) for x in lam), lossless, True,
                     paper=_pct(5.58, _T6_LOSSLESS)),
            Contrast(f"Table 6: min-p cap (p_base 0.5, {real}), mean over l, vs lossless",
                     tuple(lab("minp-cap", p_base=0.5, l=x, realization=real) for x in lam), lossless, True,
                     paper=_pct(5.62, _T6_LOSSLESS)),
        ]
    ceil = {real: tuple(lab("ceiling", l=x, realization=real) for x in lam) for real in ("normalized", "residual")}
    cap = {real: tuple(lab("minp-cap", p_base=0.5, l=x, realization=real) for x in lam)
           for real in ("normalized", "residual")}
    len_ = tuple(lab("lenience", l=x) for x in lam)
    for real in ("normalized", "residual"):
        out += [Contrast(f"Table 6: ceiling ({real}) - lenience, mean over l", ceil[real], len_,
                         paper="+0.05 (5.58 - 5.53)"),
                Contrast(f"Table 6: min-p cap ({real}) - ceiling ({real}), mean over l", cap[real], ceil[real],
                         paper="+0.04 (5.62 - 5.58)")]
    for rule, paper in (("adaptive-interpolation", (9.15, 7.93, 6.80, 5.95)),
                        ("overshoot-ceiling", (5.59, 5.57, 5.54, 5.54))):
        for real in ("normalized", "residual"):
            for x, be in zip(PRESETS[rule]["lam"], paper, strict=True):
                out.append(Contrast(f"Table 1: {rule} ({real}) lam {x} vs lossless",
                                    (lab(rule, lam=x, realization=real),), lossless, True,
                                    paper=_pct(be, _T6_LOSSLESS)))
    table4 = {"minp-sampling": (5.42, 5.56, 5.45, 5.59, 5.62), "spec-cascade": (5.64, 5.59, 5.51, 5.48, 5.41),
              "eta-sampling": (5.42, 5.49, 5.44, 5.57, 5.57), "typical": (5.64, 5.64, 5.66, 5.63, 5.55)}
    for rule, paper in table4.items():
        (param, values), = PRESETS[rule].items()
        for x, be in zip(values, paper, strict=True):
            out.append(Contrast(f"Table 4: {rule} {param} {x} vs lossless", (lab(rule, **{param: x}),), lossless,
                                True, paper=_pct(be, _T4_BASE)))
    for x, be in zip(PRESETS["lenience"]["l"], (5.65, 5.61, 5.52, 5.52), strict=True):
        out.append(Contrast(f"Table 4: lenience l {x} vs lossless", (lab("lenience", l=x),), lossless, True,
                            paper=_pct(be, _T4_BASE)))
    for t, be in zip((0.2, 0.4, 0.6, 0.8), (6.05, 7.14, 7.86, 9.26), strict=True):
        out.append(Contrast(f"Table 4: CoS t {t} (cos-we lam {round(1 - t, 10)}) vs lossless",
                            (lab("cos-we", lam=round(1 - t, 10)),), lossless, True, paper=_pct(be, _T4_BASE)))
    return out


def shapes(res: BECurves) -> pd.DataFrame:
    """Per curve and task: the x of the largest BE, BE(peak) - BE(first x) and BE(peak) - BE(last x) with
    intervals, and how many adjacent steps go up / down with an interval excluding 0."""
    rows = []
    t = res.table
    for curve in res.curves:
        for task in res._be:
            sub = t[(t["curve"] == curve.name) & (t["task"] == task)].sort_values("x")
            if sub.empty:
                continue
            peak = sub.loc[sub["be"].idxmax()]
            first, last = sub.iloc[0], sub.iloc[-1]
            up = int((sub["d_prev_lo"] > 0).sum())
            down = int((sub["d_prev_hi"] < 0).sum())
            row = {"family": curve.family, "curve": curve.name, "task": task, "x_name": curve.x_name,
                   "x_peak": peak["x"], "be_peak": peak["be"], "x_first": first["x"], "x_last": last["x"],
                   "steps": len(sub) - 1, "steps_up": up, "steps_down": down}
            for end, r in (("first", first), ("last", last)):
                p, lo, hi = res.contrast(Contrast("", (peak["label"],), (r["label"],)), task)
                row.update({f"peak_minus_{end}": p, f"peak_minus_{end}_lo": lo, f"peak_minus_{end}_hi": hi})
            rows.append(row)
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------------ writing


def _ci(p: float, lo: float, hi: float, fmt: str = "{:+.4f}") -> str:
    return format_ci(p, lo, hi, fmt)


def _small(x: float) -> str:
    """A KL / TV for display: 0 below 1e-12 in size (float rounding of an exact 0)."""
    return "0" if abs(x) < 1e-12 else f"{x:.2e}"


def _markdown(res: BECurves, shape: pd.DataFrame) -> str:
    t = res.table
    info = res.log_info
    groups = list(res._be)
    pct = f"{100 * res.level:g}%"
    per_task = ", ".join(f"{k} {n} trajectories / {p} positions" for k, (n, p) in info["per_task"].items())
    lines = [
        "# Expected BE vs parameter (offline estimator)", "",
        f"Expected block efficiency BE_traj (emitted accepted drafts per target call, gamma = {res.gamma}) of every "
        f"setting along the log's {info['trajectories']} trajectories ({info['positions']} positions"
        f"{'; ' + per_task if per_task else ''}), top_k {info['top_k']}, temperature "
        f"{info['sampling'].get('temperature')}. Intervals: {pct} trajectory-clustered bootstrap "
        f"({res.n_boot} resamples, seed {res.seed}, percentile), joint over settings. d_ref: the setting minus its "
        "reference (lossy rule: matched baseline; truncation baseline: lossless); d_prev: minus the previous "
        "parameter value of the same curve (in the paper's parameter x). See the module docstring of "
        "verispec.studies.be_curves for what these numbers do and do not answer.", "",
        "## The paper's BE claims", "",
        "Relative claims (%) are ratios of mean BE minus 1. Paper: its own models and BE definition; compare "
        "signs and relative sizes.", "",
    ]
    rows = []
    for c in paper_contrasts():
        if not res.has(c.plus + c.minus):
            continue
        fmt = "{:+.2%}" if c.relative else ("{:.3f}" if not c.minus else "{:+.4f}")
        rows.append([c.name] + [_ci(*res.contrast(c, g), fmt=fmt) for g in groups] + [c.paper])
    lines += [md_table(["claim"] + [f"ours: {g}" for g in groups] + ["paper"], rows), ""]
    lines += ["## Shapes", "",
              f"Per curve: the x with the largest BE; BE(peak) - BE(first x) and BE(peak) - BE(last x); adjacent "
              f"steps whose {pct} interval lies above 0 (up) or below 0 (down).", ""]
    rows = []
    for _, s in shape.iterrows():
        rows.append([s["curve"], s["task"], f"{s['x_name']} {s['x_peak']:g}", f"{s['be_peak']:.3f}",
                     _ci(s["peak_minus_first"], s["peak_minus_first_lo"], s["peak_minus_first_hi"]),
                     _ci(s["peak_minus_last"], s["peak_minus_last_lo"], s["peak_minus_last_hi"]),
                     f"{s['steps_up']} / {s['steps_down']} of {s['steps']}"])
    lines += [md_table(["curve", "task", "peak at", "BE peak", "peak - first", "peak - last", "steps up / down"],
                       rows), ""]
    base = t[t["curve"] == "lossless"].set_index("task")
    lines += ["## Lossless SD", "",
              *[f"- {g}: BE {_ci(base.loc[g, 'be'], base.loc[g, 'be_lo'], base.loc[g, 'be_hi'], '{:.3f}')}, "
                f"alpha {base.loc[g, 'alpha']:.4f}" for g in groups], ""]
    for fam in FAMILIES:
        sub = t[t["family"] == fam]
        sub = sub[sub["curve"].isin([c.name for c in res.curves])]
        if sub.empty:
            continue
        lines += [f"## {fam}", ""]
        for g in groups:
            s = sub[sub["task"] == g]
            rows = [[r["curve"], f"{r['x']:g}", _ci(r["be"], r["be_lo"], r["be_hi"], "{:.3f}"),
                     _ci(r["d_ref"], r["d_ref_lo"], r["d_ref_hi"]) + (f" vs {r['ref']}" if r["ref"] else ""),
                     _ci(r["d_prev"], r["d_prev_lo"], r["d_prev_hi"]), f"{r['alpha']:.4f}", _small(r["kl"]),
                     _small(r["tv"])] for _, r in s.iterrows()]
            lines += [f"### {g}", ""]
            lines += [md_table(["curve", "x", "BE_traj", "d_ref", "d_prev", "alpha", "KL", "TV"], rows), ""]
    return "\n".join(lines)


def _plot(res: BECurves, path: Path, col: str = "be") -> None:
    """One panel per (task group, family): ``col`` ("be", or "d_lossless": the paired difference to lossless)
    vs the paper's parameter with its interval as a band; lossless SD dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = res.table
    fams = [f for f in FAMILIES if any(c.family == f for c in res.curves)]
    groups = list(res._be)
    fig, axes = plt.subplots(len(groups), len(fams), figsize=(4.4 * len(fams), 3.3 * len(groups)), squeeze=False)
    for gi, g in enumerate(groups):
        tg = t[t["task"] == g]
        base = tg[tg["curve"] == "lossless"].iloc[0]
        for fi, fam in enumerate(fams):
            ax = axes[gi][fi]
            curves = [c for c in res.curves if c.family == fam]
            for c in curves:
                s = tg[tg["curve"] == c.name].sort_values("x")
                color = plt.cm.tab10(FAMILIES[fam].index(c.rule) % 10)
                dashed = _variant(c)
                ax.plot(s["x"], s[col], marker="o", ms=3, lw=1.3, ls="--" if dashed else "-", color=color,
                        label=c.name)
                ax.fill_between(s["x"], s[f"{col}_lo"], s[f"{col}_hi"], color=color, alpha=0.08 if dashed else 0.18)
            if col == "be":
                ax.axhline(base["be"], ls=":", color="black", lw=1, label="lossless SD")
                ax.axhspan(base["be_lo"], base["be_hi"], color="gray", alpha=0.12)
            else:
                ax.axhline(0, ls=":", color="black", lw=1, label="lossless SD")
            xs = sorted({c.x_name for c in curves})
            ax.set_xlabel(" / ".join(xs) if fam != "CoS (Table 4)" else "t = 1 - lam (cos-we) / lam (cos-cd)")
            ax.set_title(f"{fam}: {g}", fontsize=9)
            ax.grid(alpha=0.3)
            if gi == 0:
                ax.legend(fontsize=6, loc="best")
            if fi == 0:
                ax.set_ylabel(f"expected BE_traj (gamma {res.gamma})" if col == "be" else "BE_traj - lossless")
    what = "Expected BE" if col == "be" else "Expected BE minus lossless SD (paired)"
    fig.suptitle(f"{what} vs parameter along the logged trajectories (offline estimator; band: "
                 f"{100 * res.level:g}% trajectory bootstrap)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_be_curves(log: DistLog | str | Path, out_dir: str | Path, *, gamma: int = 5, fine: bool = False,
                    n_boot: int = N_BOOT, seed: int = BOOT_SEED) -> dict[str, Path]:
    """Run :func:`be_curves` and write ``be_curves.csv`` (the table), ``be_shapes.csv`` (:func:`shapes`),
    ``be_claims.csv`` (:func:`paper_contrasts`), ``be_curves.md`` (all of them as tables), ``be_curves.png``
    (BE vs parameter) and ``be_deltas.png`` (BE minus lossless, paired intervals) into ``out_dir``."""
    if not isinstance(log, DistLog):
        log = DistLog.load(log)
    res = be_curves(log, gamma=gamma, fine=fine, n_boot=n_boot, seed=seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shape = shapes(res)
    claims = []
    for c in paper_contrasts():
        if res.has(c.plus + c.minus):
            for g in res._be:
                p, lo, hi = res.contrast(c, g)
                claims.append({"claim": c.name, "task": g, "relative": c.relative, "ours": p, "lo": lo, "hi": hi,
                               "paper": c.paper})
    files = {"csv": out / "be_curves.csv", "shapes": out / "be_shapes.csv", "claims": out / "be_claims.csv",
             "md": out / "be_curves.md", "png": out / "be_curves.png", "deltas_png": out / "be_deltas.png"}
    res.table.to_csv(files["csv"], index=False, float_format="%.6g")
    shape.to_csv(files["shapes"], index=False, float_format="%.6g")
    pd.DataFrame(claims).to_csv(files["claims"], index=False, float_format="%.6g")
    files["md"].write_text(_markdown(res, shape) + "\n")
    _plot(res, files["png"])
    _plot(res, files["deltas_png"], "d_lossless")
    return files
