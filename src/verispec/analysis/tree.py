"""Exact analysis of tree verification (Appendix H of the lossy-verification paper): the per-position
emitted distribution given the ordered candidate set (Lemma 3), a_lossless(C) vs a_lossy(C) (Corollary 1),
the block efficiency of Proposition 2, and KL_EAGLE of Lemma 2. Float64, no sampling; a position is computed
from the very step object the sampler uses (:class:`verispec.core.verify.tree.PositionWalk`), and closed forms are given
next to them for the tests.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from verispec.analysis.exact import as_dist, kl
from verispec.analysis.truncation import kl_eagle
from verispec.core.rules import Rule, TruncationRule, get, matched_baseline
from verispec.core.verify.tree import (
    PositionWalk,
    TokenTree,
    TypicalMode,
    _with_typical,
    check_tree_rule,
    tree_acceptance,
)

__all__ = [
    "PositionLaw",
    "a_lossless",
    "a_lossy",
    "block_efficiency",
    "expected_accepted_length",
    "kl_eagle_closed_form",
    "kl_eagle_minp",
    "kl_eagle_tree",
    "position_law",
    "position_law_sampled",
]


def _rule(rule: Rule | str) -> Rule:
    r = get(rule) if isinstance(rule, str) else rule
    check_tree_rule(r)
    return r


@dataclass
class PositionLaw:
    """What one position of the walk does, exactly. ``emitted`` [V]: law of the emitted token;
    ``accept`` [D]: Pr[candidate i accepted]; ``acceptance``: a(C) = sum of ``accept``; ``bonus`` [V]: the
    (normalized) bonus distribution on all-reject, reached with probability 1 - a(C)."""

    emitted: torch.Tensor
    accept: torch.Tensor
    bonus: torch.Tensor

    @property
    def acceptance(self) -> float:
        return float(self.accept.sum())


def position_law(
    rule: Rule | str,
    p: object,
    candidates: Sequence[int],
    q: object | None = None,
    typical: TypicalMode | None = None,
) -> PositionLaw:
    """Lemma 3: the exact law of one position given the ordered candidates (and q for a sampled set), from the
    walk's own step (:class:`verispec.core.verify.tree.PositionWalk`): Pr[reach x(i)] = prod_{k<i} (1 - h_k),
    Pr[accept x(i)] = Pr[reach x(i)] h_i, and the all-reject mass goes to the walk's bonus distribution.
    ``typical`` is the deprecated form of typical's ``acceptance`` parameter."""
    rule, p = _with_typical(_rule(rule), typical), as_dist(p)
    walk = PositionWalk(rule, p, candidates, None if q is None else as_dist(q))
    emitted = torch.zeros_like(walk.bonus)
    accept = torch.zeros(len(candidates), dtype=torch.float64)
    reach = 1.0
    for i, h in enumerate(walk):
        accept[i] = reach * h
        emitted[walk.candidates[i]] += reach * h
        reach *= 1.0 - h
    return PositionLaw(emitted=emitted + reach * walk.bonus, accept=accept, bonus=walk.bonus)


def position_law_sampled(rule: Rule | str, p: object, q: object, k: int) -> torch.Tensor:
    """Emitted law of a position whose k candidates are drawn one after another without replacement from q,
    marginalized over the draws by enumeration (small vocabularies only). Lossless rules give p_Theta."""
    rule, p, q = _rule(rule), as_dist(p), as_dist(q)
    out = torch.zeros_like(p)
    support = torch.nonzero(q > 0).flatten().tolist()
    k = min(k, len(support))
    for cands in itertools.permutations(support, k):
        prob, cur = 1.0, q.clone()
        for x in cands:
            prob *= float(cur[x] / cur.sum())
            cur[x] = 0.0
        out += prob * position_law(rule, p, list(cands), q).emitted
    return out


def a_lossless(p: object, candidates: Sequence[int], rule: Rule | str = "lossless") -> float:
    """Lemma 3(i), Eq. 29: a_lossless(C) = p_Theta(C) for a token-only candidate set (p_Theta = rule.target)."""
    rule, p = _rule(rule), as_dist(p)
    pt = rule.target(p)
    return float(pt[list(candidates)].sum()) if candidates else 0.0


def a_lossy(rule: Rule | str, p: object, candidates: Sequence[int], typical: TypicalMode | None = None) -> float:
    """Lemma 3(ii), Eq. 30: a_lossy(C) = 1 - prod_i (1 - h(x_i)); for the indicator h (SpecCascade; typical
    as an indicator) this is 1[C meets A_Theta]. Closed form, computed from h directly (not from the walk)."""
    rule, p = _with_typical(_rule(rule), typical), as_dist(p)
    if not isinstance(rule, TruncationRule):
        raise ValueError(f"{rule.name!r} is not a truncation-based rule")
    h = tree_acceptance(rule, rule.target(p))
    rej = 1.0
    for x in candidates:
        rej *= 1.0 - float(h[x])
    return 1.0 - rej


def block_efficiency(factors: object) -> torch.Tensor:
    """Proposition 2, Eq. 32: BE = sum_{d >= 1} prod_{j <= d} a_j over the last dimension of ``factors``
    (a_j = Pr[L >= j | L >= j - 1])."""
    a = as_dist(factors)
    return a.cumprod(-1).sum(-1)


def expected_accepted_length(
    rule: Rule | str,
    tree: TokenTree,
    dist_fn: Callable[[int], torch.Tensor],
    typical: TypicalMode | None = None,
) -> tuple[float, list[float]]:
    """Exact E[L] of the walk over ``tree`` (``dist_fn(node)`` = target p after node, -1 the root), and the
    factors Pr[L >= d | L >= d - 1] of Proposition 2, from the per-position laws of Lemma 3."""
    rule = _with_typical(_rule(rule), typical)
    reach_depth: list[float] = []  # Pr[L >= d], d = 1..

    def walk(node: int, prob: float, d: int) -> None:
        kids = tree.children(node)
        if not kids or prob == 0.0:
            return
        law = position_law(rule, dist_fn(node), [tree.tokens[k] for k in kids], tree.child_q.get(node))
        for kid, a in zip(kids, law.accept.tolist(), strict=True):
            if a > 0:
                while len(reach_depth) <= d:
                    reach_depth.append(0.0)
                reach_depth[d] += prob * a
                walk(kid, prob * a, d + 1)

    walk(-1, 1.0, 0)
    factors = [reach_depth[0]] + [
        reach_depth[j] / reach_depth[j - 1] if reach_depth[j - 1] > 0 else 0.0 for j in range(1, len(reach_depth))
    ]
    return float(sum(reach_depth)), factors


def kl_eagle_tree(rule: Rule | str, p: object, candidates: Sequence[int], typical: TypicalMode | None = None) -> float:
    """KL(emitted law of the position || p_Theta), exactly, from Lemma 3 (p_Theta of the matched baseline,
    i.e. of the rule's own truncation). Zero for lossless rules; Lemma 2's KL_EAGLE for truncation rules."""
    rule, p = _with_typical(_rule(rule), typical), as_dist(p)
    pt = matched_baseline(rule).target(p) if isinstance(rule, TruncationRule) else rule.target(p)
    return float(kl(position_law(rule, p, candidates).emitted, pt))


def kl_eagle_closed_form(rule: Rule | str, p: object, candidates: Sequence[int]) -> float:
    """Lemma 2: KL_EAGLE = log(Z_Theta(p) / p(x)) with x the first candidate accepted surely (h(x) = 1,
    indicator form); +inf when no candidate is accepted surely (the formula does not apply). For SpecCascade
    this is :func:`verispec.analysis.kl_eagle` with A_Theta = A_min-p(p). Lemma 2 is stated for the indicator,
    so typical is read with ``acceptance="indicator"`` here whatever the rule's own setting."""
    rule, p = _rule(rule), as_dist(p)
    if not isinstance(rule, TruncationRule):
        raise ValueError(f"{rule.name!r} is not a truncation-based rule")
    if "acceptance_form" in rule.param_names:
        rule = dataclasses.replace(rule, acceptance_form="indicator")  # type: ignore[type-var]
    h = tree_acceptance(rule, rule.target(p))
    sure = [x for x in candidates if float(h[x]) == 1.0]
    if not sure:
        return float("inf")
    zp = p[rule.allowed(p)].sum()
    return float(torch.log(zp / p[sure[0]]))


def kl_eagle_minp(p: object, candidates: Sequence[int], p_base: float) -> float:
    """The existing :func:`verispec.analysis.kl_eagle` on the min-p set (SpecCascade's KL_EAGLE)."""
    p = as_dist(p)
    rule = get("spec-cascade", p_base=p_base)
    return float(kl_eagle(p, torch.tensor(list(candidates)), rule.allowed(p)))
