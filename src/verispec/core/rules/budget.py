"""A divergence budget on a relaxed rule: at each position, the most relaxed parameter of the rule's family whose
induced distribution is within total-variation distance epsilon of the target's, computed exactly.

A family is a rule with one relaxation parameter in (0, 1] that is lossless at 1 and accepts more as it falls:
lenience ``l`` and CoS-WE ``lam``. Not yet families: the overshoot ceiling, whose TV to p is not monotone in lam
(measured on random pairs: a bisection would satisfy the budget but could miss a more relaxed feasible lam), and
the min-p cap, which is not lossless at l = 1 (its reference is the min-p-truncated target, so the distance to
measure against needs choosing: p, or min-p sampling's law). For a position's processed p
and q, TV(pi_theta, p) with pi_theta the rule's exact induced distribution (:meth:`Rule.induced`) is computed for
every row at once; the chosen theta is the smallest one on the family's range with TV <= epsilon:

- CoS-WE has a closed form: pi_lam - p = (1 - lam)(q - p), so TV = (1 - lam) TV(q, p) and
  lam* = max(lam_min, 1 - epsilon / TV(q, p)) (lam_min where q = p: every lam induces p then).
- the other families by bisection on theta, whose TV is non-increasing in theta (checked on generated pairs by
  ``tests/test_budget.py``); the bisection keeps the feasible end, so the returned theta always satisfies the budget
  exactly (TV computed, not estimated), and lies within ``tol`` of the optimum.

:func:`choose` returns the parameters and the realized distances; :func:`budgeted` builds the rule for those rows
(parameters as a tensor, one per row), which the one sampler (:func:`verispec.core.verify.chain.verify_block`)
samples and the exact analysis analyses like any other rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from verispec.core.rules import get
from verispec.core.rules.base import Rule

__all__ = ["FAMILIES", "Family", "budgeted", "choose", "tv_to_target"]


@dataclass(frozen=True)
class Family:
    """A rule with one relaxation parameter: ``param`` in [``lowest``, 1], lossless at 1, more relaxed below."""

    rule: str
    param: str
    lowest: float


FAMILIES: dict[str, Family] = {
    f.rule: f
    for f in (
        Family("lenience", "l", 1e-3),
        Family("cos-we", "lam", 0.0),
    )
}


def _family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"rule {name!r} has no budget; budgets apply to {', '.join(FAMILIES)}") from None


def budgeted(name: str, theta: torch.Tensor, **fixed: object) -> Rule:
    """The family's rule with a parameter per row: ``theta`` must broadcast against every p and q the rule is
    called with (``[..., 1]`` matching their leading dims, or a 0-d tensor). The chain sampler calls a rule on
    [B, gamma, V] (acceptance) and on [B, V] (correction, bonus), so a per-position parameter needs the sampler's
    help; one parameter per call works as is."""
    fam = _family(name)
    rule = get(name, **{fam.param: 0.5, **fixed})  # validated with a scalar, then given its rows' values
    object.__setattr__(rule, fam.param, theta)
    return rule


def tv_to_target(name: str, p: torch.Tensor, q: torch.Tensor, theta: torch.Tensor, **fixed: object) -> torch.Tensor:
    """TV(pi_theta, p) per row ([..., 1]), with pi_theta the exact distribution the rule induces."""
    pi = budgeted(name, theta, **fixed).induced(p, q)
    return 0.5 * (pi - p).abs().sum(-1, keepdim=True)


def choose(name: str, p: torch.Tensor, q: torch.Tensor, epsilon: float, tol: float = 1e-6, **fixed: object
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """(theta, TV) per row ([..., 1] each): the most relaxed parameter of the family within TV ``epsilon`` of p."""
    if not epsilon >= 0:
        raise ValueError(f"the budget epsilon must be >= 0, got {epsilon}")
    fam = _family(name)
    p, q = p.to(torch.float64), q.to(torch.float64)
    shape = p.shape[:-1] + (1,)
    if name == "cos-we":
        tv_q = 0.5 * (q - p).abs().sum(-1, keepdim=True)
        safe = torch.where(tv_q > 0, tv_q, torch.ones_like(tv_q))
        # q = p: every lam induces p, so the most relaxed one is the lowest
        theta = torch.where(tv_q > 0, (1 - epsilon / safe).clamp(min=fam.lowest, max=1.0),
                            torch.full_like(tv_q, fam.lowest))
        return theta, tv_to_target(name, p, q, theta, **fixed)
    lo = torch.full(shape, fam.lowest, dtype=torch.float64, device=p.device)
    hi = torch.ones(shape, dtype=torch.float64, device=p.device)  # feasible: lossless
    ok_lo = tv_to_target(name, p, q, lo, **fixed) <= epsilon
    while bool(((hi - lo) > tol).any()):
        mid = (lo + hi) / 2
        fits = tv_to_target(name, p, q, mid, **fixed) <= epsilon
        hi = torch.where(fits, mid, hi)
        lo = torch.where(fits, lo, mid)
    theta = torch.where(ok_lo, torch.full_like(hi, fam.lowest), hi)
    return theta, tv_to_target(name, p, q, theta, **fixed)
