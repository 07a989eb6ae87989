"""Run a sweep: work units -> engine -> grader -> one JSON line each in ``RUN_DIR/results.jsonl``.

Crash safety. Each result line is written with one ``write`` call, flushed and ``os.fsync``-ed before the
next unit starts. On (re)start the runner reads the keys already in ``results.jsonl``, cuts a trailing
partial line (a kill mid-write) off the file, and runs only the missing units; so killing a run and starting
it again loses nothing that was complete and never writes a key twice. A lock file (``flock``) keeps two
runners out of one directory. ``shard=(I, N)`` splits a sweep across N processes or machines sharing the
directory: shard I runs its share of the units (:func:`shard_units`) and appends to ``results-I-of-N.jsonl``;
:func:`read_results` merges all result files. A unit that raises is logged to ``errors.jsonl`` (not to the
results) and retried on the next start.

Result line (schema 1)::

    key, schema, config_name, task, problem_id, method (rule name), params, label, baseline (label of the
    matched baseline), lossless, seed, gen_seed, settings, prompt_tokens, text, token_ids, finish_reason,
    grade {passed, score, extracted, detail}, be, tokens_per_round, ds (tokens/s), new_tokens, rounds,
    drafted, accepted, emitted_accepted, accepted_fraction, proposed_nodes, per_round [[drafted, accepted], ...],
    per_round_emitted (BE counts only emitted accepted drafts),
    timings {draft_s, target_s, verify_s, other_s, total_s, grade_s}, finished_at (UTC ISO time)

The engine comes from ``engine_factory(config)``; the default loads the configured real pair through
:func:`verispec.api.load_engine`, or a tiny random pair for ``target = "toy"`` (tests and dry runs).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verispec import api
from verispec.defaults import DEFAULT_BATCH_SIZE, DEFAULT_VERIFIER
from verispec.eval.grid import SweepConfig, WorkUnit, expand, load_config, shard_units
from verispec.eval.store import (
    SCHEMA,
    append_line,
    locked,
    log_failure,
    now,
    read_results,
    repair_tail,
    shard_results_name,
    write_atomic,
)
from verispec.eval.tasks import get_task
from verispec.eval.tasks.base import Grade, Problem
from verispec.runtime.scheduler import Scheduler
from verispec.runtime.types import GenerationResult, Request
from verispec.toy import toy_engine as make

__all__ = [
    "RunPlan",
    "RunSummary",
    "UnitExecutor",
    "default_engine_factory",
    "encode_problem",
    "load_problems",
    "open_run",
    "run_sweep",
    "run_unit",
    "toy_engine",
]


EngineFactory = Callable[[SweepConfig], Any]


def toy_engine(cfg: SweepConfig | None = None, vocab_size: int = 64) -> Any:
    """The tiny random pair of :func:`verispec.toy.toy_engine` with the config's drafter: a sweep in seconds."""

    if cfg is None:
        return make("model", vocab_size)
    return make(cfg.drafter, vocab_size, deterministic=cfg.deterministic)


def default_engine_factory(cfg: SweepConfig) -> Any:
    """The configured pair via :func:`verispec.api.load_engine` (``target = "toy"``: :func:`toy_engine`)."""
    if cfg.target == "toy":
        if cfg.threads:
            import torch

            torch.set_num_threads(cfg.threads)
        return toy_engine(cfg)

    return api.load_engine(cfg.target, cfg.draft if cfg.uses_draft else None, cfg.drafter, cfg.dtype, cfg.threads,
                           device=cfg.device, target_backend=cfg.target_backend, deterministic=cfg.deterministic)


# ------------------------------------------------------------------------------------------------- running


def load_problems(cfg: SweepConfig) -> dict[str, list[Problem]]:
    """Problems of every task of the config (limit and subset applied); ValueError naming the ``subset`` entries
    that select no problem (neither a problem id nor a category / language of one)."""
    out = {}
    for t in cfg.tasks:
        task = get_task(t.name, **cfg.task_options(t.name))
        if not t.subset:
            out[t.name] = task.load(limit=t.limit)
            continue
        try:
            problems = task.load(subset=list(t.subset))  # every loader's limit keeps a prefix: applied below
        except KeyError as exc:
            raise ValueError(f"subset of task {t.name!r}: unknown entry {exc.args[0]!r}") from None
        found = {p.id for p in problems} | {str(v) for p in problems for k, v in p.meta.items()
                                           if k in ("category", "language")}
        unknown = [s for s in t.subset if s not in found]
        if unknown:
            raise ValueError(f"subset of task {t.name!r}: {', '.join(map(repr, unknown))} match(es) no problem "
                             "id (nor category / language) of the task")
        out[t.name] = problems if t.limit is None else problems[: max(0, t.limit)]
    return out


def encode_problem(engine: Any, problem: Problem) -> list[int]:
    """Prompt token ids: the problem's messages rendered with the tokenizer's chat template."""
    tok = engine.tokenizer
    if tok is None or not hasattr(tok, "apply_chat_template"):
        raise ValueError("the engine has no tokenizer with a chat template")
    ids = tok.apply_chat_template(problem.messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, Mapping):  # a BatchEncoding
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def unit_request(unit: WorkUnit, cfg: SweepConfig, prompt_ids: list[int]) -> Request:
    """The engine request of one unit: its rule, the sweep's sampling settings, its own seed."""
    return Request(prompt_ids, rule=cfg.build(unit.method), sampling=cfg.sampling_config(), gamma=cfg.gamma,
                   max_new_tokens=cfg.max_tokens(unit.task), seed=unit.gen_seed, verifier=cfg.verifier,
                   budget=unit.method.budget_spec())


def run_unit(unit: WorkUnit, engine: Any, task: Any, problem: Problem, cfg: SweepConfig,
             prompt_ids: list[int] | None = None) -> dict:
    """Generate and grade one unit on its own; return its result line (a dict)."""
    ids = prompt_ids if prompt_ids is not None else encode_problem(engine, problem)
    req = unit_request(unit, cfg, ids)
    res = engine.generate(ids, rule=req.rule, sampling=req.sampling, gamma=req.gamma,
                          max_new_tokens=req.max_new_tokens, seed=req.seed, verifier=req.verifier, budget=req.budget)
    return unit_record(unit, task, problem, cfg, ids, res)


def unit_record(unit: WorkUnit, task: Any, problem: Problem, cfg: SweepConfig, ids: list[int],
                res: GenerationResult) -> dict:
    """Grade a unit's generation and build its result line."""
    t0 = time.perf_counter()
    try:
        grade = task.grade(problem, res.text)
    except Exception as exc:  # a grader bug must not stop the sweep; the line says what happened
        grade = Grade(False, 0.0, f"grader error: {type(exc).__name__}: {exc}"[:500], None)
    grade_s = time.perf_counter() - t0
    m = res.metrics
    return {
        "key": unit.key,
        "schema": SCHEMA,
        "config_name": cfg.name,
        "task": unit.task,
        "problem_id": unit.problem_id,
        "method": unit.method.rule,
        "params": unit.method.param_dict(),
        "label": unit.method.label,
        "baseline": cfg.baseline_of(unit.method).label,
        "lossless": unit.method.lossless,
        "seed": unit.seed,
        "gen_seed": unit.gen_seed,
        "settings": cfg.settings(unit.task),
        "prompt_tokens": len(ids),
        "text": res.text,
        "token_ids": res.token_ids,
        "finish_reason": res.finish_reason,
        "grade": grade_record(task, grade),
        "be": m.block_efficiency,
        "tokens_per_round": m.tokens_per_round,
        "ds": m.tokens_per_s,
        "new_tokens": m.new_tokens,
        "rounds": m.rounds,
        "drafted": m.drafted,
        "accepted": m.accepted,
        "emitted_accepted": m.emitted_accepted,
        "accepted_fraction": m.accepted_fraction,
        "proposed_nodes": m.proposed_nodes,
        "per_round": [list(r) for r in m.per_round],
        "per_round_emitted": list(m.per_round_emitted),
        "timings": {"draft_s": m.draft_s, "target_s": m.target_s, "verify_s": m.verify_s, "other_s": m.other_s,
                    "total_s": m.total_s, "grade_s": grade_s},
        **({"budget": _budget_record(m.budget)} if m.budget else {}),
        "finished_at": now(),
    }


def grade_record(task: Any, grade: Grade) -> dict:
    """A result line's ``grade``: pass, score, what was graded, why, and the task's grader (its settings)."""
    out = {"passed": bool(grade.passed), "score": float(grade.score), "extracted": grade.extracted,
           "detail": grade.detail}
    if getattr(task, "grader", None) is not None:  # tasks that name their grader (their settings) record it
        out["grader"] = task.grader
    return out


def _budget_record(report: dict) -> dict:
    """A unit's divergence budget: what was asked, the spent TV, and per emitted token the parameter and the
    position's TV (6 significant digits)."""
    return {"budget": report["budget"], "param": report["param"], "spent": report["spent"],
            "theta": [float(f"{t:.6g}") for t in report["theta"]], "tv": [float(f"{t:.6g}") for t in report["tv"]]}


class UnitExecutor:
    """Runs the units of one sweep on one loaded engine (:func:`run_unit`); caches the task objects and each
    problem's encoded prompt. The local runner uses one; each Ray worker (:mod:`.ray_runner`) holds one."""

    def __init__(self, cfg: SweepConfig, engine: Any, problems: Mapping[str, Sequence[Problem]]) -> None:
        self.cfg = cfg
        self.engine = engine
        self.tasks = {name: get_task(name, **cfg.task_options(name)) for name in problems}
        self.problems = {(name, p.id): p for name, ps in problems.items() for p in ps}
        self.prompts: dict[tuple[str, str], list[int]] = {}

    def prompt(self, unit: WorkUnit) -> list[int]:
        """The unit's encoded prompt (cached per problem)."""
        pkey = (unit.task, unit.problem_id)
        if pkey not in self.prompts:
            self.prompts[pkey] = encode_problem(self.engine, self.problems[pkey])
        return self.prompts[pkey]

    def __call__(self, unit: WorkUnit) -> dict:
        """Generate and grade ``unit`` on its own; return its result line (exceptions propagate to the caller)."""
        pkey = (unit.task, unit.problem_id)
        return run_unit(unit, self.engine, self.tasks[unit.task], self.problems[pkey], self.cfg, self.prompt(unit))


@dataclass
class RunSummary:
    run_dir: Path
    total: int = 0
    skipped: int = 0
    completed: int = 0
    failed: int = 0
    repaired_bytes: int = 0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)


def _check_settings(run_dir: Path, cfg: SweepConfig) -> None:
    path = run_dir / "config.json"
    if not path.exists():
        return
    old = json.loads(path.read_text())
    new = cfg.to_json()
    keys = ("temperature", "sampling", "gamma", "max_new_tokens", "target", "drafter", "dtype")
    diff = [k for k in keys if old.get(k) != new.get(k)]
    # runs made before the option existed ran their baselines with the draft truncated too
    if old.get("baseline_draft_truncation", "same") != new.get("baseline_draft_truncation", "same"):
        diff.append("baseline_draft_truncation")
    if old.get("target_backend", "hf") != new.get("target_backend", "hf"):  # runs before the key ran transformers
        diff.append("target_backend")
    # runs made before the option existed shared the random numbers across methods ("common")
    if old.get("coupling", "common") != new.get("coupling", "common"):
        diff.append(f"coupling {old.get('coupling', 'common')!r} vs {new.get('coupling', 'common')!r}")
    # runs made before the option existed verified token by token
    if old.get("verifier", DEFAULT_VERIFIER) != new.get("verifier", DEFAULT_VERIFIER):
        diff.append(f"verifier {old.get('verifier', DEFAULT_VERIFIER)!r} vs {new.get('verifier', DEFAULT_VERIFIER)!r}")
    if bool(old.get("deterministic", False)) != bool(new.get("deterministic", False)):
        diff.append(f"deterministic {bool(old.get('deterministic', False))} vs {bool(new.get('deterministic', False))}")
    if cfg.uses_draft and old.get("draft") != new.get("draft"):
        diff.append("draft")
    old_tasks = {t["name"]: t for t in old.get("tasks", [])}
    for t in new["tasks"]:
        prev = old_tasks.get(t["name"])
        if prev is not None and prev.get("max_new_tokens") != t.get("max_new_tokens"):
            diff.append(f"max_new_tokens of {t['name']}")
        if prev is not None and (prev.get("options") or {}) != (t.get("options") or {}):
            diff.append(f"options of {t['name']}")
    if diff:
        raise ValueError(f"{run_dir} holds results of a sweep with different settings ({', '.join(diff)}); "
                         "use another --out directory")


def _check_engine(run_dir: Path, engines: set[str], engine: Any) -> None:
    """A run directory holds one engine's results (``engines``: the ``engine`` of its lines; none: verispec's
    own): a unit done by another engine is not this one's, so a run that would mix them is refused (the engine is
    closed first)."""
    name = getattr(engine, "engine_name", None) or "local"
    others = sorted(engines - {name})
    if others:
        if callable(getattr(engine, "close", None)):
            engine.close()
        raise ValueError(f"{run_dir} holds results of the {', '.join(others)} engine; this run's engine is "
                         f"{name} (--engine): use another --out directory")


@dataclass
class RunPlan:
    """What one invocation of a sweep runs, as :func:`open_run` found it while holding the run's lock."""

    cfg: SweepConfig  # the grid restricted by limit / tasks / seeds / methods
    problems: dict[str, list[Problem]]
    todo: list[WorkUnit]  # units not done by any earlier run, in grid order (shard and max_units applied)
    results_path: Path  # the one file this invocation appends to
    summary: RunSummary
    engines: set[str]  # the engines whose results the directory holds ("local": verispec's own)


@contextlib.contextmanager
def open_run(
    config: SweepConfig | str | Path,
    out_dir: str | Path,
    *,
    limit: int | None = None,
    tasks: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
    max_units: int | None = None,
    log: Callable[[str], None] | None = None,
    shard: tuple[int, int] | None = None,
    methods: Sequence[str] | None = None,
) -> Iterator[RunPlan]:
    """Lock ``out_dir``, check and record the sweep's settings, repair a torn last line and find the pending
    units; yield them as a :class:`RunPlan` and hold the lock until the block ends. Arguments as
    :func:`run_sweep`'s; every runner (local, sharded, Ray) starts here."""
    if shard is not None:
        if shard[1] == 1:
            shard = None
        elif not 0 <= shard[0] < shard[1]:
            raise ValueError(f"shard I/N needs 0 <= I < N, got {shard[0]}/{shard[1]}")
    results_path = Path(out_dir) / shard_results_name(shard)
    run_dir = Path(out_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    src_path = None
    if not isinstance(config, SweepConfig):
        src_path = Path(config)
        config = load_config(src_path)
    cfg = config.restricted(limit=limit, tasks=tasks, seeds=seeds, methods=methods)
    say = log or (lambda s: None)
    summary = RunSummary(run_dir)
    with locked(run_dir, shard):
        _check_settings(run_dir, config)
        if src_path is not None and not (run_dir / "config.toml").exists():
            write_atomic(run_dir / "config.toml", src_path.read_text())
        if not (run_dir / "config.json").exists():
            write_atomic(run_dir / "config.json", json.dumps(config.to_json(), indent=1) + "\n")
        problems = load_problems(cfg)
        units = expand(cfg, {k: [p.id for p in v] for k, v in problems.items()})
        write_atomic(run_dir / "run.json", json.dumps(
            {"grid": cfg.to_json(), "units": len(units), "started_at": now()}, indent=1) + "\n")
        if shard is not None:
            units = shard_units(units, shard)
        summary.total = len(units)
        summary.repaired_bytes = repair_tail(results_path)
        if summary.repaired_bytes:
            say(f"cut a partial last line ({summary.repaired_bytes} bytes) off {results_path}")
        stored = read_results(run_dir)
        done = {r["key"] for r in stored}
        engines = {r.get("engine") or "local" for r in stored}
        todo = [u for u in units if u.key not in done]
        summary.skipped = len(units) - len(todo)
        if max_units is not None:
            todo = todo[:max_units]
        where = "in the grid" if shard is None else f"in shard {shard[0]}/{shard[1]}"
        say(f"{len(units)} units {where}, {summary.skipped} already done, {len(todo)} to run")
        yield RunPlan(cfg, problems, todo, results_path, summary, engines)


def run_sweep(
    config: SweepConfig | str | Path,
    out_dir: str | Path,
    *,
    engine_factory: EngineFactory | None = None,
    limit: int | None = None,
    tasks: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
    progress: bool = True,
    max_units: int | None = None,
    log: Callable[[str], None] | None = None,
    shard: tuple[int, int] | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    methods: Sequence[str] | None = None,
) -> RunSummary:
    """Run (or resume) a sweep into ``out_dir``; see the module docstring for the guarantees.

    ``config``: a :class:`SweepConfig` or a TOML path (copied verbatim to ``out_dir/config.toml``).
    ``limit``/``tasks``/``seeds``/``methods`` (setting labels) shrink the grid; ``max_units`` stops after that
    many new units. ``shard=(I, N)`` runs shard I's share of the grid (:func:`shard_units`), appending to
    ``results-I-of-N.jsonl``: N processes (or machines sharing the directory) split one sweep. Units done by
    any earlier run, sharded or not, are skipped, so a sweep can switch between sharded and unsharded runs.
    ``batch_size``: units decoded at once as rows of one batch (continuous batching: a finished unit is graded
    and written at once, and the next unit joins); each unit keeps its own seed, so results do not depend on it.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    start = time.perf_counter()
    say = log or (lambda s: None)
    with open_run(config, out_dir, limit=limit, tasks=tasks, seeds=seeds, max_units=max_units, log=say,
                  shard=shard, methods=methods) as plan:
        cfg, todo, summary, run_dir = plan.cfg, plan.todo, plan.summary, plan.summary.run_dir
        if not todo:
            summary.seconds = time.perf_counter() - start
            return summary
        engine = (engine_factory or default_engine_factory)(cfg)
        _check_engine(run_dir, plan.engines, engine)
        execute = UnitExecutor(cfg, engine, plan.problems)
        bar = _progress(len(todo), progress)
        stats = {"passed": 0, "be": 0.0}

        def fail(unit: WorkUnit, exc: BaseException | str) -> None:  # logged; the unit is retried on the next start
            summary.failed += 1
            msg = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
            summary.failures.append(f"{unit.key}: {msg}")
            log_failure(run_dir, unit.key, msg)
            say(f"FAILED {unit.key}: {msg}")
            tick(unit)

        def tick(unit: WorkUnit) -> None:
            if bar is not None:
                bar.update(1)
                n = max(summary.completed, 1)
                bar.set_postfix_str(f"{unit.task} {unit.method.label} | BE {stats['be'] / n:.2f} "
                                    f"acc {100 * stats['passed'] / n:.0f}%", refresh=False)

        def finish(out: Any, unit: WorkUnit, ids: list[int], res: GenerationResult) -> None:
            problem = execute.problems[(unit.task, unit.problem_id)]
            rec = unit_record(unit, execute.tasks[unit.task], problem, cfg, ids, res)
            if getattr(execute.engine, "engine_name", None):
                rec["engine"] = execute.engine.engine_name
            append_line(out, rec)
            summary.completed += 1
            stats["passed"] += rec["grade"]["passed"]
            stats["be"] += rec["be"]
            tick(unit)

        if getattr(execute.engine, "generates_batches", False):
            _run_batches(execute, todo, cfg, plan.results_path, batch_size, finish, fail)
            todo = []
        sched = Scheduler(execute.engine, max_batch=batch_size)
        with open(plan.results_path, "ab") as out:
            # the Scheduler is the one queue: every unit waits there and joins the batch as a row frees up
            # (continuous batching, in grid order); a finished unit is graded and written at once
            def done(handle: Any, unit: WorkUnit, ids: list[int]) -> None:
                if handle.error is not None:
                    fail(unit, handle.error)  # "ExceptionType: message" of the failed round
                    return
                try:
                    finish(out, unit, ids, handle.result)
                except Exception as exc:
                    fail(unit, exc)

            for unit in todo:
                try:
                    ids = execute.prompt(unit)
                    sched.submit(unit_request(unit, cfg, ids), on_done=lambda h, u=unit, i=ids: done(h, u, i))
                except Exception as exc:
                    fail(unit, exc)
            while not sched.idle:
                try:
                    sched.step()
                except Exception:  # the round's rows failed (their on_done saw the error); the rest go on
                    continue
        if bar is not None:
            bar.close()
    summary.seconds = time.perf_counter() - start
    return summary


def _run_batches(execute: UnitExecutor, todo: Sequence[WorkUnit], cfg: SweepConfig, results_path: Path,
                 batch_size: int, finish: Callable, fail: Callable) -> None:
    """Units through an engine that schedules whole batches itself (``generates_batches``: vLLM), ``batch_size``
    units per call; each unit carries its rule as a ``verification`` object (the server's and vLLM's form)."""
    with open(results_path, "ab") as out:
        for start in range(0, len(todo), batch_size):
            units, ids, reqs = [], [], []
            for unit in todo[start : start + batch_size]:
                try:
                    i = execute.prompt(unit)
                    reqs.append(unit_request(unit, cfg, i))
                    units.append(unit)
                    ids.append(i)
                except Exception as exc:
                    fail(unit, exc)
            if not units:
                continue
            verifications = [{"rule": u.method.rule, "params": u.method.param_dict()} for u in units]
            try:
                results = execute.engine.generate_batch(reqs, verifications)
            except Exception as exc:  # the whole call failed: every unit of it is retried next time
                for unit in units:
                    fail(unit, exc)
                continue
            for unit, i, res in zip(units, ids, results, strict=True):
                try:
                    finish(out, unit, i, res)
                except Exception as exc:
                    fail(unit, exc)


def _progress(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="unit", dynamic_ncols=True, smoothing=0.1)
