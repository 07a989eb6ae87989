"""Adaptive draft length: the expected-tokens formula, the choice it implies, and losslessness with it."""

from __future__ import annotations

import pytest

from verispec.backends.hf import HFBackend
from verispec.drafters import ModelDrafter
from verispec.engine import SpeculativeEngine
from verispec.processors import SamplingConfig
from verispec.schedule import AdaptiveGamma, expected_tokens
from verispec.testing import tiny_qwen


def test_expected_tokens_closed_form():
    for alpha in (0.0, 0.3, 0.9):
        for g in range(6):
            assert expected_tokens(alpha, g) == pytest.approx((1 - alpha ** (g + 1)) / (1 - alpha))


def test_choice_follows_costs_and_acceptance():
    s = AdaptiveGamma(gamma_max=8)
    assert s.choose() == 8  # no measurements yet: explore with the longest draft
    for _ in range(50):
        s.update(drafted=5, accepted=0, draft_s=0.5, target_s=0.2)  # useless, expensive draft
    assert s.alpha < 0.01 and s.choose() == 0
    fast = AdaptiveGamma(gamma_max=8)
    for _ in range(50):
        fast.update(drafted=5, accepted=5, draft_s=0.005, target_s=0.2)  # free and always right
    assert fast.choose() == 8


def test_invalid_arguments():
    with pytest.raises(ValueError):
        AdaptiveGamma(gamma_max=-1)
    eng = SpeculativeEngine(HFBackend(tiny_qwen(1)), None)
    with pytest.raises(ValueError, match="gamma"):
        eng.generate([1, 2], gamma="sometimes")


def test_auto_gamma_keeps_greedy_exact():
    target, draft = tiny_qwen(1), tiny_qwen(2)
    plain = SpeculativeEngine(HFBackend(target), None)
    spec = SpeculativeEngine(HFBackend(target), ModelDrafter(HFBackend(draft)))
    greedy = SamplingConfig(temperature=0)
    for prompt in ([1, 2, 3], [7, 7, 7, 7], [40, 2, 9, 13, 5]):
        ref = plain.generate(prompt, sampling=greedy, gamma=0, max_new_tokens=30).token_ids
        assert spec.generate(prompt, sampling=greedy, gamma="auto", max_new_tokens=30).token_ids == ref
