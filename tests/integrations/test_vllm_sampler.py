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
from verispec.testing import chi_square_pvalue, toy_model

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


def test_a_group_that_fails_leaves_every_row_as_it_was():
    """Rows are verified group by group (here lossless, then lenience); when a later group fails (its q is not a
    distribution), no earlier row may keep the plug-in's tokens: the caller then keeps vLLM's own result."""
    drafts, num = torch.tensor([1, 2, 3, 4]), [2, 2]
    target, bonus, q = _dists(4, 0), _dists(2, 1), _dists(4, 2)
    q[2:] = float("nan")  # the lenience row's draft distributions
    out = torch.full((2, 3), 7, dtype=torch.int32)  # vLLM's own result, here a marker
    with pytest.raises(ValueError):
        verify_requests([rules.get("lossless"), rules.get("lenience", l=0.5)], drafts, num, q, target, bonus,
                        greedy=[False, False], out=out)
    assert out.tolist() == [[7, 7, 7], [7, 7, 7]]


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



def _argmax_one_hot(q_fn):
    return lambda prefix: torch.nn.functional.one_hot(q_fn(prefix).argmax(), q_fn(prefix).numel()).double()


def test_vllm_round_structure_lossless_is_the_target_law_and_lossy_laws_depend_on_it():
    """sequence_distribution with vLLM's draft_length (target-only first step, gamma drafts every round, the output
    cut at the limit): lossless is the target's law to 1e-12 with a one-hot argmax draft; lenience's law sums to 1
    and differs from the one under verispec's capped rounds by more than 0.01 (so the structure matters)."""
    from verispec.analysis import sequence_distribution
    from verispec.integrations.vllm import draft_length

    p_fn = toy_model(1, 4)
    q_fn = _argmax_one_hot(toy_model(2, 4))
    target = sequence_distribution("lossless", p_fn, None, 0, 4, (0,))
    vllm_law = sequence_distribution("lossless", p_fn, q_fn, 2, 4, (0,), draft_length=draft_length)
    assert max(abs(vllm_law.get(k, 0.0) - v) for k, v in target.items()) < 1e-12
    lenient = rules.get("lenience", l=0.3)
    a = sequence_distribution(lenient, p_fn, q_fn, 2, 4, (0,), draft_length=draft_length)
    b = sequence_distribution(lenient, p_fn, q_fn, 2, 4, (0,))
    assert sum(a.values()) == pytest.approx(1.0, abs=1e-12)
    assert max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b)) > 0.01
    from verispec.core.rules.budget import Budget

    with pytest.raises(ValueError, match="budget"):
        sequence_distribution(lenient, p_fn, q_fn, 2, 4, (0,), budget=Budget(tv=0.1), draft_length=draft_length)


N_LOOP = 20_000


@pytest.mark.parametrize("rule", [rules.get("lossless"), rules.get("lenience", l=0.3),
                                  rules.get("spec-cascade", p_base=0.3), rules.get("typical", epsilon=0.1)],
                         ids=lambda r: type(r).__name__)
def test_vllms_loop_through_the_adapter_follows_the_vllm_round_law(rule):
    """vLLM's loop simulated on toy models with the adapter itself: a prefill step (no drafts: the bonus position
    only), then rounds of 2 one-hot argmax drafts verified by verify_requests, output cut at 3 tokens; N = 20,000
    rows, seed 0, chi-square against sequence_distribution(..., draft_length=vllm's) at alpha 1e-4 (bins with
    expected count < 5 pooled), a zero-probability continuation fails at once. The law under verispec's own
    capped rounds differs by > 0.005 and is rejected by the same data (lenience)."""
    from verispec.analysis import sequence_distribution
    from verispec.integrations.vllm import draft_length

    p_fn, q_fn, gamma, length = toy_model(5, 4), _argmax_one_hot(toy_model(6, 4)), 2, 3
    torch.manual_seed(0)
    seqs: list[tuple[int, ...]] = [(0,)] * N_LOOP
    while len(seqs[0]) - 1 < length:
        done = len(seqs[0]) - 1  # every row is at the same length until the cut: rounds emit variable lengths
        g = draft_length(done, length, gamma)
        rows = []
        for s in seqs:
            drafts = []
            for _ in range(g):
                drafts.append(int(q_fn(s + tuple(drafts)).argmax()))
            rows.append(drafts)
        flat = torch.tensor([t for d in rows for t in d], dtype=torch.long)
        pairs = zip(seqs, rows, strict=True)
        target = (torch.stack([p_fn(s + tuple(d[:i])) for s, d in pairs for i in range(g)]) if g
                  else torch.zeros(0, 4, dtype=torch.float64))
        bonus = torch.stack([p_fn(s + tuple(d)) for s, d in zip(seqs, rows, strict=True)])
        out = verify_requests([rule] * len(seqs), flat, [g] * len(seqs), None, target, bonus, [False] * len(seqs))
        seqs = [s + tuple(int(t) for t in o.tolist() if t != PLACEHOLDER) for s, o in zip(seqs, out, strict=True)]
        seqs = [s[: 1 + length] for s in seqs]
        if len({len(s) for s in seqs}) > 1:  # rows diverge in length: finish each row on its own
            break
    # rows that are not done yet finish with one-row calls (same loop, same law)
    finished = []
    for s in seqs:
        while len(s) - 1 < length:
            g = draft_length(len(s) - 1, length, gamma)
            d = []
            for _ in range(g):
                d.append(int(q_fn(s + tuple(d)).argmax()))
            target = torch.stack([p_fn(s + tuple(d[:i])) for i in range(g)]) if g else torch.zeros(0, 4,
                                                                                                 dtype=torch.float64)
            o = verify_requests([rule], torch.tensor(d, dtype=torch.long), [g], None, target,
                                p_fn(s + tuple(d)).unsqueeze(0), [False])[0]
            s = (s + tuple(int(t) for t in o.tolist() if t != PLACEHOLDER))[: 1 + length]
        finished.append(s[1:])
    law = sequence_distribution(rule, p_fn, q_fn, gamma, length, (0,), draft_length=draft_length)
    assert chi_square_pvalue(Counter(finished), law) > 1e-4
    if not rule.lossless and isinstance(rule, rules.Lenience):  # the test can tell the two round structures apart
        capped = sequence_distribution(rule, p_fn, q_fn, gamma, length, (0,))
        assert max(abs(capped.get(k, 0.0) - law.get(k, 0.0)) for k in set(law) | set(capped)) > 0.005
        try:
            wrong = chi_square_pvalue(Counter(finished), capped)
        except AssertionError:  # a continuation impossible under the capped rounds was sampled
            wrong = 0.0
        assert wrong < 1e-4
