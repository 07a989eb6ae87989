"""The draft's confidence gate (``p_min``, llama.cpp's --draft-p-min): a chain stops where the draft's top
probability falls below p_min. The length then depends only on the draft's own distributions, so lossless
verification stays exact (chi-square against the target's law) and greedy stays the target's greedy."""

from __future__ import annotations

import pytest
import torch

from verispec.analysis import sequence_distribution
from verispec.backends.hf import HFBackend
from verispec.core.rules import get
from verispec.core.sampling import SamplingConfig, history_counts, process
from verispec.drafters import ModelDrafter
from verispec.drafters.registry import make_drafter
from verispec.runtime.engine import Engine
from verispec.testing import chi_square_pvalue, reference_greedy, tiny_qwen

V = 5
N_SEQ = 4000
ALPHA = 1e-4


def _p_fn(model, cfg):
    cache: dict[tuple[int, ...], torch.Tensor] = {}

    def fn(prefix):
        if prefix not in cache:
            with torch.no_grad():
                logits = model(torch.tensor([list(prefix)])).logits[0, -1]
            counts = history_counts(torch.zeros(V, dtype=torch.long), torch.tensor(prefix))[-1]
            cache[prefix] = process(logits, cfg, counts)
        return cache[prefix]

    return fn


@pytest.fixture(scope="module")
def pair():
    return tiny_qwen(11, vocab_size=V, logit_scale=8), tiny_qwen(12, vocab_size=V, logit_scale=8)


def test_gated_chains_follow_the_target_law(pair):
    """Lossless, T = 1, gamma 3, p_min 0.4 (the gate stops some chains early and lets others run): N = 4000
    seeded 3-token continuations, chi-square against the target's exact sequence law, alpha = 1e-4, bins with
    expected count < 5 pooled; a continuation of probability 0 fails at once."""
    target, draft = pair
    cfg = SamplingConfig(temperature=1.0)
    prompt = (1, 3, 2)
    exact = sequence_distribution("lossless", _p_fn(target, cfg), None, 0, 3, prompt)
    drafter = ModelDrafter(HFBackend(draft), p_min=0.4)
    eng = Engine(HFBackend(target), drafter)
    counts: dict[tuple[int, ...], int] = {}
    drafted = 0
    outs = eng.generate([list(prompt)] * N_SEQ, sampling=cfg, gamma=3, max_new_tokens=3, seed=list(range(N_SEQ)),
                        batch_size=64)  # one seeded row per continuation, 64 at a time
    for out in outs:
        key = tuple(out.token_ids)
        assert exact.get(key, 0.0) > 0, f"sampled a zero-probability continuation {key}"
        counts[key] = counts.get(key, 0) + 1
        drafted += out.metrics.drafted
    assert drafter.gated > 0 and drafted > 0  # the gate cut some chains, not all
    assert chi_square_pvalue(counts, exact) > ALPHA


def test_gated_greedy_is_the_target_greedy_and_drafts_less(pair):
    target, draft = pair
    prompt = [1, 3, 2]
    greedy = SamplingConfig(temperature=0)
    plain = Engine(HFBackend(target), ModelDrafter(HFBackend(draft)))
    gated_drafter = ModelDrafter(HFBackend(draft), p_min=0.4)
    gated = Engine(HFBackend(target), gated_drafter)
    a = plain.generate(prompt, sampling=greedy, gamma=4, max_new_tokens=24)
    b = gated.generate(prompt, sampling=greedy, gamma=4, max_new_tokens=24)
    assert a.token_ids == b.token_ids == reference_greedy(target, prompt, 24)
    assert b.metrics.drafted < a.metrics.drafted and gated_drafter.gated > 0
    # p_min 1 drafts nothing (no top probability reaches 1 here): plain decoding through the same loop
    none = Engine(HFBackend(target), ModelDrafter(HFBackend(draft), p_min=1.0))
    c = none.generate(prompt, sampling=SamplingConfig(temperature=1.0), gamma=4, max_new_tokens=8, seed=3)
    assert c.metrics.drafted == 0 and c.metrics.rounds == 8


def test_gate_is_validated():
    with pytest.raises(ValueError, match=r"draft p_min must be in \[0, 1\], got 1.5"):
        ModelDrafter(HFBackend(tiny_qwen(1, vocab_size=V)), p_min=1.5)
    with pytest.raises(ValueError, match="draft p_min gates a draft model's chain; drafter 'ngram' has none"):
        make_drafter("ngram", None, None, p_min=0.5)
    assert get("lossless").lossless
