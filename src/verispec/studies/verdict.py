"""The verdict words of docs/results/FINDINGS.md, as one decision table.

A comparison is an estimate (metric(a) - metric(b)) with a confidence interval [lo, hi], the paper's value for the
same difference (or None) and the kind of claim the paper makes about it:

- ``"effect"``: the paper reports an effect of sign s = sign(paper). On the unrounded interval:

  ============================================================  ===========================
  interval                                                      verdict
  ============================================================  ===========================
  excludes 0 on the paper's side, contains the paper's value    "reproduced"
  excludes 0 on the paper's side, excludes the paper's value    "reproduced in direction"
  contains 0 and the paper's value                              "undecided"
  contains 0, not the paper's value                             "not reproduced"
  excludes 0 on the other side                                  "not reproduced"
  ============================================================  ===========================

  "On the paper's side" is hi < 0 for s < 0 and lo > 0 for s > 0; "contains" includes the ends.
- ``"equivalence"`` (no effect beyond a margin m > 0): "reproduced" when -m <= lo and hi <= m; "not reproduced"
  when the interval lies wholly outside [-m, m] (hi < -m or lo > m); "undecided" otherwise.
- ``"non-inferiority"`` (a loses no more than m against b): "reproduced" when lo >= -m; "not reproduced" when
  hi < -m; "undecided" otherwise.
- ``"not testable here"``: the claim is below what the offline benchmarks can resolve (decided before looking at
  the data, from the pairs docs/results/POWER.md says it needs); always "not testable here".

Any kind gives "not testable here" when there is no estimate or interval (NaN or None): the units are not all
there, or the data cannot speak.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["EFFECT", "EQUIVALENCE", "KINDS", "NON_INFERIORITY", "NOT_REPRODUCED", "NOT_TESTABLE", "REPRODUCED",
           "REPRODUCED_IN_DIRECTION", "UNDECIDED", "VERDICTS", "summarize", "verdict"]

REPRODUCED = "reproduced"
REPRODUCED_IN_DIRECTION = "reproduced in direction"
UNDECIDED = "undecided"
NOT_REPRODUCED = "not reproduced"
NOT_TESTABLE = "not testable here"
#: every verdict word, strongest first
VERDICTS = (REPRODUCED, REPRODUCED_IN_DIRECTION, UNDECIDED, NOT_REPRODUCED, NOT_TESTABLE)

EFFECT = "effect"
EQUIVALENCE = "equivalence"
NON_INFERIORITY = "non-inferiority"
#: the kinds of claim :func:`verdict` decides
KINDS = (EFFECT, EQUIVALENCE, NON_INFERIORITY, NOT_TESTABLE)


def _missing(x: float | None) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def verdict(estimate: float | None, lo: float | None, hi: float | None, paper: float | None = None,
            kind: str = EFFECT, margin: float | None = None) -> str:
    """The verdict word for a difference ``estimate`` with interval [``lo``, ``hi``] against the paper's value
    ``paper``, for a claim of ``kind`` (with ``margin`` for equivalence and non-inferiority), by the decision
    table of this module's docstring. ValueError for an unknown kind, an effect claim without a nonzero paper
    value, a margin-based claim without a positive margin, or lo > hi."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if kind == EFFECT and (paper is None or paper == 0 or math.isnan(paper)):
        raise ValueError("an effect claim needs the paper's nonzero value (its sign is the claim)")
    if kind in (EQUIVALENCE, NON_INFERIORITY) and (margin is None or not margin > 0):
        raise ValueError(f"a {kind} claim needs a positive margin, got {margin!r}")
    if kind == NOT_TESTABLE or _missing(estimate) or _missing(lo) or _missing(hi):
        return NOT_TESTABLE
    assert lo is not None and hi is not None  # for the type checker: _missing ruled None out
    if lo > hi:
        raise ValueError(f"interval [{lo}, {hi}] has lo > hi")
    if kind == EQUIVALENCE:
        if -margin <= lo and hi <= margin:
            return REPRODUCED
        return NOT_REPRODUCED if hi < -margin or lo > margin else UNDECIDED
    if kind == NON_INFERIORITY:
        if lo >= -margin:
            return REPRODUCED
        return NOT_REPRODUCED if hi < -margin else UNDECIDED
    assert paper is not None
    same_side = hi < 0 if paper < 0 else lo > 0
    has_paper = lo <= paper <= hi
    if same_side:
        return REPRODUCED if has_paper else REPRODUCED_IN_DIRECTION
    if lo <= 0 <= hi:
        return UNDECIDED if has_paper else NOT_REPRODUCED
    return NOT_REPRODUCED


def summarize(verdicts: Sequence[str], names: Sequence[str] | None = None) -> str:
    """One line for a family of verdicts: the word when every member has it; otherwise each word that occurs
    (strongest first) with how many members have it and, given ``names``, which: "reproduced in direction: 2 of
    4 (lam 0.2, lam 0.6); undecided: 2 of 4 (lam 0.4, lam 0.8)"."""
    if not verdicts:
        raise ValueError("an empty family has no verdict")
    if names is not None and len(names) != len(verdicts):
        raise ValueError("names must match verdicts one to one")
    unknown = sorted(set(verdicts) - set(VERDICTS))
    if unknown:
        raise ValueError(f"not verdict words: {', '.join(unknown)}")
    if len(set(verdicts)) == 1:
        return verdicts[0]
    parts = []
    for word in VERDICTS:
        idx = [i for i, v in enumerate(verdicts) if v == word]
        if idx:
            who = f" ({', '.join(names[i] for i in idx)})" if names is not None else ""
            parts.append(f"{word}: {len(idx)} of {len(verdicts)}{who}")
    return "; ".join(parts)
