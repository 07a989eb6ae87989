"""The one bootstrap of verispec's reports and studies: clusters (problems) resampled with replacement, percentile
intervals, and the one way an estimate with its interval is written.

Every interval in docs/results is a percentile interval of ``n_boot`` resamples drawn by numpy's
``default_rng(seed)``; paired comparisons resample whole clusters (all seeds and settings of a problem together),
as multinomial cluster weights (:func:`cluster_weights`) so that one draw serves every statistic of a table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from verispec.defaults import N_BOOT

__all__ = ["N_BOOT", "BOOT_SEED", "chi_square_bins", "chi_square_power", "chi_square_pvalue", "cluster_weights",
           "format_ci", "percentile_interval", "resample_indices"]

#: resamples and seed of every reported interval
BOOT_SEED = 0


def cluster_weights(n_clusters: int, n_boot: int = N_BOOT, seed: int = BOOT_SEED) -> np.ndarray:
    """[n_boot, n_clusters] multinomial counts (as floats): clusters resampled with replacement, each row one
    resample; a statistic that is a function of cluster sums takes ``weights @ sums``."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n_clusters, np.full(n_clusters, 1.0 / n_clusters), size=n_boot).astype(float)


def resample_indices(rng: np.random.Generator, n: int) -> np.ndarray:
    """One resample of ``n`` clusters by index, with replacement (for statistics that are not sums)."""
    return rng.integers(0, n, n)


def percentile_interval(boot: np.ndarray, level: float = 0.95, *, finite_only: bool = False,
                        method: str = "linear") -> tuple[float, float]:
    """The central ``level`` percentile interval of the bootstrap values ``boot`` (NaN dropped; with
    ``finite_only`` infinities too); (nan, nan) when nothing is left."""
    x = np.asarray(boot, dtype=float)
    x = x[np.isfinite(x)] if finite_only else x[~np.isnan(x)]
    if x.size == 0:
        return math.nan, math.nan
    q = 100 * (1 - level) / 2
    lo, hi = np.percentile(x, [q, 100 - q], method=method)
    return float(lo), float(hi)


def format_ci(point: float | None, lo: float, hi: float, fmt: str = "{:+.4f}", missing: str = "") -> str:
    """``point [lo, hi]`` in ``fmt`` (the point alone when the interval is undefined; ``missing`` when the point
    is)."""
    if point is None or (isinstance(point, float) and math.isnan(point)):
        return missing
    if math.isnan(lo) or math.isnan(hi):
        return fmt.format(point)
    return f"{fmt.format(point)} [{fmt.format(lo)}, {fmt.format(hi)}]"


def chi_square_bins(exact: Mapping[tuple, float], n: int) -> tuple[list[tuple], list[tuple]]:
    """The bins of :func:`chi_square_pvalue` for ``n`` samples: (kept outcomes, pooled outcomes). Outcomes with
    expected count < 5 are pooled into one bin, and while that bin's expected count is still below 5 the smallest
    kept outcomes join it (a pool of expected 0.02 would turn a single chance hit into a rejection)."""
    keys = sorted(exact, key=lambda k: -exact[k])
    kept = [k for k in keys if exact[k] * n >= 5]
    pooled = [k for k in keys if exact[k] * n < 5]
    while pooled and sum(exact[k] for k in pooled) * n < 5 and len(kept) > 1:
        pooled.insert(0, kept.pop())
    return kept, pooled


def chi_square_pvalue(counts: Mapping[tuple, int], exact: Mapping[tuple, float]) -> float:
    """Chi-square goodness-of-fit p-value of observed ``counts`` against the exact law ``exact`` (outcomes with
    expected count < 5 pooled into one bin of at least 5: :func:`chi_square_bins`). Raises AssertionError at once
    if a bin of exact probability zero was observed: a sampler that emits an impossible outcome fails regardless of
    the statistic."""
    from scipy.stats import chisquare

    impossible = [k for k, c in counts.items() if c and exact.get(k, 0.0) <= 0]
    if impossible:
        raise AssertionError(f"sampled zero-probability outcome(s) {impossible[:3]}")
    n = sum(counts.values())
    kept, pooled = chi_square_bins(exact, n)
    expected = np.array([exact[k] * n for k in kept])
    observed = np.array([counts.get(k, 0) for k in kept], dtype=float)
    if pooled:
        expected = np.append(expected, sum(exact[k] for k in pooled) * n)
        observed = np.append(observed, sum(counts.get(k, 0) for k in pooled))
    return float(chisquare(observed, expected * observed.sum() / expected.sum()).pvalue)


def chi_square_power(exact: Mapping[tuple, float], wrong: Mapping[tuple, float], n: int, alpha: float) -> float:
    """Power of :func:`chi_square_pvalue` (level ``alpha``, the same bins) to reject ``exact`` with ``n`` samples
    that follow ``wrong``: the noncentral chi-square's tail at the central one's critical value."""
    from scipy.stats import chi2, ncx2

    kept, _ = chi_square_bins(exact, n)
    e_b = np.array([exact[k] for k in kept] + [1 - sum(exact[k] for k in kept)])
    w_b = np.array([wrong.get(k, 0.0) for k in kept] + [1 - sum(wrong.get(k, 0.0) for k in kept)])
    if e_b[-1] <= 1e-12:
        e_b, w_b = e_b[:-1], w_b[:-1]
    df = len(e_b) - 1
    return float(ncx2.sf(chi2.isf(alpha, df), df, n * float(((w_b - e_b) ** 2 / e_b).sum())))
