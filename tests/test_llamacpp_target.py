"""The llama.cpp TARGET (``load_engine(..., target_backend="llamacpp")``) on the real Qwen2.5-Coder GGUFs: loading,
greedy equality with llama.cpp's own greedy decode, speculative greedy == target-only greedy up to batch-shape
near-ties, and the exact sampled law of whole short continuations (chi-square).

Skipped with a reason when llama-cpp-python (requirements-fast.txt) or the real pair (``verispec models install``)
is missing.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from verispec import SamplingConfig, models
from verispec.backends.base import ScoreRequest, common_prefix_len

pytest.importorskip("llama_cpp", reason="llama-cpp-python not installed: pip install -r requirements-fast.txt")

from verispec.api import build_drafter, load_engine  # noqa: E402
from verispec.backends.llamacpp import LlamaCppBackend  # noqa: E402
from verispec.runtime.engine import Engine  # noqa: E402
from verispec.testing import REAL_THREADS, chi_square_power  # noqa: E402

pytestmark = pytest.mark.real

LOGIT_TOL = 1.0  # batch-shape tolerance of llama.cpp's logits (see tests/backends/test_llamacpp_backend.py)
T = REAL_THREADS  # llama.cpp threads: the laws are compared within one engine
#: rows of the module's engine: the sampled-law tests run 16 rows per batch (about 1.5x the samples per second of 8)
ROWS = 16


@pytest.fixture(scope="module")
def engine() -> Engine:
    for name in (models.DEFAULT_TARGET, models.DEFAULT_DRAFT):
        if not models.gguf_path(name).is_file() or not models.is_installed(name):
            pytest.skip(f"{name} not installed (verispec models install)")
    return load_engine(drafter="none", target_backend="llamacpp", threads=T, cache=False, max_rows=ROWS)


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
    assert engine.max_rows == t.max_rows == ROWS  # llama.cpp sequences, allocated up front
    wide = load_engine(drafter="llamacpp", target_backend="llamacpp", threads=T, cache=False, max_rows=12)
    assert wide.max_rows == wide.target.max_rows == wide.drafter.backend.max_rows == 12
    del wide


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


N_SEQ = 600
ALPHA = 1e-4


#: llama.cpp's logits move by ~0.1 between batch shapes and even between rows of one batch (measured: the prompt
#: below, 3rd vs 4th candidate 16.05 vs 15.97 alone, 15.96 vs 15.86 as row 0 of a 6-row batch); a top-k support is
#: only the same in every batch shape if the k-th and (k+1)-th logits are further apart than that
SUPPORT_GAP = 0.5


@contextmanager
def _dist_fn(backend: LlamaCppBackend, cfg: SamplingConfig, check_gap: bool = True):
    """prefix -> the backend's processed next-token distribution (float64), one row per call, cached; the row is
    freed on leaving the block. With ``check_gap``, fail when the top-k boundary is a near-tie (the support would
    depend on the batch shape)."""
    from verispec.core.sampling import process

    row, cache = backend.add_row(), {}

    def fn(prefix: tuple[int, ...]) -> torch.Tensor:
        if prefix not in cache:
            logits = backend.score([ScoreRequest(row, list(prefix))])[0][0]
            if check_gap and cfg.top_k:
                top = logits.topk(cfg.top_k + 1).values
                if float(top[-2] - top[-1]) < SUPPORT_GAP:
                    pytest.fail(f"top-{cfg.top_k} boundary is a near-tie after {prefix[-3:]}: "
                                f"{float(top[-2]):.3f} vs {float(top[-1]):.3f}; pick another prompt or top_k")
            cache[prefix] = process(logits, cfg).double()
        return cache[prefix]

    try:
        yield fn
    finally:
        backend.remove_row(row)


def _pooled_chisquare(exact: dict, outs: list) -> float:
    """p-value of the sampled continuations against ``exact`` (bins with expected count < 5 pooled); fails at once
    on an error or a zero-probability continuation."""
    counts: dict[tuple[int, ...], int] = {}
    for out in outs:
        key = tuple(out.token_ids)
        assert out.error is None
        assert exact.get(key, 0.0) > 0, f"sampled a zero-probability continuation {key}"
        counts[key] = counts.get(key, 0) + 1
    keys = sorted(exact, key=lambda k: -exact[k])
    expected = np.array([exact[k] for k in keys]) * len(outs)
    observed = np.array([counts.get(k, 0) for k in keys], dtype=float)
    small = expected < 5
    if small.any():
        expected = np.append(expected[~small], expected[small].sum())
        observed = np.append(observed[~small], observed[small].sum())
    return float(chisquare(observed, expected * observed.sum() / expected.sum()).pvalue)


@pytest.mark.slow
def test_sampled_law_is_the_llamacpp_target_law(engine):
    """Lossless speculative sampling with the llama.cpp target and the llama.cpp draft (gamma 2, T = 1, top_k 2),
    whole 2-token continuations: chi-square goodness of fit to the target's exact law (its own processed
    llama.cpp distributions), N = 600 continuations (seeds 0..N-1, 16 rows per batch), alpha = 1e-4, bins with
    expected count < 5 pooled, hard failure on a zero-probability sample. The test can fail: the exact law of the
    wrong rule (naive resampling) on the same pair is far enough that this N rejects it with power > 0.99."""
    from verispec.analysis import sequence_distribution

    cfg = SamplingConfig(temperature=1.0, top_k=2)
    prompt = tuple(engine.encode("Name a prime number.", chat=True))
    d = build_drafter("llamacpp", models.DEFAULT_DRAFT, engine.tokenizer, engine.target, draft_threads=T,
                      max_rows=ROWS)
    # q's support may move (no gap check): the verifier gets the q it drew from
    with _dist_fn(engine.target, cfg) as p_fn, _dist_fn(d.backend, cfg, check_gap=False) as q_fn:
        exact = sequence_distribution("lossless", p_fn, q_fn, 2, 2, prompt)
        plain = sequence_distribution("lossless", p_fn, None, 2, 2, prompt)
        naive = sequence_distribution("naive-resample", p_fn, q_fn, 2, 2, prompt)
    assert sum(exact.values()) == pytest.approx(1.0, abs=1e-9) and len(exact) <= 4
    assert max(abs(exact.get(k, 0) - v) for k, v in plain.items()) < 1e-9  # lossless: the target's own law
    power = chi_square_power(exact, naive, N_SEQ, ALPHA)
    assert power > 0.99, f"naive resampling would not be detected (power {power:.3f})"

    spec = Engine(engine.target, d, engine.tokenizer, sorted(engine.eos_token_ids))
    outs = spec.generate([list(prompt)] * N_SEQ, sampling=cfg, gamma=2, max_new_tokens=2, seed=list(range(N_SEQ)),
                         batch_size=ROWS)
    pvalue = _pooled_chisquare(exact, outs)
    assert pvalue > ALPHA, f"chi-square p = {pvalue:.2e}"


N_HSD = 600


@pytest.mark.slow
def test_hsd_sampled_law_is_the_llamacpp_target_law(engine):
    """HSD verification on the real pair (llama.cpp target and draft, gamma 2, T = 1, top_k 2), whole 3-token
    continuations, so that rounds verify two drafts (with one draft every verifier is token-wise): chi-square
    goodness of fit to the target's exact law, N = 600 continuations (seeds 0..N-1, 16 rows per batch), alpha =
    1e-4, bins with expected count < 5 pooled, hard failure on a zero-probability sample; the enumerated HSD law on
    the same distributions equals the target's first, and a wrong law (naive resampling) would be rejected with
    power > 0.85 (0.89 here: this law is nearer the naive one than the 2-token law above). Block verification's
    round law equals HSD's exactly (tests/core/test_hsd.py)."""
    from verispec.analysis import sequence_distribution

    cfg = SamplingConfig(temperature=1.0, top_k=2)
    prompt = tuple(engine.encode("What is 2+2?", chat=True))
    d = build_drafter("llamacpp", models.DEFAULT_DRAFT, engine.tokenizer, engine.target, draft_threads=T,
                      max_rows=ROWS)
    with _dist_fn(engine.target, cfg) as p_fn, _dist_fn(d.backend, cfg, check_gap=False) as q_fn:
        plain = sequence_distribution("lossless", p_fn, None, 2, 3, prompt)
        hsd = sequence_distribution("lossless", p_fn, q_fn, 2, 3, prompt, verifier="hsd")
        naive = sequence_distribution("naive-resample", p_fn, q_fn, 2, 3, prompt)
    assert max(abs(hsd.get(k, 0) - v) for k, v in plain.items()) < 1e-9
    power = chi_square_power(plain, naive, N_HSD, ALPHA)
    assert power > 0.85, f"naive resampling would not be detected (power {power:.3f})"

    spec = Engine(engine.target, d, engine.tokenizer, sorted(engine.eos_token_ids))
    outs = spec.generate([list(prompt)] * N_HSD, sampling=cfg, gamma=2, max_new_tokens=3, seed=list(range(N_HSD)),
                         batch_size=ROWS, verifier="hsd")
    assert sum(out.metrics.accepted for out in outs) > N_HSD // 4  # two-draft rounds were really verified
    pvalue = _pooled_chisquare(plain, outs)
    assert pvalue > ALPHA, f"chi-square p = {pvalue:.2e}"
