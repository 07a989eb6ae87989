"""A divergence budget on a relaxed rule: at each position, the parameter of the rule's family that accepts most
among those whose induced distribution is within total-variation distance epsilon of the target's, computed
exactly.

A family is a rule with one relaxation parameter theta on [``lowest``, 1], lossless at 1 (but the min-p cap) and
more relaxed below: lenience ``l`` and CoS-WE ``lam``, which accept more as theta falls, and, in their residual
realization, the overshoot ceiling ``lam`` and the min-p cap ``l``. For a position's processed p and q the distance
TV(pi_theta, p), pi_theta the rule's exact induced distribution (:meth:`Rule.induced`), has a closed form in each:

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

Two more families run in the ``residual`` realization (h = min(1, P/q), r = norm([P - q]+), falling back to
norm([p - q]+)), where the induced law is P on {q > p} and below p elsewhere, so TV = sum_{q > p} (P - p):

- overshoot ceiling (Sec. 4): per token with d > 0, (1 - lam) d where q <= p/lam (lam <= t = p/q in exact arithmetic;
  the code uses the rule's own float test), else p (1/lam - 1). Not monotone: as lam falls toward t from above the
  token's term rises toward d; at t it drops to (1 - t) d. Its acceptance is a constant plus this TV, so "accepts most
  within epsilon" is the largest TV <= epsilon: between consecutive thresholds TV is continuous and decreasing in lam,
  so each segment offers either a root of TV = epsilon (a quadratic) or its supremum at its left end; the best over
  all segments is found exactly, sorting only the threshold bins that bounds cannot rule out (:func:`_overshoot_row`).
  Where that supremum is not attained (an open end) the parameter sits a relative 1e-12 inside it.
- min-p cap (App. E, p_base fixed): C_A + sum_{x not in A} min(d_x, p_x u), u = 1/l - 1, with C_A the excess
  of q over p on the min-p set A, where the draft is kept whatever l is. Monotone like lenience (the same solve on
  the tokens outside A, with epsilon - C_A); not lossless at l = 1, so where C_A > epsilon no l fits and the
  position is verified losslessly (theta NaN inside, reported as 1 with distance 0: for this family theta 1 is
  not lossless, so the distance is what tells the two apart).

Their ``normalized`` realizations (P / sum P, the rules' default) have no such form: the normalizer moves with the
parameter, so the set where the emitted law exceeds p does too, and a budget on them is refused naming the
realization.

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

import numpy as np
import torch

from verispec.core.rules import get
from verispec.core.rules.base import Rule
from verispec.core.rules.lossless import Lossless
from verispec.core.sampling import minp_mask

__all__ = ["FAMILIES", "Budget", "Family", "PerPosition", "budgeted", "choose", "family_of", "tv_closed_form",
           "tv_to_target"]

#: the lenience breakpoints are binned by binary exponent from 2^_E0 up (smaller ones share the first bin)
_E0 = -40
#: relative step inside the exact solution, so that float rounding rarely puts the distance over the budget
_SHRINK = 1e-12


@dataclass(frozen=True)
class Family:
    """A rule with one relaxation parameter ``param`` in [``lowest``, 1], more relaxed below. ``requires``: other
    parameters the rule must have for the closed form (the residual realization); ``monotone``: TV to p is
    non-increasing in the parameter; ``lossless_at_one``: the parameter 1 induces p."""

    rule: str
    param: str
    lowest: float
    requires: tuple[tuple[str, object], ...] = ()
    monotone: bool = True
    lossless_at_one: bool = True


FAMILIES: dict[str, Family] = {
    f.rule: f
    for f in (
        Family("lenience", "l", 1 / 1025),  # u = 1/l - 1 up to 2^10: the exponent bins end there
        Family("cos-we", "lam", 0.0),
        Family("overshoot-ceiling", "lam", 1 / 1025, (("realization", "residual"),), monotone=False),
        Family("minp-cap", "l", 1 / 1025, (("realization", "residual"),), lossless_at_one=False),
    )
}


def _family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"rule {name!r} has no budget; budgets apply to {', '.join(FAMILIES)}") from None


def family_of(rule: Rule | str) -> Family:
    """The budget family of a rule (by its registered name); ValueError naming the families otherwise, or the
    parameter a rule instance must change (the overshoot ceiling and min-p cap need ``realization="residual"``)."""
    fam = _family(rule if isinstance(rule, str) else rule.name)
    if not isinstance(rule, str):
        for key, value in fam.requires:
            if getattr(rule, key) != value:
                raise ValueError(f"a budget on {fam.rule} needs {key}={value!r}, where its distance to p has a "
                                 f"closed form (the {getattr(rule, key)!r} {key} has none)")
    return fam


def _resolve(rule: Rule | str) -> tuple[Family, Rule]:
    """The family and a rule carrying the fixed parameters (p_base, realization): a name gets the defaults and
    the family's required parameters."""
    fam = family_of(rule)
    return fam, (get(fam.rule, **dict(fam.requires)) if isinstance(rule, str) else rule)


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


def budgeted(rule: Rule | str, theta: torch.Tensor) -> Rule:
    """The family's rule (a name, or the request's rule with its other parameters) with the parameter ``theta``
    (a tensor broadcasting against the p and q it is called with, ``[..., 1]``, or 0-d). A 0-d NaN, a position
    where no parameter fits, is the lossless rule; tensors holding NaN go through :class:`PerPosition`."""
    fam, base = _resolve(rule)
    if theta.numel() == 1 and bool(torch.isnan(theta).all()):
        return Lossless()
    out = get(fam.rule, **{**base.params, fam.param: 0.5})  # validated with a scalar, then given its rows' values
    object.__setattr__(out, fam.param, theta)
    return out


@dataclass(frozen=True, eq=False)
class PerPosition(Rule):
    """A family's rule with one parameter per (row, position): ``theta`` [B, gamma, 1] for a block verified by
    :func:`~verispec.core.verify.chain.verify_block`, which calls the acceptance on [B, gamma, V] and, through
    :meth:`at`, the correction on the stopping position of each row. Bonus and target: p (lossless there)."""

    family: str = "lenience"
    theta: torch.Tensor | None = None
    #: the request's rule, for the family's other parameters (p_base, realization); the defaults when None
    base: Rule | None = None
    name: ClassVar[str] = "budgeted"
    equation: ClassVar[str] = "per-position parameter within a TV budget"

    def _rule(self) -> Rule:
        theta = self.theta.nan_to_num(1.0)  # type: ignore[union-attr]
        return budgeted(self.base or self.family, theta)

    def _lossless(self) -> torch.Tensor | None:
        """Where no parameter fitted (theta NaN): those positions run the lossless rule."""
        mask = torch.isnan(self.theta)  # type: ignore[arg-type]
        return mask if bool(mask.any()) else None

    def acceptance(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        h, mask = self._rule().acceptance(p, q), self._lossless()
        return h if mask is None else torch.where(mask, Lossless().acceptance(p, q), h)

    def correction(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        r, mask = self._rule().correction(p, q), self._lossless()
        return r if mask is None else torch.where(mask, Lossless().correction(p, q), r)

    def at(self, rows: torch.Tensor, index: torch.Tensor) -> Rule:
        return PerPosition(self.family, self.theta[rows, index], self.base)  # type: ignore[index]

    def describe(self) -> str:
        return f"{self.family}(budgeted)"


# --------------------------------------------------------------------------------------------------- distances


def tv_to_target(rule: Rule | str, p: torch.Tensor, q: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """TV(pi_theta, p) per row ([..., 1]) from the rule's exact induced distribution pi_theta (the reference the
    closed forms are tested against; theta NaN: lossless)."""
    fam, base = _resolve(rule)
    pi = PerPosition(fam.rule, theta, base).induced(p, q)
    return 0.5 * (pi - p).abs().sum(-1, keepdim=True)


def tv_closed_form(rule: Rule | str, p: torch.Tensor, q: torch.Tensor, theta: torch.Tensor,
                   d: torch.Tensor | None = None) -> torch.Tensor:
    """TV(pi_theta, p) per row ([..., 1]) by the family's closed form (module docstring); ``d``: [q - p]+ if the
    caller has it; theta NaN (no parameter fitted, lossless): 0."""
    fam, base = _resolve(rule)
    if d is None:
        d = (q - p).clamp(min=0)
    lossless = torch.isnan(theta)
    th = theta.nan_to_num(1.0)
    if fam.rule == "cos-we":
        out = (1 - th) * d.sum(-1, keepdim=True)
    elif fam.rule == "lenience":
        out = torch.minimum(d, p * (1 / th - 1)).sum(-1, keepdim=True)
    elif fam.rule == "overshoot-ceiling":
        # the rule's own test for the mixture branch (q <= p / lam), so the two agree at the breakpoints; tokens
        # with q <= p pass it with d = 0, so they add nothing
        out = torch.where(q <= p / th, (1 - th) * d, p * (1 / th - 1)).sum(-1, keepdim=True)
    else:  # minp-cap: the draft is kept on A whatever l is; lenience's excess outside it
        inside = minp_mask(p, base.p_base)  # type: ignore[attr-defined]
        out = torch.where(inside, d, torch.minimum(d, p * (1 / th - 1))).sum(-1, keepdim=True)
    return torch.where(lossless, torch.zeros_like(out), out)


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


#: the overshoot ceiling's thresholds are binned by their float64 bit pattern shifted right by this much: 16 bins
#: per binade, exactly in t's order (a positive double's bits, read as an integer, grow with it)
_OVERSHOOT_SHIFT = 48


def _segments(t: np.ndarray, dp: np.ndarray, pp: np.ndarray, prev: float, d_above: float, p_below: float,
              e: float, lowest: float) -> tuple[float, float]:
    """(value, lam) of the best of the segments (t_{i-1}, t_i] ending at the sorted thresholds ``t`` (t_{-1} =
    ``prev``, -inf for none: closed at lowest), with d of the tokens after them ``d_above`` and p of those before
    ``p_below``: on each, G = (1 - lam) D + (1/lam - 1) P is continuous and decreasing, so a segment whose right
    end fits offers eps (the root of D lam^2 - (D - P - eps) lam - P = 0) if its left end reaches eps, else its
    left end's value (a relative 1e-12 inside an open end). (-inf, nan) if none fits; the first of equals."""
    p_lo = p_below + np.concatenate([[0.0], np.cumsum(pp[:-1])])
    d_hi = d_above + np.cumsum(dp[::-1])[::-1]
    left = np.concatenate([[prev], t[:-1]])
    closed = left < lowest  # the segment holding lowest starts there, included
    a = np.maximum(left, lowest)
    valid = (a < t) | (closed & (a <= t))
    g_a = (1 - a) * d_hi + (1 / a - 1) * p_lo
    g_b = (1 - t) * d_hi + (1 / t - 1) * p_lo
    reaches = g_a >= e
    value = np.where(reaches, e, g_a)
    value[~(valid & (g_b <= e))] = -math.inf
    k = int(np.argmax(value))
    if value[k] == -math.inf:
        return -math.inf, math.nan
    dk, pk, ak = float(d_hi[k]), float(p_lo[k]), float(a[k])
    start = ak if bool(closed[k]) else ak * (1 + 1e-12)
    if not bool(reaches[k]) or dk == pk == 0:
        lam = start
    else:  # the root, by the stable form of the quadratic formula (D = 0 gives P / (P + eps))
        bq = dk - pk - e
        disc = math.sqrt(bq * bq + 4 * dk * pk)
        lam = max((bq + disc) / (2 * dk) if bq >= 0 else 2 * pk / (disc - bq), start)
        lam = lam + (1 - lam) * _SHRINK  # a hair toward lossless, so rounding rarely needs the nudge
    return float(value[k]), min(lam, float(t[k]))


def _overshoot_lam(p: torch.Tensor, q: torch.Tensor, d: torch.Tensor, eps: torch.Tensor, lowest: float
                   ) -> torch.Tensor:
    """The overshoot ceiling's lam in [lowest, 1] with the largest G(lam) <= eps, per row of [R, V] (eps [R]):
    G = sum over d > 0 of (1 - lam) d where lam <= t = p/q, else p (1/lam - 1) (module docstring); the smallest
    such lam where several reach eps (:func:`_overshoot_row`)."""
    out = torch.empty(p.shape[0], dtype=torch.float64)
    p_np, q_np, d_np = p.numpy(), q.numpy(), d.numpy()
    for r in range(p.shape[0]):
        pos = np.flatnonzero(d_np[r] > 0)
        pp = p_np[r][pos]
        out[r] = _overshoot_row(pp / q_np[r][pos], d_np[r][pos], pp, float(eps[r]), lowest)
    return out


def _overshoot_row(t: np.ndarray, dp: np.ndarray, pp: np.ndarray, e: float, lowest: float) -> float:
    """:func:`_overshoot_lam` for one row, given the thresholds t = p/q, d and p of its tokens with d > 0.

    The sorted thresholds t (< 1) cut [lowest, 1] into segments (t_{k-1}, t_k] (the last ending at 1, the first
    closed at lowest), each searched exactly by :func:`_segments`. Sorting all of them is avoided: thresholds are
    binned by their bit pattern (16 bins per binade, in t's order), and a bin's segments are sorted and searched
    only if bounds from the bins' sums say they may hold the answer: no segment ending in bin j fits if G at its
    upper edge, with the bin's own tokens left out, is over eps; none offers more than
    (1 - L) D(bins >= j) + (1/L - 1) P(bins <= j), L the lower edge of the nearest non-empty bin below. Bins are
    searched from small lam up while their bound reaches eps (the first segment reaching eps is the answer), then
    by decreasing bound while it beats the best value found."""
    low = t < lowest  # below lowest: the ceiling branch at every allowed lam
    p0 = 0.0
    if low.any():
        p0 = float(pp[low].sum())
        t, dp, pp = t[~low], dp[~low], pp[~low]
    none = np.zeros(1)
    if not t.size:  # G = (1/lam - 1) p0 on [lowest, 1]: one segment
        return _segments(np.ones(1), none, none, -math.inf, 0.0, p0, e, lowest)[1]
    first = int(np.float64(lowest).view(np.int64)) >> _OVERSHOOT_SHIFT  # the bin holding lowest
    k_bins = (int(np.float64(1.0).view(np.int64)) >> _OVERSHOOT_SHIFT) - first  # bins below 1
    edges = ((np.arange(k_bins + 1, dtype=np.int64) + first) << _OVERSHOOT_SHIFT).view(np.float64)
    edges[0] = lowest  # bin j holds [edges[j], edges[j + 1]) of the thresholds >= lowest; edges[K] = 1
    b = (t.view(np.int64) >> _OVERSHOOT_SHIFT) - first  # monotone in t
    d_bin = np.bincount(b, weights=dp, minlength=k_bins)
    p_bin = np.bincount(b, weights=pp, minlength=k_bins)
    filled = np.bincount(b, minlength=k_bins) > 0
    d_from = np.cumsum(d_bin[::-1])[::-1]  # d of bins >= j
    p_upto = p0 + np.cumsum(p_bin)  # p of bins <= j (and of those below lowest)
    d_after, p_before = d_from - d_bin, p_upto - p_bin
    below = np.concatenate([[-1], np.maximum.accumulate(np.where(filled, np.arange(k_bins), -1))[:-1]])
    lower = np.where(below >= 0, edges[np.maximum(below, 0)], lowest)
    upper = edges[1:]
    bound = (1 - lower) * d_from + (1 / lower - 1) * p_upto
    fits = filled & ((1 - upper) * d_after + (1 / upper - 1) * p_before <= e)

    def search(j: int) -> tuple[float, float]:
        idx = np.flatnonzero(b == j)
        o = np.argsort(t[idx])
        prev = float(t[b == below[j]].max()) if below[j] >= 0 else -math.inf
        return _segments(t[idx][o], dp[idx][o], pp[idx][o], prev, float(d_after[j]), float(p_before[j]), e, lowest)

    best, lam = -math.inf, math.nan
    searched = np.zeros(k_bins, dtype=bool)
    for j in np.flatnonzero(fits & (bound >= e)):  # from small lam up: the first to reach eps wins
        searched[j] = True
        v, x = search(int(j))
        if v > best:
            best, lam = v, x
        if v == e:
            return lam
    v, x = _segments(np.ones(1), none, none, float(t.max()), 0.0, p0 + float(pp.sum()), e, lowest)  # (t_max, 1]
    if v > best:
        best, lam = v, x
    for j in np.argsort(-bound, kind="stable"):
        if best >= e or bound[j] <= best:
            break
        if fits[j] and not searched[j]:
            v, x = search(int(j))
            if v > best:
                best, lam = v, x
    return lam


def choose(rule: Rule | str, p: torch.Tensor, q: torch.Tensor, epsilon: float | torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """(theta, TV) per row ([..., 1] each, float64): the parameter of the rule's family that accepts most among
    those whose induced distribution is within TV ``epsilon`` (a number, or one per row [..., 1]) of p, and its
    distance; theta NaN where no parameter fits (the min-p cap), for the lossless rule there. ``rule``: a family's
    name or the request's rule (its other parameters: p_base, realization)."""
    fam, base = _resolve(rule)
    name = fam.rule
    p, q = p.to(torch.float64), q.to(torch.float64)
    eps = torch.as_tensor(epsilon, dtype=torch.float64).expand(p.shape[:-1] + (1,))
    if bool(torch.isnan(eps).any()) or bool((eps < 0).any()):
        raise ValueError(f"the budget epsilon must be >= 0, got {epsilon}")
    d = (q - p).clamp(min=0)
    flat_p, flat_d = p.reshape(-1, p.shape[-1]), d.reshape(-1, d.shape[-1])
    if name == "cos-we":
        tv_q = d.sum(-1, keepdim=True)
        safe = torch.where(tv_q > 0, tv_q, torch.ones_like(tv_q))
        theta = torch.where(tv_q > 0, (1 - eps / safe).clamp(min=fam.lowest, max=1.0),
                            torch.full_like(tv_q, fam.lowest))  # q = p: every lam induces p
    elif name == "overshoot-ceiling":
        lam = _overshoot_lam(flat_p, q.reshape(flat_p.shape), flat_d, eps.reshape(-1), fam.lowest)
        theta = lam.reshape(eps.shape).clamp(min=fam.lowest, max=1.0)
    else:
        u_max = 1 / fam.lowest - 1
        room, dd = eps, flat_d
        if name == "minp-cap":  # the tokens of A keep their excess at every l: solve outside A for what is left
            inside = minp_mask(p, base.p_base)  # type: ignore[attr-defined]
            room = eps - torch.where(inside, d, torch.zeros_like(d)).sum(-1, keepdim=True)
            dd = torch.where(inside, torch.zeros_like(d), d).reshape(flat_d.shape)
        u = _lenience_u(flat_p, dd, room.clamp(min=0).reshape(-1), u_max)
        theta = (1 / (1 + u)).reshape(eps.shape).clamp(min=fam.lowest, max=1.0)
        if name == "minp-cap":
            theta = torch.where(room < 0, torch.full_like(theta, math.nan), theta)
    tv = tv_closed_form(base, p, q, theta, d)
    solved = theta
    for _ in range(64):  # rounding: step toward lossless until the computed distance is within the budget
        over = tv > eps
        if not bool(over.any()):
            return theta, tv
        theta = torch.where(over, theta + (1 - theta) * 1e-9 + 1e-15, theta).clamp(max=1.0)
        tv = tv_closed_form(base, p, q, theta, d)

    def take(candidate: torch.Tensor) -> bool:
        """Take ``candidate`` where the current theta is over the budget and it is not; True if none is over."""
        nonlocal theta, tv
        tv_c = tv_closed_form(base, p, q, candidate, d)
        fixed = (tv > eps) & (tv_c <= eps)
        theta, tv = torch.where(fixed, candidate, theta), torch.where(fixed, tv_c, tv)
        return not bool((tv > eps).any())

    if name == "overshoot-ceiling":
        # the solve's lam can sit on a threshold t = p/q where the rule's float test q <= p/lam fails, so the token
        # takes the ceiling branch (near d) and stepping up only stays there: step down from it ulp by ulp instead,
        # to where the test holds and the token's term is (1 - lam) d; failing that (t - ulps is over too), solve
        # again a relative 1e-9 inside the budget
        down, done = solved, False
        for _ in range(16):
            down = torch.nextafter(down, torch.zeros_like(down)).clamp(min=fam.lowest)
            if done := take(down):
                break
        if not done:
            lam = _overshoot_lam(flat_p, q.reshape(flat_p.shape), flat_d, (eps * (1 - 1e-9)).reshape(-1), fam.lowest)
            take(lam.reshape(eps.shape).clamp(min=fam.lowest, max=1.0))
    # a last guard: lossless (distance 0) never breaks the budget; the min-p cap is not lossless at l = 1, so NaN
    over = tv > eps
    theta = torch.where(over, torch.full_like(theta, 1.0 if fam.lossless_at_one else math.nan), theta)
    tv = torch.where(over, torch.zeros_like(tv), tv)
    return theta, tv
