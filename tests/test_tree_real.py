"""The real Qwen2.5-Coder pair (fp32): tree speculative greedy decoding equals the target's own greedy decode.

Skipped with a reason when the pair is not installed (``verispec models install``)."""

from __future__ import annotations

import pytest

from verispec import SamplingConfig
from verispec.drafters import TreeDrafter
from verispec.runtime.engine import Engine

pytestmark = pytest.mark.real

PROMPT = "Write a Python function `fib(n)` that returns the n-th Fibonacci number."
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def engine(real_engine_fp32) -> Engine:
    return real_engine_fp32  # tests/conftest.py: one fp32 load per session


def test_real_pair_tree_greedy_equals_target_greedy(engine, target_greedy):
    ids = engine.encode(PROMPT, chat=True)
    ref = target_greedy(ids, NEW_TOKENS)
    greedy = SamplingConfig(temperature=0)
    for kw in (dict(depth=4, top_k=2), dict(depth=5, top_k=3, budget=10)):
        tree = Engine(engine.target, TreeDrafter(engine.drafter.backend, **kw), engine.tokenizer, engine.eos_token_ids)
        out = tree.generate(ids, sampling=greedy, max_new_tokens=NEW_TOKENS)
        assert out.token_ids == ref, kw
        assert out.metrics.accepted > 0  # a trained pair agrees on something
