"""Reports of a run directory: Markdown + CSV + PNG in ``RUN_DIR/report/``.

* ``table_settings`` (paper Table 4): per task x method x parameter, BE, DS and accuracy as mean +- std over
  seeds. Per (task, setting, seed): BE = sum emitted accepted drafts / sum rounds over the problems (pooled: the
  BE of the whole run; drafts accepted after the cut at EOS / stop / max_new_tokens are not counted, recomputed
  from ``per_round`` for result files that predate ``emitted_accepted``, see :mod:`verispec.eval.metrics`),
  DS = sum new tokens / sum wall seconds, accuracy = % of problems passed; ``accepted_fraction`` = accepted /
  drafted (``acceptance_rate`` in older files) is carried in the per-seed CSV. The std is the sample
  std (ddof 1) over seeds, blank with one seed. When the settings of a task cover different (problem, seed)
  units (a run extended for some settings or seeds only), this table, ``table_methods`` and the plots use only
  the problems every setting and seed of the task completed (:func:`balanced`), so each row and each seed
  averages the same problems;
  ``table_settings_all`` then gives every setting over all of its units.
* ``table_methods`` (Table 2): the same, averaged over each method's parameter settings.
* ``table_delta`` (Table 7): Delta BE and Delta accuracy (percentage points) of each lossy setting minus its
  matched baseline, on the units both completed, paired by (task, problem, seed). 95% confidence interval by
  a paired cluster bootstrap: problems are resampled with replacement (all seeds of a problem move together,
  and lossy/baseline stay paired), 2000 resamples, percentile interval, numpy seed 0. Rows ``all settings``
  average the per-setting deltas of one rule over its grid (bootstrapped jointly). Each row also gives the
  mean number of leading tokens the two outputs of a pair share (``shared_prefix``: the index of the first
  differing token, the whole output when one is a prefix of the other) and the fraction of pairs whose outputs
  are token-identical (``identical``): with common random numbers (``coupling = "common"``) a pair only differs
  after its first diverging decision.
* ``tradeoff.png`` (Figures 3 and 6): BE vs accuracy, one marker per setting, lines through each rule's
  settings in parameter order, plain lossless SD as a star with dashed reference lines.
* ``be_vs_param.png`` (Figure 5): BE vs each swept parameter, mean +- std band over seeds, lossless dashed.
* ``diffs.md`` / ``diffs.csv`` (Appendix F): for each (problem, seed) where a lossy setting and its matched
  baseline disagree on pass/fail, the first character (and token) where the two outputs differ, with context.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from verispec.eval.metrics import record_accepted_fraction, record_emitted_accepted
from verispec.eval.stats import BOOT_SEED, N_BOOT, cluster_weights, format_ci, percentile_interval
from verispec.eval.store import SCHEMA, read_results

__all__ = ["balanced", "check_record", "compare_runs", "first_difference", "gap_difference", "load_frame",
           "matched_pairs", "paired_delta", "per_seed", "per_setting", "problem_numbers", "select_problems",
           "shared_prefix", "write_report"]

CONTEXT = 80
#: numbers in the CSVs: 10 significant digits, so that a report regenerates byte for byte on any machine (the
#: bootstrap's matrix products may differ in the last bits between BLAS kernels and thread counts)
CSV_FLOAT = "%.10g"


# ------------------------------------------------------------------------------------------------- frames


_STR, _INT, _NUM = (str,), "a non-negative integer", "a finite number"
#: the fields of a result line the reports read, with what each must hold (a result line's ``grade`` and
#: ``timings`` are checked inside)
_FIELDS: dict[str, object] = {
    "task": _STR, "problem_id": _STR, "method": _STR, "label": _STR, "baseline": _STR, "lossless": (bool,),
    "seed": _INT, "params": (dict,), "grade": (dict,), "accepted": _INT, "rounds": _INT, "drafted": _INT,
    "new_tokens": _INT, "timings": (dict,), "finish_reason": (str, type(None)), "text": _STR, "token_ids": (list,),
}


def _bad_value(v: object, want: object) -> str | None:
    """Why ``v`` is not what ``want`` asks for (None when it is)."""
    if want == _INT:
        ok = isinstance(v, int) and not isinstance(v, bool) and v >= 0
    elif want == _NUM:
        ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    else:
        assert isinstance(want, tuple)
        ok = isinstance(v, want)
        want = " or ".join("null" if t is type(None) else t.__name__ for t in want)
    return None if ok else f"must be {want}, got {v!r}"[:200]


def check_record(rec: dict) -> str | None:
    """Why a result line cannot go into a report (a field missing or of the wrong type, another schema), or None:
    a line the reports would misread (a null ``rounds`` summed as nothing, a string ``passed`` read as true) must
    stop them rather than give a wrong table."""
    if rec.get("schema", SCHEMA) != SCHEMA:
        return f"schema {rec['schema']!r}, this verispec reads schema {SCHEMA}"
    checks = [(name, want, rec) for name, want in _FIELDS.items()]
    checks += [("grade.passed", (bool,), rec.get("grade")), ("grade.score", _NUM, rec.get("grade")),
               ("timings.total_s", _NUM, rec.get("timings"))]
    for name, want, where in checks:
        field = name.rsplit(".", 1)[-1]
        if not isinstance(where, dict):
            continue  # the enclosing object's own check reports it
        if field not in where:
            return f"field {name!r} missing"
        why = _bad_value(where[field], want)
        if why:
            return f"field {name!r} {why}"
    if rec.get("emitted_accepted") is not None:
        why = _bad_value(rec["emitted_accepted"], _INT)
        if why:
            return f"field 'emitted_accepted' {why}"
    return None


def load_frame(run_dir: str | Path) -> pd.DataFrame:
    """One row per result line (first occurrence of each key). ``accepted`` is the EMITTED accepted drafts (what
    BE counts), ``accepted_all`` every accepted draft as the engine counted it, ``be`` = accepted / rounds.
    ValueError naming the line's key for a line the reports cannot read (:func:`check_record`)."""
    recs = read_results(run_dir)
    rows = []
    for r in recs:
        why = check_record(r)
        if why:
            raise ValueError(f"{run_dir}: result line {r['key']!r}: {why}")
        rows.append({
            "key": r["key"], "task": r["task"], "problem_id": r["problem_id"], "method": r["method"],
            "label": r["label"], "baseline": r["baseline"], "lossless": bool(r["lossless"]), "seed": r["seed"],
            "params": json.dumps(r["params"], sort_keys=True), "passed": bool(r["grade"]["passed"]),
            "score": float(r["grade"]["score"]), "accepted": record_emitted_accepted(r),
            "accepted_all": r["accepted"], "rounds": r["rounds"], "drafted": r["drafted"],
            "accepted_fraction": record_accepted_fraction(r), "new_tokens": r["new_tokens"],
            "total_s": r["timings"]["total_s"], "be": record_emitted_accepted(r) / r["rounds"] if r["rounds"] else 0.0,
            "finish_reason": r["finish_reason"], "text": r["text"], "token_ids": r["token_ids"],
        })
    cols = ["key", "task", "problem_id", "method", "label", "baseline", "lossless", "seed", "params", "passed",
            "score", "accepted", "accepted_all", "rounds", "drafted", "accepted_fraction", "new_tokens", "total_s",
            "be", "finish_reason", "text", "token_ids"]
    return pd.DataFrame(rows, columns=cols)


def _setting_order(df: pd.DataFrame, run_dir: Path | None) -> list[str]:
    """Labels in sweep order (the config's), then any others in order of appearance."""
    order: list[str] = []
    if run_dir is not None and (run_dir / "config.json").exists():
        order = [m["label"] for m in json.loads((run_dir / "config.json").read_text())["methods"]]
    seen = set(order)
    for lab in df["label"]:
        if lab not in seen:
            order.append(lab)
            seen.add(lab)
    present = set(df["label"])
    return [lab for lab in order if lab in present]


def balanced(df: pd.DataFrame) -> pd.DataFrame:
    """The units that make a table of means average the same problems in every row and every seed.

    Per task, first choice: the problems that every (setting, seed) of the task completed, so that a mean +- std
    over seeds compares seeds on one problem set (a run extended for some seeds or settings only would otherwise
    average seed 0 over more problems than seeds 1-2). When no problem of the task has every (setting, seed),
    the (problem, seed) pairs that every setting completed; when none has that either, every unit of the task."""
    keep = np.zeros(len(df), dtype=bool)
    for rows in df.groupby("task", sort=False).indices.values():  # positions: safe with a repeated index
        g = df.iloc[rows]
        cell = g["label"].astype(str) + "\x00" + g["seed"].astype(str)
        complete = (cell.groupby(g["problem_id"].to_numpy()).transform("nunique") == cell.nunique()).to_numpy()
        if not complete.any():
            by = [g["problem_id"].to_numpy(), g["seed"].to_numpy()]
            complete = (g["label"].groupby(by).transform("nunique") == g["label"].nunique()).to_numpy()
        keep[rows] = complete if complete.any() else True
    return df[keep]


def per_seed(df: pd.DataFrame) -> pd.DataFrame:
    """BE (pooled), DS (pooled) and accuracy per (task, setting, seed)."""
    g = df.groupby(["task", "method", "label", "params", "seed"], sort=False)
    out = g.agg(accepted=("accepted", "sum"), accepted_all=("accepted_all", "sum"), rounds=("rounds", "sum"),
                drafted=("drafted", "sum"), new_tokens=("new_tokens", "sum"), total_s=("total_s", "sum"),
                passed=("passed", "sum"), n=("passed", "size")).reset_index()
    out["be"] = out["accepted"] / out["rounds"].where(out["rounds"] > 0)
    out["accepted_fraction"] = out["accepted_all"] / out["drafted"].where(out["drafted"] > 0)
    out["ds"] = out["new_tokens"] / out["total_s"].where(out["total_s"] > 0)
    out["acc"] = 100.0 * out["passed"] / out["n"]
    return out


def per_setting(seeds: pd.DataFrame) -> pd.DataFrame:
    """Mean and sample std (ddof 1) over seeds of BE, DS, accuracy per (task, setting)."""
    g = seeds.groupby(["task", "method", "label", "params"], sort=False)
    out = g.agg(be=("be", "mean"), be_std=("be", "std"), ds=("ds", "mean"), ds_std=("ds", "std"),
                acc=("acc", "mean"), acc_std=("acc", "std"), n_seeds=("seed", "nunique"),
                n_problems=("n", "max"), n_units=("n", "sum")).reset_index()
    return out


# --------------------------------------------------------------------------------------------- bootstrap


_PAIR_COLS = ("accepted_l", "rounds_l", "passed_l", "accepted_b", "rounds_b", "passed_b", "one",
              "new_tokens_l", "total_s_l", "new_tokens_b", "total_s_b")


def _cluster_sums(pairs: pd.DataFrame, clusters: list[str]) -> dict[str, np.ndarray]:
    """Per (cluster, setting) sums of the pair columns: {column: [C, S]} (clusters in the given order)."""
    settings = list(dict.fromkeys(pairs["setting"]))
    ci, si = {c: i for i, c in enumerate(clusters)}, {s: i for i, s in enumerate(settings)}
    mats = {}
    for col in _PAIR_COLS:
        m = np.zeros((len(clusters), len(settings)))
        vals = np.ones(len(pairs)) if col == "one" else pairs[col].to_numpy(dtype=float)
        np.add.at(m, (pairs["cluster"].map(ci).to_numpy(), pairs["setting"].map(si).to_numpy()), vals)
        mats[col] = m
    return mats


def _delta_stat(mats: dict[str, np.ndarray], w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Delta BE, Delta accuracy (pp), Delta DS for cluster weights ``w`` [B, C]: pooled per setting, then the
    mean over settings; each [B]."""
    s = {k: w @ v for k, v in mats.items()}  # [B, S]
    with np.errstate(invalid="ignore", divide="ignore"), _quiet():
        dbe = s["accepted_l"] / s["rounds_l"] - s["accepted_b"] / s["rounds_b"]
        dacc = 100.0 * (s["passed_l"] - s["passed_b"]) / s["one"]
        dds = s["new_tokens_l"] / s["total_s_l"] - s["new_tokens_b"] / s["total_s_b"]
        return np.nanmean(dbe, -1), np.nanmean(dacc, -1), np.nanmean(dds, -1)


def _interval(x: np.ndarray, n_clusters: int) -> tuple[float, float]:
    """95% percentile interval of cluster-bootstrap values; undefined with fewer than two clusters."""
    return percentile_interval(x) if n_clusters >= 2 else (math.nan, math.nan)


def paired_delta(pairs: pd.DataFrame, n_boot: int = N_BOOT, seed: int = BOOT_SEED) -> dict:
    """Delta BE and Delta accuracy (lossy - baseline) with 95% paired cluster-bootstrap intervals.

    ``pairs`` columns: setting, cluster, accepted_l, rounds_l, passed_l, accepted_b, rounds_b, passed_b,
    new_tokens_l, total_s_l, new_tokens_b, total_s_b (one row per (setting, problem, seed) pair). The statistic
    is the mean over settings of the pooled per-setting deltas; clusters (problems) are resampled.
    """
    clusters = list(dict.fromkeys(pairs["cluster"]))
    C = len(clusters)
    mats = _cluster_sums(pairs, clusters)
    point = [float(x[0]) for x in _delta_stat(mats, np.ones((1, C)))]
    dbe, dacc, _ = _delta_stat(mats, cluster_weights(C, n_boot, seed))
    lo_be, hi_be = _interval(dbe, C)
    lo_acc, hi_acc = _interval(dacc, C)
    return {"d_be": point[0], "d_be_lo": lo_be, "d_be_hi": hi_be,
            "d_acc": point[1], "d_acc_lo": lo_acc, "d_acc_hi": hi_acc, "d_ds": point[2],
            "n_pairs": int(len(pairs)), "n_problems": C, "n_settings": len(set(pairs["setting"]))}


def gap_difference(df_a: pd.DataFrame, df_b: pd.DataFrame, lossy: str, base: str, n_boot: int = N_BOOT,
                   seed: int = BOOT_SEED) -> dict:
    """(lossy - base) in run A minus (lossy - base) in run B, on the (task, problem, seed) keys where all four
    units completed: e.g. the tree gap minus the chain gap (Table 7's amplification). 95% interval by a cluster
    bootstrap over problems with the SAME resampled problems for both runs, so each problem's two gaps stay
    paired. Returns the two gaps (``a_*``, ``b_*``), their difference (``diff_*``) and the counts."""
    tasks = sorted(set(df_a["task"]) | set(df_b["task"]))
    pa, pb = _pairs(df_a, lossy, base, tasks), _pairs(df_b, lossy, base, tasks)
    keys = ["task", "problem_id", "seed"]
    shared = pa[keys].merge(pb[keys], on=keys)
    pa, pb = pa.merge(shared, on=keys), pb.merge(shared, on=keys)
    if pa.empty:
        raise ValueError(f"no (task, problem, seed) has {lossy!r} and {base!r} completed in both runs")
    clusters = list(dict.fromkeys(pa["cluster"]))
    C = len(clusters)
    ma, mb = _cluster_sums(pa, clusters), _cluster_sums(pb, clusters)
    out: dict = {"lossy": lossy, "baseline": base, "n_pairs": int(len(pa)), "n_problems": C}
    w = cluster_weights(C, n_boot, seed)
    one = np.ones((1, C))
    pa_pt, pb_pt = _delta_stat(ma, one), _delta_stat(mb, one)  # each statistic once per run: (dBE, dAcc, dDS)
    pa_bs, pb_bs = _delta_stat(ma, w), _delta_stat(mb, w)
    for name, idx in (("be", 0), ("acc", 1)):
        a_pt, b_pt = float(pa_pt[idx][0]), float(pb_pt[idx][0])
        a_bs, b_bs = pa_bs[idx], pb_bs[idx]
        for prefix, pt, bs in (("a", a_pt, a_bs), ("b", b_pt, b_bs), ("diff", a_pt - b_pt, a_bs - b_bs)):
            lo, hi = _interval(bs, C)
            out.update({f"{prefix}_d_{name}": pt, f"{prefix}_d_{name}_lo": lo, f"{prefix}_d_{name}_hi": hi})
    return out


class _quiet:
    def __enter__(self) -> None:
        import warnings

        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore", category=RuntimeWarning)

    def __exit__(self, *exc: object) -> None:
        self._w.__exit__(*exc)


def _pairs(df: pd.DataFrame, lossy: str, base: str, tasks: Sequence[str]) -> pd.DataFrame:
    keep = ["task", "problem_id", "seed", "accepted", "rounds", "passed", "new_tokens", "total_s", "token_ids"]
    a = df[(df["label"] == lossy) & df["task"].isin(tasks)][keep]
    b = df[(df["label"] == base) & df["task"].isin(tasks)][keep]
    m = a.merge(b, on=["task", "problem_id", "seed"], suffixes=("_l", "_b"))
    m["setting"] = lossy
    m["cluster"] = m["task"] + "|" + m["problem_id"]
    for c in ("passed_l", "passed_b"):
        m[c] = m[c].astype(float)
    return m


def shared_prefix(pairs: pd.DataFrame) -> dict:
    """Mean shared prefix (tokens) of the paired outputs (``token_ids_l`` / ``token_ids_b`` columns), the
    fraction of token-identical pairs, and the mean length of the two outputs (for scale)."""
    a, b = pairs["token_ids_l"].tolist(), pairs["token_ids_b"].tolist()
    prefix = [_first_token_difference(x, y) for x, y in zip(a, b, strict=True)]
    same = [list(x) == list(y) for x, y in zip(a, b, strict=True)]
    length = [(len(x) + len(y)) / 2 for x, y in zip(a, b, strict=True)]
    n = len(prefix)
    return {"shared_prefix": float(np.mean(prefix)) if n else math.nan,
            "identical": float(np.mean(same)) if n else math.nan,
            "mean_tokens": float(np.mean(length)) if n else math.nan}


def delta_table(df: pd.DataFrame, order: list[str], n_boot: int = N_BOOT) -> pd.DataFrame:
    """Table 7: one row per (lossy setting or rule average, task or 'all')."""
    lossy = df.drop_duplicates("label").set_index("label")
    tasks = list(dict.fromkeys(df["task"]))
    rows = []
    by_rule: dict[str, list[tuple[str, str]]] = {}
    for lab in order:
        rec = lossy.loc[lab]
        if rec["lossless"] or rec["baseline"] == lab or rec["baseline"] not in set(df["label"]):
            continue
        by_rule.setdefault(rec["method"], []).append((lab, rec["baseline"]))
    for rule, pairs_list in by_rule.items():
        groups = [(lab, [(lab, base)]) for lab, base in pairs_list]
        if len(pairs_list) > 1:
            groups.append((f"{rule} (all settings)", pairs_list))
        for name, members in groups:
            for scope in [*tasks, "all"] if len(tasks) > 1 else tasks:
                scope_tasks = tasks if scope == "all" else [scope]
                p = pd.concat([_pairs(df, lab, base, scope_tasks) for lab, base in members], ignore_index=True)
                if p.empty:
                    continue
                res = paired_delta(p, n_boot=n_boot)
                rows.append({"rule": rule, "setting": name,
                             "baseline": members[0][1] if len(members) == 1 else "matched baselines",
                             "task": scope, **res, **shared_prefix(p)})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------------- diffs


def first_difference(a: str, b: str) -> int:
    """Index of the first character where ``a`` and ``b`` differ (the shorter length if one is a prefix)."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _first_token_difference(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def diff_table(df: pd.DataFrame, order: list[str]) -> pd.DataFrame:
    """Appendix F: (problem, seed) pairs where a lossy setting and its matched baseline disagree on pass/fail."""
    info = df.drop_duplicates("label").set_index("label")
    rows = []
    for lab in order:
        rec = info.loc[lab]
        base = rec["baseline"]
        if rec["lossless"] or base == lab or base not in info.index:
            continue
        a = df[df["label"] == lab]
        b = df[df["label"] == base]
        m = a.merge(b, on=["task", "problem_id", "seed"], suffixes=("_l", "_b"))
        m = m[m["passed_l"] != m["passed_b"]]
        for _, r in m.iterrows():
            i = first_difference(r["text_l"], r["text_b"])
            rows.append({
                "setting": lab, "baseline": base, "task": r["task"], "problem_id": r["problem_id"],
                "seed": r["seed"], "lossy_passed": bool(r["passed_l"]), "baseline_passed": bool(r["passed_b"]),
                "char_offset": i, "token_offset": _first_token_difference(r["token_ids_l"], r["token_ids_b"]),
                "common_prefix": r["text_l"][max(0, i - CONTEXT):i],
                "lossy_continues": r["text_l"][i:i + CONTEXT + 40],
                "baseline_continues": r["text_b"][i:i + CONTEXT + 40],
            })
    return pd.DataFrame(rows, columns=["setting", "baseline", "task", "problem_id", "seed", "lossy_passed",
                                       "baseline_passed", "char_offset", "token_offset", "common_prefix",
                                       "lossy_continues", "baseline_continues"])


# ------------------------------------------------------------------------------------------------- tables


def _pm(mean: float, std: float, digits: int) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "-"
    s = f"{mean:.{digits}f}"
    if std is not None and not (isinstance(std, float) and math.isnan(std)):
        s += f" ± {std:.{digits}f}"
    return s


def _param_text(params: str) -> str:
    d = json.loads(params)
    return ", ".join(f"{k}={v}" for k, v in d.items()) or "–"


def md_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table (cells converted with str)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _settings_md(st: pd.DataFrame, tasks: list[str], order: list[str], problems: bool = False) -> str:
    cols = ("BE", "DS", "Acc (%)") + (("problems",) if problems else ())
    header = ["Method", "Param"] + [f"{t} {m}" for t in tasks for m in cols]
    rows = []
    for lab in order:
        sub = st[st["label"] == lab]
        if sub.empty:
            continue
        first = sub.iloc[0]
        row = [first["method"], _param_text(first["params"])]
        for t in tasks:
            r = sub[sub["task"] == t]
            if r.empty:
                row += ["-"] * len(cols)
                continue
            r = r.iloc[0]
            row += [_pm(r["be"], r["be_std"], 2), _pm(r["ds"], r["ds_std"], 2), _pm(r["acc"], r["acc_std"], 1)]
            row += [str(int(r["n_problems"]))] if problems else []
        rows.append(row)
    return md_table(header, rows)


def method_table(st: pd.DataFrame) -> pd.DataFrame:
    """Table 2: per task and rule, the mean over its settings of the per-setting means."""
    g = st.groupby(["task", "method"], sort=False)
    return g.agg(be=("be", "mean"), ds=("ds", "mean"), acc=("acc", "mean"), n_settings=("label", "nunique"),
                 n_seeds=("n_seeds", "max"), n_problems=("n_problems", "max")).reset_index()


def _methods_md(mt: pd.DataFrame, tasks: list[str], rule_order: list[str]) -> str:
    header = ["Method", "settings"] + [f"{t} {m}" for t in tasks for m in ("BE", "DS", "Acc (%)")]
    rows = []
    for rule in rule_order:
        sub = mt[mt["method"] == rule]
        if sub.empty:
            continue
        row = [rule, str(int(sub["n_settings"].max()))]
        for t in tasks:
            r = sub[sub["task"] == t]
            if r.empty:
                row += ["-", "-", "-"]
            else:
                r = r.iloc[0]
                row += [f"{r['be']:.2f}", f"{r['ds']:.2f}", f"{r['acc']:.1f}"]
        rows.append(row)
    return md_table(header, rows)


def _ci(point: float, lo: float, hi: float, digits: int) -> str:
    return format_ci(point, lo, hi, f"{{:+.{digits}f}}", missing="-")


def _delta_md(dt: pd.DataFrame) -> str:
    header = ["Lossy setting", "Matched baseline", "Task", "pairs", "Δ BE [95% CI]", "Δ Acc pp [95% CI]", "Δ DS",
              "shared prefix (tokens of mean length; identical)"]
    rows = [[r["setting"], r["baseline"], r["task"], f"{r['n_pairs']} ({r['n_problems']} problems)",
             _ci(r["d_be"], r["d_be_lo"], r["d_be_hi"], 3), _ci(r["d_acc"], r["d_acc_lo"], r["d_acc_hi"], 1),
             f"{r['d_ds']:+.2f}" if not math.isnan(r["d_ds"]) else "-",
             f"{r['shared_prefix']:.1f} of {r['mean_tokens']:.1f}; {100 * r['identical']:.0f}%"]
            for _, r in dt.iterrows()]
    return md_table(header, rows)


def _fence(text: str) -> str:
    return "~~~~text\n" + text.replace("~~~~", "~ ~ ~ ~") + "\n~~~~"


def _diffs_md(dd: pd.DataFrame) -> str:
    out = ["# Qualitative differences (like Appendix F)", "",
           "For every (problem, seed) where a lossy setting and its matched baseline disagree on pass/fail "
           "(same seed, so both start from the same random numbers): the first place where the two outputs "
           "differ, as a character offset (and token offset), the common text just before it, and how each "
           "continues.", ""]
    if dd.empty:
        out.append("No disagreements on pass/fail in this run.")
    for _, r in dd.iterrows():
        mark = {True: "✓", False: "✗"}
        out += [f"## {r['task']} {r['problem_id']} seed {r['seed']}: {r['setting']} {mark[r['lossy_passed']]} vs "
                f"{r['baseline']} {mark[r['baseline_passed']]}", "",
                f"First difference at character {r['char_offset']} (token {r['token_offset']}). Common text "
                "before it:", "", _fence(r["common_prefix"]), "", f"{r['baseline']} continues:", "",
                _fence(r["baseline_continues"]), "", f"{r['setting']} continues:", "", _fence(r["lossy_continues"]),
                ""]
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------------- plots


def _swept_param(sub: pd.DataFrame) -> str | None:
    """The one numeric parameter that varies across a rule's settings (or the only one it has)."""
    dicts = [json.loads(p) for p in sub["params"].unique()]
    names = [k for k in (dicts[0] if dicts else {}) if all(isinstance(d.get(k), int | float) for d in dicts)]
    varying = [k for k in names if len({d[k] for d in dicts}) > 1]
    if len(varying) == 1:
        return varying[0]
    if not varying and len(names) == 1:
        return names[0]
    return None


def plot_tradeoff(st: pd.DataFrame, tasks: list[str], order: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(tasks), figsize=(5.2 * len(tasks), 4.4), squeeze=False)
    rules_in_order = list(dict.fromkeys(st.set_index("label").loc[order]["method"]))
    colors = {r: plt.cm.tab10(i % 10) for i, r in enumerate(rules_in_order)}
    for ax, task in zip(axes[0], tasks, strict=True):
        t = st[st["task"] == task]
        for rule in rules_in_order:
            sub = t[t["method"] == rule]
            if sub.empty:
                continue
            if rule == "lossless":
                r = sub.iloc[0]
                ax.scatter([r["be"]], [r["acc"]], marker="*", s=260, color="black", zorder=5, label="lossless SD")
                ax.axvline(r["be"], ls="--", color="gray", lw=1)
                ax.axhline(r["acc"], ls="--", color="gray", lw=1)
                continue
            pname = _swept_param(sub)
            if pname:
                sub = sub.assign(_x=[json.loads(p)[pname] for p in sub["params"]]).sort_values("_x")
            xerr = sub["be_std"].fillna(0).to_numpy() if sub["n_seeds"].max() > 1 else None
            yerr = sub["acc_std"].fillna(0).to_numpy() if sub["n_seeds"].max() > 1 else None
            ax.errorbar(sub["be"], sub["acc"], xerr=xerr, yerr=yerr, marker="o", ms=6, lw=1.2, capsize=2,
                        color=colors[rule], label=rule)
            if pname:
                for _, r in sub.iterrows():
                    ax.annotate(f"{r['_x']:g}", (r["be"], r["acc"]), textcoords="offset points", xytext=(4, 4),
                                fontsize=7, color=colors[rule])
        ax.set_title(task)
        ax.set_xlabel("block efficiency (accepted drafts / target step)")
        ax.set_ylabel("accuracy / pass@1 (%)")
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    for ax in axes[0][1:]:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), fontsize=8, frameon=False)
    fig.suptitle("Efficiency vs task performance (one marker per setting; star: lossless SD)")
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_be_vs_param(st: pd.DataFrame, tasks: list[str], order: list[str], path: Path) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, list[str]] = {}
    for rule in dict.fromkeys(st.set_index("label").loc[order]["method"]):
        if rule == "lossless":
            continue
        pname = _swept_param(st[st["method"] == rule])
        if pname:
            groups.setdefault(pname, []).append(rule)
    if not groups:
        return False
    fig, axes = plt.subplots(len(groups), len(tasks), figsize=(4.6 * len(tasks), 3.4 * len(groups)), squeeze=False)
    for gi, (pname, rule_list) in enumerate(groups.items()):
        for ti, task in enumerate(tasks):
            ax = axes[gi][ti]
            t = st[st["task"] == task]
            for i, rule in enumerate(rule_list):
                sub = t[t["method"] == rule]
                if sub.empty:
                    continue
                sub = sub.assign(_x=[json.loads(p)[pname] for p in sub["params"]]).sort_values("_x")
                color = plt.cm.tab10(i % 10)
                ax.plot(sub["_x"], sub["be"], marker="o", color=color, label=rule)
                std = sub["be_std"].fillna(0).to_numpy()
                if len(sub) > 1:
                    ax.fill_between(sub["_x"], sub["be"] - std, sub["be"] + std, color=color, alpha=0.2)
                else:
                    ax.errorbar(sub["_x"], sub["be"], yerr=std, color=color, capsize=3)
            base = t[t["method"] == "lossless"]
            if not base.empty:
                ax.axhline(base.iloc[0]["be"], ls="--", color="gray", lw=1, label="lossless SD")
            ax.set_title(f"{task}")
            ax.set_xlabel(pname)
            ax.set_ylabel("BE")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle("Block efficiency vs hyperparameter (mean ± std over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# ------------------------------------------------------------------------------------------------ compare


def matched_pairs(df: pd.DataFrame) -> list[tuple[str, str]]:
    """(lossy setting, its matched baseline) for every lossy setting of a frame whose baseline is in it."""
    labels = set(df["label"])
    first = df.drop_duplicates("label")
    return [(r.label, r.baseline) for r in first.itertuples()
            if not r.lossless and r.baseline != r.label and r.baseline in labels]


def problem_numbers(df: pd.DataFrame) -> pd.Series:
    """Each row's problem number: the integer after the last ``/`` of its id (``HumanEval/64`` is 64)."""
    tail = df["problem_id"].astype(str).str.rsplit("/", n=1).str[-1]
    bad = ~tail.str.fullmatch(r"\d+")
    if bad.any():
        raise ValueError(f"problem id {df['problem_id'][bad].iloc[0]!r} does not end in a number")
    return tail.astype(int)


def select_problems(df: pd.DataFrame, start: int | None = None, stop: int | None = None) -> pd.DataFrame:
    """The rows whose problem number (:func:`problem_numbers`) is in ``[start, stop)``; an open end is None."""
    n = problem_numbers(df)
    keep = pd.Series(True, index=df.index)
    if start is not None:
        keep &= n >= start
    if stop is not None:
        keep &= n < stop
    return df[keep]


def compare_runs(run_a: str | Path, run_b: str | Path | None = None,
                 pairs: Sequence[tuple[str, str]] | None = None, n_boot: int = N_BOOT,
                 problems: tuple[int | None, int | None] | None = None) -> tuple[pd.DataFrame, str]:
    """Gap of each (lossy, baseline) pair in run A vs in run B on their shared (task, problem, seed) keys
    (:func:`gap_difference`); ``pairs`` default: the matched pairs of run A that run B also holds. Without run B,
    the paired gaps of ``pairs`` within run A (any two settings, e.g. two CoS parameters). ``problems=(start,
    stop)``: only the problems numbered in ``[start, stop)`` (:func:`select_problems`), e.g. the problems a run
    was extended to, as a held-out replication of what its first problems showed. Returns the table and its
    Markdown."""
    df_a = load_frame(run_a)
    df_b = df_a if run_b is None else load_frame(run_b)
    if problems is not None:
        df_a, df_b = select_problems(df_a, *problems), select_problems(df_b, *problems)
    if pairs is None:
        have_b = set(df_b["label"])
        pairs = [(lossy, base) for lossy, base in matched_pairs(df_a) if lossy in have_b and base in have_b]
    if not pairs:
        raise ValueError(f"{run_a} and {run_b} share no (lossy setting, matched baseline) pair")
    table = pd.DataFrame([gap_difference(df_a, df_b, lossy, base, n_boot=n_boot) for lossy, base in pairs])
    boot = f"95% cluster-bootstrap intervals ({n_boot} resamples over problems"
    if problems is not None:
        lo, hi = problems
        boot += (f"; only problems numbered {'' if lo is None else lo}..{'' if hi is None else hi - 1}, by the "
                 "number ending their id")
    if run_b is None:
        table = table[[c for c in table.columns if not c.startswith(("b_", "diff_"))]]
        rows = [[r.lossy, r.baseline, f"{r.n_pairs} ({r.n_problems})", _ci(r.a_d_be, r.a_d_be_lo, r.a_d_be_hi, 3),
                 _ci(r.a_d_acc, r.a_d_acc_lo, r.a_d_acc_hi, 1)] for r in table.itertuples()]
        md = (f"Run `{run_a}`: each gap is the first setting minus the second on the (task, problem, seed) keys "
              f"both completed; {boot}).\n\n"
              + md_table(["setting", "minus", "pairs (problems)", "dBE", "dAcc (pp)"], rows) + "\n")
        return table, md
    rows = [[r.lossy, r.baseline, f"{r.n_pairs} ({r.n_problems})",
             _ci(r.a_d_be, r.a_d_be_lo, r.a_d_be_hi, 3), _ci(r.b_d_be, r.b_d_be_lo, r.b_d_be_hi, 3),
             _ci(r.diff_d_be, r.diff_d_be_lo, r.diff_d_be_hi, 3),
             _ci(r.a_d_acc, r.a_d_acc_lo, r.a_d_acc_hi, 1), _ci(r.b_d_acc, r.b_d_acc_lo, r.b_d_acc_hi, 1),
             _ci(r.diff_d_acc, r.diff_d_acc_lo, r.diff_d_acc_hi, 1)] for r in table.itertuples()]
    md = (f"Run A `{run_a}`, run B `{run_b}`: each gap is lossy - baseline on the (task, problem, seed) keys all "
          f"four units completed; {boot}, the same problems drawn for both runs).\n\n"
          + md_table(["lossy", "baseline", "pairs (problems)", "dBE A", "dBE B", "dBE A - B", "dAcc A (pp)",
                      "dAcc B (pp)", "dAcc A - B (pp)"], rows) + "\n")
    return table, md


# ------------------------------------------------------------------------------------------------- report


def write_report(run_dir: str | Path, out_dir: str | Path | None = None, n_boot: int = N_BOOT) -> dict[str, Path]:
    """Write the report of ``run_dir`` into ``out_dir`` (default ``run_dir/report``); return the files."""
    run_dir = Path(run_dir)
    out = Path(out_dir) if out_dir is not None else run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    df = load_frame(run_dir)
    if df.empty:
        raise ValueError(f"{run_dir} has no results yet")
    order = _setting_order(df, run_dir)
    tasks = list(dict.fromkeys(df["task"]))
    seeds = per_seed(df)
    bal = balanced(df)
    uneven = len(bal) < len(df)
    st_all = per_setting(seeds)
    st = per_setting(per_seed(bal)) if uneven else st_all  # the tables of means and plots: like with like
    mt = method_table(st)
    dt = delta_table(df, order, n_boot=n_boot)
    dd = diff_table(df, order)
    files = {
        "per_seed": out / "per_seed.csv",
        "settings": out / "table_settings.csv",
        "methods": out / "table_methods.csv",
        "delta": out / "table_delta.csv",
        "diffs_csv": out / "diffs.csv",
        "diffs": out / "diffs.md",
        "tradeoff": out / "tradeoff.png",
        "be_vs_param": out / "be_vs_param.png",
        "report": out / "report.md",
    }
    seeds.to_csv(files["per_seed"], index=False, float_format=CSV_FLOAT)
    st.assign(param=st["params"].map(_param_text)).to_csv(files["settings"], index=False,
                                                           float_format=CSV_FLOAT)
    settings_all = out / "table_settings_all.csv"
    if uneven:
        files["settings_all"] = settings_all
        st_all.assign(param=st_all["params"].map(_param_text)).to_csv(settings_all, index=False,
                                                                       float_format=CSV_FLOAT)
    else:  # a rebuild after the run completed: a table left from an earlier, uneven report would be stale
        settings_all.unlink(missing_ok=True)
    mt.to_csv(files["methods"], index=False, float_format=CSV_FLOAT)
    dt.to_csv(files["delta"], index=False, float_format=CSV_FLOAT)
    dd.to_csv(files["diffs_csv"], index=False, float_format=CSV_FLOAT)
    files["diffs"].write_text(_diffs_md(dd))
    plot_tradeoff(st, tasks, order, files["tradeoff"])
    if not plot_be_vs_param(st, tasks, order, files["be_vs_param"]):
        files.pop("be_vs_param").unlink(missing_ok=True)  # no swept parameter now: drop an earlier plot

    run = json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").exists() else {}
    cfg = json.loads((run_dir / "config.json").read_text()) if (run_dir / "config.json").exists() else {}
    settings = {k: cfg.get(k) for k in ("temperature", "sampling", "gamma", "max_new_tokens", "target", "draft",
                                        "drafter", "dtype", "baseline_draft_truncation", "coupling")}
    rule_order = list(dict.fromkeys(df.set_index("label").loc[order]["method"]))
    n_err = 0
    if (run_dir / "errors.jsonl").exists():
        done = set(df["key"])
        errs = [json.loads(x) for x in (run_dir / "errors.jsonl").read_text().splitlines() if x.strip()]
        n_err = len({e["key"] for e in errs} - done)
    lines = [
        f"# Benchmark report: {cfg.get('name', run_dir.name)}",
        "",
        f"Run directory `{run_dir}`: {len(df)} results"
        + (f" of {run['units']} units in the last invocation's grid" if run.get("units") else "")
        + (f"; {n_err} units failed and are retried on the next `bench run`" if n_err else "") + ".",
        "",
        "Settings: " + ", ".join(f"{k} = `{v}`" for k, v in settings.items() if v not in (None, {}))
        + "".join(f", max_new_tokens of {t['name']} = `{t['max_new_tokens']}`" for t in cfg.get("tasks", [])
                  if t.get("max_new_tokens")) + ".",
        "",
        f"Tasks: {', '.join(f'{t} ({df[df.task == t].problem_id.nunique()} problems)' for t in tasks)}; "
        f"seeds: {sorted(df.seed.unique().tolist())}.",
        "",
        "BE = accepted drafted tokens that were emitted per target forward pass (bonus excluded; drafts accepted "
        "after EOS, a stop string or max_new_tokens are not counted), pooled over the problems of a "
        "(task, setting, seed): sum emitted accepted / sum rounds. DS = generated tokens per second of wall time (sum "
        "tokens / sum seconds, grading excluded). Acc = % of problems passed (pass@1 for code). Mean ± sample "
        "std over seeds (no ± with one seed).",
        "",
    ]
    if uneven:
        per_seed_n = bal.groupby(["task", "seed"])["problem_id"].nunique()

        def _common(t: str) -> str:
            n = per_seed_n[t]
            if n.nunique() == 1:
                return f"{t}: {int(n.iloc[0])} problems in each of {len(n)} seeds"
            return f"{t}: " + ", ".join(f"seed {s}: {int(k)} problems" for s, k in n.items())

        lines += [
            "Settings cover different (problem, seed) units here (the run was extended for some settings or seeds "
            "only): the two tables of means and the plots use the problems every setting and seed of a task "
            "completed (" + "; ".join(_common(t) for t in tasks) + "), so their rows and seeds average the same "
            "problems; the per-setting table over every completed unit (`table_settings_all.csv`) follows them, "
            "and the paired deltas use every pair.",
            "",
        ]
    lines += [
        "## Per method, averaged over its settings (like Table 2)",
        "",
        _methods_md(mt, tasks, rule_order),
        "",
        "## Per setting (like Table 4)",
        "",
        _settings_md(st, tasks, order),
        "",
    ]
    if uneven:
        lines += ["Over every completed unit (`table_settings_all.csv`):", "",
                  _settings_md(st_all, tasks, order, problems=True), ""]
    lines += [
        "## Lossy vs matched baseline (like Table 7)",
        "",
        "Δ = lossy − matched baseline on the (problem, seed) pairs both completed. 95% CI: paired cluster "
        f"bootstrap over problems ({n_boot} resamples, percentile interval, seed {BOOT_SEED}); no CI with a "
        "single problem. Δ DS is a point estimate (timings are noisy on a shared machine). Shared prefix: mean "
        "number of leading tokens the lossy and the baseline output of a pair have in common (the first diverging "
        "token), next to the mean output length, and the % of pairs with token-identical outputs.",
        "",
        _delta_md(dt) if not dt.empty else "No lossy setting with its matched baseline in this run.",
        "",
        "## Plots",
        "",
        "![BE vs accuracy](tradeoff.png)",
        "",
    ]
    if "be_vs_param" in files:
        lines += ["![BE vs hyperparameter](be_vs_param.png)", ""]
    lines += ["## Qualitative differences (like Appendix F)", ""]
    if dd.empty:
        lines.append("No (problem, seed) where a lossy setting and its matched baseline disagree on pass/fail.")
    else:
        counts = dd.groupby(["setting", "task"]).size()
        lines.append(f"{len(dd)} (problem, seed) pairs where a lossy setting and its matched baseline disagree on "
                     "pass/fail; each with the first differing character in [diffs.md](diffs.md):")
        lines.append("")
        lines += [f"- {s} on {t}: {n}" for (s, t), n in counts.items()]
    est = run_dir / "estimator" / "estimate.md"
    if est.exists():
        lines += ["", "## Offline estimator", "", est.read_text().split("\n", 2)[-1].strip()]
    files["report"].write_text("\n".join(lines) + "\n")
    return files
