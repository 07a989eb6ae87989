"""The divergence budget (``verispec.core.rules.budget``): certified and optimal, exactly.

Generated (p, q) pairs (hypothesis, vocabularies of 2-8 with zeros in either): the induced distribution at the
chosen parameter is within epsilon of p (TV computed exactly, tolerance 1e-12), and a slightly more relaxed
parameter is not (optimality, up to the bisection's tolerance); TV is non-increasing in the parameter on a grid.
Statistical test: N = 20,000 rows of one batched ``verify_block`` call with the budgeted rule, seed 0, chi-square
of the emitted token against the exact induced distribution at alpha = 1e-4; a token of probability 0 fails
outright."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verispec.core.rules.budget import FAMILIES, budgeted, choose, tv_to_target
from verispec.core.verify.chain import verify_block
from verispec.testing import chi_square_pvalue

TOL = 1e-6


@st.composite
def pairs(draw):
    v = draw(st.integers(2, 8))
    w = st.floats(0, 1, allow_nan=False)
    p = torch.tensor(draw(st.lists(w, min_size=v, max_size=v)), dtype=torch.float64)
    q = torch.tensor(draw(st.lists(w, min_size=v, max_size=v)), dtype=torch.float64)
    if p.sum() < 1e-3 or q.sum() < 1e-3:
        p, q = p + 1, q + 1
    return p / p.sum(), q / q.sum()


@pytest.mark.parametrize("name", list(FAMILIES))
@settings(max_examples=150, deadline=None)
@given(pq=pairs(), eps=st.sampled_from([0.0, 0.01, 0.05, 0.2]))
def test_chosen_parameter_is_within_budget_and_optimal(name, pq, eps):
    p, q = pq
    theta, tv = choose(name, p, q, eps, tol=TOL)
    assert float(tv) <= eps + 1e-12
    assert float(tv_to_target(name, p, q, theta)) == pytest.approx(float(tv), abs=1e-15)
    lowest = FAMILIES[name].lowest
    if float(theta) > lowest + 2 * TOL:
        more_relaxed = theta - 2 * TOL
        assert float(tv_to_target(name, p, q, more_relaxed)) > eps, "a more relaxed parameter fits the budget"


@pytest.mark.parametrize("name", list(FAMILIES))
@settings(max_examples=100, deadline=None)
@given(pq=pairs())
def test_tv_is_non_increasing_in_the_parameter(name, pq):
    p, q = pq
    grid = torch.linspace(FAMILIES[name].lowest, 1.0, 101, dtype=torch.float64).unsqueeze(-1)
    tvs = tv_to_target(name, p.expand(101, -1), q.expand(101, -1), grid).squeeze(-1)
    assert bool((tvs[1:] <= tvs[:-1] + 1e-12).all())
    assert float(tvs[-1]) < 1e-12  # lossless at 1


def test_cos_we_closed_form():
    p = torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64)
    q = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)  # TV(q, p) = 0.4
    theta, tv = choose("cos-we", p, q, 0.1)
    assert float(theta) == pytest.approx(0.75) and float(tv) == pytest.approx(0.1)  # (1 - 0.75) * 0.4
    theta, tv = choose("cos-we", p, p, 0.0)
    assert float(theta) == 0.0 and float(tv) == 0.0  # q = p: every lam induces p, the most relaxed is chosen


def test_rows_get_their_own_parameters_and_bad_input_is_refused():
    p = torch.tensor([[0.6, 0.3, 0.1], [0.34, 0.33, 0.33]], dtype=torch.float64)
    q = torch.tensor([[0.1, 0.3, 0.6], [0.33, 0.34, 0.33]], dtype=torch.float64)
    theta, tv = choose("lenience", p, q, 0.05)
    assert theta.shape == (2, 1) and float(theta[1]) < float(theta[0])  # a near-equal pair affords more relaxation
    with pytest.raises(ValueError, match="no budget"):
        choose("spec-cascade", p, q, 0.05)
    with pytest.raises(ValueError, match="epsilon"):
        choose("lenience", p, q, -0.1)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_sampler_follows_the_budgeted_law(name):
    n, g = 20_000, torch.Generator().manual_seed(0)
    p = torch.tensor([0.45, 0.25, 0.15, 0.1, 0.05, 0.0], dtype=torch.float64)
    q = torch.tensor([0.1, 0.3, 0.2, 0.2, 0.0, 0.2], dtype=torch.float64)
    theta, tv = choose(name, p, q, 0.1)
    assert 0 < float(tv) <= 0.1
    rule = budgeted(name, theta.reshape(()))  # every row has this (p, q): one parameter for all of them
    exact = rule.induced(p, q)
    drafts = torch.multinomial(q, n, replacement=True, generator=g).unsqueeze(-1)
    res = verify_block(rule, drafts, q.expand(n, 1, 6), p.expand(n, 2, 6), g)
    counts = Counter(int(t) for t in res.tokens[:, 0])
    support = [k for k in range(6) if float(exact[k]) > 0]
    assert set(counts) <= set(support), "sampled a zero-probability token"
    pvalue = chi_square_pvalue({(k,): c for k, c in counts.items()}, {(k,): float(exact[k]) for k in support})
    assert pvalue > 1e-4, (name, pvalue)
