"""Per-token verification details, an opt-in report (``Request.token_details``): for every emitted token, how it was
emitted and what the rule did at its position.

A round emits its accepted drafted tokens, then one more token (:mod:`verispec.core.verify.chain`):

* ``accepted``: a drafted token the rule kept;
* ``correction``: the token drawn from the rule's correction r at the first rejected position;
* ``bonus``: the token drawn from ``rule.bonus(p)`` after every draft was accepted (also the one token of a round
  that drafted nothing).

Each token's :class:`TokenDetail` carries the target's p, the draft's q and the rule's induced law at its position
over the most probable tokens, the acceptance probability h of the drafted token there, the probability that a
draft from q is accepted (sum q h) and the total variation of the law from p: all computed by the exact analysis
(:mod:`verispec.analysis.exact`), the same functions ``verispec analyze`` reports. The engine computes them only
for rows that ask, so a request without them pays nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from verispec.analysis.exact import acceptance_probability, induced_distribution, tv
from verispec.core.rules import Rule
from verispec.defaults import MAX_TOP_LOGPROBS

__all__ = ["MARKS", "TokenDetail", "check_token_details", "round_details"]

#: how an emitted token came to be, in the order a round emits them
MARKS = ("accepted", "correction", "bonus")


@dataclass
class TokenDetail:
    """One emitted token's verification: its ``mark`` (:data:`MARKS`), the ``round`` (the row's target forward,
    from 0) and that round's draft length ``gamma``; ``drafted``: the draft's token at this position (the token
    itself when accepted, the rejected one at a correction, None at a bonus); ``accept_prob``: h(drafted; p, q);
    ``acceptance``: sum_x q(x) h(x); ``tv``: TV(law, p). ``top`` lists token ids (the union of the most probable
    tokens of p, q and the law, by the law's probability) and ``p``, ``q`` (None at a bonus position) and ``law``
    their probabilities in that order."""

    token: int
    mark: str
    round: int
    gamma: int
    drafted: int | None
    accept_prob: float | None
    acceptance: float | None
    tv: float
    top: list[int]
    p: list[float]
    q: list[float] | None
    law: list[float]

    def to_dict(self) -> dict:
        return {"token": self.token, "mark": self.mark, "round": self.round, "gamma": self.gamma,
                "drafted": self.drafted, "accept_prob": self.accept_prob, "acceptance": self.acceptance,
                "tv": self.tv, "top": self.top, "p": self.p, "q": self.q, "law": self.law}


def check_token_details(k: object) -> None:
    """ValueError unless ``k`` (most probable tokens per distribution) is None or an integer in [0,
    :data:`~verispec.defaults.MAX_TOP_LOGPROBS`]."""
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_TOP_LOGPROBS):
        raise ValueError(f"token_details must be an integer in [0, {MAX_TOP_LOGPROBS}] (most probable tokens per "
                         f"distribution), got {k!r}")


def _top(k: int, *dists: torch.Tensor | None) -> list[int]:
    ids: list[int] = []
    for d in dists:
        if d is not None and k:
            ids.extend(int(t) for t in d.topk(min(k, d.shape[-1])).indices if int(t) not in ids)
    return ids


def round_details(rules: Sequence[Rule], p: torch.Tensor, q: torch.Tensor | None, drafted: Sequence[int],
                  emitted: Sequence[int], accepted: int, top: int, round_index: int) -> list[TokenDetail]:
    """The details of one round's emitted tokens. ``rules[i]``: the rule that verified position i (one per
    drafted position, plus the bonus position's); ``p`` [len(emitted), V]: the target at each emitted position;
    ``q`` [gamma, V]: the draft's distributions (one-hot for a token-only draft); ``accepted``: drafts kept."""
    gamma, out = len(drafted), []
    for i, tok in enumerate(emitted):
        pi = p[i].to(torch.float64)
        rule = rules[min(i, len(rules) - 1)]
        if i < gamma:
            qi = q[i].to(torch.float64)  # type: ignore[index]
            law = induced_distribution(rule, pi, qi)
            h = float(rule.acceptance(pi, qi)[drafted[i]])
            acc: float | None = float(acceptance_probability(rule, pi, qi))
            mark = "accepted" if i < accepted else "correction"
            drafted_i: int | None = int(drafted[i])
        else:
            qi, law, h, acc, mark, drafted_i = None, rule.bonus(pi), None, None, "bonus", None
        ids = _top(top, law, pi, qi)
        ids += [t for t in dict.fromkeys((int(tok), drafted_i)) if top and t is not None and t not in ids]
        idx = torch.tensor(ids, dtype=torch.long)
        out.append(TokenDetail(
            int(tok), mark, round_index, gamma, drafted_i, h, acc, float(tv(law, pi)), ids,
            pi[idx].tolist(), None if qi is None else qi[idx].tolist(), law[idx].tolist()))
    return out
