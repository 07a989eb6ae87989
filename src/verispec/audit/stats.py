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

Two samples (:func:`two_sample_test`, no exact law: the engine's and a reference endpoint's samples, N_a and N_b
per prompt). Pearson's statistic of homogeneity of the 2 x B table of bin counts, the bins chosen from the pooled
counts alone (an outcome alone when its expected count on the smaller side, N_min pi_b with pi the pooled law, is
>= 5 and pi_b >= the floor; the rest pooled, as :func:`make_bins` does for a law). A binning that depends on the
pooled counts only keeps the test valid: given them, which side each sample came from is all that is random under
the null. X^2 is asymptotically noncentral chi-square with df = sum_j (B_j - 1) and noncentrality
lambda = n_eff sum_j chi2(a_j - b_j; pi_j), chi2(d; pi) = sum_b d_b^2 / pi_b and n_eff = N_a N_b / (N_a + N_b)
(N / 2 for equal sides). Everything above carries over with N replaced by n_eff and the pooled law in place of
the reference law: the tolerance null TV(a_j, b_j) <= tau has lambda_0 = n_eff sum_j tau^2 (1/pi_j(1) +
1/pi_j(2)); Cauchy-Schwarz gives chi2(d; pi) >= (sum |d|)^2 = 4 TV^2 for any law pi, so the least power at
average TV delta is P(chi2'(df, 4 n_eff J delta^2) >= c), now with c at the whole alpha (there is no
impossible-outcome part: an outcome seen on one side only is an ordinary cell of the table). For the same power
the two-sample test needs twice the samples per side of the one-sample test, four times the requests in all.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import chndtrinc
from scipy.stats import binom, chi2, ncx2

from verispec.eval.stats import percentile_interval

__all__ = ["Bins", "combined_pvalue", "critical_value", "homogeneity_x2", "impossible_pvalue", "make_bins",
           "min_detectable_tv", "pearson", "plan", "plan_n", "tolerance_noncentrality", "tolerant_pvalue",
           "tv_estimate", "tv_two_sample", "two_sample_test", "worst_case_power"]

#: a bin's smallest reference probability (with tau = 0.002 and N = 5000 this keeps lambda_0 <= 4)
MIN_BIN_PROB = 0.01
#: the bin floors :func:`plan` chooses from
MIN_BIN_PROBS = (0.02, 0.01, 0.005, 0.002, 0.001)
#: the smallest expected count of a bin (Pearson's approximation)
MIN_EXPECTED = 5.0
#: the largest N per prompt :func:`plan` considers: a plan that reaches it found no N that detects the TV asked for
N_MAX = 200_000


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


def tolerance_noncentrality(bins: Sequence[Bins], n: float, tau: float) -> float:
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


def worst_case_power(delta: float, n_total: float, df: int, lam0: float, alpha: float) -> float:
    """The least power against any engine law at average TV ``delta`` (binned) with ``n_total`` samples in all:
    P(chi2'(df, 4 n_total delta^2) >= critical value) (Cauchy-Schwarz bound, module docstring)."""
    if df < 1:
        return 0.0
    return float(ncx2.sf(critical_value(alpha, df, lam0), df, 4.0 * n_total * delta**2))


def min_detectable_tv(n_total: float, df: int, lam0: float, alpha: float, power: float = 0.9,
                      pooled_mass: float = 0.0) -> float:
    """The smallest average TV detected with probability >= ``power`` by :func:`worst_case_power`, plus the
    pooled bins' mass (mean over prompts): computed, not assumed. inf when no TV <= 1 is."""
    if df < 1 or n_total < 1:
        return math.inf
    c = critical_value(alpha, df, lam0)
    # the alternative's noncentrality 4 n delta^2 at which P(chi2'(df, .) >= c) = power, by cdflib's inverse in
    # the noncentrality (one call; a root search over ncx2.sf costs about 15x more and agrees to 1e-7 in delta)
    lam = float(chndtrinc(c, df, 1.0 - power))
    if not math.isfinite(lam) or lam > 4.0 * n_total:
        return math.inf
    return math.sqrt(lam / (4.0 * n_total)) + pooled_mass


def plan(laws: Sequence[Mapping[Hashable, float]], target_tv: float, tau: float, alpha: float,
         power: float = 0.9, two_sample: bool = False) -> tuple[int, float]:
    """(samples per prompt, bins' smallest probability): the bin floor among :data:`MIN_BIN_PROBS` that needs the
    fewest samples (:func:`plan_n`). A lower floor pools less mass but lets the tolerance weigh more. With
    ``two_sample`` the samples per prompt on each side of :func:`two_sample_test`, ``laws`` standing in for the
    pooled laws."""
    return min(((plan_n(laws, target_tv, tau, alpha, power, min_prob=m, two_sample=two_sample), m)
                for m in MIN_BIN_PROBS), key=lambda x: (x[0], -x[1]))


def plan_n(laws: Sequence[Mapping[Hashable, float]], target_tv: float, tau: float, alpha: float,
           power: float = 0.9, n_max: int = N_MAX, min_prob: float = MIN_BIN_PROB, two_sample: bool = False) -> int:
    """The smallest number of samples per prompt whose design detects an average TV of ``target_tv`` with
    ``power`` (bins, lambda_0 and the pooled mass recomputed for each n; the chi-square at ``alpha / 2``, its
    Bonferroni share); n_max when none up to it does. With ``two_sample``: per prompt and side, for the test of
    homogeneity (n_eff = n / 2, the whole ``alpha``)."""

    def ok(n: int) -> bool:
        bins = [make_bins(law, n, min_prob) for law in laws]
        df = sum(b.df for b in bins)
        n_eff, level = (n / 2, alpha) if two_sample else (n, alpha / 2)
        lam0 = tolerance_noncentrality(bins, n_eff, tau)
        pooled = float(np.mean([b.pooled_mass for b in bins]))
        return min_detectable_tv(n_eff * len(laws), df, lam0, level, power, pooled) <= target_tv

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


def _pooled_law(a: Mapping[Hashable, int], b: Mapping[Hashable, int]) -> dict[Hashable, float]:
    total = sum(a.values()) + sum(b.values())
    # keys in a fixed order, so that bins of equal pooled counts are formed alike in every process
    keys = sorted(set(a) | set(b), key=repr)
    return {k: (a.get(k, 0) + b.get(k, 0)) / total for k in keys} if total else {}


def homogeneity_x2(bins: Bins, a: Mapping[Hashable, int], b: Mapping[Hashable, int]) -> float:
    """Pearson's X^2 of homogeneity of the 2 x B table (bin counts of the samples ``a`` and ``b``; expected counts
    N_side x the pooled bin frequency)."""
    oa, ob = bins.observed(a), bins.observed(b)
    na, nb = oa.sum(), ob.sum()
    col = oa + ob
    keep = col > 0
    if na <= 0 or nb <= 0 or keep.sum() < 2:
        return 0.0
    ea, eb = na * col[keep] / (na + nb), nb * col[keep] / (na + nb)
    return float(((oa[keep] - ea) ** 2 / ea).sum() + ((ob[keep] - eb) ** 2 / eb).sum())


def two_sample_test(a: Sequence[Mapping[Hashable, int]], b: Sequence[Mapping[Hashable, int]], tau: float,
                    alpha: float, power: float = 0.9, target_tv: float | None = None) -> dict:
    """The test of homogeneity of the outcome counts ``a[j]`` (engine) and ``b[j]`` (reference) of each prompt j,
    under the tolerance null TV(a_j, b_j) <= tau (module docstring). The bin floor is the one of
    :data:`MIN_BIN_PROBS` whose bins (from the pooled counts alone) detect the smallest TV; the power is the
    noncentral chi-square bound at that floor, computed from the run's bins. Returns the statistic, df, lambda_0,
    the p-value, the smallest TV detectable with ``power`` at ``alpha`` (pooled mass included), the power at
    ``target_tv``, the bins per prompt, the floor and the pooled mass."""
    ns = [(sum(x.values()), sum(y.values())) for x, y in zip(a, b, strict=True)]
    n_eff = float(sum(na * nb / (na + nb) for na, nb in ns if na and nb))
    pooled_laws = [_pooled_law(x, y) for x, y in zip(a, b, strict=True)]
    best: dict | None = None
    seen = set()
    for floor in MIN_BIN_PROBS:
        bins = [make_bins(law, min(na, nb), floor) for law, (na, nb) in zip(pooled_laws, ns, strict=True)]
        shape = tuple(tuple(len(m) for m in bn.members) for bn in bins)  # floors below 5 / N bin alike
        if shape in seen:
            continue
        seen.add(shape)
        df = sum(bn.df for bn in bins)
        # lambda_0 per prompt at that prompt's n_eff (equal here when every prompt has the same N per side)
        lam0 = sum(tolerance_noncentrality([bn], na * nb / (na + nb), tau)
                   for bn, (na, nb) in zip(bins, ns, strict=True) if na and nb)
        pooled = float(np.mean([bn.pooled_mass for bn in bins]))
        mdt = min_detectable_tv(n_eff, df, lam0, alpha, power, pooled)
        if best is None or mdt < best["min_detectable_tv"]:
            best = {"bins": bins, "df": df, "lambda0": lam0, "pooled_mass": pooled, "min_detectable_tv": mdt,
                    "bin_floor": floor}
    assert best is not None
    x2 = sum(homogeneity_x2(bn, x, y) for bn, x, y in zip(best["bins"], a, b, strict=True))
    best.update(x2=x2, pvalue=tolerant_pvalue(x2, best["df"], best["lambda0"]), n_eff=n_eff)
    if target_tv is not None:
        best["power_at_target_tv"] = worst_case_power(max(target_tv - best["pooled_mass"], 0.0), n_eff, best["df"],
                                                      best["lambda0"], alpha)
    return best


def tv_two_sample(a: Sequence[Mapping[Hashable, int]], b: Sequence[Mapping[Hashable, int]], n_boot: int = 2000,
                  seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
    """Average (over prompts) plug-in TV between the two empirical laws of each prompt, with a basic
    (reverse-percentile) bootstrap interval from ``n_boot`` multinomial resamples of both sides (numpy
    ``default_rng(seed)``), clipped at 0. The plug-in estimate is biased up by the sampling noise of both sides
    (TV of two samples of one law is > 0); the basic interval carries that bias back, as in :func:`tv_estimate`."""
    rng = np.random.default_rng(seed)
    points, boots = [], []
    for x, y in zip(a, b, strict=True):
        keys = sorted(set(x) | set(y), key=repr)
        ca = np.array([x.get(k, 0) for k in keys], dtype=float)
        cb = np.array([y.get(k, 0) for k in keys], dtype=float)
        na, nb = ca.sum(), cb.sum()
        if na == 0 or nb == 0:
            return math.nan, math.nan, math.nan
        points.append(0.5 * float(np.abs(ca / na - cb / nb).sum()))
        da = rng.multinomial(int(na), ca / na, size=n_boot) / na
        db = rng.multinomial(int(nb), cb / nb, size=n_boot) / nb
        boots.append(0.5 * np.abs(da - db).sum(axis=1))
    point = float(np.mean(points))
    lo, hi = percentile_interval(np.mean(boots, axis=0), level)
    return point, max(0.0, 2 * point - hi), max(0.0, 2 * point - lo)
