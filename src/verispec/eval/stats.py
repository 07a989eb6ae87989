"""The one bootstrap of verispec's reports and studies: clusters (problems) resampled with replacement, percentile
intervals, and the one way an estimate with its interval is written.

Every interval in docs/results is a percentile interval of ``n_boot`` resamples drawn by numpy's
``default_rng(seed)``; paired comparisons resample whole clusters (all seeds and settings of a problem together),
as multinomial cluster weights (:func:`cluster_weights`) so that one draw serves every statistic of a table.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["N_BOOT", "BOOT_SEED", "cluster_weights", "format_ci", "percentile_interval", "resample_indices"]

#: resamples and seed of every reported interval
N_BOOT = 2000
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
