"""Bad input to `bench grid` / `bench report` / `generate` / `serve`: one clear error naming the config key or
CLI option, a non-zero exit status, never a traceback or a silently wrong result (toy target, seconds)."""

from __future__ import annotations

import importlib
import json

import pytest
from click.testing import CliRunner

import verispec.api
from verispec.cli.bench import bench
from verispec.cli.main import main
from verispec.eval.grid import parse_config
from verispec.testing import toy_engine

main_mod = importlib.import_module("verispec.cli.main")

BASE = """name = "r"
seeds = [0, 1]
max_new_tokens = 8
{top}
[models]
target = "toy"
[[tasks]]
name = "toy"
limit = 2
{task}
[[methods]]
rule = "spec-cascade"
params = {{ p_base = 0.3 }}
"""


def _grid(tmp_path, *args, top="", task="", text=None):
    path = tmp_path / "c.toml"
    path.write_text(text if text is not None else BASE.format(top=top, task=task))
    return CliRunner().invoke(bench, ["grid", str(path), *args])


def _refused(res, *words):
    assert res.exit_code != 0, res.output
    assert not isinstance(res.exception, Exception) or isinstance(res.exception, SystemExit), res.exception
    assert "Traceback" not in res.output
    for w in words:
        assert w in res.output, (w, res.output)


def test_grid_accepts_the_base_config(tmp_path):
    res = _grid(tmp_path)
    assert res.exit_code == 0, res.output
    assert "8 units" in res.output


# 1. [sampling] keys
def test_unknown_sampling_key_is_refused_naming_it_and_the_allowed_ones(tmp_path):
    _refused(_grid(tmp_path, top="[sampling]\nfoo = 1"), "[sampling]", "foo", "top_k")
    assert _grid(tmp_path, top="[sampling]\ntop_k = 5").exit_code == 0


# 2. malformed shapes
@pytest.mark.parametrize("top, task, words", [
    ("sampling = 5", "", ["sampling", "table"]),
    ('temperature = "hot"', "", ["temperature", "number"]),
    ("[sampling]\ntemperature = \"hot\"", "", ["temperature", "number"]),
    ("", "subset = 5", ["subset", "toy"]),
    ("verifier = 3", "", ["verifier", "string"]),
])
def test_malformed_shapes_are_refused_naming_the_key(tmp_path, top, task, words):
    _refused(_grid(tmp_path, top=top, task=task), *words)


@pytest.mark.parametrize("key", ["target", "draft", "drafter", "dtype", "device", "target_backend"])
def test_a_model_key_that_is_not_a_string_is_refused(tmp_path, key):
    text = BASE.format(top="", task="").replace('target = "toy"', f'target = "toy"\n{key} = 5'.replace(
        'target = "toy"\ntarget = 5', 'target = 5'))
    _refused(_grid(tmp_path, text=text), key, "string")


def test_a_task_name_or_rule_that_is_not_a_string_is_refused(tmp_path):
    _refused(_grid(tmp_path, text=BASE.format(top="", task="").replace('name = "r"', "name = { a = 1 }")),
             "name", "string")
    _refused(_grid(tmp_path, text=BASE.format(top="", task="").replace('name = "toy"', "name = 7")), "name", "string")
    _refused(_grid(tmp_path, text=BASE.format(top="", task="").replace('rule = "spec-cascade"', "rule = [1]")),
             "rule", "string")


def test_models_not_a_table_is_refused(tmp_path):
    text = 'models = 5\n[[tasks]]\nname = "toy"\n[[methods]]\nrule = "lossless"\n'
    _refused(_grid(tmp_path, text=text), "models", "table")


@pytest.mark.parametrize("section", ["tasks", "methods"])
def test_a_table_where_an_array_of_tables_belongs_is_refused(tmp_path, section):
    tasks = '[tasks]\nname = "toy"\n' if section == "tasks" else '[[tasks]]\nname = "toy"\n'
    methods = '[methods]\nrule = "lossless"\n' if section == "methods" else '[[methods]]\nrule = "lossless"\n'
    text = '[models]\ntarget = "toy"\n' + tasks + methods
    _refused(_grid(tmp_path, text=text), f"[[{section}]]", "array of tables")


# 3. pair_baselines
@pytest.mark.parametrize("value", ['"false"', '"no"', "1"])
def test_pair_baselines_must_be_a_boolean(tmp_path, value):
    _refused(_grid(tmp_path, top=f"pair_baselines = {value}"), "pair_baselines", "true or false")
    res = _grid(tmp_path, top="pair_baselines = false")
    assert res.exit_code == 0 and "4 units" in res.output, res.output


# 4. --seeds
@pytest.mark.parametrize("seeds, words", [
    ("0,0", ["--seeds", "distinct"]),
    ("-1", ["--seeds", ">= 0"]),
    ("7", ["--seeds", "7", "not in the config"]),
    (",", ["--seeds"]),
    ("", ["--seeds"]),
    ("x", ["--seeds"]),
])
def test_bad_seeds_option_is_refused(tmp_path, seeds, words):
    _refused(_grid(tmp_path, "--seeds", seeds), *words)


def test_seeds_option_keeps_the_named_seeds(tmp_path):
    res = _grid(tmp_path, "--seeds", "1", "--list")
    assert res.exit_code == 0, res.output
    assert "4 units" in res.output and "|s1" in res.output and "|s0" not in res.output


def test_duplicate_task_is_an_error_not_a_traceback(tmp_path):
    _refused(_grid(tmp_path, task='[[tasks]]\nname = "toy"\nlimit = 3'), "duplicate")


# 5. subset ids
def test_subset_id_matching_no_problem_is_refused(tmp_path):
    _refused(_grid(tmp_path, task='subset = ["toy/1", "nonexistent"]'), "nonexistent", "subset", "toy")
    assert "toy/1" not in _grid(tmp_path, task='subset = ["toy/1", "nonexistent"]').output


def test_subset_beyond_the_limit_is_still_known(tmp_path):
    cfg = parse_config({"seeds": [0], "models": {"target": "toy"}, "methods": [{"rule": "lossless"}],
                        "tasks": [{"name": "toy", "limit": 1, "subset": ["toy/3", "toy/1"]}]})
    from verispec.eval.run import load_problems

    assert [p.id for p in load_problems(cfg)["toy"]] == ["toy/1"]


def test_unknown_mgsm_language_is_refused_naming_it(tmp_path):
    text = BASE.format(top="", task="").replace('name = "toy"\nlimit = 2', 'name = "mgsm"\nsubset = ["deu", "klingon"]')
    _refused(_grid(tmp_path, text=text), "klingon", "subset", "mgsm")


# 6. --threads
@pytest.mark.parametrize("command", ["generate", "serve"])
@pytest.mark.parametrize("value", ["-1", "0"])
def test_threads_must_be_at_least_one(command, value):
    args = ["generate", "hi"] if command == "generate" else ["serve"]
    res = CliRunner().invoke(main, [*args, "--threads", value])
    assert res.exit_code == 2 and "--threads" in res.output, res.output


# 7. closed stdout
def test_generate_ends_quietly_when_stdout_is_closed(monkeypatch):
    monkeypatch.setattr(verispec.api, "load_engine", lambda *a, **kw: toy_engine("model"))

    def closed(*args, **kwargs):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(main_mod, "_run_streaming", closed)
    res = CliRunner().invoke(main, ["generate", "hello", "--max-new-tokens", "4"])
    assert res.exit_code == 1
    assert "Broken pipe" not in res.output and "Error" not in res.output


# 8. result line without a key
@pytest.mark.parametrize("line", ['{"method": "lossless"}', "5", '{"key": 3}'])
def test_result_line_without_key_is_a_clear_error(tmp_path, line):
    (tmp_path / "results.jsonl").write_text(line + "\n")
    res = CliRunner().invoke(bench, ["report", str(tmp_path)])
    _refused(res, "results.jsonl:1", "malformed result line", "key")


def test_result_line_without_key_via_read_results(tmp_path):
    from verispec.eval.store import read_results

    (tmp_path / "results.jsonl").write_text(json.dumps({"key": "a"}) + "\n" + json.dumps({"x": 1}) + "\n")
    with pytest.raises(ValueError, match=r"results.jsonl:2: malformed"):
        read_results(tmp_path)
