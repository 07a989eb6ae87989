"""The tree walk of Appendix H.1 fed fixed p and candidate sets (no models): its per-position emitted law
matches Lemma 3 exactly computed (chi-square), and the exact analysis matches the paper's closed forms
(Lemma 3, Corollary 1, Proposition 2, Lemma 2)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from verispec.analysis import kl_eagle
from verispec.analysis.tree import (
    a_lossless,
    a_lossy,
    block_efficiency,
    expected_accepted_length,
    kl_eagle_closed_form,
    kl_eagle_minp,
    kl_eagle_tree,
    position_law,
    position_law_sampled,
)
from verispec.core.rules import get, matched_baseline
from verispec.core.verify.tree import TokenTree, select_child, tree_acceptance, verify_tree
from verispec.drafters.tree import TreeDrafter

P = torch.tensor([0.30, 0.20, 0.15, 0.12, 0.10, 0.08, 0.04, 0.01], dtype=torch.float64)
P2 = torch.tensor([0.40, 0.25, 0.12, 0.08, 0.06, 0.05, 0.03, 0.01], dtype=torch.float64)  # typical: a fractional h
Q = torch.tensor([0.10, 0.30, 0.05, 0.20, 0.05, 0.15, 0.10, 0.05], dtype=torch.float64)
N = 3000  # draws per (rule, candidate set)
ALPHA = 1e-4

RULES = {  # rule, reading of Eq. 28, target p
    "lossless": (get("lossless"), "indicator", P),
    "minp-sampling": (get("minp-sampling", p_base=0.3), "indicator", P),
    "eta-sampling": (get("eta-sampling", epsilon=0.3), "indicator", P2),
    "spec-cascade": (get("spec-cascade", p_base=0.3), "indicator", P),
    "typical": (get("typical", epsilon=0.3), "indicator", P2),
    "typical-ratio": (get("typical", epsilon=0.3, acceptance="ratio"), "ratio", P2),
}
CANDIDATES = [[6, 3, 1], [7, 6], [1, 0, 2, 4], [4, 5, 2], []]


def _chi2(observed_tokens, exact):
    obs = np.bincount(observed_tokens, minlength=len(exact)).astype(float)
    exp = exact.numpy() * len(observed_tokens)
    assert obs[exp == 0].sum() == 0, "emitted a token of exact probability zero"
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    small = exp < 5
    if small.any():
        obs = np.append(obs[~small], obs[small].sum())
        exp = np.append(exp[~small], exp[small].sum())
    if len(exp) == 1:
        return 1.0
    return chisquare(obs, exp).pvalue


@pytest.mark.parametrize("name", list(RULES))
def test_walk_matches_lemma3(name):
    """Chi-square, N = 3000 draws of one position per candidate set, alpha = 1e-4 (bins < 5 pooled)."""
    rule, typical, P = RULES[name]
    gen = torch.Generator().manual_seed(7)
    pt = rule.target(P)
    for cands in CANDIDATES:
        law = position_law(rule, P, cands)
        assert float(law.emitted.sum()) == pytest.approx(1.0, abs=1e-12)
        if rule.lossless:  # Lemma 3(i): emits p_Theta, accepts x(i) with p_Theta(x(i)), a = p_Theta(C)
            assert (law.emitted - pt).abs().max() < 1e-12
            assert law.accept.tolist() == pytest.approx([float(pt[x]) for x in cands], abs=1e-12)
            assert law.acceptance == pytest.approx(a_lossless(P, cands, rule), abs=1e-12)
        else:  # Lemma 3(ii): accepted tokens lie in C meet A_Theta
            allowed = rule.allowed(P)
            assert all(a == 0 or bool(allowed[x]) for x, a in zip(cands, law.accept.tolist(), strict=True))
            assert law.acceptance == pytest.approx(a_lossy(rule, P, cands), abs=1e-12)
            assert (law.bonus - pt).abs().max() == 0
        toks = []
        for _ in range(N):
            i, tok = select_child(rule, P, cands, None, gen)
            assert (i is None) or cands[i] == tok
            toks.append(tok)
        pvalue = _chi2(toks, law.emitted)
        assert pvalue > ALPHA, (cands, pvalue)


@pytest.mark.filterwarnings("ignore:typical= is deprecated:DeprecationWarning")
def test_lossy_laws_are_not_p_theta():
    """Not a vacuous pass: the truncation rules' laws differ from p_Theta, and typical's two readings differ."""
    sc = RULES["spec-cascade"][0]
    law = position_law(sc, P, [6, 3, 1])
    assert law.emitted[3] == 1.0  # first in-set candidate, surely (token 6 is outside A)
    assert (position_law(sc, P, [7, 6]).emitted - sc.target(P)).abs().max() < 1e-12  # C misses A: bonus p_Theta
    ty = RULES["typical"][0]
    h_ind = tree_acceptance(ty, ty.target(P2), "indicator")
    h_rat = tree_acceptance(ty, ty.target(P2), "ratio")
    frac = (h_rat > 0) & (h_rat < 1)
    assert frac.tolist() == [False] * 4 + [True] + [False] * 3 and h_ind[4] == 0
    assert 0 < a_lossy(ty, P2, [4], "ratio") < 1 and a_lossy(ty, P2, [4]) == 0
    law_ratio = position_law(ty, P2, [4, 5, 2], typical="ratio")
    assert 0 < law_ratio.accept[0] < 1 and law_ratio.accept[1] == 0


@pytest.mark.parametrize("name", ["lossless", "minp-sampling", "eta-sampling"])
def test_sampled_candidates_are_lossless(name):
    """Recursive rejection sampling over k candidates drawn without replacement from q: exactly p_Theta when
    marginalized over the draws (enumeration), and the sampler matches it (chi-square, N = 3000, alpha 1e-4)."""
    rule, _, P = RULES[name]
    pt = rule.target(P)
    q = rule.draft(Q)
    for k in (1, 2, 3):
        assert (position_law_sampled(rule, P, q, k) - pt).abs().max() < 1e-12
    conditional = position_law(rule, P, [1, 3], q).emitted
    assert (conditional - pt).abs().max() > 0.05  # given the candidates the law is not p_Theta
    gen = torch.Generator().manual_seed(3)
    toks = []
    for _ in range(N):
        cands = TreeDrafter._draw(q, 3, gen)
        toks.append(select_child(rule, P, cands, q, gen)[1])
    assert _chi2(toks, pt) > ALPHA


def test_corollary1_lossless_accepts_less_than_spec_cascade():
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    strict = 0
    for _ in range(200):
        p = torch.distributions.Dirichlet(torch.full((8,), 0.5, dtype=torch.float64)).sample()
        cands = torch.randperm(8, generator=gen)[: int(torch.randint(1, 4, (), generator=gen))].tolist()
        sc = get("spec-cascade", p_base=0.2)
        base = matched_baseline(sc)
        a_ll, a_sc = a_lossless(p, cands, base), a_lossy(sc, p, cands)
        assert a_sc == float(bool(sc.allowed(p)[cands].any()))  # Eq. 30
        assert a_ll <= a_sc + 1e-15  # Eq. 31
        assert position_law(base, p, cands).acceptance == pytest.approx(a_ll, abs=1e-12)
        strict += 0 < a_ll < 1 and a_ll < a_sc
    assert strict > 50


def _tree():
    # depth 3: root has 3 candidates, each depth-1 node 2, one depth-2 node has 2 more
    return TokenTree([0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2], [-1, -1, -1, 0, 0, 1, 1, 2, 3, 3, 5])


def _dist_fn(seed):
    """Fixed target distributions per node (Dirichlet(1) draws under a fixed seed)."""
    torch.manual_seed(seed)
    table = {n: torch.distributions.Dirichlet(torch.ones(8, dtype=torch.float64)).sample() for n in range(-1, 11)}
    return table.__getitem__


def test_proposition2_block_efficiency_and_simulation():
    """Exact E[L] on a tree equals sum_d prod_j a_j (Eq. 32); a simulated mean of L agrees (z-test, N = 3000,
    |z| < 3.9, i.e. alpha ~ 1e-4); BE under SpecCascade >= BE under the matched min-p baseline."""
    tree, dist = _tree(), _dist_fn(0)
    for rule in (get("lossless"), get("minp-sampling", p_base=0.6), get("spec-cascade", p_base=0.6)):
        be, factors = expected_accepted_length(rule, tree, dist)
        assert be == pytest.approx(float(block_efficiency(factors)), abs=1e-12)
        gen = torch.Generator().manual_seed(5)
        lengths = np.array([verify_tree(rule, tree, dist, gen).accepted for _ in range(N)], dtype=float)
        if not rule.lossless:  # indicator h with fixed p: the walk, hence L, is deterministic
            assert (lengths == be).all()
            continue
        z = (lengths.mean() - be) / (lengths.std(ddof=1) / math.sqrt(N))
        assert abs(z) < 3.9, (rule.name, be, lengths.mean())
    be_base = expected_accepted_length(get("minp-sampling", p_base=0.6), tree, dist)[0]
    be_sc = expected_accepted_length(get("spec-cascade", p_base=0.6), tree, dist)[0]
    assert be_sc > be_base
    # a chain of identical positions: the factors are a(C) of Lemma 3 and BE the geometric sum of Eq. 32
    parents = [-1, -1] + [n for n in range(6) for _ in range(2)]  # full binary tree of depth 3
    chain = TokenTree([1, 3] * 7, parents)
    assert chain.depth == 3 and len(chain) == 14
    be, factors = expected_accepted_length("lossless", chain, lambda node: P)
    a = float(P[1] + P[3])
    assert factors == pytest.approx([a, a, a], abs=1e-12)
    assert be == pytest.approx(a + a**2 + a**3, abs=1e-12)


def test_lemma2_kl_eagle():
    sc, ty = RULES["spec-cascade"][0], RULES["typical"][0]
    for cands in ([6, 3, 1], [1, 0, 2, 4], [0]):
        exact = kl_eagle_tree(sc, P, cands)
        assert exact == pytest.approx(kl_eagle_closed_form(sc, P, cands), abs=1e-12)
        assert exact == pytest.approx(kl_eagle_minp(P, cands, 0.3), abs=1e-12)
        assert exact == pytest.approx(float(kl_eagle(P, torch.tensor(cands), sc.allowed(P))), abs=1e-12)
        assert exact > 0  # Proposition 1: |A| > 1, so the point mass is never p_Theta
        assert kl_eagle_tree(ty, P2, cands) == pytest.approx(kl_eagle_closed_form(ty, P2, cands), abs=1e-12)
        assert kl_eagle_tree("lossless", P, cands) == pytest.approx(0.0, abs=1e-12)
        assert kl_eagle_tree(get("minp-sampling", p_base=0.3), P, cands) == pytest.approx(0.0, abs=1e-12)


def test_a_new_rule_walks_trees_with_no_edit_to_tree_modules():
    """A rule defined here (lenience declared recursive) runs through select_child and position_law unchanged;
    chi-square of N = 3000 walks against the exact law, alpha = 1e-4, a zero-probability token fails hard."""
    from dataclasses import dataclass
    from typing import ClassVar

    from verispec.core.rules.collaborative import Lenience

    @dataclass(frozen=True)
    class TreeLenience(Lenience):
        tree_rejection: ClassVar[str | None] = "residual"

    rule = TreeLenience(l=0.5)
    gen = torch.Generator().manual_seed(11)
    for cands in ([6, 3, 1], [1, 0]):
        law = position_law(rule, P, cands, Q)
        assert float(law.emitted.sum()) == pytest.approx(1.0, abs=1e-12)
        toks = [select_child(rule, P, cands, Q, gen)[1] for _ in range(N)]
        assert _chi2(toks, law.emitted) > ALPHA
    with pytest.raises(ValueError, match="tree verification supports"):
        select_child(get("lenience"), P, [1], None)


def test_typical_ratio_is_one_rule_parameter_for_chains_and_trees():
    """The chain's h and the tree's h are the same function of the distribution scored (p vs p_Theta)."""
    rat = get("typical", epsilon=0.3, acceptance="ratio")
    pt = rat.target(P2)
    assert torch.equal(tree_acceptance(rat, pt), rat.acceptance(pt, pt))
    with pytest.warns(DeprecationWarning, match="typical="):
        old = position_law(get("typical", epsilon=0.3), P2, [4, 5, 2], typical="ratio")
    assert torch.equal(old.emitted, position_law(rat, P2, [4, 5, 2]).emitted)
    with pytest.raises(ValueError, match="typical must be"):
        select_child(rat, P2, [4], None, None, "sometimes")


def test_the_walk_refuses_what_is_not_a_distribution_or_a_token():
    """The tree walk checks its rows as the chain samplers do: a ValueError naming the problem, not a sample."""
    lossless = get("lossless")
    q = torch.tensor([0.25, 0.25, 0.25, 0.25], dtype=torch.float64)
    with pytest.raises(ValueError, match="p has negative entries"):
        select_child(lossless, torch.tensor([0.5, 0.6, -0.1, 0.0], dtype=torch.float64), [1])
    with pytest.raises(ValueError, match="p rows must sum to 1"):
        select_child(lossless, torch.tensor([0.5, 0.4, 0.0, 0.0], dtype=torch.float64), [1])
    with pytest.raises(ValueError, match="q contains NaN"):
        select_child(lossless, q, [1], q=torch.tensor([float("nan"), 0.5, 0.25, 0.25], dtype=torch.float64))
    with pytest.raises(ValueError, match="token id 9 is outside the vocabulary"):
        select_child(lossless, q, [1, 9])
