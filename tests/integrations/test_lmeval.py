"""verispec as an lm-evaluation-harness model (``lm_eval --model verispec``) and lm-eval through ``verispec serve``.

The registration is checked through the stock ``lm_eval`` console script (no extra flag); bad model arguments get
lm-eval's error with verispec's message naming the key or the rule, and a "none" that lm-eval's parser made None
keeps its meaning or is refused; batched log-likelihood scoring equals one row at a time; on a toy engine, copies of
a sampled request get seeds of their own, inputs longer than the context are scored in the windows lm-eval's HF
model scores, and context and continuation are split as it splits them; and a short run of
``benchmarks/lm_eval.py`` (2 GSM8K questions, a log-likelihood and a generation task over local data files) gives
the same log-likelihoods, greedy flags and generations through the server, through the verispec model and through
the engine directly (needs the real pair; skips without it)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval")

from verispec.testing import skip_unless_real_pair  # noqa: E402
from verispec.toy import ToyTokenizer, toy_engine  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
#: the toy vocabulary's newline: the test tokenizer's EOS, hence the prefix token of an empty context
NEWLINE = 63


class _Tok(ToyTokenizer):
    """The toy tokenizer as the lm-eval model calls it: ``add_special_tokens`` and BOS / EOS ids."""

    bos_token_id: int | None = None
    eos_token_id = NEWLINE

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text)}


def _toy_lm(monkeypatch, model_args: str = "", engine=None, batch_size: int = 4):
    """The model as lm-eval's Python API builds it, around a toy engine; also the arguments load_engine got."""
    from lm_eval.api.registry import get_model

    import verispec.integrations.lmeval as lmeval

    calls = []
    engine = engine or toy_engine(drafter="none")

    def load(*args, **kwargs):
        calls.append((args, kwargs))
        return engine

    monkeypatch.setattr(lmeval, "load_engine", load)
    lm = get_model("verispec").create_from_arg_string(model_args, {"batch_size": batch_size, "device": "cpu"})
    lm.tokenizer = _Tok()
    return lm, calls


def _req(kind: str, *args):
    from lm_eval.api.instance import Instance

    return Instance(request_type=kind, doc={}, arguments=args, idx=0, metadata=("t", 0, 1))


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
    ("deterministic=no", "deterministic must be true or false, got 'no'"),  # the text "no" was read as true
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


def test_rows_on_llamacpp_are_isolated_unless_asked_otherwise(monkeypatch):
    """On the llama.cpp target, scores and samples must not depend on --batch_size: the model loads its engine
    with deterministic=True (rows on backends of their own) unless the model arguments say false; a transformers
    target batches its rows unless they say true."""
    for args, want in [("target_backend=llamacpp", True), ("target_backend=llamacpp,deterministic=false", False),
                       ("target_backend=hf", False), ("target_backend=hf,deterministic=true", True)]:
        _, calls = _toy_lm(monkeypatch, args)
        assert calls[0][1]["deterministic"] is want, args


def test_none_from_lm_evals_parser_keeps_its_meaning(monkeypatch):
    """lm-eval's argument parser reads "none" as None: the drafter and a rule's draft_truncation get "none" back,
    threads and a nullable sampling option keep None."""
    lm, calls = _toy_lm(monkeypatch, "drafter=none,threads=none,top_p=none")
    ((args, kwargs),) = calls
    assert args[2] == "none" and kwargs["threads"] is None and lm.request["top_p"] is None
    lm, _ = _toy_lm(monkeypatch, "rule=minp-sampling,p_base=0.1,draft_truncation=none")
    assert lm.rule.draft_truncation == "none"


@pytest.mark.parametrize(("model_args", "words"), [
    ("target=none", "target cannot be none"),
    ("pretrained=none", "pretrained cannot be none"),
    ("draft=none", r"draft cannot be none \(drafter=none"),
    ("dtype=none", "dtype cannot be none"),
    ("target_backend=none", "target_backend cannot be none"),
    ("seed=none", "seed must be an integer"),
    ("rule=lenience,l=none", "l must be"),
])
def test_none_where_it_means_nothing_is_refused_by_name(monkeypatch, model_args, words):
    with pytest.raises(ValueError, match=words):
        _toy_lm(monkeypatch, model_args)


def test_copies_of_a_sampled_request_get_seeds_of_their_own(monkeypatch):
    """lm-eval's ``repeats`` passes one sampled request N times: request i samples with (base + i) mod 2**63, base
    the given seed (model argument or the task's), else drawn from torch's generator, which lm-eval's --seed seeds."""
    sampled = {"until": [], "max_gen_toks": 12, "do_sample": True, "temperature": 1.0}
    lm, _ = _toy_lm(monkeypatch)
    copies = [_req("generate_until", "hello world", sampled)] * 4
    torch.manual_seed(1234)
    first = lm.generate_until(copies)
    assert len(set(first)) == 4
    torch.manual_seed(1234)
    assert lm.generate_until(copies) == first
    torch.manual_seed(1235)
    assert lm.generate_until(copies) != first
    greedy = [_req("generate_until", "hello world", {"until": [], "max_gen_toks": 12})] * 3
    assert len(set(lm.generate_until(greedy))) == 1
    ids = lm.tok_encode("hello world")
    for model_args, task_seed, base in [("seed=7", None, 7), ("seed=7", 2**63 - 2, 2**63 - 2)]:
        lm, _ = _toy_lm(monkeypatch, model_args)
        kw = sampled if task_seed is None else {**sampled, "seed": task_seed}
        got = lm.generate_until([_req("generate_until", "hello world", kw)] * 4)
        want = lm.engine.generate([ids] * 4, rule=lm.rule, batch_size=4, temperature=1.0, max_new_tokens=12,
                                  seed=[(base + i) % 2**63 for i in range(4)])
        assert got == [r.text for r in want]


def test_generation_arguments_read_as_lm_evals_hf_model_reads_them(monkeypatch):
    """An empty stop string stops nothing (it failed the whole call), and the token limit's aliases
    (``max_new_tokens``, ``max_tokens``, ``max_completion_tokens``) are read in lm-eval's priority after
    ``max_gen_toks`` (they were ignored: 256 tokens)."""
    lm, _ = _toy_lm(monkeypatch)
    ids = lm.tok_encode("hello world")
    want = {n: lm.engine.generate([ids], rule=lm.rule, temperature=0.0, max_new_tokens=n)[0].text for n in (3, 5)}
    for kw, n in [({"until": [""], "max_gen_toks": 3}, 3), ({"until": ["", "\u2603"], "max_new_tokens": 3}, 3),
                  ({"until": [], "max_tokens": 5}, 5), ({"max_completion_tokens": 5}, 5),
                  ({"max_tokens": 5, "max_new_tokens": 3}, 3), ({"max_gen_toks": 5, "max_new_tokens": 3}, 5)]:
        assert lm.generate_until([_req("generate_until", "hello world", kw)]) == [want[n]], kw


#: the context of the small toy target below, in tokens
CONTEXT = 17


def _small_engine():
    """A toy engine whose target holds CONTEXT tokens."""
    engine = toy_engine(drafter="none", cache=False)
    engine.target.max_context = CONTEXT
    with pytest.raises(ValueError, match="exceeds the model's context"):
        engine.prompt_logprobs(list(range(CONTEXT + 1)))
    return engine


def test_a_long_text_is_scored_in_lm_evals_rolling_windows(monkeypatch):
    """Every token once, in the windows lm-eval's HF model scores: the prefix token and the first L tokens, then
    each window the L + 1 tokens ending at its last, scoring the ones not scored yet (L = CONTEXT - 1)."""
    engine = _small_engine()
    lm, _ = _toy_lm(monkeypatch, engine=engine)
    L = CONTEXT - 1
    assert lm.max_length == L
    rng = torch.Generator().manual_seed(0)
    for n in (5, L, L + 1, 5 * L + 3):
        toks = torch.randint(0, 52, (n,), generator=rng).tolist()  # letters
        seq = [NEWLINE, *toks]
        want, done = 0.0, 0
        while done < n:
            end = min(done + L, n)
            window = seq[max(end - L, 0) : end + 1]
            assert len(window) <= L + 1
            want += sum(t.logprob for t in engine.prompt_logprobs(window)[len(window) - (end - done):])
            done = end
        got = lm.loglikelihood_rolling([_req("loglikelihood_rolling", engine.tokenizer.decode(toks))])[0]
        assert got == pytest.approx(want, abs=1e-4), n


def test_a_long_pair_keeps_the_last_tokens_that_fill_the_context(monkeypatch):
    """lm-eval's HF model keeps the last L + 1 tokens of context + continuation and scores up to L of them; a long
    prompt keeps room for ``max_gen_toks`` (up to L)."""
    engine = _small_engine()
    lm, _ = _toy_lm(monkeypatch, engine=engine)
    L = CONTEXT - 1
    context = "abcdefghijklmnopqrstuvwxyzABCD"
    for continuation in ("EFGHIJ", "EFGHIJKLMNOPQRSTUVWXYZ"):
        ids = (lm.tok_encode(context) + lm.tok_encode(continuation))[-(L + 1):]
        scored = engine.prompt_logprobs(ids, top=1)[-min(len(continuation), L):]
        (got,) = lm.loglikelihood([_req("loglikelihood", context, continuation)])
        assert got[0] == pytest.approx(sum(t.logprob for t in scored), abs=1e-5)
        assert got[1] == all(t.top[0][0] == t.token for t in scored)
    for max_gen in (5, L):
        (text,) = lm.generate_until([_req("generate_until", context, {"until": [], "max_gen_toks": max_gen})])
        assert len(lm.tok_encode(text)) == max_gen


class _MergeTok(_Tok):
    """_Tok with one token more, "ab" (id 64), which merges across a context / continuation boundary."""

    def encode(self, text: str) -> list[int]:
        out, i = [], 0
        while i < len(text):
            merged = text.startswith("ab", i)
            out.append(64 if merged else self.index[text[i]])
            i += 2 if merged else 1
        return out


def test_context_and_continuation_are_split_as_lm_eval_splits_them(monkeypatch):
    """lm-eval's split: the context's own ids, the continuation the whole text's ids after as many; trailing spaces
    move to the continuation; an empty context conditions on BOS, else EOS, or on the continuation's first token
    where that is it."""
    lm, _ = _toy_lm(monkeypatch)
    lm.tokenizer = _MergeTok()
    x, a, c, space = (lm.tokenizer.index[ch] for ch in "xac ")
    assert lm._encode_pair("xa", "bc") == ([x, a], [c])  # "xabc" encodes to x, ab, c
    assert lm._encode_pair("xa ", "c") == ([x, a], [space, c])
    lm.tokenizer = _Tok()
    engine = lm.engine
    abc = lm.tok_encode("abc")
    after_newline = sum(t.logprob for t in engine.prompt_logprobs([NEWLINE, *abc])[1:])
    got = lm.loglikelihood([_req("loglikelihood", "", "abc"), _req("loglikelihood", "", "\nabc")])
    assert [g[0] for g in got] == pytest.approx([after_newline] * 2, abs=1e-5)
    lm.tokenizer.bos_token_id = 5
    after_bos = sum(t.logprob for t in engine.prompt_logprobs([5, *abc])[1:])
    assert lm.loglikelihood([_req("loglikelihood", "", "abc")])[0][0] == pytest.approx(after_bos, abs=1e-5)


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
