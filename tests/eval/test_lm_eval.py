"""lm-evaluation-harness through ``verispec serve`` gives the scores the engine gives directly: a short run of
``benchmarks/lm_eval_server.py`` (2 GSM8K questions per task, a log-likelihood and a generation task over local data
files). Runs where lm-eval's environment exists (``bash scripts/install_lmeval.sh`` makes .venv-lmeval) and the real
pair is installed; skips elsewhere."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from verispec.testing import skip_unless_real_pair

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.real
@pytest.mark.slow
def test_lm_eval_through_the_server_equals_the_engine(tmp_path):
    if not (ROOT / ".venv-lmeval" / "bin" / "python").exists():
        pytest.skip("lm-eval's environment is not here (bash scripts/install_lmeval.sh makes .venv-lmeval)")
    skip_unless_real_pair()
    out = tmp_path / "lm_eval.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "lm_eval_server.py"), "--limit", "2",
                           "--max-gen-toks", "16", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          check=False, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    ll = [r for r in res["rows"] if r["task"] == "vs_gsm_loglik"]
    gen = [r for r in res["rows"] if r["task"] == "vs_gsm_gen"]
    assert len(ll) == 2 and len(gen) == 2
    assert all(r["abs_diff"] == 0.0 and r["same_greedy"] for r in ll), ll
    assert all(r["same_text"] for r in gen), gen
    for metrics in res["scores"].values():
        for name, v in metrics.items():
            assert v["lm-eval via server"] == pytest.approx(v["engine"], rel=1e-12), (name, v)
