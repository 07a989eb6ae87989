"""The audit's test: chi-square goodness of fit against an exact law, under a tolerance null TV <= tau.

Outcomes (continuations) are binned: every outcome of reference probability >= ``min_prob`` (and expected count
>= 5) is a bin of its own, the rest share one pooled bin (:func:`make_bins`). With N samples per prompt and J
prompts, Pearson's statistic X^2 = sum_j sum_b (O_jb - N e_jb)^2 / (N e_jb) is asymptotically noncentral
chi-square with df = sum_j (B_j - 1) and noncentrality lambda = N sum_j chi2(engine_j || e_j), chi2 the
chi-square divergence sum_b (a_b - e_b)^2 / e_b.

Tolerance. The null is not "the engine's law equals the reference law" but "their total-variation distance is at
most tau on every prompt" (reference and engine may differ by float noise: another kernel, another batch shape).
Over that set the chi-square divergence is a convex function of the difference d = a - e, so its maximum sits on
a vertex of {sum d = 0, sum |d| <= 2 tau}: tau on one bin, -tau on another, the two smallest bins,

    lambda_0 = N sum_j tau^2 (1 / e_j(1) + 1 / e_j(2))                      (:func:`tolerance_noncentrality`)

and the p-value is the noncentral tail P(chi2'(df, lambda_0) >= X^2) (:func:`tolerant_pvalue`): a valid test of
TV <= tau (asymptotically, as Pearson's). Bins of at least ``min_prob`` keep lambda_0 small.

Power. An engine whose law is at average TV delta from the reference (the law of (prompt, continuation) with the
prompts equally weighted) has, by Cauchy-Schwarz ((sum |d|)^2 <= sum d^2 / e), chi2 >= 4 delta_j^2 on each
prompt and so lambda >= 4 N J mean_j(delta_j^2) >= 4 (N J) delta^2: the power at delta is at least
P(chi2'(df, 4 N J delta^2) >= c), c the critical value at alpha under lambda_0 (:func:`worst_case_power`). The
smallest TV detectable with power >= 0.9 (:func:`min_detectable_tv`) is that bound's root, plus the pooled bins'
reference mass (a defect that only moves mass inside a pooled bin changes the binned law by nothing).

Impossible outcomes (reference probability exactly 0, e.g. outside top-k): under the null each sample is one with
probability at most tau, so m of them have p-value P(Binomial(N J, tau) >= m). The two p-values are combined by
Bonferroni (alpha / 2 each): :func:`combined_pvalue`.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq
from scipy.stats import binom, chi2, ncx2

from verispec.eval.stats import percentile_interval

__all__ = ["Bins", "combined_pvalue", "critical_value", "impossible_pvalue", "make_bins", "min_detectable_tv",
           "pearson", "plan", "plan_n", "tolerance_noncentrality", "tolerant_pvalue", "tv_estimate", "worst_case_power"]

#: a bin's smallest reference probability (with tau = 0.002 and N = 5000 this keeps lambda_0 <= 4)
MIN_BIN_PROB = 0.01
#: the bin floors :func:`plan` chooses from
MIN_BIN_PROBS = (0.02, 0.01, 0.005, 0.002, 0.001)
#: the smallest expected count of a bin (Pearson's approximation)
MIN_EXPECTED = 5.0


@dataclass
class Bins:
    """One prompt's bins: ``members[b]`` the outcomes of bin b, ``probs[b]`` its reference probability; the last
    bin is the pooled one when ``pooled`` (its reference mass: ``pooled_mass``)."""

    members: list[list[Hashable]]
    probs: np.ndarray
    pooled: bool

    @property
    def pooled_mass(self) -> float:
        return float(self.probs[-1]) if self.pooled else 0.0

    @property
    def df(self) -> int:
        return len(self.probs) - 1

    def observed(self, counts: Mapping[Hashable, int]) -> np.ndarray:
        """Counts per bin (outcomes outside the reference support are not in any bin)."""
        return np.array([sum(counts.get(k, 0) for k in m) for m in self.members], dtype=float)


def make_bins(law: Mapping[Hashable, float], n: int, min_prob: float = MIN_BIN_PROB) -> Bins:
    """Bins for ``n`` samples of ``law``: outcomes with probability >= max(min_prob, 5 / n) alone, the rest pooled;
    while the pooled bin's expected count is below 5, the smallest single bins join it."""
    floor = max(min_prob, MIN_EXPECTED / max(n, 1))
    keys = sorted((k for k, v in law.items() if v > 0), key=lambda k: -law[k])
    kept = [k for k in keys if law[k] >= floor]
    pooled = [k for k in keys if law[k] < floor]
    while pooled and sum(law[k] for k in pooled) * n < MIN_EXPECTED and len(kept) > 1:
        pooled.insert(0, kept.pop())
    if pooled and len(kept) == 0:  # everything small: one bin cannot be tested, so take the largest out
        kept.append(pooled.pop(0))
    members = [[k] for k in kept] + ([pooled] if pooled else [])
    probs = np.array([sum(law[k] for k in m) for m in members])
    return Bins(members, probs / probs.sum(), bool(pooled))


def pearson(observed: np.ndarray, probs: np.ndarray) -> float:
    """Pearson's X^2 of bin counts against bin probabilities (expected = total x probs)."""
    n = float(observed.sum())
    if n <= 0:
        return 0.0
    e = n * probs
    return float(((observed - e) ** 2 / e).sum())


def tolerance_noncentrality(bins: Sequence[Bins], n: int, tau: float) -> float:
    """lambda_0 = n sum_j tau^2 (1/e_j(1) + 1/e_j(2)): the largest noncentrality of X^2 when every prompt's law is
    within TV tau of the reference (the vertex argument in the module docstring)."""
    total = 0.0
    for b in bins:
        if b.df < 1:
            continue
        small = np.sort(b.probs)[:2]
        total += n * tau**2 * float((1.0 / small).sum())
    return total


def tolerant_pvalue(x2: float, df: int, lam0: float) -> float:
    """P(chi2'(df, lam0) >= x2): the p-value of X^2 under the least favourable law of the tolerance null."""
    if df < 1:
        return 1.0
    return float(ncx2.sf(x2, df, lam0)) if lam0 > 0 else float(chi2.sf(x2, df))


def critical_value(alpha: float, df: int, lam0: float) -> float:
    """The X^2 beyond which the tolerance null is rejected at level ``alpha``."""
    return float(ncx2.isf(alpha, df, lam0)) if lam0 > 0 else float(chi2.isf(alpha, df))


def worst_case_power(delta: float, n_total: int, df: int, lam0: float, alpha: float) -> float:
    """The least power against any engine law at average TV ``delta`` (binned) with ``n_total`` samples in all:
    P(chi2'(df, 4 n_total delta^2) >= critical value) (Cauchy-Schwarz bound, module docstring)."""
    if df < 1:
        return 0.0
    return float(ncx2.sf(critical_value(alpha, df, lam0), df, 4.0 * n_total * delta**2))


def min_detectable_tv(n_total: int, df: int, lam0: float, alpha: float, power: float = 0.9,
                      pooled_mass: float = 0.0) -> float:
    """The smallest average TV detected with probability >= ``power`` by :func:`worst_case_power`, plus the
    pooled bins' mass (mean over prompts): computed, not assumed. inf when no TV <= 1 is."""
    if df < 1 or n_total < 1 or worst_case_power(1.0, n_total, df, lam0, alpha) < power:
        return math.inf
    delta = brentq(lambda d: worst_case_power(d, n_total, df, lam0, alpha) - power, 1e-9, 1.0, xtol=1e-7)
    return float(delta) + pooled_mass


def plan(laws: Sequence[Mapping[Hashable, float]], target_tv: float, tau: float, alpha: float,
         power: float = 0.9) -> tuple[int, float]:
    """(samples per prompt, bins' smallest probability): the bin floor among :data:`MIN_BIN_PROBS` that needs the
    fewest samples (:func:`plan_n`). A lower floor pools less mass but lets the tolerance weigh more."""
    return min(((plan_n(laws, target_tv, tau, alpha, power, min_prob=m), m) for m in MIN_BIN_PROBS),
               key=lambda x: (x[0], -x[1]))


def plan_n(laws: Sequence[Mapping[Hashable, float]], target_tv: float, tau: float, alpha: float,
           power: float = 0.9, n_max: int = 200_000, min_prob: float = MIN_BIN_PROB) -> int:
    """The smallest number of samples per prompt whose design detects an average TV of ``target_tv`` with
    ``power`` (bins, lambda_0 and the pooled mass recomputed for each n; the chi-square at ``alpha / 2``, its
    Bonferroni share); n_max when none up to it does."""

    def ok(n: int) -> bool:
        bins = [make_bins(law, n, min_prob) for law in laws]
        df = sum(b.df for b in bins)
        lam0 = tolerance_noncentrality(bins, n, tau)
        pooled = float(np.mean([b.pooled_mass for b in bins]))
        return min_detectable_tv(n * len(laws), df, lam0, alpha / 2, power, pooled) <= target_tv

    lo, hi = 16, 64
    while not ok(hi):
        if hi >= n_max:
            return n_max
        lo, hi = hi, min(2 * hi, n_max)
    while hi - lo > max(8, hi // 100):
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def impossible_pvalue(m: int, n_total: int, tau: float) -> float:
    """P(Binomial(n_total, tau) >= m): ``m`` samples of reference probability zero under the tolerance null."""
    if m <= 0:
        return 1.0
    return float(binom.sf(m - 1, n_total, tau)) if tau > 0 else 0.0


def combined_pvalue(p_chi: float, p_impossible: float) -> float:
    """Bonferroni over the two parts of the test: min(1, 2 min(p_chi, p_impossible))."""
    return min(1.0, 2.0 * min(p_chi, p_impossible))


def tv_estimate(counts: Sequence[Mapping[Hashable, int]], laws: Sequence[Mapping[Hashable, float]],
                n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
    """Average (over prompts) plug-in TV between the empirical and the reference law of the continuations, with
    a basic (reverse-percentile) bootstrap interval from ``n_boot`` multinomial resamples of each prompt's counts
    (numpy ``default_rng(seed)``), clipped at 0: the plug-in estimate is biased upwards by sampling noise (about
    sum_k sqrt(e_k / (2 pi N))), and the basic interval carries that bias back instead of doubling it as the
    percentile interval would."""
    rng = np.random.default_rng(seed)
    points, boots = [], []
    for cnt, law in zip(counts, laws, strict=True):
        keys = sorted(set(law) | set(cnt), key=repr)
        e = np.array([law.get(k, 0.0) for k in keys])
        c = np.array([cnt.get(k, 0) for k in keys], dtype=float)
        n = c.sum()
        if n == 0:
            return math.nan, math.nan, math.nan
        points.append(0.5 * float(np.abs(c / n - e).sum()))
        draws = rng.multinomial(int(n), c / n, size=n_boot) / n
        boots.append(0.5 * np.abs(draws - e).sum(axis=1))
    point = float(np.mean(points))
    lo, hi = percentile_interval(np.mean(boots, axis=0), level)
    return point, max(0.0, 2 * point - hi), max(0.0, 2 * point - lo)
