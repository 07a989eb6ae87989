"""Deterministic temperature-0 verification of any rule: ``verify_greedy_rule`` accepts a
draft iff it equals argmax of ``rule.greedy_reference(p, q)`` built from the UNtempered p and q.

No sampling: every assertion is exact. The weighted-ensemble case is compared with transformers' greedy
``assistant_ensemble_weight`` verification (transformers 5.24.0, ``generation/utils.py``, the ``do_sample=False``
branch of assisted decoding), reproduced below line for line so that the check runs on every transformers
verispec supports (4.57.6 does not have it); ``test_vendored_copy_matches_the_wheel`` checks the copy against a
5.24.0 wheel when ``VERISPEC_TRANSFORMERS_WHEEL`` points to one (skipped otherwise).
"""

from __future__ import annotations

import os
import zipfile

import pytest
import torch

from verispec import rules
from verispec.analysis import induced_distribution
from verispec.core.verify.chain import verify_greedy, verify_greedy_rule
from verispec.testing import RULE_CONFIGS


def _hf_ensemble_greedy(candidate_ids: torch.Tensor, candidate_logits: torch.Tensor, new_logits: torch.Tensor,
                        assistant_ensemble_weight: float) -> tuple[torch.Tensor, int]:
    """transformers 5.24.0 greedy ensemble verification (utils.py lines 4134-4147), batch size 1."""
    candidate_length = candidate_ids.shape[1]
    p_probs = new_logits[:, :candidate_length, :].softmax(dim=-1)
    q_probs = candidate_logits.softmax(dim=-1)
    nu_probs = assistant_ensemble_weight * p_probs + (1.0 - assistant_ensemble_weight) * q_probs
    bonus_logits = new_logits[:, candidate_length:, :]
    selected_tokens = torch.cat([nu_probs.argmax(dim=-1), bonus_logits.argmax(dim=-1)], dim=-1)
    n_matches = ((~(candidate_ids == selected_tokens[:, :-1])).cumsum(dim=-1) < 1).sum()
    valid_tokens = selected_tokens[:, : n_matches + 1]
    return valid_tokens, int(n_matches)


def _logits(g: torch.Generator, *shape: int) -> torch.Tensor:
    return 3 * torch.randn(*shape, generator=g, dtype=torch.float64)


def test_cos_we_greedy_matches_transformers_assistant_ensemble_weight():
    """500 random (p, q, draft) blocks, gamma = 4, V = 12, w in {0.2, 0.5, 0.8}; drafts are the draft's greedy
    tokens with a random 30% replaced: same accepted count and same emitted tokens as transformers."""
    g = torch.Generator().manual_seed(0)
    v, gamma = 12, 4
    for trial in range(500):
        w = (0.2, 0.5, 0.8)[trial % 3]
        lp, lq = _logits(g, 1, gamma + 1, v), _logits(g, 1, gamma, v)
        drafts = lq.argmax(-1)
        noise = torch.randint(0, v, drafts.shape, generator=g)
        drafts = torch.where(torch.rand(drafts.shape, generator=g) < 0.3, noise, drafts)
        hf_tokens, hf_n = _hf_ensemble_greedy(drafts, lq, lp, w)
        res = verify_greedy_rule(rules.get("cos-we", lam=w), drafts, lp.softmax(-1), lq.softmax(-1))
        assert int(res.num_accepted[0]) == hf_n
        assert res.emitted(0) == hf_tokens[0].tolist()


def test_lossless_greedy_is_the_exact_greedy_path():
    g = torch.Generator().manual_seed(1)
    for _ in range(200):
        lp, lq = _logits(g, 3, 4, 9), _logits(g, 3, 3, 9)
        drafts = torch.where(torch.rand(3, 3, generator=g) < 0.5, lp[:, :3].argmax(-1), lq.argmax(-1))
        for name in ("lossless", "minp-sampling", "eta-sampling"):
            a = verify_greedy_rule(rules.get(name), drafts, lp.softmax(-1), lq.softmax(-1))
            b = verify_greedy(drafts, lp.argmax(-1))
            assert torch.equal(a.tokens, b.tokens) and torch.equal(a.num_accepted, b.num_accepted)


@pytest.mark.parametrize(("name", "params"), RULE_CONFIGS)
def test_every_rule_accepts_iff_draft_is_the_reference_argmax(name, params):
    """Accept iff draft == argmax greedy_reference; the correction is that argmax; the bonus argmax p.
    The reference is the rule's own induced law (lossless: its target)."""
    rule = rules.get(name, **params)
    g = torch.Generator().manual_seed(2)
    p = torch.softmax(_logits(g, 64, 3, 10), -1)
    q = torch.softmax(_logits(g, 64, 2, 10), -1)
    ref = rule.greedy_reference(p[:, :2], q)
    best = ref.argmax(-1)
    drafts = torch.where(torch.rand(64, 2, generator=g) < 0.5, best, q.argmax(-1))
    res = verify_greedy_rule(rule, drafts, p, q)
    for i in range(64):
        n = 0
        while n < 2 and int(drafts[i, n]) == int(best[i, n]):
            n += 1
        assert int(res.num_accepted[i]) == n
        last = int(best[i, n]) if n < 2 else int(p[i, 2].argmax())
        assert res.emitted(i) == drafts[i, :n].tolist() + [last]
    expected = rule.target(p[:, :2]) if rule.lossless else induced_distribution(rule, p[:, :2], q)
    assert torch.allclose(ref, expected, atol=1e-12, rtol=0)


def test_greedy_reference_of_cos_rules_is_their_equation():
    p, q = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64), torch.tensor([0.1, 0.2, 0.7], dtype=torch.float64)
    assert torch.equal(rules.get("cos-we", lam=0.4).greedy_reference(p, q), 0.4 * p + 0.6 * q)
    cd = rules.get("cos-cd", lam=0.5)
    assert torch.equal(cd.greedy_reference(p, q), cd.reference(p, q))
    # the deterministic reading is not the one-hot reading: with one-hot p and q a CoS-WE "greedy" run is random
    onehot_p, onehot_q = torch.eye(3, dtype=torch.float64)[0], torch.eye(3, dtype=torch.float64)[2]
    assert 0 < float(rules.get("cos-we", lam=0.4).acceptance(onehot_p, onehot_q)[2]) < 1
    assert int(rules.get("cos-we", lam=0.4).greedy_reference(p, q).argmax()) == 2


def test_bonus_argmax_is_argmax_p_for_every_registered_rule():
    g = torch.Generator().manual_seed(3)
    p = torch.softmax(_logits(g, 200, 11), -1)
    for name, params in RULE_CONFIGS:
        assert torch.equal(rules.get(name, **params).bonus(p).argmax(-1), p.argmax(-1)), name


@pytest.mark.skipif(not os.environ.get("VERISPEC_TRANSFORMERS_WHEEL"), reason="set VERISPEC_TRANSFORMERS_WHEEL to a "
                    "transformers-5.24.0 wheel (pip download --no-deps transformers==5.24.0) to check the copy")
def test_vendored_copy_matches_the_wheel():
    with zipfile.ZipFile(os.environ["VERISPEC_TRANSFORMERS_WHEEL"]) as zf:
        src = zf.read("transformers/generation/utils.py").decode()
    for line in ("nu_probs = assistant_ensemble_weight * p_probs + (1.0 - assistant_ensemble_weight) * q_probs",
                 "selected_tokens = torch.cat([nu_probs.argmax(dim=-1), bonus_logits.argmax(dim=-1)], dim=-1)",
                 "p_probs = new_logits[:, :candidate_length, :].softmax(dim=-1)",
                 "q_probs = candidate_logits.softmax(dim=-1)",
                 "n_matches = ((~(candidate_new_tokens == selected_tokens[:, :-1])).cumsum(dim=-1) < 1).sum()"):
        assert line in src, line
