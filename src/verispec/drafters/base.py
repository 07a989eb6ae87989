"""What every drafter returns (a :class:`Proposal`) and the per-row bookkeeping all drafters share.

A proposal is a token tree given by parent indices (-1 = the root, the last committed token; a parent
precedes its children); a chain of gamma drafts is the degenerate tree with parents [-1, 0, ..., gamma - 2].
``q[i]`` is the draft distribution node i was drawn from (siblings drawn one after another without
replacement share their parent's q), or ``q is None`` for a token-only proposal (n-gram lookup, greedy
drafting, top-k trees): the verifier then treats each candidate as one-hot (tutorial 3.3 / Appendix H.1).

Drafters work on a batch of rows at once and own their adaptation: :meth:`BaseDrafter.update` receives every
verified round, and ``gamma="auto"`` keeps an :class:`~verispec.core.schedule.AdaptiveGamma` per row, so adaptive
length works for every drafter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from verispec.backends.base import chain_parents, is_chain
from verispec.core.rules import Rule
from verispec.core.sampling import History, SamplingConfig
from verispec.core.schedule import AdaptiveGamma
from verispec.core.verify.tree import tree_depths
from verispec.defaults import DEFAULT_GAMMA

__all__ = ["BaseDrafter", "DraftRequest", "Drafter", "Proposal", "check_gamma"]


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


class Drafter(Protocol):
    """Everything the engine calls on a drafter."""

    name: str
    default_gamma: int

    def add_row(self, key: int, gamma: int | str | None = None) -> None: ...

    def remove_row(self, key: int) -> None: ...

    def propose(self, requests: Sequence[DraftRequest]) -> list[Proposal]: ...

    def commit(self, key: int, proposal: Proposal, path: Sequence[int]) -> None: ...

    def update(self, key: int, proposal: Proposal, accepted: int, target_s: float) -> None: ...


class BaseDrafter:
    """Per-row draft lengths (fixed or adaptive) and the default hooks; subclasses implement :meth:`draft`."""

    name = "base"
    #: capability: proposals are token trees (the target needs tree attention; only tree-safe rules verify)
    proposes_trees = False
    default_gamma = DEFAULT_GAMMA
    #: the target's block-cost curve (k -> cost of a k-token block in single steps, e.g. a llama.cpp target's
    #: ``block_cost``) for ``gamma="auto"``; None: a constant target cost per round. Set by ``load_engine``.
    target_cost: Callable[[int], float] | None = None

    def __init__(self, gamma_max: int = 8) -> None:
        self.gamma_max = gamma_max
        self._gamma: dict[int, int | AdaptiveGamma] = {}

    # -- rows ------------------------------------------------------------------------------------------------
    def add_row(self, key: int, gamma: int | str | None = None) -> None:
        check_gamma(gamma)
        gamma = self.default_gamma if gamma is None else gamma
        auto = gamma == "auto"
        self._gamma[key] = AdaptiveGamma(self.gamma_max, target_cost=self.target_cost) if auto else int(gamma)

    def remove_row(self, key: int) -> None:
        self._gamma.pop(key, None)

    def schedule_summary(self, key: int) -> dict | None:
        """What a row's adaptive schedule believes (``gamma="auto"``; see :meth:`AdaptiveGamma.summary`), or
        None for a constant gamma."""
        g = self._gamma.get(key)
        return g.summary() if isinstance(g, AdaptiveGamma) else None

    def length(self, req: DraftRequest) -> int:
        """This round's depth for the row: its gamma (or the adaptive choice), capped by ``max_len``."""
        g = self._gamma.get(req.key, self.default_gamma)
        wanted = g.choose() if isinstance(g, AdaptiveGamma) else g
        return max(min(wanted, req.max_len), 0)

    # -- rounds ----------------------------------------------------------------------------------------------
    def propose(self, requests: Sequence[DraftRequest]) -> list[Proposal]:
        return self.draft(requests, [self.length(r) for r in requests])

    def draft(self, requests: Sequence[DraftRequest], lengths: Sequence[int]) -> list[Proposal]:
        raise NotImplementedError

    def commit(self, key: int, proposal: Proposal, path: Sequence[int]) -> None:
        """Keep what the drafter computed for the accepted path (default: nothing to keep)."""

    def update(self, key: int, proposal: Proposal, accepted: int, target_s: float) -> None:
        """Adapt from a verified round (default: the row's adaptive gamma, if any)."""
        g = self._gamma.get(key)
        if isinstance(g, AdaptiveGamma):
            g.update(proposal.depth, accepted, proposal.seconds, target_s)
