"""Re-grade a run from its stored completions, without generating anything: ``verispec bench regrade RUN``.

Each result line's ``text`` is graded again by its task as the task grades now (the sandbox's packages and limits
included: the line's ``grade.grader`` says which grader made its grade). Reported per setting: how many units
were regraded and how many grades changed each way. With ``write``, every results file of the run is rewritten
(atomically, under the run's exclusive lock, so never beside a running sweep) with the new grades; a changed
line keeps its old grade as ``grade_before``. The lines' order, keys and everything else stay as they were (a
partial last line, left by a run killed mid-write, is not a result: it is skipped, and dropped on writing, as the
next ``bench run`` would cut it), so ``verispec bench report`` then regenerates the reports from the regraded lines.
A line is graded against its task's problem of that id, whatever limit config.json records (a run extended to more
problems keeps the config.json of its first invocation); counts are per key, as the reports read the lines.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verispec.eval.grid import SweepConfig
from verispec.eval.run import grade_record
from verispec.eval.store import locked, read_lines, results_files, write_atomic
from verispec.eval.tasks import get_task
from verispec.eval.tasks.base import Grade

__all__ = ["RegradeSummary", "regrade"]


@dataclass
class RegradeSummary:
    """Counts per setting label: ``units``, ``to_pass`` (failed before, passes now), ``to_fail``; ``changed``
    lists (key, before, now, detail now) of every unit whose pass/fail changed."""

    per_setting: dict[str, dict[str, int]] = field(default_factory=dict)
    changed: list[tuple[str, bool, bool, str]] = field(default_factory=list)
    written: bool = False

    @property
    def units(self) -> int:
        return sum(v["units"] for v in self.per_setting.values())

    def table(self) -> str:
        """A Markdown table of the counts (rows in the run's order)."""
        lines = ["| setting | units | fail -> pass | pass -> fail |", "|---|---|---|---|"]
        for label, v in self.per_setting.items():
            lines.append(f"| {label} | {v['units']} | {v['to_pass']} | {v['to_fail']} |")
        return "\n".join(lines)


def _task_options(cfg: SweepConfig, records: list[dict[str, Any]], name: str) -> dict[str, Any]:
    """The constructor options of task ``name``: the config's, or for a task added to the run after config.json
    was written, those its result lines record."""
    if any(t.name == name for t in cfg.tasks):
        return cfg.task_options(name)
    rec = next(r for r in records if r["task"] == name)
    return dict((rec.get("settings") or {}).get("task_options") or {})


def regrade(run_dir: str | Path, write: bool = False, workers: int | None = None,
            progress: Callable[[int, int], None] | None = None) -> RegradeSummary:
    """Grade every result line of ``run_dir`` again (``workers`` sandboxes at a time: default the CPU count);
    with ``write`` store the new grades. ValueError when the run has no config.json or no results."""
    run = Path(run_dir)
    if not (run / "config.json").exists():
        raise ValueError(f"{run} has no config.json: not a run directory")
    cfg = SweepConfig.from_json(json.loads((run / "config.json").read_text()))
    files = results_files(run)
    if not files:
        raise ValueError(f"{run} has no results")
    with locked(run):
        # the readers' view of the files: complete lines only (a kill mid-write leaves a partial last line, which
        # the next `bench run` cuts off and reruns), a malformed complete line is an error naming file and line
        lines = {f: read_lines(f) for f in files}
        records = [r for recs, _ in lines.values() for r in recs]
        tasks = {name: get_task(name, **_task_options(cfg, records, name)) for name in {r["task"] for r in records}}
        # every problem of each task, not only config.json's: a run extended to more problems (a larger limit)
        # keeps the config.json of its first invocation
        problems = {(name, p.id): p for name, task in tasks.items() for p in task.load()}
        unknown = sorted({r["key"] for r in records if (r["task"], r["problem_id"]) not in problems})
        if unknown:
            raise ValueError(f"{run}: {len(unknown)} result line(s) name a problem their task does not have, e.g. "
                             f"{unknown[0]!r}")

        def grade(r: dict[str, Any]) -> dict:
            task = tasks[r["task"]]
            try:
                g = task.grade(problems[(r["task"], r["problem_id"])], r["text"])
            except Exception as exc:  # as the runner does: a grader bug is a failed grade with its reason
                g = Grade(False, 0.0, f"grader error: {type(exc).__name__}: {exc}"[:500], None)
            return grade_record(task, g)

        done = 0
        new: list[dict] = []
        with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
            for g in pool.map(grade, records):
                new.append(g)
                done += 1
                if progress is not None:
                    progress(done, len(records))
        summary = RegradeSummary()
        seen: set[str] = set()
        for r, g in zip(records, new, strict=True):
            before, now = bool(r["grade"]["passed"]), bool(g["passed"])
            if before != now:
                r["grade_before"] = r["grade"]
            r["grade"] = g
            if r["key"] in seen:  # counted once, as the reports read it (first occurrence of a key)
                continue
            seen.add(r["key"])
            counts = summary.per_setting.setdefault(r["label"], {"units": 0, "to_pass": 0, "to_fail": 0})
            counts["units"] += 1
            if before != now:
                counts["to_pass" if now else "to_fail"] += 1
                summary.changed.append((r["key"], before, now, str(g["detail"])))
        if write:
            for f, (recs, _) in lines.items():  # a partial last line is dropped, as the runner's repair_tail does
                write_atomic(f, "".join(json.dumps(r) + "\n" for r in recs))
            summary.written = True
    return summary
