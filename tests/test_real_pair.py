"""The real Qwen2.5-Coder pair (fp32): speculative greedy decoding equals the target's own greedy decode.

Skipped with a reason when the pair is not installed (``verispec models install``); CI installs it."""

from __future__ import annotations

import pytest

from verispec import SamplingConfig
from verispec.drafters import NgramDrafter
from verispec.runtime.engine import SpeculativeEngine

pytestmark = pytest.mark.real

PROMPTS = [
    "Write a Python function `fib(n)` that returns the n-th Fibonacci number.",
    "def is_palindrome(s: str) -> bool:\n    \"\"\"Return True if s reads the same backwards.\"\"\"\n",
    "The capital of France is",
]
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def engine(real_engine_fp32) -> SpeculativeEngine:
    return real_engine_fp32  # tests/conftest.py: one fp32 load per session


def test_real_pair_greedy_equals_target_greedy(engine, target_greedy):
    """One row alone: the model drafter on the chat prompt and the n-gram drafter on the code prompt (its
    repetitions give n-gram proposals) equal the target's own greedy decode. Every prompt, rows joining and
    leaving a batch: the next test (the same reference decodes, computed once)."""
    ids = engine.encode(PROMPTS[0], chat=True)
    out = engine.generate(ids, sampling=SamplingConfig(temperature=0), gamma=5, max_new_tokens=NEW_TOKENS)
    assert out.token_ids == target_greedy(ids, NEW_TOKENS)
    assert out.metrics.drafted > 0 and out.metrics.accepted > 0  # a trained pair agrees on something
    ids = engine.encode(PROMPTS[1])
    ngram = SpeculativeEngine(engine.target, NgramDrafter(), engine.tokenizer, engine.eos_token_ids)
    out_ng = ngram.generate(ids, sampling=SamplingConfig(temperature=0), gamma=5, max_new_tokens=NEW_TOKENS)
    assert out_ng.token_ids == target_greedy(ids, NEW_TOKENS)
    assert out_ng.metrics.drafted > 0


def test_real_pair_batch_rows_equal_target_greedy(engine, target_greedy):
    """A batch of 3 rows of different prompt lengths (fp32, greedy), two of them finishing early so that the
    third runs alone at the end: every row equals the target's own greedy decode."""
    ids = [engine.encode(p, chat=i == 0) for i, p in enumerate(PROMPTS)]
    lengths = [NEW_TOKENS, 6, 11]
    refs = [target_greedy(x, n) for x, n in zip(ids, lengths, strict=True)]
    outs = engine.generate(ids, sampling=SamplingConfig(temperature=0), gamma=5, max_new_tokens=lengths,
                           batch_size=2)  # the third row joins when the second leaves
    assert [o.token_ids for o in outs] == refs


def test_real_pair_completes_paris(engine):
    out = engine.generate("The capital of France is", sampling=SamplingConfig(temperature=0), max_new_tokens=3)
    assert out.text.strip().startswith("Paris")
