"""Half-precision p and q (what vLLM and other callers pass): accepted with a dtype-aware tolerance, computed in
float64 after renormalizing, with the same exact law; q(x) = 0 for a drafted token still rejected; non-finite
values and rows far from 1 still an error. The greedy cases follow the structure of vLLM's rejection-sampler
tests (perfect match with bonus, early and late mismatch, several sequences, one-token and empty drafts), in
float16 and bfloat16.

Statistical test: N = 40,000 rows of one batched ``verify_block`` call, seed 0, chi-square of the first emitted
token against the exact induced distribution of the renormalized inputs at alpha = 1e-4; a sampled token of
probability 0 fails outright (``chi_square_pvalue``)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from verispec import rules
from verispec.analysis import induced_distribution
from verispec.core.verify.chain import as_float64, check_distribution, sum_tolerance, verify_block, verify_greedy
from verispec.testing import chi_square_pvalue

HALF = [torch.float16, torch.bfloat16]
N = 40_000


def softmax_in(dtype: torch.dtype, logits: torch.Tensor) -> torch.Tensor:
    """A softmax computed in ``dtype`` (how a half-precision engine hands over its probabilities)."""
    return torch.softmax(logits.to(dtype), -1)


@pytest.mark.parametrize("dtype", HALF)
def test_large_vocabulary_half_precision_rows_are_accepted(dtype):
    g = torch.Generator().manual_seed(0)
    p = softmax_in(dtype, torch.randn(2, 4, 32_000, generator=g) * 3)
    q = softmax_in(dtype, torch.randn(2, 3, 32_000, generator=g) * 3)
    off = float((p.double().sum(-1) - 1).abs().max())
    if dtype == torch.bfloat16:
        assert off > 1e-4  # the float32 tolerance would refuse these rows
    drafts = torch.randint(0, 32_000, (2, 3), generator=g)
    res = verify_block(rules.get("lossless"), drafts, q, p, g)
    assert res.tokens.shape == (2, 4) and bool((res.num_accepted <= 3).all())


@pytest.mark.parametrize("dtype", HALF)
def test_tolerance_is_dtype_aware_and_still_refuses_non_distributions(dtype):
    assert sum_tolerance(torch.float32) == sum_tolerance(torch.float64) == 1e-4
    info = torch.finfo(dtype)
    assert sum_tolerance(dtype) == 2 * info.eps + info.tiny * info.eps / 2  # one entry's worth of flushing
    with pytest.raises(ValueError, match="sum to 1"):
        check_distribution("p", torch.tensor([0.5, 0.4], dtype=dtype))
    with pytest.raises(ValueError, match="inf"):
        check_distribution("q", torch.tensor([float("inf"), 0.0], dtype=dtype))
    with pytest.raises(ValueError, match="NaN"):
        check_distribution("q", torch.tensor([float("nan"), 1.0], dtype=dtype))
    with pytest.raises(ValueError, match="negative"):
        check_distribution("p", torch.tensor([1.5, -0.5], dtype=dtype))


def test_a_float16_softmax_whose_tail_flushes_to_zero_is_accepted():
    """float16 flushes entries under 3e-8 to 0: a 151,936-token softmax with two likely tokens and a tail of 1.8e-8
    each sums to 0.9973 in float16, off by more than 2 eps; the tolerance counts the flushed entries, so it is
    accepted (renormalized), and a row truly off is still refused."""
    logits = torch.full((151_936,), -17.5)
    logits[:2] = torch.tensor([0.0, -1.0])
    p = torch.softmax(logits, -1).to(torch.float16)
    assert abs(float(p.double().sum()) - 1) > 2 * torch.finfo(torch.float16).eps
    check_distribution("p", p)
    with pytest.raises(ValueError, match="sum to 1"):
        check_distribution("p", (p.double() * 0.99).to(torch.float16))


@pytest.mark.parametrize("dtype", HALF)
def test_drafted_token_with_zero_q_is_rejected(dtype):
    p = torch.tensor([0.5, 0.5, 0.0], dtype=dtype)
    q = torch.tensor([0.5, 0.5, 0.0], dtype=dtype)
    drafts = torch.full((1000, 1), 2, dtype=torch.long)
    res = verify_block(rules.get("lossless"), drafts, q.expand(1000, 1, 3), p.expand(1000, 2, 3),
                       torch.Generator().manual_seed(0))
    assert int(res.num_accepted.sum()) == 0 and not bool((res.tokens[:, 0] == 2).any())


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize(("name", "params"), [("lossless", {}), ("lenience", {"l": 0.5}),
                                              ("spec-cascade", {"p_base": 0.3}), ("typical", {"epsilon": 0.1})])
def test_half_precision_law_is_the_exact_law_of_the_renormalized_inputs(dtype, name, params):
    g = torch.Generator().manual_seed(0)
    vocab = 12
    p = softmax_in(dtype, torch.randn(2, vocab, generator=g) * 2)
    q = softmax_in(dtype, torch.randn(1, vocab, generator=g) * 2)
    q = torch.cat([q[:, :-1], torch.zeros(1, 1, dtype=dtype)], -1)  # a token q never proposes
    rule = rules.get(name, **params)
    exact = induced_distribution(rule, as_float64(p[0]), as_float64(q[0]))
    drafts = torch.multinomial(as_float64(q[0]).float(), N, replacement=True, generator=g).unsqueeze(-1)
    res = verify_block(rule, drafts, q.expand(N, 1, vocab), p.expand(N, 2, vocab), g)
    counts = Counter(int(t) for t in res.tokens[:, 0])
    support = [k for k, v in enumerate(exact) if v > 0]
    assert set(counts) <= set(support), f"sampled a zero-probability token: {set(counts) - set(support)}"
    if len(support) == 1:  # a point mass: nothing to test beyond the support
        return
    pvalue = chi_square_pvalue({(k,): c for k, c in counts.items()},
                               {(k,): float(exact[k]) for k in support})
    assert pvalue > 1e-4, (name, dtype, pvalue)


def _greedy_p(dtype: torch.dtype, argmax: list[list[int]], vocab: int = 8) -> torch.Tensor:
    """Rows of p in ``dtype`` whose argmax at each position is the given token."""
    p = torch.full((len(argmax), len(argmax[0]), vocab), 0.02, dtype=torch.float64)
    for b, row in enumerate(argmax):
        for i, t in enumerate(row):
            p[b, i, t] = 1 - 0.02 * (vocab - 1)
    return p.to(dtype)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize(("drafts", "target", "accepted", "emitted"), [
    ([[1, 2, 3]], [[1, 2, 3, 4]], [3], [[1, 2, 3, 4]]),        # perfect match: all accepted, then the bonus
    ([[1, 2, 3]], [[1, 5, 3, 4]], [1], [[1, 5]]),              # early mismatch: the target's token replaces it
    ([[1, 2, 3]], [[1, 2, 6, 4]], [2], [[1, 2, 6]]),           # late mismatch
    ([[1, 2], [3, 4]], [[1, 2, 5], [3, 7, 5]], [2, 1], [[1, 2, 5], [3, 7]]),  # several sequences
    ([[4]], [[4, 6]], [1], [[4, 6]]),                          # one drafted token
])
def test_greedy_cases_in_half_precision(dtype, drafts, target, accepted, emitted):
    p = _greedy_p(dtype, target)
    argmax = as_float64(p).argmax(-1)
    res = verify_greedy(torch.tensor(drafts), argmax)
    assert res.num_accepted.tolist() == accepted
    assert [res.emitted(b) for b in range(len(drafts))] == emitted
    # the same blocks through the sampler at a one-hot p: lossless accepts exactly the matches
    q = torch.nn.functional.one_hot(torch.tensor(drafts), 8).to(dtype)
    onehot = torch.nn.functional.one_hot(argmax, 8).to(dtype)
    res = verify_block(rules.get("lossless"), torch.tensor(drafts), q, onehot, torch.Generator().manual_seed(0))
    assert res.num_accepted.tolist() == accepted
    assert [res.emitted(b) for b in range(len(drafts))] == emitted


@pytest.mark.parametrize("dtype", HALF)
def test_empty_draft_emits_the_bonus_only(dtype):
    p = _greedy_p(dtype, [[5]])
    res = verify_block(rules.get("lossless"), torch.zeros(1, 0, dtype=torch.long), None,
                       torch.nn.functional.one_hot(as_float64(p).argmax(-1), 8).to(dtype),
                       torch.Generator().manual_seed(0))
    assert res.num_accepted.tolist() == [0] and res.emitted(0) == [5]
