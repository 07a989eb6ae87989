"""A fake benchmark for tiny random models (``task = "toy"`` / ``"toy2"``): problem i asks for a letter and passes
when the output contains it. Exercises the whole harness in seconds, with no real model or data."""

from __future__ import annotations

from collections.abc import Sequence

from verispec.defaults import TOY_ALPHABET
from verispec.eval.tasks.base import Grade, Problem

__all__ = ["ALPHABET", "ToyTask"]

#: the toy tokenizer's symbols (:class:`verispec.toy.ToyTokenizer` reads them from the same place)
ALPHABET = TOY_ALPHABET


class ToyTask:
    """A fake benchmark for tiny random models: problem i passes when the output contains its letter."""

    def __init__(self, name: str = "toy", size: int = 20) -> None:
        self.name = name
        self.size = size

    def load(self, limit: int | None = None, subset: Sequence[str] | str | None = None) -> list[Problem]:
        wanted = None if subset is None else ({subset} if isinstance(subset, str) else set(subset))
        probs = [
            Problem(task=self.name, id=f"{self.name}/{i}",
                    messages=[{"role": "user", "content": f"write letter {ALPHABET[i % 26]} {i}"}],
                    reference=ALPHABET[i % 26])
            for i in range(self.size)
        ]
        probs = [p for p in probs if wanted is None or p.id in wanted]
        return probs if limit is None else probs[:limit]

    def grade(self, problem: Problem, completion_text: str) -> Grade:
        hit = problem.reference in completion_text
        return Grade(hit, float(hit), "letter found" if hit else "letter missing", problem.reference if hit else None)
