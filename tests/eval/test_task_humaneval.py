"""HumanEval: 164 problems; every canonical solution passes in the sandbox, wrong ones fail."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from verispec.eval.tasks import get_task
from verispec.eval.tasks.humaneval import build_program, extract_code

TASK = get_task("humaneval")
PROBLEMS = TASK.load()


def _grade_all(completions: list[str]):
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(TASK.grade, PROBLEMS, completions))


def test_count_and_prompt():
    assert len(PROBLEMS) == 164
    assert len({p.id for p in PROBLEMS}) == 164
    p = PROBLEMS[0]
    assert p.task == "humaneval" and p.id == "HumanEval/0"
    assert p.messages[0]["role"] == "user" and "```python" in p.messages[0]["content"]
    assert p.reference["prompt"] in p.messages[0]["content"]
    assert [q.id for q in TASK.load(limit=3)] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert [q.id for q in TASK.load(subset=["HumanEval/7"])] == ["HumanEval/7"]


@pytest.mark.slow
def test_all_canonical_solutions_pass():
    grades = _grade_all([p.reference["canonical_solution"] for p in PROBLEMS])
    failed = [(p.id, g.detail) for p, g in zip(PROBLEMS, grades, strict=True) if not g.passed]
    assert not failed


@pytest.mark.slow
def test_wrong_solutions_fail():
    grades = _grade_all(["    return None\n"] * len(PROBLEMS))
    passed = [p.id for p, g in zip(PROBLEMS, grades, strict=True) if g.passed]
    assert not passed


def test_completion_shapes():
    p = PROBLEMS[2]  # truncate_number(number) -> number % 1.0
    body = "    return number % 1.0\n"
    full = p.reference["prompt"] + body
    shapes = {
        "bare body": body,
        "unindented body": "return number % 1.0",
        "fenced full function": f"Sure!\n```python\n{full}```\nThat's it.",
        "fenced, no language": f"```\ndef truncate_number(number: float) -> float:\n{body}```",
        "unterminated fence": f"```python\ndef truncate_number(number):\n{body}",
        "signature repeated with helper": "```python\ndef helper(x):\n    return x % 1.0\n\n"
                                          "def truncate_number(number):\n    return helper(number)\n```",
    }
    for name, completion in shapes.items():
        grade = TASK.grade(p, completion)
        assert grade.passed, (name, grade)
    assert not TASK.grade(p, "```python\ndef truncate_number(number):\n    return 0.0\n```").passed
    assert not TASK.grade(p, "I cannot do that.").passed


def test_helpers_from_the_prompt_stay_available():
    p = next(q for q in PROBLEMS if q.id == "HumanEval/38")  # decode_cyclic uses encode_cyclic
    code = "```python\ndef decode_cyclic(s: str):\n    return encode_cyclic(encode_cyclic(s))\n```"
    assert TASK.grade(p, code).passed
    assert "def encode_cyclic" in build_program(p.reference["prompt"], extract_code(code, "decode_cyclic"),
                                                "decode_cyclic")


def test_hostile_completions_fail_and_grading_goes_on():
    task = type(TASK)(timeout_s=2)
    p = PROBLEMS[2]
    hostile = [
        "    import time\n    while True: time.sleep(1)\n",
        "    open('/tmp/verispec_pwned', 'w').write('x')\n    return number % 1.0\n",
        "    import socket; socket.create_connection(('127.0.0.1', 80))\n    return number % 1.0\n",
        "    import os; os.fork()\n    return number % 1.0\n",
    ]
    for code in hostile:
        assert not task.grade(p, code).passed, code
    assert task.grade(p, "    return number % 1.0\n").passed


def test_an_exit_before_the_hidden_tests_fails():
    """A program that exits with status 0 before check() ran (a bare exit in its module code) used to pass on its
    exit status alone; the marker printed after check() is missing, so it fails."""
    p = PROBLEMS[2]
    for code in ("def truncate_number(number):\n    return 0\n\nimport sys\nsys.exit(0)\n",
                 "def truncate_number(number):\n    return 0\n\nimport os\nos._exit(0)\n"):
        g = TASK.grade(p, f"```python\n{code}```")
        assert not g.passed and "before the hidden tests finished" in g.detail, (code, g)
    # a main block does not run, as in the reference harness (it execs the program in fresh globals): a wrong
    # answer fails on its tests and a right one passes, whatever the block does
    main = "\n\nif __name__ == '__main__':\n    raise SystemExit\n"
    wrong = TASK.grade(p, f"```python\ndef truncate_number(number):\n    return 0{main}```")
    assert not wrong.passed and "before the hidden tests" not in wrong.detail
    assert TASK.grade(p, f"```python\ndef truncate_number(number):\n    return number % 1.0{main}```").passed
    chatty = "def truncate_number(number):\n    print('x' * 10, end='')\n    return number % 1.0\n"
    assert TASK.grade(p, f"```python\n{chatty}```").passed
