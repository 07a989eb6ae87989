"""Benchmark tasks read from installed packages' data files (no network, no heavy imports).

Each task module keeps its prompt and its grader together. Common interface::

    task = get_task("gsm")
    problems = task.load(limit=10)             # list[Problem]
    grade = task.grade(problems[0], "... \\boxed{42}")   # Grade(passed, score, detail, extracted)

Tasks: ``humaneval`` (164, graded by running hidden tests in ``verispec.eval.sandbox``),
``gsm`` (100 English GSM8K test questions), ``mgsm`` (the same questions in 17 other languages),
``champ`` (270 competition-math problems), ``bfcl`` (simple/multiple/parallel/parallel_multiple
Python function calling, 400/200/200/200); ``toy`` and ``toy2`` (fake tasks for tiny random models).
"""

from __future__ import annotations

from collections.abc import Callable

from verispec.eval.tasks.base import Grade, Message, Problem, Task
from verispec.eval.tasks.bfcl import BFCLTask
from verispec.eval.tasks.champ import ChampTask
from verispec.eval.tasks.gsm import GSMTask
from verispec.eval.tasks.humaneval import HumanEvalTask
from verispec.eval.tasks.mgsm import MGSMTask
from verispec.eval.tasks.toy import ToyTask
from verispec.registry import Registry

TASKS: Registry[Callable[..., Task]] = Registry("task", [
    ("humaneval", HumanEvalTask),
    ("gsm", GSMTask),
    ("mgsm", MGSMTask),
    ("champ", ChampTask),
    ("bfcl", BFCLTask),
    # fake tasks for tiny random models (tests, dry runs)
    ("toy", ToyTask),
    ("toy2", lambda: ToyTask("toy2", 12)),
])


def get_task(name: str, **options: object) -> Task:
    """A fresh instance of the task registered as ``name``, built with ``options`` (e.g. ``lenient=True`` for
    ``bfcl``); ValueError naming the option when the task does not take it."""
    factory = TASKS[name]
    try:
        return factory(**options)
    except TypeError as e:
        raise ValueError(f"task {name!r} does not take the option(s) {', '.join(sorted(options))}: {e}") from None


__all__ = ["TASKS", "Grade", "Message", "Problem", "Task", "get_task"]
