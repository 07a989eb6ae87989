"""A divergence budget on a relaxed rule: at each position, the most relaxed parameter of the rule's family whose
induced distribution is within total-variation distance epsilon of the target's, computed exactly.

A family is a rule with one relaxation parameter theta on [``lowest``, 1] that is lossless at 1 and accepts more
as it falls: lenience ``l`` and CoS-WE ``lam``. For a position's processed p and q the distance
TV(pi_theta, p), pi_theta the rule's exact induced distribution (:meth:`Rule.induced`), has a closed form in both:

- CoS-WE (Eq. 8): pi_lam - p = (1 - lam)(q - p), so TV = (1 - lam) TV(q, p) and
  lam* = max(lam_min, 1 - epsilon / TV(q, p)) (lam_min where q = p: every lam induces p then).
- lenience (Eq. 10-11): pi_l = min(q, p/l) where q > p (at least p there) and q + Delta (p - q) <= p where
  q <= p, so TV = sum_{q > p} (min(q, p/l) - p) = f(u) = sum_x min(d_x, p_x u) with d = [q - p]+ and
  u = 1/l - 1: concave, piecewise linear and non-decreasing in u, with a breakpoint at b_x = d_x / p_x per
  token. The largest u with f(u) <= epsilon is found exactly in O(V): the breakpoints are binned by binary
  exponent, f is evaluated at every bin edge from the bins' sums, and the one bin holding the solution is sorted
  and walked segment by segment (:func:`_lenience_u`).

Both return the parameter (per row) and the realized distance, computed by the closed form again at the returned
parameter, which is nudged toward lossless if rounding put it a hair over epsilon: the budget always holds as
computed, and no parameter that accepts more fits (up to float64 rounding). The tests check both closed forms
against :meth:`Rule.induced`.

Not families (yet): the overshoot ceiling, whose TV to p is not monotone in lam (a more relaxed lam can be
closer to p again, so "the most relaxed within epsilon" needs every breakpoint of a non-monotone function); the
min-p cap, which is not lossless at l = 1 (its distance to p never reaches 0).

:class:`Budget` is what a request asks for: ``tv`` (per position) and / or ``tv_total`` (per sequence; see
:meth:`Budget.allowance` and docs/budget.md for the coupling argument that bounds the whole sequence's TV).
:class:`PerPosition` is the family's rule with one parameter per (row, position), which the one chain sampler
(:func:`verispec.core.verify.chain.verify_block`) samples like any rule.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch

from verispec.core.rules import get
from verispec.core.rules.base import Rule

__all__ = ["FAMILIES", "Budget", "Family", "PerPosition", "budgeted", "choose", "family_of", "tv_closed_form",
           "tv_to_target"]

#: the lenience breakpoints are binned by binary exponent from 2^_E0 up (smaller ones share the first bin)
_E0 = -40
#: relative step inside the exact solution, so that float rounding rarely puts the distance over the budget
_SHRINK = 1e-12


@dataclass(frozen=True)
class Family:
    """A rule with one relaxation parameter: ``param`` in [``lowest``, 1], lossless at 1, more relaxed below."""

    rule: str
    param: str
    lowest: float


FAMILIES: dict[str, Family] = {
    f.rule: f
    for f in (
        Family("lenience", "l", 1 / 1025),  # u = 1/l - 1 up to 2^10: the exponent bins end there
        Family("cos-we", "lam", 0.0),
    )
}


def _family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"rule {name!r} has no budget; budgets apply to {', '.join(FAMILIES)}") from None


def family_of(rule: Rule | str) -> Family:
    """The budget family of a rule (by its registered name); ValueError naming the families otherwise."""
    return _family(rule if isinstance(rule, str) else rule.name)


# --------------------------------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class Budget:
    """A divergence budget: ``tv`` caps every position's TV(pi, p); ``tv_total`` caps the sum over a sequence's
    positions, which bounds the TV between the law of the whole generated sequence and the target's
    (docs/budget.md). Either or both; with both, each position gets the smaller allowance."""

    tv: float | None = None
    tv_total: float | None = None
    KEYS: ClassVar[tuple[str, ...]] = ("tv", "tv_total")

    def __post_init__(self) -> None:
        if self.tv is None and self.tv_total is None:
            raise ValueError("a budget needs tv (per position) or tv_total (per sequence)")
        for key in self.KEYS:
            v = getattr(self, key)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ValueError(f"budget {key} must be a finite number, got {v!r}")
            if key == "tv" and not 0 <= v <= 1:
                raise ValueError(f"budget tv must be in [0, 1] (a total-variation distance), got {v}")
            if key == "tv_total" and v < 0:
                raise ValueError(f"budget tv_total must be >= 0, got {v}")

    @classmethod
    def parse(cls, obj: object) -> Budget | None:
        """None, a Budget, a mapping ``{"tv": 0.05, "tv_total": 1.0}`` or the command-line text
        ``"tv=0.05,tv_total=1"``; ValueError naming the problem otherwise."""
        if obj is None or isinstance(obj, Budget):
            return obj
        if isinstance(obj, str):
            items: dict[str, object] = {}
            for part in filter(None, (s.strip() for s in obj.split(","))):
                key, sep, value = part.partition("=")
                if not sep:
                    raise ValueError(f"budget {part!r} is not of the form name=value (names: {', '.join(cls.KEYS)})")
                try:
                    items[key.strip()] = float(value)
                except ValueError:
                    raise ValueError(f"budget {key.strip()} is not a number: {value.strip()!r}") from None
            obj = items
        if not isinstance(obj, Mapping):
            raise ValueError(f"budget must be an object like {{\"tv\": 0.05}}, got {type(obj).__name__}")
        unknown = set(obj) - set(cls.KEYS)
        if unknown:
            raise ValueError(f"budget has unknown field(s) {', '.join(sorted(map(str, unknown)))}; "
                             f"allowed: {', '.join(cls.KEYS)}")
        return cls(**{k: (float(v) if isinstance(v, int) and not isinstance(v, bool) else v)  # type: ignore[arg-type]
                      for k, v in obj.items()})

    def allowance(self, spent: float, positions_left: int) -> float:
        """This position's epsilon: ``tv``, and with ``tv_total`` at most an even share of what is left,
        (tv_total - spent) / positions_left, over the positions that may still be generated (this one included).
        Since positions_left >= 1, spent + epsilon never exceeds tv_total: the sum over any sequence stays within
        it, however the realized distances fall; what a position does not spend flows to the later ones."""
        eps = math.inf if self.tv is None else self.tv
        if self.tv_total is not None:
            eps = min(eps, max(self.tv_total - spent, 0.0) / max(positions_left, 1))
        return eps

    def to_dict(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in self.KEYS if getattr(self, k) is not None}

    def describe(self) -> str:
        return ",".join(f"{k}={v:g}" for k, v in self.to_dict().items())


# --------------------------------------------------------------------------------------------------- rules


def budgeted(name: str, theta: torch.Tensor, **fixed: object) -> Rule:
    """The family's rule with the parameter ``theta`` (a tensor broadcasting against the p and q it is called
    with, ``[..., 1]``, or 0-d)."""
    fam = _family(name)
    rule = get(name, **{fam.param: 0.5, **fixed})  # validated with a scalar, then given its rows' values
    object.__setattr__(rule, fam.param, theta)
    return rule


@dataclass(frozen=True, eq=False)
class PerPosition(Rule):
    """A family's rule with one parameter per (row, position): ``theta`` [B, gamma, 1] for a block verified by
    :func:`~verispec.core.verify.chain.verify_block`, which calls the acceptance on [B, gamma, V] and, through
    :meth:`at`, the correction on the stopping position of each row. Bonus and target: p (lossless there)."""

    family: str = "lenience"
    theta: torch.Tensor | None = None
    name: ClassVar[str] = "budgeted"
    equation: ClassVar[str] = "per-position parameter within a TV budget"

    def _rule(self) -> Rule:
        return budgeted(self.family, self.theta)  # type: ignore[arg-type]

    def acceptance(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return self._rule().acceptance(p, q)

    def correction(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return self._rule().correction(p, q)

    def at(self, rows: torch.Tensor, index: torch.Tensor) -> Rule:
        return PerPosition(self.family, self.theta[rows, index])  # type: ignore[index]

    def describe(self) -> str:
        return f"{self.family}(budgeted)"


# --------------------------------------------------------------------------------------------------- distances


def tv_to_target(name: str, p: torch.Tensor, q: torch.Tensor, theta: torch.Tensor, **fixed: object) -> torch.Tensor:
    """TV(pi_theta, p) per row ([..., 1]) from the rule's exact induced distribution pi_theta (the reference the
    closed forms are tested against)."""
    pi = budgeted(name, theta, **fixed).induced(p, q)
    return 0.5 * (pi - p).abs().sum(-1, keepdim=True)


def tv_closed_form(name: str, p: torch.Tensor, q: torch.Tensor, theta: torch.Tensor,
                   d: torch.Tensor | None = None) -> torch.Tensor:
    """TV(pi_theta, p) per row ([..., 1]) by the family's closed form (module docstring); ``d``: [q - p]+ if the
    caller has it."""
    _family(name)
    if d is None:
        d = (q - p).clamp(min=0)
    if name == "cos-we":
        return (1 - theta) * d.sum(-1, keepdim=True)
    return torch.minimum(d, p * (1 / theta - 1)).sum(-1, keepdim=True)


def _lenience_u(p: torch.Tensor, d: torch.Tensor, eps: torch.Tensor, u_max: float) -> torch.Tensor:
    """The largest u in [0, u_max] with f(u) = sum_x min(d_x, p_x u) <= eps, per row of [R, V] (d = [q - p]+,
    eps [R]; u_max a power of two)."""
    rows, e_top = p.shape[0], math.frexp(u_max)[1] - 1  # u_max = 2^e_top
    k = e_top + 1 - _E0  # bins 0..k-1 below u_max, bin k at or beyond it
    # bin j >= 1 holds b in [2^(j + E0 - 1), 2^(j + E0)) (frexp's exponent minus E0), bin 0 everything smaller,
    # bin k everything >= u_max: edges e_0 = 0 < e_1 = 2^E0 < ... < e_k = u_max. Tokens with d = 0 (b = 0) land in
    # bin 0, saturated from u = 0 on with nothing to add; tokens with p = 0 < d in bin k, never saturated on the
    # range and with no slope: neither needs filtering out.
    edges = torch.tensor([0.0] + [2.0 ** (j + _E0 - 1) for j in range(1, k + 1)], dtype=torch.float64)
    # the breakpoints, floored into bin 0 for binning (0 = d has exponent 0 in frexp); exact ones in the walk below
    safe_p = p.clamp(min=1e-300)
    idx = torch.frexp((d / safe_p).clamp_(min=2.0 ** (_E0 - 2), max=2 * u_max)).exponent.sub_(_E0).clamp_(0, k)
    flat = (idx + torch.arange(rows, dtype=idx.dtype).unsqueeze(1) * (k + 1)).flatten()
    dsum = torch.zeros(rows * (k + 1), dtype=torch.float64).index_add_(0, flat, d.flatten()).view(rows, k + 1)
    psum = torch.zeros(rows * (k + 1), dtype=torch.float64).index_add_(0, flat, p.flatten()).view(rows, k + 1)
    # f(e_j) = sum of d over bins < j + e_j * sum of p over bins >= j, for j = 0..k
    below = torch.cat([torch.zeros(rows, 1, dtype=torch.float64), dsum.cumsum(1)[:, :k]], 1)
    above = psum.flip(1).cumsum(1).flip(1)
    f_edges = below + edges * above
    fits_all = f_edges[:, k] <= eps
    j = ((f_edges <= eps.unsqueeze(1)).sum(1) - 1).clamp_(min=0)  # f non-decreasing, f(e_0) = 0: last edge that fits
    out = torch.full((rows,), u_max, dtype=torch.float64)
    todo = (~fits_all).nonzero().flatten().tolist()
    if not todo:
        return out
    in_bin = idx == j.to(idx.dtype).unsqueeze(1)
    zero = torch.zeros(1, dtype=torch.float64)
    for r in todo:
        e, jr = float(eps[r]), int(j[r])
        sel = in_bin[r].nonzero().squeeze(-1)
        bs, order = (d[r, sel] / safe_p[r, sel]).sort()
        ds, ps = d[r, sel][order], p[r, sel][order]
        # at breakpoint i of the bin, f = c + sum_{i' < i} d + b_i (pg - sum_{i' < i} p)
        cs = float(below[r, jr]) + torch.cat([zero, ds.cumsum(0)])
        pgs = float(above[r, jr]) - torch.cat([zero, ps.cumsum(0)])
        over = (cs[:-1] + bs * pgs[:-1]) > e
        i = int(over.nonzero()[0]) if bool(over.any()) else len(bs)
        slope = float(pgs[i])
        u = (e - float(cs[i])) / slope if slope > 0 else u_max
        out[r] = min(max(u * (1 - _SHRINK), 0.0), u_max)  # a hair inside, so rounding rarely needs the nudge
    return out


def choose(name: str, p: torch.Tensor, q: torch.Tensor, epsilon: float | torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """(theta, TV) per row ([..., 1] each, float64): the most relaxed parameter of the family whose induced
    distribution is within TV ``epsilon`` (a number, or one per row [..., 1]) of p, and its distance."""
    fam = _family(name)
    p, q = p.to(torch.float64), q.to(torch.float64)
    eps = torch.as_tensor(epsilon, dtype=torch.float64).expand(p.shape[:-1] + (1,))
    if bool(torch.isnan(eps).any()) or bool((eps < 0).any()):
        raise ValueError(f"the budget epsilon must be >= 0, got {epsilon}")
    d = None
    if name == "cos-we":
        tv_q = (q - p).clamp(min=0).sum(-1, keepdim=True)
        safe = torch.where(tv_q > 0, tv_q, torch.ones_like(tv_q))
        theta = torch.where(tv_q > 0, (1 - eps / safe).clamp(min=fam.lowest, max=1.0),
                            torch.full_like(tv_q, fam.lowest))  # q = p: every lam induces p
    else:
        u_max = 1 / fam.lowest - 1
        d = (q - p).clamp_(min=0)
        flat = _lenience_u(p.reshape(-1, p.shape[-1]), d.reshape(-1, d.shape[-1]), eps.reshape(-1), u_max)
        theta = (1 / (1 + flat)).reshape(eps.shape).clamp(min=fam.lowest, max=1.0)
    tv = tv_closed_form(name, p, q, theta, d)
    for _ in range(64):  # rounding: step toward lossless until the computed distance is within the budget
        over = tv > eps
        if not bool(over.any()):
            break
        theta = torch.where(over, theta + (1 - theta) * 1e-9 + 1e-15, theta).clamp(max=1.0)
        tv = tv_closed_form(name, p, q, theta, d)
    return theta, tv
