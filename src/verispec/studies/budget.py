"""Budget against fixed parameter at matched block efficiency: does a divergence budget lose less accuracy than a
fixed relaxation that accepts as much?

Inputs: a run of budgeted settings (``configs/budget.toml``) and a run of fixed-parameter settings of the same
family with the lossless baseline (``configs/table1_power.toml``), made with the same models, numerics and seeds
under common random numbers, so units pair by (task, problem, seed) across the two directories. Only the
(task, problem, seed) keys every compared setting completed are used.

Per setting: BE = emitted accepted drafts / rounds (ratio of sums over the units: the paper's block efficiency,
bonus excluded) and pass@1 (% of units passed), with 95% cluster-bootstrap intervals (problems resampled, all
seeds of a problem together, :data:`verispec.eval.stats.N_BOOT` resamples, seed
:data:`verispec.eval.stats.BOOT_SEED`).

Matched comparison, per budgeted setting b: the fixed settings sorted by BE form a frontier; with f1, f2 the
adjacent fixed settings whose BEs bracket BE_b and w = (BE_b - BE_f1) / (BE_f2 - BE_f1), the fixed frontier's
accuracy at b's block efficiency is (1 - w) acc_f1 + w acc_f2 (linear interpolation), and the statistic is
acc_b minus it, in percentage points. Each bootstrap resample recomputes every BE, the bracket and w, so the
interval carries the uncertainty of the matching too. A budget whose BE lies outside the fixed settings' range has
no matched comparison (reported as such); the share of resamples in which it falls outside is reported
(``vs_fixed_unmatched``; the interval is over the others). The baseline may be one of the fixed settings: a family
lossless at theta = 1 (CoS-WE at lam 1) has lossless as its frontier's end point, so a budget between lossless and
the least relaxed fixed setting is matched too. Also the plain gap to lossless (acc_b - acc_lossless, paired).

The fixed frontier is also read as its upper envelope: the least concave majorant of the fixed settings' (BE,
pass@1) points, i.e. the best accuracy that mixing two fixed settings (a random one per request) reaches at each
block efficiency. Interpolating between BE-adjacent fixed settings follows every dip of the fixed points (a setting
below the line through its neighbours); the envelope does not, so acc_b minus the envelope (``vs_envelope``) is the
harder comparison of the two. Both are recomputed in every resample.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from verispec.eval.report import load_frame, md_table
from verispec.eval.stats import BOOT_SEED, N_BOOT, cluster_weights, percentile_interval

__all__ = ["frontier", "frontier_frame", "frontier_resamples", "matched_difference", "plot_frontier",
           "write_frontier"]


def _sums(df: pd.DataFrame, labels: list[str], clusters: list[str]) -> dict[str, np.ndarray]:
    """{accepted, rounds, passed, units}: [C, S] sums per (problem cluster, setting)."""
    ci, si = {c: i for i, c in enumerate(clusters)}, {s: i for i, s in enumerate(labels)}
    out = {}
    for col in ("accepted", "rounds", "passed", "one"):
        m = np.zeros((len(clusters), len(labels)))
        vals = np.ones(len(df)) if col == "one" else df[col].to_numpy(dtype=float)
        np.add.at(m, (df["cluster"].map(ci).to_numpy(), df["label"].map(si).to_numpy()), vals)
        out[col] = m
    return out


def _upper_hull(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The vertices of the least concave majorant of the points (x sorted ascending): at a repeated x the highest
    y, then every point on or below the chord of its neighbours dropped (monotone chain)."""
    hx: list[float] = []
    hy: list[float] = []
    for xi, yi in zip(x.tolist(), y.tolist(), strict=True):
        if hx and xi == hx[-1]:
            if yi <= hy[-1]:
                continue
            hx.pop()
            hy.pop()
        while len(hx) >= 2 and (hy[-1] - hy[-2]) * (xi - hx[-2]) <= (yi - hy[-2]) * (hx[-1] - hx[-2]):
            hx.pop()
            hy.pop()
        hx.append(xi)
        hy.append(yi)
    return np.array(hx), np.array(hy)


def matched_difference(be: np.ndarray, acc: np.ndarray, fixed: Sequence[int], b: int,
                       construction: str = "interpolation") -> np.ndarray:
    """acc_b minus the fixed frontier's accuracy at BE_b, per row of the [R, S] matrices ``be`` and ``acc`` (NaN
    where BE_b lies outside the fixed settings' BE range). ``construction``: "interpolation" (linear between the
    BE-adjacent fixed settings) or "envelope" (linear along the upper envelope, the least concave majorant of the
    fixed points)."""
    if construction not in ("interpolation", "envelope"):
        raise ValueError(f"construction must be 'interpolation' or 'envelope', got {construction!r}")
    fixed = list(fixed)
    if construction == "interpolation":
        return _matched(be, acc, fixed, b)
    out = np.full(be.shape[0], math.nan)
    for r in range(be.shape[0]):
        order = np.argsort(be[r, fixed], kind="stable")
        hx, hy = _upper_hull(be[r, fixed][order], acc[r, fixed][order])
        x = be[r, b]
        if hx[0] <= x <= hx[-1]:
            out[r] = acc[r, b] - float(np.interp(x, hx, hy))
    return out


def _matched(be: np.ndarray, acc: np.ndarray, fixed: list[int], b: int) -> np.ndarray:
    """acc_b minus the fixed frontier's interpolated accuracy at BE_b, per row of [R, S] (NaN outside)."""
    out = np.full(be.shape[0], math.nan)
    fb, fa = be[:, fixed], acc[:, fixed]
    order = np.argsort(fb, axis=1)
    fb, fa = np.take_along_axis(fb, order, 1), np.take_along_axis(fa, order, 1)
    for r in range(be.shape[0]):
        x = be[r, b]
        k = int(np.searchsorted(fb[r], x))
        if k == 0 or k == fb.shape[1]:
            if k < fb.shape[1] and fb[r, k] == x:
                out[r] = acc[r, b] - fa[r, k]
            continue
        x0, x1 = fb[r, k - 1], fb[r, k]
        w = 0.0 if x1 == x0 else (x - x0) / (x1 - x0)
        out[r] = acc[r, b] - ((1 - w) * fa[r, k - 1] + w * fa[r, k])
    return out


def frontier_resamples(df: pd.DataFrame, budget: Sequence[str], fixed: Sequence[str], baseline: str = "lossless",
                       n_boot: int = N_BOOT, seed: int = BOOT_SEED
                       ) -> tuple[list[str], np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """(labels, BE, pass@1 %, cluster sums) of every listed setting on the (task, problem, seed) keys all of them
    completed: BE and pass@1 as [1 + n_boot, S] matrices, row 0 the point estimate and every other row one cluster
    resample (:func:`verispec.eval.stats.cluster_weights`), columns in ``labels`` order (fixed, budget, baseline,
    each once); the sums {accepted, rounds, passed, one} are [C, S]."""
    labels = list(dict.fromkeys([*fixed, *budget, baseline]))  # the baseline may be a fixed setting too
    missing = [lab for lab in labels if lab not in set(df["label"])]
    if missing:
        raise ValueError(f"no results for {', '.join(missing)}")
    if len(set(fixed)) < 2:
        raise ValueError("a frontier needs at least two fixed-parameter settings")
    df = df[df["label"].isin(labels)].copy()
    key = df["task"].astype(str) + "\x00" + df["problem_id"].astype(str) + "\x00" + df["seed"].astype(str)
    complete = key.map(df.groupby(key.to_numpy())["label"].nunique()) == len(labels)
    df = df[complete.to_numpy()]
    if df.empty:
        raise ValueError("no (task, problem, seed) completed every setting")
    df["cluster"] = df["task"].astype(str) + "\x00" + df["problem_id"].astype(str)
    clusters = list(dict.fromkeys(df["cluster"]))
    mats = _sums(df, labels, clusters)
    w = np.vstack([np.ones((1, len(clusters))), cluster_weights(len(clusters), n_boot, seed)])
    s = {k: w @ v for k, v in mats.items()}
    with np.errstate(invalid="ignore", divide="ignore"):
        be = s["accepted"] / s["rounds"]
        acc = 100.0 * s["passed"] / s["one"]
    return labels, be, acc, mats


def frontier_frame(df: pd.DataFrame, budget: Sequence[str], fixed: Sequence[str], baseline: str = "lossless",
                   n_boot: int = N_BOOT, seed: int = BOOT_SEED) -> pd.DataFrame:
    """One row per setting, the baseline and fixed ones first, then the budgeted ones, each group in BE order: BE
    and pass@1 with intervals; for budgeted settings the matched difference to the fixed frontier and the gap to
    the baseline, with intervals. ``df``: result rows (:func:`verispec.eval.report.load_frame`) of every listed
    setting."""
    labels, be, acc, mats = frontier_resamples(df, budget, fixed, baseline, n_boot, seed)
    clusters = range(mats["one"].shape[0])
    fixed_i = [labels.index(lab) for lab in dict.fromkeys(fixed)]
    base_i = labels.index(baseline)
    rows = []
    for j, lab in enumerate(labels):
        kind = "baseline" if j == base_i else "fixed" if j in fixed_i else "budget"
        row = {"setting": lab, "kind": kind, "frontier": j in fixed_i, "be": be[0, j], "acc": acc[0, j],
               "units": int(mats["one"][:, j].sum()), "problems": len(clusters)}
        row["be_lo"], row["be_hi"] = percentile_interval(be[1:, j])
        row["acc_lo"], row["acc_hi"] = percentile_interval(acc[1:, j])
        if kind == "budget":
            d = _matched(be, acc, fixed_i, j)
            row["vs_fixed"] = d[0]
            row["vs_fixed_lo"], row["vs_fixed_hi"] = (percentile_interval(d[1:], finite_only=True)
                                                      if math.isfinite(d[0]) else (math.nan, math.nan))
            row["vs_fixed_unmatched"] = float(np.mean(~np.isfinite(d[1:])))  # resamples outside the fixed range
            e = matched_difference(be, acc, fixed_i, j, "envelope")
            row["vs_envelope"] = e[0]
            row["vs_envelope_lo"], row["vs_envelope_hi"] = (percentile_interval(e[1:], finite_only=True)
                                                            if math.isfinite(e[0]) else (math.nan, math.nan))
            gap = acc[:, j] - acc[:, base_i]
            row["vs_baseline"] = gap[0]
            row["vs_baseline_lo"], row["vs_baseline_hi"] = percentile_interval(gap[1:])
        rows.append(row)
    # read in order: the baseline and fixed settings by BE, then the budgets by BE
    out = pd.DataFrame(rows)
    out["_rank"] = (out["kind"] == "budget").astype(int)
    return out.sort_values(["_rank", "be"], kind="stable").drop(columns="_rank").reset_index(drop=True)


def frontier(budget_run: str | Path, fixed_run: str | Path, fixed: Sequence[str], baseline: str = "lossless",
             n_boot: int = N_BOOT, seed: int = BOOT_SEED) -> pd.DataFrame:
    """:func:`frontier_frame` over every setting of ``budget_run`` against ``fixed`` (labels of ``fixed_run``)
    and its ``baseline``."""
    b, f = load_frame(budget_run), load_frame(fixed_run)
    budget = list(dict.fromkeys(b["label"]))
    both = pd.concat([b, f[f["label"].isin([*fixed, baseline])]], ignore_index=True)
    return frontier_frame(both, budget, list(fixed), baseline, n_boot, seed)


def _ci(x: float, lo: float, hi: float, fmt: str) -> str:
    if not math.isfinite(x):
        return "outside the fixed range"
    return f"{fmt.format(x)} [{fmt.format(lo)}, {fmt.format(hi)}]"


def _short(label: str) -> str:
    """A plot annotation: the parameters inside a label's parentheses, less its realization (the legend names the
    kind): 'adaptive-interpolation(lam=0.2, realization=residual)' -> 'lam=0.2'."""
    if "(" not in label or not label.endswith(")"):
        return label
    inner = [part.strip() for part in label[label.index("(") + 1:-1].split(",")]
    return ", ".join(part for part in inner if not part.startswith("realization=")) or label


def plot_frontier(table: pd.DataFrame, path: Path) -> None:
    """BE against pass@1: the fixed settings joined in BE order, the budgeted ones likewise, the baseline a star;
    95% intervals as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    series = ((table["frontier"], "o-", "fixed parameter"), (table["kind"] == "budget", "s-", "TV budget"))
    for on, style, label in series:
        t = table[on].sort_values("be")
        ax.errorbar(t["be"], t["acc"], xerr=[t["be"] - t["be_lo"], t["be_hi"] - t["be"]],
                    yerr=[t["acc"] - t["acc_lo"], t["acc_hi"] - t["acc"]], fmt=style, capsize=2, label=label)
        for _, r in t.iterrows():
            ax.annotate(_short(r["setting"]), (r["be"], r["acc"]), fontsize=6, xytext=(3, 3),
                        textcoords="offset points")
    base = table[table["kind"] == "baseline"].iloc[0]
    ax.plot([base["be"]], [base["acc"]], "k*", markersize=11, label=base["setting"])
    ax.axhline(base["acc"], color="k", lw=0.6, ls="--")
    ax.set_xlabel("block efficiency (accepted drafts per target step)")
    ax.set_ylabel("pass@1 (%)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=150, bbox_inches="tight")
    plt.close(fig)


def write_frontier(table: pd.DataFrame, out_dir: str | Path) -> dict[str, Path]:
    """frontier.md, frontier.csv and frontier.png in ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "frontier.csv", index=False)
    rows = []
    for _, r in table.iterrows():
        kind = "baseline, fixed" if r["kind"] == "baseline" and r["frontier"] else r["kind"]
        rows.append([r["setting"], kind, _ci(r["be"], r["be_lo"], r["be_hi"], "{:.3f}"),
                     _ci(r["acc"], r["acc_lo"], r["acc_hi"], "{:.1f}"),
                     _ci(r.get("vs_fixed", math.nan), r.get("vs_fixed_lo", math.nan), r.get("vs_fixed_hi", math.nan),
                         "{:+.1f}") if r["kind"] == "budget" else "",
                     _ci(r.get("vs_envelope", math.nan), r.get("vs_envelope_lo", math.nan),
                         r.get("vs_envelope_hi", math.nan), "{:+.1f}") if r["kind"] == "budget" else "",
                     _ci(r["vs_baseline"], r["vs_baseline_lo"], r["vs_baseline_hi"], "{:+.1f}")
                     if r["kind"] == "budget" else "", str(r["units"])])
    md = md_table(["setting", "kind", "BE [95% CI]", "pass@1 % [95% CI]", "vs fixed at equal BE (pp)",
                   "vs the fixed envelope at equal BE (pp)", "vs baseline (pp)", "units"], rows)
    (out / "frontier.md").write_text(md + "\n")
    plot_frontier(table, out / "frontier.png")
    return {"md": out / "frontier.md", "csv": out / "frontier.csv", "png": out / "frontier.png"}
