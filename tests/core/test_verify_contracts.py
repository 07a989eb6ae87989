"""Input contracts of the verification API (found by porting vLLM's rejection-sampler tests).

Statistical setup where sampling is involved: N = 20,000 rows of ONE batched ``verify_block`` call, fixed seed;
the only assertions are exact (a token of probability 0 must never appear; a token whose q is 0 is never
accepted), so no test statistic is needed: one bad draw fails the test.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from verispec import rules
from verispec.core.verify.chain import verify_block, verify_greedy, verify_greedy_rule
from verispec.core.verify.tree import select_child
from verispec.testing import RULE_CONFIGS

N = 20_000


def d(x: object) -> torch.Tensor:
    return torch.as_tensor(x, dtype=torch.float64)


def test_draft_with_zero_q_is_rejected_and_p_zero_never_emitted():
    """p = [.5, .5, 0], q = [.5, .5, 0], draft token 2 (q(2) = 0: it cannot have been drawn from q). Before the
    fix it was accepted every time (the 'moot' branch) and token 2 (p = 0) was emitted."""
    p, q = d([0.5, 0.5, 0.0]), d([0.5, 0.5, 0.0])
    drafts = torch.full((N, 1), 2, dtype=torch.long)
    for name in ("lossless", "minp-sampling", "eta-sampling"):
        rule = rules.get(name)
        res = verify_block(rule, drafts, q.expand(N, 1, 3), p.expand(N, 2, 3), torch.Generator().manual_seed(0))
        assert int(res.num_accepted.sum()) == 0, name
        assert bool((res.accept_prob == 0).all()), name
        assert not bool((res.tokens[:, 0] == 2).any()), f"{name} emitted a token with p = 0"


@pytest.mark.parametrize(("name", "params"), RULE_CONFIGS)
def test_zero_q_draft_is_rejected_by_every_rule(name, params):
    """Whatever h a rule would give, a drafted token outside q's support is rejected (h forced to 0)."""
    rule = rules.get(name, **params)
    p, q = d([0.3, 0.3, 0.4]), d([0.6, 0.4, 0.0])
    res = verify_block(rule, torch.tensor([[2]] * 50), q.expand(50, 1, 3), p.expand(50, 2, 3),
                       torch.Generator().manual_seed(1))
    assert int(res.num_accepted.sum()) == 0


def test_lossless_never_emits_p_zero_tokens_over_random_blocks():
    """N = 20,000 blocks, gamma = 3, random p with zeros, drafts drawn from q by the test (q overlapping p's zeros):
    no emitted token (accepted, correction or bonus) has p = 0 at its position (hard failure, no statistic)."""
    g = torch.Generator().manual_seed(5)
    v, gamma = 7, 3
    p = torch.rand(gamma + 1, v, generator=g, dtype=torch.float64) * (torch.rand(gamma + 1, v, generator=g) > 0.4)
    p[:, 0] += 0.1
    p = p / p.sum(-1, keepdim=True)
    q = torch.rand(gamma, v, generator=g, dtype=torch.float64)
    q = q / q.sum(-1, keepdim=True)
    drafts = torch.stack([torch.multinomial(q[k], N, replacement=True, generator=g) for k in range(gamma)], -1)
    res = verify_block(rules.get("lossless"), drafts, q.expand(N, gamma, v), p.expand(N, gamma + 1, v), g)
    for k in range(gamma + 1):
        rows = res.num_accepted >= k
        assert bool((p[k][res.tokens[rows, k]] > 0).all()), f"position {k + 1}"


@pytest.mark.parametrize(
    ("which", "bad", "needle"),
    [
        ("p", [[0.5, 0.6], [0.5, 0.5]], "p rows must sum to 1"),
        ("p", [[1.5, -0.5], [0.5, 0.5]], "p has negative entries"),
        ("p", [[2.0, 3.0], [0.5, 0.5]], "p rows must sum to 1"),
        ("p", [[float("nan"), 1.0], [0.5, 0.5]], "p contains NaN"),
        ("p", [[float("inf"), 1.0], [0.5, 0.5]], "p contains inf"),
        ("q", [[0.5, 0.4]], "q rows must sum to 1"),
        ("q", [[-0.1, 1.1]], "q has negative entries"),
        ("q", [[float("nan"), 0.5]], "q contains NaN"),
    ],
)
def test_rows_that_are_not_distributions_are_refused(which, bad, needle):
    p, q = d([[0.5, 0.5], [0.5, 0.5]]).unsqueeze(0), d([[0.5, 0.5]]).unsqueeze(0)
    if which == "p":
        p = d(bad).unsqueeze(0)
    else:
        q = d(bad).unsqueeze(0)
    with pytest.raises(ValueError, match=needle):
        verify_block(rules.get("lossless"), torch.tensor([[0]]), q, p)
    with pytest.raises(ValueError, match=needle):
        verify_greedy_rule(rules.get("cos-we", lam=0.5), torch.tensor([[0]]), p, q)


def test_small_rounding_in_the_sum_is_accepted():
    p = d([[0.5, 0.5 + 5e-5], [0.5, 0.5]]).unsqueeze(0)
    verify_block(rules.get("lossless"), torch.tensor([[0]]), None, p)


def test_out_of_range_and_non_integer_draft_ids():
    p = d([[0.5, 0.5], [0.5, 0.5]]).unsqueeze(0)
    for ids in (torch.tensor([[2]]), torch.tensor([[-1]])):
        with pytest.raises(ValueError, match="outside the vocabulary"):
            verify_block(rules.get("lossless"), ids, None, p)
        with pytest.raises(ValueError, match="outside the vocabulary"):
            verify_greedy_rule(rules.get("lossless"), ids, p, None)
    with pytest.raises(ValueError, match="integer token ids"):
        verify_block(rules.get("lossless"), torch.tensor([[0.0]]), None, p)


def test_int32_ids_work_everywhere():
    p = d([[0.1, 0.9], [0.7, 0.3]]).unsqueeze(0)
    ids32, ids64 = torch.tensor([[1]], dtype=torch.int32), torch.tensor([[1]])
    a = verify_block(rules.get("lossless"), ids32, None, p, torch.Generator().manual_seed(0))
    b = verify_block(rules.get("lossless"), ids64, None, p, torch.Generator().manual_seed(0))
    assert torch.equal(a.tokens, b.tokens) and a.tokens.dtype == torch.long
    g = verify_greedy(ids32, torch.tensor([[1, 0]], dtype=torch.int32))
    assert g.tokens.tolist() == [[1, 0]] and g.num_accepted.tolist() == [1]
    r = verify_greedy_rule(rules.get("lossless"), ids32, p, None)
    assert r.tokens.tolist() == [[1, 0]]


def test_accept_prob_and_deprecated_h():
    p = d([[0.6, 0.3, 0.1], [0.2, 0.2, 0.6]]).unsqueeze(0)
    res = verify_block(rules.get("lossless"), torch.tensor([[1]]), None, p, torch.Generator().manual_seed(0))
    assert res.accept_prob[0].tolist() == pytest.approx([0.3])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert torch.equal(res.h, res.accept_prob)
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)


def test_tree_walk_refuses_a_sampled_candidate_outside_q():
    with pytest.raises(ValueError, match="zero draft probability"):
        select_child(rules.get("lossless"), d([0.5, 0.5, 0.0]), [2], d([0.5, 0.5, 0.0]))


def test_tree_walk_token_only_never_emits_p_zero():
    """Token-only candidate 2 with p(2) = 0: N = 2,000 walks, never accepted, never emitted (hard failure)."""
    g = torch.Generator().manual_seed(3)
    for _ in range(2000):
        i, tok = select_child(rules.get("lossless"), d([0.5, 0.5, 0.0]), [2, 0], None, g)
        assert i != 0 and tok != 2
