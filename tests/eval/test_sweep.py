"""Sweeps: config parsing, grid expansion with automatic matched baselines, crash-safe resume."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest

from verispec.eval import run as runner
from verispec.eval import store
from verispec.eval.grid import PRESETS, expand, generation_seed, load_config, parse_config, setting
from verispec.eval.run import run_sweep
from verispec.eval.store import RESULTS, read_results

REPO = Path(__file__).resolve().parents[2]


def _cfg(**over):
    base = {
        "name": "t",
        "seeds": [0, 1],
        "tasks": [{"name": "toy", "limit": 2}],
        "methods": [
            {"rule": "spec-cascade", "params": {"p_base": [0.3, 0.5]}},
            {"rule": "typical", "params": {"epsilon": 0.1}},
            {"rule": "lenience", "params": {"l": 0.5}},
            {"rule": "cos-we", "params": {"lambda": 0.5}},
        ],
        "models": {"target": "toy"},
    }
    base.update(over)
    return parse_config(base)


def test_grid_expansion_adds_matched_baselines():
    cfg = _cfg()
    labels = [m.label for m in cfg.methods]
    assert labels == [
        "minp-sampling(p_base=0.3)", "spec-cascade(p_base=0.3)",
        "minp-sampling(p_base=0.5)", "spec-cascade(p_base=0.5)",
        "eta-sampling(epsilon=0.1)", "typical(epsilon=0.1)",
        "lossless", "lenience(l=0.5)", "cos-we(lam=0.5)",
    ]
    # every lossy setting's matched baseline is in the grid, and it is the one rules.matched_baseline gives
    for m in cfg.methods:
        if not m.lossless:
            assert m.baseline() in cfg.methods
    assert setting("spec-cascade", p_base=0.7).baseline().label == "minp-sampling(p_base=0.7)"
    assert setting("typical", epsilon=0.2).baseline().label == "eta-sampling(epsilon=0.2)"
    assert setting("cos-we", lam=0.2).baseline().label == "lossless"
    # defaults and defaults of non-swept parameters: same unit whether spelled out or not
    assert setting("spec-cascade", p_base=0.3, correction="draft") == setting("spec-cascade", p_base=0.3)
    assert setting("spec-cascade", p_base=0.3, correction="target").label == \
        "spec-cascade(p_base=0.3, correction_source=target)"

    units = expand(cfg, {"toy": ["toy/0", "toy/1"]})
    assert len(units) == 2 * 2 * len(cfg.methods)
    assert len({u.key for u in units}) == len(units)
    # the generation seed depends on (seed, task, problem) only: every method shares the random numbers
    seeds = {(u.seed, u.problem_id): set() for u in units}
    for u in units:
        seeds[(u.seed, u.problem_id)].add(u.gen_seed)
        assert u.gen_seed == generation_seed(u.seed, u.task, u.problem_id)
    assert all(len(s) == 1 for s in seeds.values())
    assert len({next(iter(s)) for s in seeds.values()}) == 4


def test_no_pairing_presets_and_lossless_not_duplicated():
    cfg = _cfg(pair_baselines=False)
    assert "lossless" not in [m.label for m in cfg.methods]
    assert "minp-sampling(p_base=0.3)" not in [m.label for m in cfg.methods]
    cfg = _cfg(methods=[{"rule": "lossless"}, {"rule": "spec-cascade", "params": "paper"},
                        {"rule": "minp-sampling", "params": {"p_base": 0.3}}, {"rule": "lenience", "params": "paper"}])
    labels = [m.label for m in cfg.methods]
    assert labels.count("lossless") == 1 and labels.count("minp-sampling(p_base=0.3)") == 1
    p_bases = [m.param_dict()["p_base"] for m in cfg.methods if m.rule == "spec-cascade"]
    assert p_bases == PRESETS["spec-cascade"]["p_base"]
    assert [m.param_dict()["l"] for m in cfg.methods if m.rule == "lenience"] == [0.2, 0.4, 0.6, 0.8]
    assert PRESETS["minp-sampling"]["p_base"] == [0.1, 0.3, 0.5, 0.7, 0.9]
    assert PRESETS["eta-sampling"]["epsilon"] == [0.05, 0.1, 0.15, 0.2, 0.25]
    assert cfg.temperature == 0.7 and list(_cfg(seeds=[0, 1, 2]).seeds) == [0, 1, 2]
    # --limit / --tasks / --seeds
    two = _cfg(tasks=[{"name": "toy", "limit": 5}, {"name": "toy2"}], seeds=[0, 1, 2])
    small = two.restricted(limit=3, tasks=["toy2"], seeds=[1])
    assert [(t.name, t.limit) for t in small.tasks] == [("toy2", 3)] and small.seeds == (1,)
    assert [(t.name, t.limit) for t in two.restricted(limit=9).tasks] == [("toy", 5), ("toy2", 9)]
    assert small.methods == two.methods and small.settings() == two.settings()
    per_task = _cfg(tasks=[{"name": "toy", "max_new_tokens": 7}, {"name": "toy2"}], max_new_tokens=20)
    assert per_task.max_tokens("toy") == 7 and per_task.max_tokens("toy2") == 20
    assert per_task.restricted(limit=1).max_tokens("toy") == 7
    units = expand(per_task, {"toy": ["toy/0"], "toy2": ["toy2/0"]})
    assert {u.task: u.settings["max_new_tokens"] for u in units} == {"toy": 7, "toy2": 20}


def test_restricted_to_settings_keeps_their_baselines_and_grid_order():
    cfg = _cfg()
    one = cfg.restricted(methods=["lenience(l=0.5)", "spec-cascade(p_base=0.5)"])
    assert [m.label for m in one.methods] == ["minp-sampling(p_base=0.5)", "spec-cascade(p_base=0.5)", "lossless",
                                              "lenience(l=0.5)"]
    unpaired = _cfg(pair_baselines=False).restricted(methods=["lenience(l=0.5)"])
    assert [m.label for m in unpaired.methods] == ["lenience(l=0.5)"]
    assert cfg.restricted(methods=[]).methods == cfg.methods
    # the baseline as the sweep runs it (here with the draft truncated too), not the rule's bare baseline
    same = _cfg(baseline_draft_truncation="same").restricted(methods=["spec-cascade(p_base=0.3)"])
    assert [m.label for m in same.methods] == ["minp-sampling(p_base=0.3, draft_truncation=same)",
                                               "spec-cascade(p_base=0.3)"]
    with pytest.raises(ValueError, match="'lenience\\(l=0.4\\)' not in the config"):
        cfg.restricted(methods=["lenience(l=0.4)"])


@pytest.mark.parametrize("bad, match", [
    ({"methods": [{"rule": "nope"}]}, "unknown rule"),
    ({"methods": [{"rule": "spec-cascade", "params": {"p_base": 2.0}}]}, "p_base"),
    ({"methods": [{"rule": "lenience", "params": {"lam": 0.5}}]}, "no parameter"),
    ({"methods": [{"rule": "lossless", "extra": 1}]}, "unknown key"),
    ({"tasks": []}, "no \\[\\[tasks\\]\\]"),
    ({"seeds": [0, 0]}, "distinct"),
    ({"temperature": -1}, "temperature"),
    ({"colour": "blue"}, "unknown key"),
    ({"tasks": [{"name": "toy", "options": {"lenient": True}}]}, "task .toy. does not take the option"),
    ({"tasks": [{"name": "bfcl", "options": {"lenent": True}}]}, "does not take the option"),
    ({"tasks": [{"name": "bfcl", "options": [1]}]}, "table of named values"),
])
def test_config_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        _cfg(**bad)


def test_repo_configs_parse():
    small = load_config(REPO / "configs" / "paper_small.toml")
    assert [m.label for m in small.methods] == [
        "lossless", "lenience(l=0.5)", "cos-we(lam=0.5)", "minp-sampling(p_base=0.3)", "spec-cascade(p_base=0.3)"]
    assert [(t.name, t.limit) for t in small.tasks] == [("humaneval", 20), ("gsm", 20)]
    assert list(small.seeds) == [0, 1, 2] and small.temperature == 0.7
    for name in ("smoke.toml", "paper_grid.toml", "toy.toml"):
        load_config(REPO / "configs" / name)


def test_task_options_reach_the_task_and_the_settings():
    """``[[tasks]] options`` builds the task with them (bfcl's lenient checker), is recorded in the settings of
    that task's units only, survives config.json, and a resumed run with other options is refused."""
    cfg = _cfg(tasks=[{"name": "bfcl", "limit": 1, "options": {"lenient": True}}, {"name": "toy", "limit": 1}])
    assert cfg.task_options("bfcl") == {"lenient": True} and cfg.task_options("toy") == {}
    assert cfg.settings("bfcl")["task_options"] == {"lenient": True} and "task_options" not in cfg.settings("toy")
    back = type(cfg).from_json(json.loads(json.dumps(cfg.to_json())))
    assert back.task_options("bfcl") == {"lenient": True} and back.restricted(limit=1).task_options("bfcl")
    assert runner.get_task("bfcl", **cfg.task_options("bfcl")).lenient is True
    assert runner.get_task("bfcl").lenient is False
    problems = runner.load_problems(cfg)
    executor = runner.UnitExecutor(cfg, engine=None, problems=problems)
    assert executor.tasks["bfcl"].lenient is True
    strict = _cfg(tasks=[{"name": "bfcl", "limit": 1}, {"name": "toy", "limit": 1}])
    assert runner.UnitExecutor(strict, engine=None, problems=problems).tasks["bfcl"].lenient is False


def test_resume_refuses_other_task_options(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lenient = _cfg(tasks=[{"name": "bfcl", "limit": 1, "options": {"lenient": True}}])
    (run_dir / "config.json").write_text(json.dumps(lenient.to_json()))
    runner._check_settings(run_dir, lenient)  # same options: accepted
    with pytest.raises(ValueError, match="options of bfcl"):
        runner._check_settings(run_dir, _cfg(tasks=[{"name": "bfcl", "limit": 1}]))


def _write_toy(path: Path, seeds=(0, 1), limit=4) -> Path:
    path.write_text(
        f'name = "resume"\nseeds = {list(seeds)}\ngamma = 3\nmax_new_tokens = 12\n'
        '[models]\ntarget = "toy"\nthreads = 1\n'
        f'[[tasks]]\nname = "toy"\nlimit = {limit}\n'
        '[[methods]]\nrule = "spec-cascade"\nparams = { p_base = 0.3 }\n'
        '[[methods]]\nrule = "lenience"\nparams = { l = 0.5 }\n'
    )
    return path


def _child_run(cfg_path: Path, run_dir: Path) -> None:
    run_sweep(cfg_path, run_dir, progress=False)


def test_resume_after_kill_loses_and_duplicates_nothing(tmp_path):
    """Run in a subprocess, SIGKILL it after a few lines, cut the last line in half (a kill mid-write), start
    again: the unit keys are exactly the grid, none twice, earlier lines untouched, outputs as uninterrupted."""
    N = 2 * 4 * 4  # seeds x problems x settings (spec-cascade, its min-p baseline, lenience, lossless)
    cfg_path = _write_toy(tmp_path / "toy.toml")
    run_dir = tmp_path / "run"
    results = run_dir / RESULTS
    # a forked child inherits the imported modules and the built toy engine (a fresh interpreter would spend
    # seconds importing transformers)
    runner.toy_engine(load_config(cfg_path))
    proc = multiprocessing.get_context("fork").Process(target=_child_run, args=(cfg_path, run_dir), daemon=True)
    proc.start()
    deadline = time.time() + 60
    while time.time() < deadline and proc.is_alive():
        if results.exists() and results.read_bytes().count(b"\n") >= 6:
            break
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    assert proc.exitcode == -signal.SIGKILL, "the run ended before it could be killed; make the grid larger"
    data = results.read_bytes()
    lines = data.split(b"\n")[:-1]
    assert 6 <= len(lines) < N
    # simulate a kill in the middle of a write: cut the last line in half
    kept = b"\n".join(lines[:-1]) + b"\n"
    results.write_bytes(kept + lines[-1][: len(lines[-1]) // 2])
    # a reader during the run ignores the partial line
    assert len(read_results(run_dir)) == len(lines) - 1

    calls = []

    def factory(cfg):
        calls.append(cfg)
        return runner.toy_engine(cfg)

    summary = run_sweep(cfg_path, run_dir, engine_factory=factory, progress=False)
    assert len(calls) == 1
    assert summary.skipped == len(lines) - 1 and summary.repaired_bytes == len(lines[-1]) // 2
    assert summary.completed == N - (len(lines) - 1) and summary.failed == 0

    final = results.read_bytes()
    assert final.startswith(kept), "complete lines written before the kill must stay untouched"
    raw_keys = [json.loads(x)["key"] for x in final.split(b"\n") if x]
    cfg = load_config(cfg_path)
    grid = [u.key for u in expand(cfg, {"toy": [f"toy/{i}" for i in range(4)]})]
    assert len(raw_keys) == len(set(raw_keys)) == N, "no duplicates"
    assert set(raw_keys) == set(grid), "exactly the grid: nothing lost"

    # a unit is a pure function of its config: the interrupted-and-resumed run equals an uninterrupted one
    clean = tmp_path / "clean"
    run_sweep(cfg_path, clean, progress=False, max_units=len(lines) + 4)
    a = {r["key"]: r["token_ids"] for r in read_results(run_dir)}
    b = {r["key"]: r["token_ids"] for r in read_results(clean)}
    assert len(b) == len(lines) + 4 and all(a[k] == v for k, v in b.items())

    # nothing left to do: a third start runs nothing and does not need an engine
    again = run_sweep(cfg_path, run_dir, engine_factory=lambda c: pytest.fail("no engine needed"), progress=False)
    assert again.completed == 0 and again.skipped == N
    assert results.read_bytes() == final


def test_resume_guards(tmp_path):
    cfg_path = _write_toy(tmp_path / "toy.toml", seeds=(0,), limit=1)
    run_dir = tmp_path / "run"
    s = run_sweep(cfg_path, run_dir, progress=False, max_units=1)
    assert s.completed == 1 and (run_dir / "config.toml").read_text() == cfg_path.read_text()
    # a different generation setting in the same directory is refused
    other = tmp_path / "other.toml"
    other.write_text(cfg_path.read_text().replace("max_new_tokens = 12", "max_new_tokens = 13"))
    with pytest.raises(ValueError, match="different settings"):
        run_sweep(other, run_dir, progress=False)
    # a second runner on the same directory is refused while the first holds the lock
    with runner.locked(run_dir), pytest.raises(RuntimeError, match="another"):
        run_sweep(cfg_path, run_dir, progress=False)
    # --limit / --tasks / --seeds shrink the grid; growing it later resumes into the same directory
    s = run_sweep(cfg_path, run_dir, progress=False)
    assert (s.skipped, s.completed) == (1, 3)
    with pytest.raises(ValueError, match="not in the config"):
        run_sweep(cfg_path, run_dir, progress=False, tasks=["gsm"])
    # --method runs some settings of a grid over more problems; the full grid later runs only the rest
    big = tmp_path / "big.toml"
    big.write_text(cfg_path.read_text().replace("limit = 1", "limit = 2"))
    s = run_sweep(big, run_dir, progress=False, methods=["lenience(l=0.5)"])
    assert (s.skipped, s.completed) == (2, 2)  # lenience and lossless, on problems 0 (done) and 1
    assert {r["label"] for r in read_results(run_dir) if r["problem_id"] == "toy/1"} == {"lenience(l=0.5)",
                                                                                      "lossless"}
    s = run_sweep(big, run_dir, progress=False)
    assert (s.skipped, s.completed) == (6, 2)


def test_failed_unit_is_logged_and_retried(tmp_path):
    cfg_path = _write_toy(tmp_path / "toy.toml", seeds=(0,), limit=1)
    run_dir = tmp_path / "run"

    class Broken:
        """The toy engine whose first decoding round raises."""

        def __init__(self, engine):
            self.engine, self.n = engine, 0

        def __getattr__(self, name):
            return getattr(self.engine, name)

        def step(self, rows):
            self.n += 1
            if self.n == 1:
                raise RuntimeError("boom")
            return self.engine.step(rows)

    s = run_sweep(cfg_path, run_dir, engine_factory=lambda c: Broken(runner.toy_engine(c)), progress=False,
                  batch_size=1)
    assert (s.completed, s.failed) == (3, 1) and "boom" in s.failures[0]
    assert os.path.getsize(run_dir / "errors.jsonl") > 0
    s = run_sweep(cfg_path, run_dir, progress=False)
    assert (s.skipped, s.completed, s.failed) == (3, 1, 0)
    assert len(read_results(run_dir)) == 4
    # batched: the failing round fails every row it held (all 4 units here); all are retried next time
    run2 = tmp_path / "run2"
    s = run_sweep(cfg_path, run2, engine_factory=lambda c: Broken(runner.toy_engine(c)), progress=False,
                  batch_size=4)
    assert (s.completed, s.failed) == (0, 4)
    s = run_sweep(cfg_path, run2, progress=False, batch_size=4)
    assert (s.skipped, s.completed, s.failed) == (0, 4, 0)


def test_batched_run_equals_unbatched_run(tmp_path):
    """Each unit keeps its own seed: batch size 1 and 3 give the same tokens unit for unit."""
    cfg_path = _write_toy(tmp_path / "toy.toml", seeds=(0, 1), limit=2)
    a, b = tmp_path / "a", tmp_path / "b"
    run_sweep(cfg_path, a, progress=False, batch_size=1)
    run_sweep(cfg_path, b, progress=False, batch_size=3)
    ra = {r["key"]: r["token_ids"] for r in read_results(a)}
    rb = {r["key"]: r["token_ids"] for r in read_results(b)}
    assert ra == rb and len(ra) == 16  # 2 seeds x 2 problems x 4 settings


def test_unit_order_is_seed_major_and_interleaves_tasks():
    """A run cut short holds whole seeds and both tasks in equal measure, matched pairs together."""
    cfg = _cfg(tasks=[{"name": "toy"}, {"name": "toy2"}], seeds=[0, 1],
               methods=[{"rule": "spec-cascade", "params": {"p_base": 0.3}}])
    units = expand(cfg, {"toy": ["a0", "a1", "a2"], "toy2": ["b0", "b1"]})
    order = [(u.seed, u.problem_id, u.method.rule) for u in units]
    expected = [(s, p, m) for s in (0, 1) for p in ("a0", "b0", "a1", "b1", "a2")
                for m in ("minp-sampling", "spec-cascade")]
    assert order == expected


@pytest.mark.parametrize("drafter, draft_recorded", [
    ("model", True), ("tree", True), ("llamacpp", True), ("ngram+llamacpp", True), ("ngram+model", True),
    ("ngram", False), ("none", False)])
def test_drafters_and_the_draft_they_record(drafter, draft_recorded):
    cfg = _cfg(models={"target": "toy", "draft": "d", "drafter": drafter},
               methods=[{"rule": "spec-cascade", "params": {"p_base": 0.3}}])
    assert cfg.settings()["drafter"] == drafter
    assert cfg.settings()["draft"] == ("d" if draft_recorded else None)


def test_unknown_drafter_is_refused():
    with pytest.raises(ValueError, match="drafter must be one of model, llamacpp, tree"):
        _cfg(models={"target": "toy", "drafter": "forest"})


def test_shards_split_the_grid_without_overlap(tmp_path):
    """Two shards on one directory run side by side (their locks allow it), cover the grid exactly once
    between them, produce what an unsharded run produces, and an unsharded resume then has nothing to do."""
    cfg_path = _write_toy(tmp_path / "toy.toml", seeds=(0, 1), limit=2)
    run_dir = tmp_path / "run"
    n_grid = 2 * 2 * 4
    run_dir.mkdir()
    with runner.locked(run_dir, (1, 2)):
        # shard 1/2 is "running": shard 0/2 may start, a twin 1/2 and an unsharded run may not
        s0 = run_sweep(cfg_path, run_dir, progress=False, shard=(0, 2))
        with pytest.raises(RuntimeError, match="another"):
            run_sweep(cfg_path, run_dir, progress=False, shard=(1, 2))
        with pytest.raises(RuntimeError, match="another"):
            run_sweep(cfg_path, run_dir, progress=False)
        # a shard of another N that shares units with 1/2 may not start (it would run them twice); shard 0/4, half
        # of the finished 0/2, shares none and may
        for other in ((0, 3), (3, 4)):
            with pytest.raises(RuntimeError, match=r"shard 1/2 is running .* shares units"):
                run_sweep(cfg_path, run_dir, progress=False, shard=other)
        assert run_sweep(cfg_path, run_dir, progress=False, shard=(0, 4)).skipped == n_grid // 4
    s1 = run_sweep(cfg_path, run_dir, progress=False, shard=(1, 2))
    assert s0.total == s1.total == n_grid // 2 and s0.completed == s1.completed == n_grid // 2
    f0, f1 = run_dir / "results-0-of-2.jsonl", run_dir / "results-1-of-2.jsonl"
    assert not (run_dir / RESULTS).exists()
    keys0 = [json.loads(x)["key"] for x in f0.read_text().splitlines()]
    keys1 = [json.loads(x)["key"] for x in f1.read_text().splitlines()]
    units = expand(load_config(cfg_path), {"toy": ["toy/0", "toy/1"]})
    grid = [u.key for u in units]
    # each shard holds exactly its share (lines in completion order: batched rows finish out of order)
    assert sorted(keys0) == sorted(u.key for u in runner.shard_units(units, (0, 2)))
    assert sorted(keys1) == sorted(u.key for u in runner.shard_units(units, (1, 2)))
    merged = read_results(run_dir)
    assert sorted(r["key"] for r in merged) == sorted(grid)
    # sharding does not change any output: a unit is a pure function of its config
    clean = tmp_path / "clean"
    run_sweep(cfg_path, clean, progress=False)
    assert {r["key"]: r["token_ids"] for r in merged} == {r["key"]: r["token_ids"] for r in read_results(clean)}
    again = run_sweep(cfg_path, run_dir, engine_factory=lambda c: pytest.fail("no engine needed"), progress=False)
    assert (again.completed, again.skipped) == (0, n_grid)
    # a different split resumes too: nothing is run twice
    again = run_sweep(cfg_path, run_dir, progress=False, shard=(2, 3))
    assert again.completed == 0 and not (run_dir / "results-2-of-3.jsonl").exists()


@pytest.mark.parametrize("n", [2, 3])
def test_shards_split_added_methods_evenly(tmp_path, n):
    """Methods added to a grid after it ran (4 toy methods + 2 = 6, a multiple of N): the shards still cover the
    grid exactly once, and each added method's units (the only ones left to run) are split evenly over the N
    shards. Dealing every N-th unit of the grid gave all of one method's units to one shard when N divides 6."""
    base = load_config(_write_toy(tmp_path / "toy.toml", seeds=(0, 1, 2), limit=2))
    assert len(base.methods) == 4
    more = _cfg(methods=[{"rule": "lenience", "params": {"l": 0.3}}, {"rule": "cos-we", "params": {"lam": 0.5}}])
    added = [m for m in more.methods if m not in base.methods]
    assert len(added) == 2
    cfg = dataclasses.replace(base, methods=base.methods + tuple(added))
    units = expand(cfg, {"toy": ["toy/0", "toy/1", "toy/2", "toy/3"]})
    shares = [runner.shard_units(units, (i, n)) for i in range(n)]
    keys = [u.key for share in shares for u in share]
    assert sorted(keys) == sorted(u.key for u in units) and len(set(keys)) == len(keys)
    for m in added:
        per_shard = [sum(u.method == m for u in share) for share in shares]
        assert sum(per_shard) == 12 and max(per_shard) - min(per_shard) <= 1, (m.label, per_shard)
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


@pytest.mark.parametrize("n", [2, 3])
def test_a_shard_splits_into_two_shards_of_twice_as_many(tmp_path, n):
    """Shard I of N is exactly shards I and I+N of 2N, so a shard that lags behind its twins can be finished by two
    processes (``--shard I/2N`` and ``--shard I+N/2N``) without touching the units of the others."""
    cfg = load_config(_write_toy(tmp_path / "toy.toml", seeds=(0, 1, 2), limit=3))
    units = expand(cfg, {"toy": ["toy/0", "toy/1", "toy/2", "toy/3"]})
    for i in range(n):
        whole = [u.key for u in runner.shard_units(units, (i, n))]
        halves = [u.key for j in (i, i + n) for u in runner.shard_units(units, (j, 2 * n))]
        assert whole and sorted(whole) == sorted(halves) and len(set(halves)) == len(halves)


@pytest.mark.parametrize("text", ["2/2", "1", "a/b", "0/0", "-1/2"])
def test_bad_shard_is_refused(text):
    with pytest.raises(ValueError, match="shard"):
        store.parse_shard(text)


def test_tree_sweep_end_to_end(tmp_path):
    """drafter = "tree": units run through the tree drafter (per_round holds (depth, accepted)), the report is
    written, and the chain-only offline estimator refuses the run instead of computing a wrong check. A tree sweep with
    a rule trees cannot verify (lenience) is refused when the config is read."""
    from verispec.eval.estimator import estimate_run
    from verispec.eval.report import write_report

    cfg_path = _write_toy(tmp_path / "toy.toml", seeds=(0,), limit=2)
    text = cfg_path.read_text().replace('target = "toy"', 'target = "toy"\ndrafter = "tree"')
    cfg_path.write_text(text)
    with pytest.raises(ValueError, match="tree verification supports"):
        load_config(cfg_path)
    typical = 'rule = "typical"\nparams = { epsilon = 0.1 }'
    cfg_path.write_text(text.replace('rule = "lenience"\nparams = { l = 0.5 }', typical))
    run_dir = tmp_path / "run"
    s = run_sweep(cfg_path, run_dir, progress=False)
    assert (s.completed, s.failed) == (8, 0)
    recs = read_results(run_dir)
    assert all(r["settings"]["drafter"] == "tree" for r in recs)
    # a tree round scores more nodes than its depth (drafted = depth; nodes are reported apart)
    assert max(d for r in recs for d, _ in r["per_round"]) == 3
    assert max(r["proposed_nodes"] / r["rounds"] for r in recs) > 3
    assert all(0 <= a <= 3 for r in recs for _, a in r["per_round"])
    assert write_report(run_dir)["report"].exists()
    with pytest.raises(ValueError, match="tree run"):
        estimate_run(run_dir)


def test_shards_overlap_exactly_when_their_units_do(tmp_path):
    """The lock's rule (shards I/N and J/M may share units iff I = J mod gcd(N, M)) against the units shard_units
    actually deals, for every pair of shards with N, M <= 6 on a grid of 96 units: it never calls two shards that
    share a unit disjoint, and where one N divides the other (a shard split in two) it is exact. (A small grid may
    lack the running index at which two shards of coprime-ish counts would meet: the lock then refuses, to be
    safe.)"""
    cfg = load_config(_write_toy(tmp_path / "toy.toml", seeds=(0, 1, 2), limit=3))
    units = expand(cfg, {"toy": [f"toy/{k}" for k in range(8)]})
    assert len(units) == 96
    share = {(i, n): {u.key for u in runner.shard_units(units, (i, n))} for n in range(1, 7) for i in range(n)}
    for a, ka in share.items():
        for b, kb in share.items():
            assert store.shards_overlap(a, b) >= bool(ka & kb), (a, b)
            if a[1] % b[1] == 0 or b[1] % a[1] == 0:
                assert store.shards_overlap(a, b) == bool(ka & kb), (a, b)


def test_a_run_directory_holds_one_engines_results(tmp_path):
    """Units done by verispec's own engine are not another engine's (`--engine vllm`, whose lines carry
    "engine"): a run that would mix them is refused by name, and the directory's own engine resumes it."""
    cfg_path = _write_toy(tmp_path / "toy.toml", seeds=(0,), limit=1)
    run_dir = tmp_path / "run"
    assert run_sweep(cfg_path, run_dir, progress=False, max_units=2).completed == 2

    class OtherEngine:  # the toy engine under another engine's name (the toy engine itself is cached: not set)
        engine_name = "vllm"

        def __init__(self, engine):
            self.engine = engine

        def __getattr__(self, name):
            return getattr(self.engine, name)

    def other_engine(cfg):
        return OtherEngine(runner.toy_engine(cfg))

    with pytest.raises(ValueError, match="holds results of the local engine; this run's engine is vllm"):
        run_sweep(cfg_path, run_dir, progress=False, engine_factory=other_engine)
    assert len(read_results(run_dir)) == 2
    rest = run_sweep(cfg_path, run_dir, progress=False)
    assert rest.completed == rest.total - 2 and rest.failed == 0
