"""An audit's report in a directory: ``audit.json`` (everything), ``audit.md`` (the verdict, the test, N, power,
the TV with its interval, the most over- and under-sampled continuations) and ``audit.png`` (observed vs exact
probability per continuation, with 95% binomial intervals; the acceptance profile where the engine reports it).
A two-sample audit's report puts the reference endpoint's sampled frequencies where the exact law would be, and
says that it is approximate. The JSON is strict (:func:`to_json`): a number that is not finite is null."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

__all__ = ["finite", "markdown", "to_json", "write_report"]


def finite(obj: Any) -> Any:
    """``obj`` with every float that is not finite (a smallest detectable TV that no TV up to 1 reaches is inf) as
    None, through dicts, lists and tuples: strict JSON has no Infinity or NaN."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def to_json(rep: Any, **kwargs: Any) -> str:
    """The report (an :class:`~verispec.audit.core.AuditReport` or its dict) as strict JSON: :func:`finite`'s nulls,
    never ``Infinity`` or ``NaN``; ``kwargs`` go to :func:`json.dumps`."""
    d = rep.as_dict() if hasattr(rep, "as_dict") else rep
    return json.dumps(finite(d), allow_nan=False, default=str, **kwargs)


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None:  # a non-finite number read back from the JSON
        return "n/a"
    if isinstance(x, float):
        if math.isinf(x):
            return "inf"
        if math.isnan(x):
            return "n/a"
        return f"{x:.{digits}g}" if abs(x) < 1e-3 and x != 0 else f"{x:.{digits}f}"
    return str(x)


def _fmt_tv(x: Any) -> str:
    """A smallest detectable TV; not finite (null in the JSON) when no TV up to 1 is."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "none (no TV up to 1 is detectable with this N and these bins)"
    return _fmt(x)


def _markdown_two_sample(d: dict) -> str:
    """The two-sample report: the engine's and the reference endpoint's counts side by side, no exact law."""
    t, p, tv, n, s = d["test"], d["power"], d["tv"], d["n"], d["settings"]
    lines = [
        f"# Audit: {d['verdict'].upper()} (two-sample, approximate)",
        "",
        f"Engine `{d['engine']['model']}` at {d['engine']['base_url']}; reference: the endpoint "
        f"{d['reference']['name']}, sampled (two-sample mode: approximate, see the note below).",
        "",
        f"Audited: {s['law']}; {s['length']}-token continuations at temperature {s['temperature']}, top_k "
        f"{s['top_k']}, top_p {s['top_p']}, min_p {s['min_p']}, penalties {s['penalties'] or 'none'}, logit_bias "
        f"{s['logit_bias'] or 'none'}; request fields {d['engine']['fields']} + {d['engine']['extra_body']} (the "
        f"reference gets the same fields, without the engine's extra body).",
        "",
        "| | |",
        "|---|---|",
        f"| verdict | **{d['verdict']}** |",
        f"| test | {t['name']} |",
        f"| N | {n['per_prompt']} per prompt x {len(d['prompts'])} prompt(s) = {n['total']} on each side (engine and "
        f"reference; planned {n['planned_per_prompt']} per prompt; "
        f"{'pilot ' + str(n['pilot_per_prompt']) + ' per candidate' if n['pilot_per_prompt'] else 'no pilot'}) |",
        f"| alpha | {t['alpha']:g} |",
        f"| tolerance tau | {_fmt(t['tau'])} (noncentrality under the null {_fmt(t['lambda0'])}; n_eff "
        f"{_fmt(t['n_eff'], 1)}) |",
        f"| X^2, df | {_fmt(t['x2'])}, {t['df']} (bins per prompt {t['bins']}, pooled mass {_fmt(t['pooled_mass'])})"
        f" |",
        f"| p-value | {_fmt(t['pvalue'])} |",
        f"| estimated TV between the two samples | {_fmt(tv['estimate'])} [{_fmt(tv['ci95'][0])}, "
        f"{_fmt(tv['ci95'][1])}] (95%; {tv['method']}; biased up by both sides' sampling noise) |",
        f"| smallest TV detectable with power {p['power_goal']} | {_fmt_tv(p['min_detectable_tv'])} ({p['method']}) "
        f"|",
        f"| power at TV {p['target_tv']} | {_fmt(p['power_at_target_tv'])} (N needed per prompt and side: "
        f"{p['n_needed_per_prompt'] if p['n_needed_per_prompt'] is not None else 'not planned (given)'}) |",
        f"| time | {_fmt(d['seconds']['total'], 1)} s (pilot and design {_fmt(d['seconds']['reference'], 1)} s, "
        f"sampling {_fmt(d['seconds']['sampling'], 1)} s, {_fmt(d['seconds']['samples_per_s'], 2)} samples/s over "
        f"both sides) |",
    ]
    if d.get("acceptance"):
        a = d["acceptance"]
        lines.append(f"| acceptance (engine-reported) | {a['accepted']} of {a['drafted']} drafts; per position "
                     f"{[round(x, 3) for x in a['per_position']]} |")
    for note in d.get("notes") or []:
        lines += ["", f"Note: {note}"]
    for prompt, rows in zip(d["prompts"], d["outcomes"], strict=True):
        lines += ["", f"## Prompt {json.dumps(prompt)}", "",
                  "| continuation | ended | engine | reference | engine count | reference count | z |",
                  "|---|---|---|---|---|---|---|"]
        total = max(sum(r["count"] for r in rows), 1)
        scored = []
        for r in rows:
            pooled = (r["observed"] + r["expected"]) / 2
            se = math.sqrt(max(pooled * (1 - pooled), 1e-12) * 2 / total)
            scored.append((r, (r["observed"] - r["expected"]) / se))
        show = sorted(scored, key=lambda x: -abs(x[1]))[:12]
        for r, z in sorted(show, key=lambda x: -x[0]["expected"]):
            lines.append(f"| {json.dumps(r['text'])} | {'eos' if r['ended'] else ''} | {r['observed']:.4f} | "
                         f"{r['expected']:.4f} | {r['count']} | {r['reference_count']} | {z:+.1f} |")
    return "\n".join(lines) + "\n"


def markdown(rep: Any) -> str:
    """The report as markdown."""
    d = rep.as_dict() if hasattr(rep, "as_dict") else rep
    if d["reference"]["mode"] == "two-sample":
        return _markdown_two_sample(d)
    t, p, tv, n, s = d["test"], d["power"], d["tv"], d["n"], d["settings"]
    lines = [
        f"# Audit: {d['verdict'].upper()}",
        "",
        f"Engine `{d['engine']['model']}` at {d['engine']['base_url']}; reference: {d['reference']['mode']} "
        f"{d['reference']['name']} (logprobs: {d['reference']['logprobs']}; {d['reference']['exact']}).",
        "",
        f"Audited: {s['law']}; {s['length']}-token continuations at temperature {s['temperature']}, top_k "
        f"{s['top_k']}, top_p {s['top_p']}, min_p {s['min_p']}, penalties {s['penalties'] or 'none'}, logit_bias "
        f"{s['logit_bias'] or 'none'}; request fields {d['engine']['fields']} + {d['engine']['extra_body']}.",
        "",
        "| | |",
        "|---|---|",
        f"| verdict | **{d['verdict']}** |",
        f"| test | {t['name']} |",
        f"| N | {n['per_prompt']} per prompt x {len(d['prompts'])} prompt(s) = {n['total']} (planned "
        f"{n['planned_per_prompt']} per prompt) |",
        f"| alpha | {t['alpha']:g} |",
        f"| tolerance tau | {_fmt(t['tau'])} (measured reference float noise {_fmt(t['tau_measured_noise'])}; "
        f"noncentrality under the null {_fmt(t['lambda0'])}) |",
        f"| X^2, df | {_fmt(t['x2'])}, {t['df']} (bins per prompt {t['bins']}, pooled mass {_fmt(t['pooled_mass'])})"
        f" |",
        f"| p-value | {_fmt(t['pvalue'])} (chi-square {_fmt(t['p_chi_square'])}; {t['impossible_samples']} "
        f"zero-probability samples, {_fmt(t['p_impossible'])}) |",
        f"| estimated TV | {_fmt(tv['estimate'])} [{_fmt(tv['ci95'][0])}, {_fmt(tv['ci95'][1])}] (95%, plug-in, "
        f"biased up by sampling noise) |",
        f"| smallest TV detectable with power {p['power_goal']} | {_fmt_tv(p['min_detectable_tv'])} |",
        f"| power at TV {p['target_tv']} | {_fmt(p['power_at_target_tv'])} (N needed per prompt: "
        f"{p['n_needed_per_prompt']}) |",
        f"| time | {_fmt(d['seconds']['total'], 1)} s (reference {_fmt(d['seconds']['reference'], 1)} s, sampling "
        f"{_fmt(d['seconds']['sampling'], 1)} s, {_fmt(d['seconds']['samples_per_s'], 2)} samples/s) |",
    ]
    if d.get("logprobs"):
        lp = d["logprobs"]
        lines.append(f"| reported logprobs | max error {_fmt(lp['max_abs_error'])} nats over {lp['tokens_checked']} "
                     f"tokens |")
    if d.get("acceptance"):
        a = d["acceptance"]
        lines.append(f"| acceptance (engine-reported) | {a['accepted']} of {a['drafted']} drafts; per position "
                     f"{[round(x, 3) for x in a['per_position']]} |")
    for note in d.get("notes") or []:
        lines += ["", f"Note: {note}"]
    for prompt, rows in zip(d["prompts"], d["outcomes"], strict=True):
        lines += ["", f"## Prompt {json.dumps(prompt)}", "",
                  "| continuation | ended | observed | exact | count | (obs - exact) / se |",
                  "|---|---|---|---|---|---|"]
        total = max(sum(r["count"] for r in rows), 1)
        scored = []
        for r in rows:
            se = math.sqrt(max(r["expected"] * (1 - r["expected"]), 1e-12) / total)
            scored.append((r, (r["observed"] - r["expected"]) / se))
        show = sorted(scored, key=lambda x: -abs(x[1]))[:12]
        for r, z in sorted(show, key=lambda x: -x[0]["expected"]):
            lines.append(f"| {json.dumps(r['text'])} | {'eos' if r['ended'] else ''} | {r['observed']:.4f} | "
                         f"{r['expected']:.4f} | {r['count']} | {z:+.1f} |")
    return "\n".join(lines) + "\n"


def figure(rep: Any, path: Path) -> None:
    """Observed vs exact probability per continuation (every prompt, 95% binomial intervals), and the
    engine-reported acceptance per draft position when present."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = rep.as_dict() if hasattr(rep, "as_dict") else rep
    has_acc = bool(d.get("acceptance") and d["acceptance"]["per_position"])
    fig, axes = plt.subplots(1, 2 if has_acc else 1, figsize=(11 if has_acc else 7, 5), squeeze=False)
    ax = axes[0, 0]
    n = d["n"]["per_prompt"]
    two = d["reference"]["mode"] == "two-sample"  # both sides sampled: the difference has twice the variance
    for j, rows in enumerate(d["outcomes"]):
        e = [r["expected"] for r in rows]
        o = [r["observed"] for r in rows]
        err = [1.96 * math.sqrt(max(x * (1 - x), 1e-12) * (2 if two else 1) / max(n, 1)) for x in e]
        ax.errorbar(e, o, yerr=err, fmt="o", ms=4, alpha=0.8, label=f"prompt {j + 1}")
        zero = [r["observed"] for r in rows if r["expected"] <= 0 and r["count"]]
        if zero:
            ax.plot([0.0] * len(zero), zero, "rx", ms=8,
                    label=("not seen in the reference sample" if two else "reference probability 0") if j == 0
                    else None)
    top = max([r["expected"] for rows in d["outcomes"] for r in rows] +
              [r["observed"] for rows in d["outcomes"] for r in rows] + [0.01]) * 1.05
    ax.plot([0, top], [0, top], "k--", lw=1)
    ax.set_xlabel("reference endpoint's frequency (sampled; two-sample, approximate)" if two
                  else "exact probability (reference law)")
    ax.set_ylabel("observed frequency (engine)")
    ax.set_title(f"{d['verdict']}: p = {_fmt(d['test']['pvalue'])}, TV = {_fmt(d['tv']['estimate'])}, "
                 f"N = {d['n']['total']}")
    ax.legend(fontsize=8)
    if has_acc:
        prof = d["acceptance"]["per_position"]
        axes[0, 1].bar(range(1, len(prof) + 1), prof)
        axes[0, 1].set_xlabel("draft position")
        axes[0, 1].set_ylabel("acceptance (engine-reported)")
        axes[0, 1].set_ylim(0, 1)
        axes[0, 1].set_xticks(range(1, len(prof) + 1))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(rep: Any, out_dir: str | Path) -> Path:
    """``audit.json``, ``audit.md`` and ``audit.png`` in ``out_dir`` (made if missing)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "audit.json").write_text(to_json(rep, indent=1) + "\n")
    (out / "audit.md").write_text(markdown(rep))
    figure(rep, out / "audit.png")
    return out
