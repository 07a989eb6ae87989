"""Reading a result line's metrics defensively, across the engine's result-schema changes.

* ``accepted_fraction`` = accepted drafts / drafted tokens (called ``acceptance_rate`` in older result files).
  It is NOT the tutorial's acceptance A = sum_x min(p, q), which the offline estimator reports per position as
  ``expected_acceptance`` (:mod:`verispec.eval.estimator`).
* BE counts accepted drafted tokens that were EMITTED: drafts accepted after the cut (EOS, stop string,
  max_new_tokens) are not. New result lines carry ``emitted_accepted``; for older ones it is recomputed from
  ``per_round`` [(drafted, accepted), ...] and the emitted ``token_ids`` (each round emits its accepted drafts then
  one correction or bonus token, so a round starting at output position s emits min(accepted, L - s) accepted
  drafts when the output has L tokens); without ``per_round`` the stored ``accepted`` is used as is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["emitted_accepted", "record_accepted_fraction", "record_emitted_accepted"]


def emitted_accepted(per_round: Sequence[Sequence[int]], n_tokens: int) -> int:
    """Accepted drafted tokens that made it into an output of ``n_tokens`` tokens."""
    total = start = 0
    for _, accepted in per_round:
        total += max(min(int(accepted), n_tokens - start), 0)
        start += int(accepted) + 1
    return total


def record_emitted_accepted(rec: Mapping[str, Any]) -> int:
    """``emitted_accepted`` of a result line (stored, else recomputed from per_round, else ``accepted``)."""
    if rec.get("emitted_accepted") is not None:
        return int(rec["emitted_accepted"])
    if rec.get("per_round") is not None and rec.get("token_ids") is not None:
        return emitted_accepted(rec["per_round"], len(rec["token_ids"]))
    return int(rec["accepted"])


def record_accepted_fraction(rec: Mapping[str, Any]) -> float:
    """accepted / drafted of a result line: ``accepted_fraction``, else the older ``acceptance_rate``."""
    for key in ("accepted_fraction", "acceptance_rate"):
        if rec.get(key) is not None:
            return float(rec[key])
    drafted = rec.get("drafted") or 0
    return rec["accepted"] / drafted if drafted else math.nan
