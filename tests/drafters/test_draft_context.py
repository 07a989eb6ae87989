"""A draft model whose context is shorter than the target's: the drafters draft within the draft's own context (fewer
tokens near its end, none past it) instead of failing the round, and greedy decoding still equals the target's."""

from __future__ import annotations

import pytest
import torch

from verispec.backends.hf import HFBackend
from verispec.core.rules import get
from verispec.core.sampling import SamplingConfig
from verispec.drafters import HybridDrafter, ModelDrafter, TreeDrafter
from verispec.drafters.base import DraftRequest
from verispec.runtime.engine import Engine
from verispec.testing import ToyTokenizer, reference_greedy, tiny_qwen

GREEDY = SamplingConfig(temperature=0)
DRAFT_CONTEXT = 32


@pytest.fixture(scope="module")
def target():
    return tiny_qwen(1, logit_scale=4.0, max_context=128)


@pytest.fixture(scope="module")
def draft():
    return tiny_qwen(2, logit_scale=4.0, max_context=DRAFT_CONTEXT)


def _drafters(draft):
    return {
        "model": ModelDrafter(HFBackend(draft)),
        "tree": TreeDrafter(HFBackend(draft), depth=4, top_k=2),
        "hybrid": HybridDrafter(ModelDrafter(HFBackend(draft))),
    }


@pytest.mark.parametrize("kind", ["model", "tree", "hybrid"])
def test_draft_depth_is_capped_by_the_draft_context(draft, kind):
    drafter = _drafters(draft)[kind]
    drafter.add_row(0, 4)
    # distinct tokens (the history never repeats), so the hybrid's look-up finds no match and its draft model drafts
    for n_ids, depth in ((DRAFT_CONTEXT - 6, 4), (DRAFT_CONTEXT - 2, 3), (DRAFT_CONTEXT, 1), (DRAFT_CONTEXT + 1, 0),
                         (DRAFT_CONTEXT + 5, 0)):
        req = DraftRequest(0, list(range(n_ids)), 8, GREEDY, get("lossless"))
        prop = drafter.propose([req])[0]
        assert prop.depth == depth, (n_ids, prop.depth)
        drafter.commit(0, prop, [])
        drafter.update(0, prop, 0, 0.0)


@pytest.mark.parametrize("kind", ["model", "tree"])
def test_greedy_decode_runs_past_the_draft_context(target, draft, kind):
    prompt = list(range(1, DRAFT_CONTEXT - 2))
    eng = Engine(HFBackend(target), _drafters(draft)[kind], ToyTokenizer(), ())
    res = eng.generate(prompt, sampling=GREEDY, max_new_tokens=12, gamma=4)
    with torch.no_grad():
        assert res.token_ids == reference_greedy(target, prompt, 12)
