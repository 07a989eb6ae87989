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
  token. The largest u with f(u) <= epsilon is found exactly in O(V): the breakpoints are binned on a log grid,
  f is evaluated at every bin edge from the bins' sums, and the one bin holding the solution is sorted and
  walked segment by segment (:func:`_lenience_u`).

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

#: log-spaced bins of the lenience breakpoints: enough that the solving bin holds few tokens of a 150k vocabulary
_BINS = 512
_B_LOW = 1e-9


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


def tv_closed_form(name: str, p: torch.Tensor, q: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """TV(pi_theta, p) per row ([..., 1]) by the family's closed form (module docstring)."""
    _family(name)
    if name == "cos-we":
        return (1 - theta) * (q - p).clamp(min=0).sum(-1, keepdim=True)
    u = 1 / theta - 1
    return torch.minimum((q - p).clamp(min=0), p * u).sum(-1, keepdim=True)


def _lenience_u(p: torch.Tensor, q: torch.Tensor, eps: torch.Tensor, u_max: float) -> torch.Tensor:
    """The largest u in [0, u_max] with f(u) = sum_x min(d_x, p_x u) <= eps, per row of [R, V] (eps [R])."""
    k = _BINS
    step = (math.log(u_max) - math.log(_B_LOW)) / (k - 1)
    # edges e_0 = 0 < e_1 = _B_LOW < ... < e_K = u_max; bin j holds b in [e_j, e_{j+1}); bin K: b >= u_max (never
    # saturated on the range). A breakpoint within rounding of an edge may land in the neighbouring bin: at such
    # a b, d = p b is p e_j to rounding, so f at the edges moves by rounding only (the caller certifies).
    edges = torch.cat([torch.zeros(1, dtype=torch.float64),
                       torch.exp(math.log(_B_LOW) + step * torch.arange(k, dtype=torch.float64))])
    edges[k] = u_max
    out = torch.full((p.shape[0],), u_max, dtype=torch.float64)
    d_all = q - p
    for r in range(p.shape[0]):
        e = float(eps[r])
        live = ((d_all[r] > 0) & (p[r] > 0)).nonzero().squeeze(-1)  # other tokens add 0 to f for every u
        if live.numel() == 0:
            continue  # f = 0: every parameter induces p
        d, pl = d_all[r, live], p[r, live]
        b = d / pl
        idx = ((b.clamp(min=_B_LOW / 2).log() - math.log(_B_LOW)) / step).floor_().add_(1).clamp_(0, k).long()
        dsum = torch.zeros(k + 1, dtype=torch.float64).index_add_(0, idx, d)
        psum = torch.zeros(k + 1, dtype=torch.float64).index_add_(0, idx, pl)
        # f(e_j) = sum of d over bins < j + e_j * sum of p over bins >= j, for j = 0..K
        below = torch.cat([torch.zeros(1, dtype=torch.float64), dsum.cumsum(0)[:k]])
        above = psum.flip(0).cumsum(0).flip(0)
        f_edges = below + edges * above
        if float(f_edges[k]) <= e:
            continue  # the whole range fits: the most relaxed parameter
        j = max(int((f_edges <= e).sum()) - 1, 0)  # f non-decreasing, f(e_0) = 0: the last edge that fits
        c, pg = float(below[j]), float(above[j])
        sel = (idx == j).nonzero().squeeze(-1)
        bs, order = b[sel].sort()
        ds, ps = d[sel][order], pl[sel][order]
        # at breakpoint i of the bin, f = c + sum_{i' < i} d + b_i (pg - sum_{i' < i} p)
        zero = torch.zeros(1, dtype=torch.float64)
        cs = c + torch.cat([zero, ds.cumsum(0)])
        pgs = pg - torch.cat([zero, ps.cumsum(0)])
        over = (cs[:-1] + bs * pgs[:-1]) > e
        i = int(over.nonzero()[0]) if bool(over.any()) else len(bs)
        slope = float(pgs[i])
        u = (e - float(cs[i])) / slope if slope > 0 else u_max
        out[r] = min(max(u, 0.0), u_max)
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
    if name == "cos-we":
        tv_q = (q - p).clamp(min=0).sum(-1, keepdim=True)
        safe = torch.where(tv_q > 0, tv_q, torch.ones_like(tv_q))
        theta = torch.where(tv_q > 0, (1 - eps / safe).clamp(min=fam.lowest, max=1.0),
                            torch.full_like(tv_q, fam.lowest))  # q = p: every lam induces p
    else:
        u_max = 1 / fam.lowest - 1
        flat = _lenience_u(p.reshape(-1, p.shape[-1]), q.reshape(-1, q.shape[-1]), eps.reshape(-1), u_max)
        theta = (1 / (1 + flat)).reshape(eps.shape).clamp(min=fam.lowest, max=1.0)
    tv = tv_closed_form(name, p, q, theta)
    for _ in range(64):  # rounding: step toward lossless until the computed distance is within the budget
        over = tv > eps
        if not bool(over.any()):
            break
        theta = torch.where(over, theta + (1 - theta) * 1e-9 + 1e-15, theta).clamp(max=1.0)
        tv = tv_closed_form(name, p, q, theta)
    return theta, tv
