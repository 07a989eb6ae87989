"""What every drafter returns (a :class:`Proposal`) and the per-row bookkeeping all drafters share.

A proposal is a token tree given by parent indices (-1 = the root, the last committed token; a parent
precedes its children); a chain of gamma drafts is the degenerate tree with parents [-1, 0, ..., gamma - 2].
``q[i]`` is the draft distribution node i was drawn from (siblings drawn one after another without
replacement share their parent's q), or ``q is None`` for a token-only proposal (n-gram lookup, greedy
drafting, top-k trees): the verifier then treats each candidate as one-hot (tutorial 3.3 / Appendix H.1).

Drafters work on a batch of rows at once and own their adaptation: :meth:`BaseDrafter.update` receives every
verified round, and ``gamma="auto"`` works for every drafter: each auto row keeps its own acceptance (an
:class:`~verispec.core.schedule.AdaptiveGamma` per row), and one schedule per batch size (rows in the round) learns
what a round costs and makes one decision for all the auto rows of a round, maximising the batch's expected tokens
per second. Costs are shared across requests, so a new request starts with the costs its predecessors measured;
a round in which some row ran its prompt's prefill is left out of the costs. So is acceptance, in a way: a new row
starts from the acceptance and hit rate pooled from the rows that finished before it (:class:`RowPrior`), not from a
fixed prior, since a row whose schedule sits at 0 may never draft to measure its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from verispec.backends.base import chain_parents, is_chain
from verispec.core.constraint import Constraint
from verispec.core.rules import Rule
from verispec.core.sampling import History, SamplingConfig
from verispec.core.schedule import PRIOR_ALPHA, AdaptiveGamma
from verispec.core.verify.tree import tree_depths
from verispec.defaults import DEFAULT_GAMMA, DRAFTERS

__all__ = ["BaseDrafter", "DraftRequest", "Drafter", "Proposal", "RowPrior", "check_gamma"]


def check_gamma(gamma: int | str | None) -> None:
    if gamma is None or gamma == "auto":
        return
    if not isinstance(gamma, int) or isinstance(gamma, bool) or gamma < 0:
        raise ValueError(f"gamma must be an integer >= 0 or 'auto', got {gamma!r}")


@dataclass
class Proposal:
    """Drafted nodes of one row for one round (see the module docstring)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] | None = None
    q: torch.Tensor | None = None
    seconds: float = 0.0
    forward_calls: int = 0
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.parents is None:
            self.parents = chain_parents(len(self.tokens))
        if len(self.parents) != len(self.tokens):
            raise ValueError(f"{len(self.tokens)} tokens but {len(self.parents)} parents")
        if self.q is not None and self.q.shape[0] != len(self.tokens):
            raise ValueError(f"q has {self.q.shape[0]} rows for {len(self.tokens)} nodes")

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        return is_chain(self.parents)

    @property
    def depth(self) -> int:
        """Longest root-to-leaf path: the most drafted tokens one round can accept."""
        return max(tree_depths(self.parents), default=0)

    def child_q(self) -> dict[int, torch.Tensor]:
        """For sampled proposals: node (-1 = root) -> the q its children were drawn from."""
        if self.q is None:
            return {}
        out: dict[int, torch.Tensor] = {}
        for i, par in enumerate(self.parents):
            out.setdefault(par, self.q[i])
        return out


@dataclass
class DraftRequest:
    """One row's drafting job for a round: continue ``ids`` with at most ``max_len`` levels.

    ``cfg`` and ``history`` are the row's sampling settings and penalty history (applied to q exactly as to
    p); ``rule.draft`` transforms q; ``generator`` is the row's own random stream. ``untempered_q``: at
    temperature 0 draft the argmax but return q at temperature 1 (for the deterministic greedy reading of a
    lossy rule).
    """

    key: int
    ids: list[int]
    max_len: int
    cfg: SamplingConfig
    rule: Rule
    generator: torch.Generator | None = None
    history: History | None = None
    untempered_q: bool = False
    #: structured output: the row's token constraint, applied to q at every drafted prefix as the verifier
    #: applies it to p (:mod:`verispec.core.constraint`)
    constraint: Constraint | None = None


class Drafter(Protocol):
    """Everything the engine calls on a drafter."""

    name: str
    default_gamma: int

    def add_row(self, key: int, gamma: int | str | None = None) -> None: ...

    def remove_row(self, key: int) -> None: ...

    def propose(self, requests: Sequence[DraftRequest]) -> list[Proposal]: ...

    def commit(self, key: int, proposal: Proposal, path: Sequence[int]) -> None: ...

    def update(self, key: int, proposal: Proposal, accepted: int, target_s: float) -> None: ...


@dataclass
class RowPrior:
    """Where a new auto row's acceptance and hit rate start: a running average over the rows that finished,
    each counted only for what it measured (a row that never drafted leaves alpha alone)."""

    alpha: float = PRIOR_ALPHA
    hit: float = 1.0
    #: weight of a finished row in the average
    weight: float = 0.25

    def new(self, gamma_max: int) -> AdaptiveGamma:
        """A row's estimate, starting here."""
        est = AdaptiveGamma(gamma_max, alpha=self.alpha)
        est.hit = self.hit
        return est

    def retire(self, est: AdaptiveGamma) -> None:
        """Fold in a finished row's estimate (which started from this prior, so only its measurements move it)."""
        if est.drafted_rounds:
            self.alpha += self.weight * (est.alpha - self.alpha)
        if est.asked_rounds:
            self.hit += self.weight * (est.hit - self.hit)


@dataclass
class _Round:
    """The round in flight: who decided it, which rows have yet to report, and its padded size."""

    schedule: AdaptiveGamma
    pending: set[int]
    prefill: bool
    asked: dict[int, int] = field(default_factory=dict)  # row -> the depth it was asked to draft
    ingest: int = 0  # tokens the draft takes in before drafting (counted in a prefill round that drafts)
    depth: int = 0
    scored: int = 0
    draft_s: float = 0.0


class BaseDrafter:
    """Per-row draft lengths (fixed or adaptive) and the default hooks; subclasses implement :meth:`draft`."""

    name = "base"
    #: capability: proposals are token trees (the target needs tree attention; only tree-safe rules verify)
    proposes_trees = DRAFTERS["model"].proposes_trees  # stated once, on the drafter specs: a chain
    default_gamma = DEFAULT_GAMMA
    #: the target's block-cost curve (k -> cost of a k-token block in single steps, e.g. a llama.cpp target's
    #: ``block_cost``) for ``gamma="auto"``; None: a constant target cost per round. Set by ``load_engine``.
    target_cost: Callable[[int], float] | None = None

    def __init__(self, gamma_max: int = 8) -> None:
        self.gamma_max = gamma_max
        self._gamma: dict[int, int | AdaptiveGamma] = {}  # per row: a constant gamma, or its acceptance (auto)
        self._costs: dict[int, AdaptiveGamma] = {}  # per batch size: what a round costs, and the decision
        self._fresh: set[int] = set()  # rows whose first round (the prompt's prefill) has not run yet
        self._round: _Round | None = None
        self._priors: dict[str, RowPrior] = {}  # per kind of estimate: where new rows start

    def new_estimate(self, kind: str = "row") -> AdaptiveGamma:
        """A new row's acceptance estimate of one kind, started from the rows of that kind that finished."""
        return self._priors.setdefault(kind, RowPrior()).new(self.gamma_max)

    def retire_estimate(self, est: AdaptiveGamma | None, kind: str = "row") -> None:
        """A finished row's estimate of one kind goes into the prior of the rows that follow."""
        if isinstance(est, AdaptiveGamma):
            self._priors.setdefault(kind, RowPrior()).retire(est)

    # -- rows ------------------------------------------------------------------------------------------------
    def add_row(self, key: int, gamma: int | str | None = None) -> None:
        check_gamma(gamma)
        gamma = self.default_gamma if gamma is None else gamma
        self._gamma[key] = self.new_estimate() if gamma == "auto" else int(gamma)  # type: ignore[arg-type]
        self._fresh.add(key)

    def remove_row(self, key: int) -> None:
        self.retire_estimate(self._gamma.pop(key, None))  # type: ignore[arg-type]
        self._fresh.discard(key)

    def nodes(self, depth: int) -> int:
        """Tokens drafted in a round of this depth (a chain: ``depth``; a tree drafter: its node count)."""
        return depth

    def schedule(self, rows: int) -> AdaptiveGamma:
        """The shared schedule of rounds with ``rows`` rows (created on first use)."""
        costs = self._cost_models()
        if (s := costs.get(rows)) is None:
            s = costs[rows] = AdaptiveGamma(self.gamma_max, target_cost=self.target_cost,
                                                  block_len=lambda g: self.nodes(g) + 1)
        return s

    def _cost_models(self) -> dict[int, AdaptiveGamma]:
        """The cost models (one per batch size) this round is priced with; a drafter with several kinds of
        draft keeps one set per kind."""
        return self._costs

    def schedule_summary(self, key: int) -> dict | None:
        """What a row's adaptive schedule believes (``gamma="auto"``): its acceptance, and the costs, probes and
        best gamma of the single-row schedule (see :meth:`AdaptiveGamma.summary`); None for a constant gamma."""
        g = self._gamma.get(key)
        if not isinstance(g, AdaptiveGamma):
            return None
        sizes = sorted(self._costs)
        one = self._costs.get(1) or AdaptiveGamma(self.gamma_max, target_cost=self.target_cost)
        out = one.summary()
        out.update(alpha=g.alpha, hit=g.hit, best=one.best([g.alpha], hits=[g.hit]), batch_sizes=sizes)
        return out

    def lengths(self, requests: Sequence[DraftRequest]) -> list[int]:
        """This round's depth for each row: its gamma, or for the auto rows one decision of the schedule of
        this batch size over their acceptances; capped by each row's ``max_len``."""
        rows = [self._gamma.get(r.key, self.default_gamma) for r in requests]
        auto = [r.key for r, g in zip(requests, rows, strict=True) if isinstance(g, AdaptiveGamma)]
        sched = self.schedule(len(requests)) if auto else None
        if sched is not None:
            sched.catch_up = lambda: self.catch_up(requests)  # prices a probe, counted only when one is due
        chosen = self.decide(sched, auto) if sched is not None else 0
        out = [max(min(chosen if isinstance(g, AdaptiveGamma) else g, r.max_len), 0)
               for g, r in zip(rows, requests, strict=True)]
        prefill = any(r.key in self._fresh for r in requests)
        if sched is not None:
            # a prefill round that drafts shows what the draft pays to take in a prompt: it prices later probes
            ingest = self.catch_up(requests) if prefill and chosen > 0 else 0
            self._round = _Round(sched, {r.key for r in requests}, prefill,
                                 {r.key: n for r, n in zip(requests, out, strict=True)}, ingest)
        else:
            self._round = None
        return out

    def asked(self, key: int) -> int | None:
        """The depth the round in flight asked of row ``key`` (None once the row has reported, or with no round)."""
        rnd = self._round
        return rnd.asked.get(key) if rnd is not None and key in rnd.pending else None

    def catch_up(self, requests: Sequence[DraftRequest]) -> int:
        """Tokens this drafter must take in before it can draft for ``requests`` (the most of any row): what a
        draft model that sat out has missed. 0 for drafters that keep no state of their own."""
        return 0

    def decide(self, schedule: AdaptiveGamma, keys: Sequence[int]) -> int:
        """One depth for the auto rows ``keys`` of a round, by the schedule of its batch size."""
        rows = [self._gamma[k] for k in keys]
        return schedule.choose([r.alpha for r in rows], hits=[r.hit for r in rows])  # type: ignore[union-attr]

    # -- rounds ----------------------------------------------------------------------------------------------
    def propose(self, requests: Sequence[DraftRequest]) -> list[Proposal]:
        """This round's proposals; a token-only chain under a constraint keeps its allowed prefix only (a model
        draft samples the constrained q, so every token it drafts is allowed)."""
        props = self.draft(requests, self.lengths(requests))
        for req, prop in zip(requests, props, strict=True):
            if req.constraint is not None and prop.q is None and prop.is_chain and len(prop):
                keep = req.constraint.valid_prefix(prop.tokens)
                if keep < len(prop):
                    prop.tokens, prop.parents = prop.tokens[:keep], prop.parents[:keep]  # type: ignore[index]
        return props

    def draft(self, requests: Sequence[DraftRequest], lengths: Sequence[int]) -> list[Proposal]:
        raise NotImplementedError

    def commit(self, key: int, proposal: Proposal, path: Sequence[int]) -> None:
        """Keep what the drafter computed for the accepted path (default: nothing to keep)."""

    def update(self, key: int, proposal: Proposal, accepted: int, target_s: float) -> None:
        """Adapt from a verified round: the row's acceptance (auto rows); once every row of the round has
        reported, the round's costs go to the schedule that decided it (unless a row ran its prefill)."""
        self._fresh.discard(key)
        g = self._gamma.get(key)
        rnd = self._round
        if isinstance(g, AdaptiveGamma):
            g.observe_acceptance(proposal.depth, accepted, self.asked(key))
        if rnd is None or key not in rnd.pending:
            return
        rnd.pending.discard(key)
        rnd.depth, rnd.scored = max(rnd.depth, proposal.depth), max(rnd.scored, len(proposal))
        rnd.draft_s = max(rnd.draft_s, proposal.seconds)
        if not rnd.pending:
            self._round = None
            if not rnd.prefill:
                rnd.schedule.observe_costs(rnd.depth, rnd.draft_s, target_s, scored=rnd.scored + 1)
            elif rnd.ingest and rnd.depth:
                rnd.schedule.observe_ingest(rnd.draft_s, rnd.ingest + rnd.depth)
