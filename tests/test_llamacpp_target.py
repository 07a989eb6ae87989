"""The llama.cpp TARGET (``load_engine(..., target_backend="llamacpp")``) on the real Qwen2.5-Coder GGUFs: loading,
greedy equality with llama.cpp's own greedy decode, speculative greedy == target-only greedy up to batch-shape
near-ties, and the exact sampled law of whole short continuations (chi-square).

Skipped with a reason when llama-cpp-python (requirements-fast.txt) or the real pair (``verispec models install``)
is missing.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from verispec import SamplingConfig, models
from verispec.backends.base import ScoreRequest, common_prefix_len

pytest.importorskip("llama_cpp", reason="llama-cpp-python not installed: pip install -r requirements-fast.txt")

from verispec.api import build_drafter, load_engine  # noqa: E402
from verispec.backends.llamacpp import LlamaCppBackend  # noqa: E402
from verispec.engine import Engine  # noqa: E402

pytestmark = pytest.mark.real

LOGIT_TOL = 1.0  # batch-shape tolerance of llama.cpp's logits (see tests/test_llamacpp_backend.py)
T = 1  # one llama.cpp thread (shared 2-core machine)


@pytest.fixture(scope="module")
def engine() -> Engine:
    for name in (models.DEFAULT_TARGET, models.DEFAULT_DRAFT):
        if not models.gguf_path(name).is_file() or not models.is_installed(name):
            pytest.skip(f"{name} not installed (verispec models install)")
    return load_engine(drafter="none", target_backend="llamacpp", threads=T, cache=False)


def test_load_engine_llamacpp_target(engine):
    t = engine.target
    assert isinstance(t, LlamaCppBackend) and t.vocab_size == 151936 and t.max_context == 4096
    assert {151643, 151645} <= engine.eos_token_ids
    text = "def add(a, b):\n    return a + b  # 你好 😀"
    assert list(engine.tokenizer(text)["input_ids"]) == t.tokenize(text)
    with pytest.raises(ValueError, match="tree attention"):
        load_engine(drafter="tree", target_backend="llamacpp", cache=False)
    with pytest.raises(ValueError, match="target backend"):
        load_engine(drafter="none", target_backend="vllm", cache=False)


def _greedy_divergence_is_near_tie(target: LlamaCppBackend, prompt: list[int], a: list[int], b: list[int]) -> bool:
    """Where two greedy outputs first differ, the target's single-step logits have a near-tie between them."""
    i = common_prefix_len(a, b)
    if i == min(len(a), len(b)):
        return True
    row = target.add_row()
    try:
        logits = target.score([ScoreRequest(row, prompt + a[:i])])[0][0]
    finally:
        target.remove_row(row)
    return abs(float(logits[a[i]] - logits[b[i]])) < LOGIT_TOL


PROMPTS = [
    "def is_palindrome(s: str) -> bool:\n",
    "Write a Python function that returns the squares of a list of numbers.",
    "What is the capital of France? Answer in one sentence.",
]


def test_greedy_equals_llamacpp_own_greedy(engine):
    """verispec's target-only greedy on the llama.cpp target == llama-cpp-python's own greedy generate on the
    same GGUF (both: prompt as one block, then one token per step), up to batch-shape near-ties."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(models.gguf_path(models.DEFAULT_TARGET)), n_ctx=512, n_threads=T, verbose=False)
    greedy = SamplingConfig(temperature=0)
    same = 0
    for text in PROMPTS:
        prompt = engine.encode(text, chat=True)
        ours = engine.generate(prompt, sampling=greedy, max_new_tokens=24).token_ids
        theirs: list[int] = []
        for tok in llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
            if tok in engine.eos_token_ids or len(theirs) == 24:
                if tok in engine.eos_token_ids:
                    theirs.append(tok)
                break
            theirs.append(tok)
        same += ours == theirs
        assert _greedy_divergence_is_near_tie(engine.target, prompt, ours, theirs), (ours, theirs)
    assert same >= 2, f"only {same}/3 prompts identical"


@pytest.mark.parametrize("drafter", ["ngram", "llamacpp"])
def test_speculative_greedy_equals_target_only(engine, drafter):
    """Speculative greedy (fixed gamma 4) == target-only greedy on the llama.cpp target, except where a block-scored
    and a single-step logit vector disagree at a near-tie (then the first divergence must be one)."""
    greedy = SamplingConfig(temperature=0)
    d = build_drafter(drafter, models.DEFAULT_DRAFT, engine.tokenizer, engine.target, draft_threads=T)
    spec = Engine(engine.target, d, engine.tokenizer, sorted(engine.eos_token_ids))
    equal = 0
    for text in PROMPTS[:2]:
        prompt = engine.encode(text, chat=True)
        ref = engine.generate(prompt, sampling=greedy, max_new_tokens=32)
        out = spec.generate(prompt, sampling=greedy, gamma=4, max_new_tokens=32)
        equal += out.token_ids == ref.token_ids
        assert _greedy_divergence_is_near_tie(engine.target, prompt, out.token_ids, ref.token_ids)
        assert out.metrics.drafted > 0
    assert equal >= 1


N_SEQ = 1200
ALPHA = 1e-4


def _exact_law(target: LlamaCppBackend, prompt: list[int], cfg: SamplingConfig, length: int) -> dict:
    """The target's own law of ``length``-token continuations: product of its processed next-token distributions,
    each computed by llama.cpp with the continuation so far as one block after the prompt."""
    from verispec.processors import process

    law: dict[tuple[int, ...], float] = {}
    row = target.add_row()

    def walk(prefix: tuple[int, ...], prob: float) -> None:
        if len(prefix) == length:
            law[prefix] = prob
            return
        p = process(target.score([ScoreRequest(row, prompt + list(prefix))])[0][0], cfg)
        for tok in torch.nonzero(p > 0).flatten().tolist():
            walk(prefix + (tok,), prob * float(p[tok]))

    walk((), 1.0)
    target.remove_row(row)
    return law


@pytest.mark.slow
def test_sampled_law_is_the_llamacpp_target_law(engine):
    """Lossless speculative sampling with the llama.cpp target and the llama.cpp draft (gamma 2, T = 1, top_k 3),
    whole 2-token continuations: chi-square goodness of fit to the target's exact law, N = 1200 continuations,
    alpha = 1e-4, bins with expected count < 5 pooled, hard failure on a zero-probability sample, seeds 0..N-1.
    The same test with the wrong rule (naive resampling) must reject (shows the test can fail)."""
    cfg = SamplingConfig(temperature=1.0, top_k=3)
    prompt = engine.encode("Name a prime number.", chat=True)
    exact = _exact_law(engine.target, prompt, cfg, 2)
    assert sum(exact.values()) == pytest.approx(1.0, abs=1e-5) and len(exact) <= 9
    d = build_drafter("llamacpp", models.DEFAULT_DRAFT, engine.tokenizer, engine.target, draft_threads=T)
    spec = Engine(engine.target, d, engine.tokenizer, sorted(engine.eos_token_ids))
    pvalues = {}
    for rule in ("lossless", "naive-resample"):
        counts: dict[tuple[int, ...], int] = {}
        outs = spec.generate([prompt] * N_SEQ, rule=rule, sampling=cfg, gamma=2, max_new_tokens=2,
                             seed=list(range(N_SEQ)), batch_size=8)
        for out in outs:
            key = tuple(out.token_ids)
            assert out.error is None
            assert exact.get(key, 0.0) > 0, f"{rule}: sampled a zero-probability continuation {key}"
            counts[key] = counts.get(key, 0) + 1
        keys = sorted(exact, key=lambda k: -exact[k])
        expected = np.array([exact[k] * N_SEQ for k in keys])
        observed = np.array([counts.get(k, 0) for k in keys], dtype=float)
        small = expected < 5
        if small.any():
            expected = np.append(expected[~small], expected[small].sum())
            observed = np.append(observed[~small], observed[small].sum())
        pvalues[rule] = chisquare(observed, expected * observed.sum() / expected.sum()).pvalue
    assert pvalues["lossless"] > ALPHA, pvalues
    assert pvalues["naive-resample"] < ALPHA, pvalues
