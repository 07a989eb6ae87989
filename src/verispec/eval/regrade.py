"""Re-grade a run from its stored completions, without generating anything: ``verispec bench regrade RUN``.

Each result line's ``text`` is graded again by its task as the task grades now (the sandbox's packages and limits
included: the line's ``grade.grader`` says which grader made its grade). Reported per setting: how many units
were regraded and how many grades changed each way. With ``write``, every results file of the run is rewritten
(atomically, under the run's exclusive lock, so never beside a running sweep) with the new grades; a changed
line keeps its old grade as ``grade_before``. The lines' order, keys and everything else stay as they were, so
``verispec bench report`` then regenerates the reports from the regraded lines.
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
from verispec.eval.run import grade_record, load_problems
from verispec.eval.store import locked, results_files, write_atomic
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
        lines = {f: [json.loads(x) for x in f.read_text().splitlines() if x.strip()] for f in files}
        problems = {(name, p.id): p for name, ps in load_problems(cfg).items() for p in ps}
        tasks = {name: get_task(name, **cfg.task_options(name)) for name in {t.name for t in cfg.tasks}}
        records = [r for recs in lines.values() for r in recs]

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
        for r, g in zip(records, new, strict=True):
            counts = summary.per_setting.setdefault(r["label"], {"units": 0, "to_pass": 0, "to_fail": 0})
            counts["units"] += 1
            before, now = bool(r["grade"]["passed"]), bool(g["passed"])
            if before != now:
                counts["to_pass" if now else "to_fail"] += 1
                summary.changed.append((r["key"], before, now, str(g["detail"])))
                r["grade_before"] = r["grade"]
            r["grade"] = g
        if write:
            for f, recs in lines.items():
                write_atomic(f, "".join(json.dumps(r) + "\n" for r in recs))
            summary.written = True
    return summary
