"""Reading stored runs back: ``bench regrade`` sees a run's lines as the reports do (a partial last line left by a
kill is no result; a malformed line names its file and line; a run extended past config.json's limit is graded
against its own problems), and the reports refuse a result line they would misread instead of tabulating it."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from verispec.eval.grid import parse_config
from verispec.eval.regrade import regrade
from verispec.eval.report import load_frame, write_report
from verispec.eval.run import run_sweep
from verispec.eval.store import read_results
from verispec.eval.tasks.toy import ALPHABET


def _config(limit: int) -> dict:
    return {"name": "stored", "seeds": [0], "gamma": 3, "max_new_tokens": 6, "temperature": 1.0,
            "models": {"target": "toy"}, "tasks": [{"name": "toy", "limit": limit}],
            "methods": [{"rule": "lossless"}]}


@pytest.fixture(scope="module")
def extended_run(tmp_path_factory):
    """A toy run of 2 problems extended to 3 (config.json keeps limit 2), every output holding its letter."""
    run = tmp_path_factory.mktemp("stored") / "run"
    run_sweep(parse_config(_config(2)), run, progress=False)
    run_sweep(parse_config(_config(3)), run, progress=False)
    path = run / "results.jsonl"
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    for r in recs:  # outputs that pass (the toy task passes an output holding the problem's letter)
        r["text"] = ALPHABET[int(r["problem_id"].split("/")[1])]
        r["grade"].update(passed=True, score=1.0)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert json.loads((run / "config.json").read_text())["tasks"][0]["limit"] == 2 and len(recs) == 3
    return run


def _copy(run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(run, out)
    return out


def test_regrade_grades_problems_past_the_limit_config_json_records(extended_run, tmp_path):
    run = _copy(extended_run, tmp_path)
    summary = regrade(run, write=True, workers=1)
    assert summary.units == 3 and summary.changed == []  # toy/2 is not "grader error: KeyError" -> fail
    assert all(r["grade"]["passed"] for r in read_results(run))


def test_regrade_skips_a_partial_last_line_as_the_reports_do(extended_run, tmp_path):
    run = _copy(extended_run, tmp_path)
    path = run / "results.jsonl"
    complete = path.read_text()
    path.write_text(complete + '{"key": "toy|toy/9|lossless|s0", "schema": 1, "te')  # a kill mid-write
    assert len(read_results(run)) == 3
    summary = regrade(run, workers=1)
    assert summary.units == 3 and summary.changed == []
    regrade(run, write=True, workers=1)
    text = path.read_text()  # the partial line dropped, as the next run's repair would; the complete ones kept
    assert text.endswith("\n") and [json.loads(x)["key"] for x in text.splitlines()] == [
        json.loads(x)["key"] for x in complete.splitlines()]


def test_regrade_names_a_malformed_line(extended_run, tmp_path):
    run = _copy(extended_run, tmp_path)
    path = run / "results.jsonl"
    lines = path.read_text().splitlines()
    lines[1] = lines[1][:40]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"results\.jsonl:2: malformed result line"):
        regrade(run, workers=1)


def test_regrade_counts_a_key_once(extended_run, tmp_path):
    run = _copy(extended_run, tmp_path)
    first = (run / "results.jsonl").read_text().splitlines()[0]
    (run / "results-0-of-2.jsonl").write_text(first + "\n")  # the same unit in a second file
    assert regrade(run, workers=1).units == 3


@pytest.mark.parametrize(("change", "match"), [
    (lambda r: r.update(rounds=None), "'rounds' must be a non-negative integer, got None"),
    (lambda r: r.pop("accepted"), "'accepted' missing"),
    (lambda r: r["grade"].update(passed="false"), "'grade.passed' must be bool"),
    (lambda r: r["timings"].pop("total_s"), "'timings.total_s' missing"),
    (lambda r: r.update(schema=2), "schema 2"),
])
def test_reports_refuse_a_line_they_would_misread(extended_run, tmp_path, change, match):
    run = _copy(extended_run, tmp_path)
    path = run / "results.jsonl"
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    load_frame(run)  # as written: fine
    change(recs[1])
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    with pytest.raises(ValueError, match=re.escape(f"result line '{recs[1]['key']}'") + ".*" + re.escape(match)):
        write_report(run)
