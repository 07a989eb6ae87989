"""verispec's rules on vLLM's flattened tensors (``verispec.integrations.vllm.sampler``): runs everywhere, vLLM
or not, since the adapter needs only torch.

Statistical test: N = 30,000 requests of one draft token each, verified in one call, seed 0; chi-square of the
emitted token against the rule's exact induced distribution (``verispec.analysis.induced_distribution``) at
alpha = 1e-4; a sampled token of probability 0 fails outright."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from verispec.analysis import induced_distribution
from verispec.core import rules
from verispec.integrations.vllm.sampler import PLACEHOLDER, verify_requests
from verispec.testing import chi_square_pvalue

V = 10


def _dists(n: int, seed: int, zero: int | None = None) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.softmax(torch.randn(n, V, generator=g, dtype=torch.float64) * 1.5, -1)
    if zero is not None:
        x[:, zero] = 0
        x = x / x.sum(-1, keepdim=True)
    return x.float()


def test_ragged_batch_mixed_rules_and_untouched_rows():
    num = [3, 0, 2, 1]
    drafts = torch.tensor([1, 2, 3, 4, 5, 6])
    target = _dists(6, 0)
    bonus = _dists(4, 1)
    q = _dists(6, 2)
    out = torch.full((4, 4), 7, dtype=torch.int32)  # vLLM's own result, here a marker
    lossless, lenience = rules.get("lossless"), rules.get("lenience", l=0.5)
    res = verify_requests([lossless, lenience, None, lossless], drafts, num, q, target, bonus,
                          greedy=[False] * 4, generators={0: torch.Generator().manual_seed(3)}, out=out)
    assert res is out
    assert out[2].tolist() == [7, 7, 7, 7]  # no rule: vLLM's row stays
    for row, n in ((0, 3), (1, 0), (3, 1)):
        toks = out[row].tolist()
        k = next(i for i, t in enumerate(toks + [PLACEHOLDER]) if t == PLACEHOLDER)
        assert 1 <= k <= n + 1 and all(t == PLACEHOLDER for t in toks[k:])
        assert all(0 <= t < V for t in toks[:k])


def test_greedy_rows_follow_the_argmax():
    target = torch.nn.functional.one_hot(torch.tensor([1, 5, 3]), V).float()  # argmax 1, 5 | 3
    bonus = torch.nn.functional.one_hot(torch.tensor([8, 9]), V).float()
    out = verify_requests([rules.get("lossless")] * 2, torch.tensor([1, 2, 3]), [2, 1], None, target, bonus,
                          greedy=[True, True])
    assert out.tolist() == [[1, 5, PLACEHOLDER], [3, 9, PLACEHOLDER]]  # mismatch at 2 -> 5; 3 accepted + bonus 9


def test_seeded_request_is_reproducible():
    target, bonus, q = _dists(2, 0), _dists(1, 1), _dists(2, 2)
    rule = rules.get("spec-cascade", p_base=0.3)
    runs = [verify_requests([rule], torch.tensor([4, 2]), [2], q, target, bonus, [False],
                            {0: torch.Generator().manual_seed(11)}).tolist() for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]


def test_bad_layout_is_refused():
    with pytest.raises(ValueError, match="drafted"):
        verify_requests([None], torch.tensor([1, 2]), [1], None, _dists(1, 0), _dists(1, 1), [False])
    with pytest.raises(ValueError, match="bonus_probs"):
        verify_requests([None], torch.tensor([1]), [1], None, _dists(1, 0), _dists(2, 1), [False])


@pytest.mark.parametrize(("name", "params"), [("lossless", {}), ("lenience", {"l": 0.5}),
                                              ("spec-cascade", {"p_base": 0.1}), ("typical", {"epsilon": 0.1}),
                                              ("cos-we", {"lam": 0.4})])
@pytest.mark.parametrize("onehot", [False, True])
def test_emitted_token_follows_the_exact_law(name, params, onehot):
    n = 30_000
    p, p_bonus = _dists(1, 5), _dists(1, 6)
    q = _dists(1, 7, zero=V - 1)
    rule = rules.get(name, **params)
    g = torch.Generator().manual_seed(0)
    drafts = torch.multinomial(q[0].double(), n, replacement=True, generator=g)
    # one-hot drafts (n-gram / EAGLE-style proposers give no q): the law is the rule's on a point mass
    res = verify_requests([rule] * n, drafts, [1] * n, None if onehot else q.expand(n, V), p.expand(n, V),
                          p_bonus.expand(n, V), [False] * n)
    counts = Counter(int(t) for t in res[:, 0])
    if onehot:
        exact = sum(float(q[0, x]) * induced_distribution(rule, p[0].double(),
                                                           torch.nn.functional.one_hot(torch.tensor(x), V).double())
                    for x in range(V))
    else:
        exact = induced_distribution(rule, p[0].double(), q[0].double())
    support = [k for k in range(V) if float(exact[k]) > 0]
    assert set(counts) <= set(support), f"sampled a zero-probability token: {set(counts) - set(support)}"
    assert len(support) > 1  # a point mass would leave nothing to test
    pvalue = chi_square_pvalue({(k,): c for k, c in counts.items()}, {(k,): float(exact[k]) for k in support})
    assert pvalue > 1e-4, (name, onehot, pvalue)
