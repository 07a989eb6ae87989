"""The Figure-4 simulation of the lossy-verification paper: Lemma 1's gain, loss and net change in acceptance.

Lemma 1 splits the change in single-token acceptance probability caused by truncating the target,
Delta BE = sum min(p_Theta, q) - sum min(p, q), into a gain on the allowed set A and a loss on the discarded tail.
Figure 4 of the paper plots it over random draft/target pairs whose candidate tokens are a chosen mix of
*matching*, *partially overlapping* and *unrelated*. This module reproduces that experiment with an explicit,
seeded generator:

* vocabulary of ``vocab`` tokens (default 50); ``k`` of them (default 10) are p's *candidates* and carry a
  fraction m ~ U(0.85, 0.95) of p's mass, split by a Dirichlet(``alpha``) (default flat); the other tokens share
  1 - m (flat Dirichlet): p's *tail*;
* each candidate is labelled matching / partial / unrelated in the proportions of the triplet (largest-remainder
  rounding of ``k * ratio``, labels shuffled over the candidates);
* q: matching candidates get p(x) times U(0.9, 1.1) ("about the same"); partial ones p(x) times a log-uniform
  factor in [0.3, 3]; unrelated ones keep p(x) times U(0, 0.1) and the rest of p(x) moves to a random token
  outside p's candidates; p's tail gets ``q_tail`` times p(x) times a log-uniform factor in [0.5, 2]; q is
  normalized. ``q_tail = 0`` (default) is a draft whose mass lives on its own candidates only (p's matching and
  partial candidates and the unrelated tokens); ``q_tail = 1`` gives the draft p's tail profile too. This knob
  decides the sign of Delta BE: truncation discards p's tail, which costs acceptance only where q also has mass
  (Lemma 1's loss), so a draft that copies p's tail makes truncation a pure loss;
* for every pair and every parameter (min-p: p_base in 0.1..0.9; eta: epsilon in 0.05..0.25 with delta = epsilon)
  the allowed set A = :func:`~verispec.analysis.allowed_set` (p) is formed and :func:`~verispec.analysis.lemma1`
  gives the direct difference, the gain and the loss;
* ``baseline_delta`` is the change in acceptance of the matched baseline AS RUN (``minp-sampling`` /
  ``eta-sampling`` with the given ``draft_truncation``, through the rule's own ``draft`` and ``acceptance``)
  over lossless SD: with ``draft_truncation="none"`` (default, the paper's protocol: the untruncated draft) it
  equals Lemma 1's direct difference exactly; with ``"same"`` (q truncated too) it does not, and Lemma 1 does
  not describe that baseline.

``simulate`` returns one row per (strategy, parameter, triplet) with the mean and standard deviation (ddof = 1)
over pairs; ``simulate_pairs`` returns the per-pair values. Everything is float64 and exact given the pairs.
:func:`pair_terms` is the per-pair computation; :mod:`verispec.studies.figure4_real` applies it to (p, q) pairs
logged from a real pair (docs/results/figure4_real).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from verispec.analysis.exact import acceptance_probability
from verispec.analysis.truncation import allowed_set, lemma1
from verispec.core.rules import Rule, get

__all__ = [
    "COLUMNS",
    "DEFAULT_TRIPLETS",
    "ETA_PARAMS",
    "MINP_PARAMS",
    "category_counts",
    "draw_pairs",
    "pair_terms",
    "plot",
    "save",
    "simulate",
    "simulate_pairs",
]

DEFAULT_TRIPLETS: tuple[tuple[float, float, float], ...] = (
    (0.8, 0.1, 0.1),
    (0.6, 0.2, 0.2),
    (0.4, 0.3, 0.3),
    (0.2, 0.4, 0.4),
)
MINP_PARAMS: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
ETA_PARAMS: tuple[float, ...] = (0.05, 0.10, 0.15, 0.20, 0.25)

#: columns of the summary frame returned by :func:`simulate` (and written by :func:`save`)
COLUMNS: list[str] = [
    "strategy",
    "param",
    "triplet",
    "match",
    "partial",
    "unrelated",
    "q_tail",
    "draft_truncation",
    "n_pairs",
    "gain_mean",
    "gain_std",
    "loss_mean",
    "loss_std",
    "net_mean",
    "net_std",
    "direct_mean",
    "baseline_delta_mean",
    "max_abs_gap",
    "kept_mass_mean",
    "allowed_size_mean",
]

_STRATEGIES = {"minp": "min-p", "eta": "eta"}


def triplet_label(triplet: Sequence[float]) -> str:
    return "/".join(f"{x:g}" for x in triplet)


def category_counts(triplet: Sequence[float], k: int) -> tuple[int, int, int]:
    """Numbers of matching, partial and unrelated candidates: largest-remainder rounding of k * ratio."""
    if len(triplet) != 3 or any(not np.isfinite(x) or x < 0 for x in triplet) or not sum(triplet) > 0:
        raise ValueError(f"triplet must be three non-negative ratios with a positive sum, got {tuple(triplet)}")
    ratios = np.asarray(triplet, dtype=np.float64) / sum(triplet)
    raw = ratios * k
    counts = np.floor(raw).astype(int)
    for i in np.argsort(-(raw - counts), kind="stable")[: k - int(counts.sum())]:
        counts[i] += 1
    return int(counts[0]), int(counts[1]), int(counts[2])


def _dirichlet(rng: np.random.Generator, n: int, size: int, alpha: float = 1.0) -> np.ndarray:
    g = rng.gamma(alpha, size=(n, size))
    return g / g.sum(-1, keepdims=True)


def draw_pairs(
    triplet: Sequence[float],
    n_pairs: int,
    vocab: int = 50,
    k: int = 10,
    rng: np.random.Generator | int | None = 0,
    *,
    q_tail: float = 0.0,
    alpha: float = 1.0,
    return_labels: bool = False,
) -> tuple[torch.Tensor, ...]:
    """Draw ``n_pairs`` (p, q) pairs [n_pairs, vocab] (float64) as described in the module docstring.

    With ``return_labels`` also returns the token labels [n_pairs, vocab] (long): 0 matching, 1 partial and
    2 unrelated for p's candidates, -1 for p's tail.
    """
    if not 1 <= k < vocab:
        raise ValueError(f"need 1 <= k < vocab, got k={k}, vocab={vocab}")
    if not (np.isfinite(q_tail) and q_tail >= 0):
        raise ValueError(f"q_tail must be a finite number >= 0, got {q_tail}")
    if not (np.isfinite(alpha) and alpha > 0):
        raise ValueError(f"alpha must be a finite number > 0, got {alpha}")
    if n_pairs < 1:
        raise ValueError(f"n_pairs must be >= 1, got {n_pairs}")
    rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    n_match, n_partial, _ = category_counts(triplet, k)
    rows = np.arange(n_pairs)[:, None]

    # which tokens are candidates: a random permutation per pair
    perm = np.argsort(rng.random((n_pairs, vocab)), axis=-1)
    cand, tail = perm[:, :k], perm[:, k:]
    m = rng.uniform(0.85, 0.95, size=(n_pairs, 1))
    p = np.zeros((n_pairs, vocab))
    p[rows, cand] = m * _dirichlet(rng, n_pairs, k, alpha)
    p[rows, tail] = (1 - m) * _dirichlet(rng, n_pairs, vocab - k)

    # labels of the candidates: 0 matching, 1 partial, 2 unrelated, shuffled per pair
    labels = np.repeat(np.arange(3), category_counts(triplet, k))[None, :].repeat(n_pairs, 0)
    labels = np.take_along_axis(labels, np.argsort(rng.random((n_pairs, k)), axis=-1), axis=-1)

    pc = p[rows, cand]
    factor = np.where(
        labels == 0,
        rng.uniform(0.9, 1.1, size=(n_pairs, k)),
        np.where(labels == 1, np.exp(rng.uniform(np.log(0.3), np.log(3.0), size=(n_pairs, k))),
                 rng.uniform(0.0, 0.1, size=(n_pairs, k))),
    )
    q = np.zeros_like(p)
    q[rows, cand] = pc * factor
    q[rows, tail] = q_tail * p[rows, tail] * np.exp(rng.uniform(np.log(0.5), np.log(2.0), size=(n_pairs, vocab - k)))
    # unrelated candidates: the removed mass lands on a random non-candidate token
    dest = tail[rows, rng.integers(0, vocab - k, size=(n_pairs, k))]
    moved = np.where(labels == 2, pc * (1 - factor), 0.0)
    np.add.at(q, (np.broadcast_to(rows, dest.shape), dest), moved)
    q /= q.sum(-1, keepdims=True)
    assert n_match + n_partial <= k
    if not return_labels:
        return torch.from_numpy(p), torch.from_numpy(q)
    token_labels = np.full((n_pairs, vocab), -1)
    token_labels[rows, cand] = labels
    return torch.from_numpy(p), torch.from_numpy(q), torch.from_numpy(token_labels)


def baseline_rule(strategy: str, param: float, draft_truncation: str = "none") -> Rule:
    """The matched baseline rule of a truncation strategy ("minp": min-p sampling, "eta": eta-sampling)."""
    if strategy == "minp":
        return get("minp-sampling", p_base=param, draft_truncation=draft_truncation)
    if strategy == "eta":
        return get("eta-sampling", epsilon=param, draft_truncation=draft_truncation)
    raise ValueError(f"unknown truncation strategy {strategy!r} (use 'minp' or 'eta')")


def simulate_pairs(
    triplets: Sequence[Sequence[float]] = DEFAULT_TRIPLETS,
    *,
    n_pairs: int = 500,
    vocab: int = 50,
    k: int = 10,
    minp_params: Sequence[float] = MINP_PARAMS,
    eta_params: Sequence[float] = ETA_PARAMS,
    seed: int = 0,
    q_tail: float = 0.0,
    alpha: float = 1.0,
    draft_truncation: str = "none",
) -> pd.DataFrame:
    """One row per (strategy, parameter, triplet, pair): :func:`pair_terms` (gain, loss, net = gain - loss,
    direct, the baseline's own change in acceptance ``baseline_delta`` with ``draft_truncation``, lossless
    acceptance, kept mass z and |A|). The same pairs (per triplet) are used for every parameter; the seed fixes
    everything."""
    seqs = np.random.SeedSequence(seed).spawn(len(triplets))
    frames = []
    for triplet, ss in zip(triplets, seqs, strict=True):
        p, q = draw_pairs(triplet, n_pairs, vocab, k, np.random.default_rng(ss), q_tail=q_tail, alpha=alpha)
        counts = category_counts(triplet, k)
        for strategy, params in (("minp", minp_params), ("eta", eta_params)):
            for param in params:
                frames.append(
                    pd.DataFrame(
                        {
                            "strategy": strategy,
                            "param": float(param),
                            "triplet": triplet_label(triplet),
                            "match": counts[0] / k,
                            "partial": counts[1] / k,
                            "unrelated": counts[2] / k,
                            "q_tail": float(q_tail),
                            "draft_truncation": draft_truncation,
                            "pair": np.arange(n_pairs),
                            **pair_terms(p, q, strategy, float(param), draft_truncation),
                        }
                    )
                )
    return pd.concat(frames, ignore_index=True)


def pair_terms(
    p: torch.Tensor, q: torch.Tensor, strategy: str, param: float, draft_truncation: str = "none"
) -> dict[str, np.ndarray]:
    """Per pair (rows of ``p``, ``q`` [n, V]): Lemma 1's ``gain``, ``loss``, ``net`` = gain - loss and ``direct``
    for the allowed set of ``strategy`` at ``param`` on p; ``baseline_delta``, the change in acceptance of the
    matched baseline as run (:func:`baseline_rule` with ``draft_truncation``, its own draft transform) over
    lossless SD; ``lossless_acc`` = sum min(p, q); kept mass z and |A|.

    The one place the Figure-4 quantities are computed, for simulated and for logged real pairs alike."""
    allowed = allowed_set(p, strategy, param)
    lem = lemma1(p, q, allowed)
    base = baseline_rule(strategy, param, draft_truncation)
    lossless = acceptance_probability("lossless", p, q)
    measured = acceptance_probability(base, p, base.draft(q)) - lossless
    return {
        "gain": lem.gain.numpy(),
        "loss": lem.loss.numpy(),
        "net": lem.net.numpy(),
        "direct": lem.direct.numpy(),
        "baseline_delta": measured.numpy(),
        "lossless_acc": lossless.numpy(),
        "kept_mass": torch.where(allowed, p, torch.zeros_like(p)).sum(-1).numpy(),
        "allowed_size": allowed.sum(-1).numpy(),
    }


def summarize(pairs: pd.DataFrame) -> pd.DataFrame:
    """Mean / std (ddof = 1) over pairs of the per-pair frame, one row per (strategy, parameter, triplet)."""
    keys = ["strategy", "param", "triplet", "match", "partial", "unrelated", "q_tail", "draft_truncation"]
    gap = (pairs["direct"] - pairs["net"]).abs().rename("gap")
    g = pairs.assign(gap=gap).groupby(keys, sort=False, dropna=False)  # NaN generator columns: real pairs
    out = g.agg(
        n_pairs=("pair", "size"),
        gain_mean=("gain", "mean"),
        gain_std=("gain", "std"),
        loss_mean=("loss", "mean"),
        loss_std=("loss", "std"),
        net_mean=("net", "mean"),
        net_std=("net", "std"),
        direct_mean=("direct", "mean"),
        baseline_delta_mean=("baseline_delta", "mean"),
        max_abs_gap=("gap", "max"),
        kept_mass_mean=("kept_mass", "mean"),
        allowed_size_mean=("allowed_size", "mean"),
    ).reset_index()
    return out[COLUMNS]


def simulate(
    triplets: Sequence[Sequence[float]] = DEFAULT_TRIPLETS,
    *,
    n_pairs: int = 500,
    vocab: int = 50,
    k: int = 10,
    minp_params: Sequence[float] = MINP_PARAMS,
    eta_params: Sequence[float] = ETA_PARAMS,
    seed: int = 0,
    q_tail: float = 0.0,
    alpha: float = 1.0,
    draft_truncation: str = "none",
) -> pd.DataFrame:
    """The Figure-4 table: per strategy, parameter and triplet, Lemma 1's gain, loss and net Delta BE (mean and
    std over ``n_pairs`` pairs), with ``max_abs_gap`` = max |direct - (gain - loss)| as a built-in check."""
    return summarize(
        simulate_pairs(
            triplets,
            n_pairs=n_pairs,
            vocab=vocab,
            k=k,
            minp_params=minp_params,
            eta_params=eta_params,
            seed=seed,
            q_tail=q_tail,
            alpha=alpha,
            draft_truncation=draft_truncation,
        )
    )


def plot(df: pd.DataFrame, path: str | Path) -> Path:
    """Figure 4: net Delta BE vs parameter, one line per triplet (+-1 std shaded), gain dashed, loss dotted;
    one panel per strategy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    path = Path(path)
    strategies = [s for s in _STRATEGIES if s in set(df["strategy"])]
    fig, axes = plt.subplots(1, len(strategies), figsize=(6.2 * len(strategies), 5.2), squeeze=False)
    colors = plt.get_cmap("viridis")
    triplets = list(dict.fromkeys(df["triplet"]))
    for ax, strategy in zip(axes[0], strategies, strict=True):
        sub = df[df["strategy"] == strategy]
        for i, trip in enumerate(triplets):
            t = sub[sub["triplet"] == trip].sort_values("param")
            c = colors(i / max(len(triplets) - 1, 1) * 0.85)
            x = t["param"].to_numpy()
            ax.plot(x, t["net_mean"], "-o", color=c, lw=2, ms=4, label=trip)
            ax.fill_between(x, t["net_mean"] - t["net_std"], t["net_mean"] + t["net_std"], color=c, alpha=0.12)
            ax.plot(x, t["gain_mean"], "--", color=c, lw=1)
            ax.plot(x, t["loss_mean"], ":", color=c, lw=1.3)
        ax.axhline(0.0, color="black", lw=0.8)
        ax.set_xlabel("$p_{base}$" if strategy == "minp" else r"$\epsilon$ ($\delta = \epsilon$)")
        ax.set_ylabel(r"$\Delta$BE (change in acceptance probability)")
        ax.set_title(f"{_STRATEGIES[strategy]} sampling")
        ax.grid(alpha=0.3)
    handles, _ = axes[0][0].get_legend_handles_labels()
    handles += [
        Line2D([], [], color="gray", lw=2, label=r"net $\Delta$BE (mean $\pm$ 1 sd)"),
        Line2D([], [], color="gray", lw=1, ls="--", label="gain"),
        Line2D([], [], color="gray", lw=1.3, ls=":", label=r"loss $\mathcal{L}_{trunc}$"),
    ]
    fig.legend(handles=handles, title="triplet: match/partial/unrelated", loc="lower center", ncol=len(handles),
               fontsize=9, title_fontsize=9, frameon=False)
    n = int(df["n_pairs"].iloc[0]) if len(df) else 0
    q_tail = float(df["q_tail"].iloc[0]) if len(df) else 0.0
    fig.suptitle(
        rf"Lemma 1: $\Delta$BE = gain $-$ loss of truncating p ({n} pairs per point, draft tail share {q_tail:g})"
    )
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def save(df: pd.DataFrame, out_dir: str | Path, stem: str = "figure4_lemma1") -> tuple[Path, Path]:
    """Write ``df`` as ``<stem>.csv`` and its figure as ``<stem>.png`` in ``out_dir``; returns both paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / f"{stem}.csv"
    df.to_csv(csv_path, index=False, float_format="%.10g")
    png_path = plot(df, out_dir / f"{stem}.png")
    return csv_path, png_path
