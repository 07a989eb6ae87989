"""verispec as an lm-evaluation-harness model (``lm_eval --model verispec``) and lm-eval through ``verispec serve``.

The registration is checked through the stock ``lm_eval`` console script (no extra flag); bad model arguments get
lm-eval's error with verispec's message naming the key or the rule; batched log-likelihood scoring equals one row at
a time; and a short run of ``benchmarks/lm_eval.py`` (2 GSM8K questions, a log-likelihood and a generation task over
local data files) gives the same log-likelihoods, greedy flags and generations through the server, through the
verispec model and through the engine directly (needs the real pair; skips without it)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

from verispec.testing import skip_unless_real_pair  # noqa: E402
from verispec.toy import toy_engine  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _lm_eval(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    task = tmp_path / "vs_tiny.yaml"
    data = tmp_path / "tiny.jsonl"
    data.write_text(json.dumps({"q": "1+1", "a": "2"}) + "\n")
    task.write_text(f"task: vs_tiny\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
                    "test_split: test\ndoc_to_text: '{{q}}='\ndoc_to_target: '{{a}}'\noutput_type: generate_until\n"
                    "generation_kwargs:\n  until: ['\\n']\n  max_gen_toks: 2\nmetric_list:\n  - metric: exact_match\n")
    exe = shutil.which("lm_eval")
    assert exe, "lm-eval's console script is not on PATH"
    env = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "PATH": str(Path(sys.executable).parent) + ":/usr/bin"}
    return subprocess.run([exe, "--model", "verispec", *args, "--tasks", "vs_tiny", "--include_path", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=300, check=False)


def test_the_stock_lm_eval_finds_verispec():
    """lm-eval's registry knows verispec's model, and its own built-in models are still there."""
    from lm_eval.api.registry import get_model

    from verispec.integrations.lmeval import VerispecLM

    assert get_model("verispec") is VerispecLM and get_model("hf").__name__ == "HFLM"


def test_a_bad_model_arg_is_named_through_the_console_script(tmp_path):
    """The stock console script, in a fresh interpreter that never imported verispec, finds the model (the error
    is verispec's own) and names the bad key."""
    proc = _lm_eval("--model_args", "rule=lenience,l=0.5,bogus=1", tmp_path=tmp_path)
    assert proc.returncode != 0
    assert "rule 'lenience' has no parameter(s) bogus" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize(("model_args", "words"), [
    ("rule=no-such-rule", "unknown rule 'no-such-rule'"),
    ("temperature=-1", "temperature must be"),
    ("gamma=0.5", r"gamma must be in \[0, 32\] or .auto., got 0.5"),
    ("rule=lenience,l=7", r"l \(lenience\) must be in"),
    ("pretrained=a,target=b", "target or pretrained"),
])
def test_bad_model_args_name_the_key_or_the_rule(model_args, words):
    from lm_eval.api.registry import get_model

    with pytest.raises(ValueError, match=words):
        get_model("verispec").create_from_arg_string(model_args, {"batch_size": 1, "device": "cpu"})


def test_batched_loglikelihoods_equal_one_row_at_a_time():
    engine = toy_engine(drafter="none", vocab_size=64)
    seqs = [[1, 2, 3, 4, 5, 6, 7], [9, 8], [3] * 11]
    batched = engine.prompt_logprobs_batch(seqs, top=1, chunk=4)
    for ids, got in zip(seqs, batched, strict=True):
        one = engine.prompt_logprobs(ids, top=1)
        assert [t.token for t in got] == ids
        # float32 logits, another batch shape: equal to float tolerance
        assert [t.logprob for t in got[1:]] == pytest.approx([t.logprob for t in one[1:]], abs=1e-5)
        assert [t.top[0][0] for t in got[1:]] == [t.top[0][0] for t in one[1:]]


@pytest.mark.real
@pytest.mark.slow
def test_lm_eval_two_ways_equals_the_engine(tmp_path):
    skip_unless_real_pair()
    out = tmp_path / "lm_eval.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "lm_eval.py"), "--limit", "2",
                           "--max-gen-toks", "16", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          check=False, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["ways"] == ["lm-eval via server", "lm-eval --model verispec"]
    for way in res["ways"]:
        ll = [r for r in res["rows"] if r["way"] == way and r["task"] == "vs_gsm_loglik"]
        gen = [r for r in res["rows"] if r["way"] == way and r["task"] == "vs_gsm_gen"]
        assert len(ll) == 2 and len(gen) == 2
        assert all(r["abs_diff"] <= 1e-6 and r["same_greedy"] for r in ll), ll
        assert all(r["same_text"] for r in gen), gen
    for metrics in res["scores"].values():
        for name, v in metrics.items():
            for way in res["ways"]:
                assert v[way] == pytest.approx(v["engine"], rel=1e-6), (name, v)
    spec = res["speculation"]["vs_gsm_gen"]
    assert spec["target_steps"] > 0 and 0 <= spec["accepted_fraction"] <= 1


def test_a_wheel_ships_the_hook(tmp_path):
    """A normal (not editable) install gets the .pth too: it sits at the wheel's root beside the hook module."""
    import zipfile

    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(ROOT),
                           "-w", str(tmp_path)], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = tmp_path.glob("verispec-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "verispec-hook.pth" in names and "_verispec_hook.py" in names
    # the hook is imported only where it is found: a stale install (its source gone) starts Python silently
    pth = zipfile.ZipFile(wheel).read("verispec-hook.pth").decode()
    assert pth.startswith('import importlib.util; importlib.util.find_spec("_verispec_hook") and ')
