"""The small interface every task implements, and how tasks find their packaged data files."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

Message = dict[str, str]


@dataclass(frozen=True)
class Problem:
    """One benchmark item.

    ``messages`` is the chat prompt (``[{"role": ..., "content": ...}]``) to render with the
    model's chat template; ``reference`` is the task-specific payload its grader needs (expected
    answer, hidden tests, possible answers ...); ``meta`` holds extras (language, category ...).
    """

    task: str
    id: str
    messages: list[Message]
    reference: Any
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Grade:
    """A grader's verdict: ``passed`` (the task's pass criterion), ``score`` in [0, 1],
    a human-readable ``detail`` and the answer ``extracted`` from the completion (if any)."""

    passed: bool
    score: float
    detail: str
    extracted: str | None = None


@runtime_checkable
class Task(Protocol):
    """A benchmark: loads problems from installed package data and grades completions.

    ``subset`` is task-specific (HumanEval/GSM: problem ids; MGSM: language codes; CHAMP:
    categories; BFCL: categories); ``limit`` keeps the first ``limit`` problems after subsetting.
    """

    name: str

    def load(self, limit: int | None = None, subset: Sequence[str] | str | None = None
             ) -> list[Problem]: ...

    def grade(self, problem: Problem, completion_text: str) -> Grade: ...


def package_dir(module: str) -> Path:
    """Directory of an installed top-level package, found WITHOUT importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {module!r} is not installed; see requirements-data.txt")
    return Path(next(iter(spec.submodule_search_locations)))


def as_list(subset: Sequence[str] | str | None) -> list[str] | None:
    """Normalize a ``subset`` argument to a list (or None for everything)."""
    if subset is None:
        return None
    return [subset] if isinstance(subset, str) else list(subset)


def take(items: list[Problem], limit: int | None) -> list[Problem]:
    """The first ``limit`` items (all when ``limit`` is None)."""
    return items if limit is None else items[: max(0, limit)]
