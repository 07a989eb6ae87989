"""Grading parity and regrading: HumanEval code may import numpy and sympy in the sandbox (still no writes
outside its scratch directory, still no other package), the reference harness's 3 s limit applies as CPU time of
the tested code, and ``verispec bench regrade`` re-grades a run's stored completions, reports the changes per
setting and, with --write, stores them (old grades kept), leaving everything else of the lines as it was."""

from __future__ import annotations

import json

from click.testing import CliRunner

from verispec.cli.main import main
from verispec.eval.grid import parse_config
from verispec.eval.run import run_sweep
from verispec.eval.sandbox import run_python
from verispec.eval.tasks.humaneval import REFERENCE_PACKAGES, HumanEvalTask


def test_reference_packages_import_and_nothing_else():
    res = run_python("import numpy as np, sympy\nprint(int(np.arange(4).sum()), sympy.isprime(97))",
                     packages=REFERENCE_PACKAGES, timeout_s=60)
    assert res.ok and res.stdout.split() == ["6", "True"], res.stderr[-500:]
    res = run_python("import numpy\nopen('/tmp/verispec-sandbox-escape', 'w')", packages=REFERENCE_PACKAGES)
    assert not res.ok and "PermissionError" in res.stderr
    res = run_python("import torch", packages=REFERENCE_PACKAGES)
    assert not res.ok and "No module named 'torch'" in res.stderr
    assert not run_python("import numpy").ok  # only where asked for


def test_humaneval_grades_numpy_solutions_and_spins_out_on_cpu():
    task = HumanEvalTask()
    problem = next(p for p in task.load() if p.id == "HumanEval/0")  # has_close_elements
    numpy_solution = ("```python\nimport numpy as np\ndef has_close_elements(numbers, threshold):\n"
                      "    a = np.sort(np.array(numbers, dtype=float))\n"
                      "    return bool(len(a) > 1 and (np.diff(a) < threshold).any())\n```")
    assert task.grade(problem, numpy_solution).passed
    spin = "```python\ndef has_close_elements(numbers, threshold):\n    while True:\n        pass\n```"
    g = task.grade(problem, spin)
    assert not g.passed and g.detail == "cpu"


def _run(tmp_path):
    cfg = parse_config({"name": "regrade", "seeds": [0], "gamma": 3, "max_new_tokens": 8, "temperature": 1.0,
                        "models": {"target": "toy"}, "tasks": [{"name": "toy", "limit": 3}],
                        "methods": [{"rule": "lossless"}, {"rule": "lenience", "params": {"l": 0.5}}]})
    run_sweep(cfg, tmp_path / "run", progress=False)
    return tmp_path / "run"


def test_regrade_reports_and_writes_changes(tmp_path):
    run = _run(tmp_path)
    path = run / "results.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    lines[1]["grade"]["passed"] = not lines[1]["grade"]["passed"]  # a stale grade
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    res = CliRunner().invoke(main, ["bench", "regrade", str(run), "--no-progress"])
    assert res.exit_code == 0, res.output
    assert f"1 of {len(lines)} grades changed" in res.output and "nothing written" in res.output
    assert json.loads(path.read_text().splitlines()[1])["grade"]["passed"] == lines[1]["grade"]["passed"]
    res = CliRunner().invoke(main, ["bench", "regrade", str(run), "--no-progress", "--write"])
    assert res.exit_code == 0 and "written to the result lines" in res.output
    after = [json.loads(x) for x in path.read_text().splitlines()]
    assert after[1]["grade"]["passed"] != lines[1]["grade"]["passed"]
    assert after[1]["grade_before"]["passed"] == lines[1]["grade"]["passed"]
    assert [a["key"] for a in after] == [r["key"] for r in lines]
    assert all(a["text"] == r["text"] and a["token_ids"] == r["token_ids"] for a, r in zip(after, lines, strict=True))
    res = CliRunner().invoke(main, ["bench", "regrade", str(run), "--no-progress"])
    assert f"0 of {len(lines)} grades changed" in res.output
    res = CliRunner().invoke(main, ["bench", "regrade", str(tmp_path), "--no-progress"])
    assert res.exit_code != 0 and "no config.json" in res.output
