"""Exact one-step analysis of any verification rule: no sampling, float64 throughout.

The output of one verification step is the accept path q(x) h(x) plus the reject path
(sum_v q(v) (1 - h(v))) r(x) (tutorial section 4; Appendix A of the lossy-verification paper).
"""

from __future__ import annotations

import torch

from verispec.core.rules import Rule, get
from verispec.core.rules.collaborative import lenience_delta
from verispec.core.rules.validate import check_l, check_lam
from verispec.core.sampling import renormalize_on
from verispec.core.verify.chain import as_float64, check_distribution

__all__ = [
    "acceptance_probability",
    "as_dist",
    "cos_we_closed_form",
    "induced_distribution",
    "kl",
    "lenience_closed_form",
    "truncation_closed_form",
    "tv",
]


def as_dist(x: object) -> torch.Tensor:
    """A float64 tensor from a list/array/tensor."""
    return torch.as_tensor(x, dtype=torch.float64)


def _rule(rule: Rule | str) -> Rule:
    return get(rule) if isinstance(rule, str) else rule


def _checked(name: str, x: object) -> torch.Tensor:
    """Rows of probabilities in float64, checked as the samplers check them (ValueError naming ``name``), a
    half-precision row renormalized as they renormalize it (:func:`verispec.core.verify.chain.as_float64`)."""
    t = x if isinstance(x, torch.Tensor) else torch.as_tensor(x, dtype=torch.float64)  # a list: float64, as given
    if not t.is_floating_point():
        t = t.to(torch.float64)
    check_distribution(name, t)
    return as_float64(t)


def induced_distribution(rule: Rule | str, p: object, q: object) -> torch.Tensor:
    """The exact distribution emitted at one drafted position: q h + (sum q (1 - h)) r, in float64.

    Generic: it uses only the rule's ``acceptance`` and ``correction``; batched over leading dims. p and q must be
    rows of probabilities (ValueError otherwise, as for the samplers).
    """
    rule, p, q = _rule(rule), _checked("p", p), _checked("q", q)
    return rule.induced(p, q)


def acceptance_probability(rule: Rule | str, p: object, q: object) -> torch.Tensor:
    """Probability that a token drawn from q is accepted: sum_x q(x) h(x). For lossless it is 1 - TV(p, q)."""
    rule, p, q = _rule(rule), _checked("p", p), _checked("q", q)
    return (q * rule.acceptance(p, q)).sum(-1)


def tv(a: object, b: object) -> torch.Tensor:
    """Total variation distance 1/2 sum |a - b|."""
    return 0.5 * (as_dist(a) - as_dist(b)).abs().sum(-1)


def kl(a: object, b: object) -> torch.Tensor:
    """KL(a || b) in nats, with 0 log 0 = 0; +inf when a puts mass where b has none."""
    a, b = as_dist(a), as_dist(b)
    pos = a > 0
    ratio = torch.where(pos, a / torch.where(b > 0, b, torch.ones_like(b)), torch.ones_like(a))
    terms = torch.where(pos, a * ratio.log(), torch.zeros_like(a))
    terms = torch.where(pos & (b <= 0), torch.full_like(a, float("inf")), terms)
    return terms.sum(-1)


def cos_we_closed_form(p: object, q: object, lam: float) -> torch.Tensor:
    """Eq. 8: CoS (weighted ensemble) generates lam p + (1 - lam) q. lam in [0, 1] and p, q rows of
    probabilities (ValueError naming the argument otherwise, as for the rule)."""
    check_lam(lam)
    return lam * _checked("p", p) + (1 - lam) * _checked("q", q)


def lenience_closed_form(p: object, q: object, l: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 10-11: lenience generates Delta p + (1 - Delta) q where q <= p, q where p < q <= p/l, p/l where
    q >= p/l. Returns (distribution, Delta), Delta from the TV form of Eq. 11 (Eq. 25). l in (0, 1] and p, q rows
    of probabilities (ValueError naming the argument otherwise, as for the rule): Eq. 25 uses sum p = sum q = 1."""
    check_l(l)
    p, q = _checked("p", p), _checked("q", q)
    num = 0.5 * (q - p / l).abs().sum(-1, keepdim=True) + 0.5 - 0.5 / l
    den = 0.5 * (q - p).abs().sum(-1, keepdim=True)
    delta = torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(den))
    out = torch.where(q <= p, delta * p + (1 - delta) * q, torch.where(q <= p / l, q, p / l))
    return out, delta.squeeze(-1)


def truncation_closed_form(q: object, allowed: torch.Tensor) -> torch.Tensor:
    """Eq. 13: truncation-based verification generates q / Z_Theta(q) on A_Theta, 0 elsewhere. Undefined (a
    ValueError) where q has no mass on A_Theta: the rule then falls back (see :func:`induced_distribution`)."""
    q = _checked("q", q)
    if bool((torch.where(allowed, q, torch.zeros_like(q)).sum(-1) <= 0).any()):
        raise ValueError("Eq. 13 is undefined where q has no mass on the allowed set; induced_distribution gives "
                         "what the rule does there")
    return renormalize_on(q, allowed)


# Re-exported for callers that want Delta of Eq. 11 in its ratio form (Eq. 15).
lenience_delta_ratio = lenience_delta
