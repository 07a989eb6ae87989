"""Prompt lookup first, a draft model when the history has no match: the cheapest good guess each round.

Under ``gamma="auto"`` the two kinds of draft are priced apart: a look-up costs nothing and a draft model's round
costs its forwards (and, after sitting out, its catch-up on everything committed since), and their acceptances
differ. So each round first checks whether every row's history has a match: if so the round is decided by the
look-up's cost models and acceptances, else by the draft model's. One shared model would price free look-ups like
model drafts and leave them unused where the model does not pay.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from verispec.core.schedule import AdaptiveGamma
from verispec.drafters.base import BaseDrafter, DraftRequest, Proposal
from verispec.drafters.ngram import ngram_lookup

__all__ = ["HybridDrafter"]


class HybridDrafter(BaseDrafter):
    """Proposes the n-gram continuation when the last ``min_ngram``..``max_ngram`` tokens occurred before
    (token-only, q one-hot), otherwise drafts with ``fallback`` (which returns its exact q). Either way the
    verifier gets the distribution each token was drawn from, so every rule keeps its law."""

    name = "hybrid"

    def __init__(self, fallback: BaseDrafter, max_ngram: int = 3, min_ngram: int = 2, gamma_max: int = 8) -> None:
        super().__init__(gamma_max)
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.fallback, self.max_ngram, self.min_ngram = fallback, max_ngram, min_ngram
        self.lookups = 0
        self._lookup_costs: dict[int, AdaptiveGamma] = {}  # per batch size, rounds where every row looked up
        self._lookup_alpha: dict[int, AdaptiveGamma] = {}  # auto row -> acceptance of its look-ups
        self._model_alpha: dict[int, AdaptiveGamma] = {}  # auto row -> acceptance of its model drafts
        self._kind = "model"  # the kind of draft this round is priced as

    def _match(self, req: DraftRequest, gamma: int) -> list[int]:
        return ngram_lookup(req.ids, gamma, self.max_ngram, self.min_ngram)

    def lengths(self, requests: Sequence[DraftRequest]) -> list[int]:
        """As every drafter, priced as a look-up round when every row's history has a match (module docstring)."""
        self._kind = "lookup" if all(self._match(r, 1) for r in requests) else "model"
        return super().lengths(requests)

    def catch_up(self, requests: Sequence[DraftRequest]) -> int:
        """Look-ups take nothing in; a model round, what the fallback drafter has missed."""
        return 0 if self._kind == "lookup" else self.fallback.catch_up(requests)

    def _cost_models(self) -> dict[int, AdaptiveGamma]:
        return self._lookup_costs if self._kind == "lookup" else self._costs

    def decide(self, schedule: AdaptiveGamma, keys: Sequence[int]) -> int:
        alphas = self._lookup_alpha if self._kind == "lookup" else self._model_alpha
        return schedule.choose([alphas[k].alpha for k in keys])

    def update(self, key: int, proposal: Proposal, accepted: int, target_s: float) -> None:
        """As every drafter, plus the acceptance of the kind of draft this row's proposal was."""
        super().update(key, proposal, accepted, target_s)
        alphas = self._lookup_alpha if proposal.meta.get("kind") == "lookup" else self._model_alpha
        if key in alphas:
            alphas[key].observe_acceptance(proposal.depth, accepted)

    def schedule_summary(self, key: int) -> dict | None:
        """The draft model's schedule as every drafter reports it, with the look-ups' under ``lookup``."""
        out = super().schedule_summary(key)
        if out is None or key not in self._lookup_alpha:
            return out
        model, look = self._model_alpha[key].alpha, self._lookup_alpha[key].alpha
        one = self._costs.get(1)
        out.update(alpha=model, best=one.best([model]) if one is not None else out["best"], lookups=self.lookups)
        lone = self._lookup_costs.get(1) or AdaptiveGamma(self.gamma_max, target_cost=self.target_cost)
        out["lookup"] = {**lone.summary(), "alpha": look, "best": lone.best([look])}
        return out

    @property
    def backend(self) -> object:
        return getattr(self.fallback, "backend", None)

    def add_row(self, key: int, gamma: int | str | None = None) -> None:
        super().add_row(key, gamma)
        self.fallback.add_row(key, 0 if gamma == "auto" else gamma)  # lengths come from this drafter
        if isinstance(self._gamma[key], AdaptiveGamma):
            self._lookup_alpha[key] = self.new_estimate("lookup")
            self._model_alpha[key] = self.new_estimate("model")

    def remove_row(self, key: int) -> None:
        super().remove_row(key)
        self.fallback.remove_row(key)
        self.retire_estimate(self._lookup_alpha.pop(key, None), "lookup")
        self.retire_estimate(self._model_alpha.pop(key, None), "model")

    def draft(self, requests: Sequence[DraftRequest], lengths: Sequence[int]) -> list[Proposal]:
        out: list[Proposal | None] = []
        rest: list[int] = []
        for i, (req, g) in enumerate(zip(requests, lengths, strict=True)):
            start = time.perf_counter()
            tokens = self._match(req, g)
            if tokens or g == 0:
                self.lookups += bool(tokens)
                kind = "lookup" if tokens else self._kind
                out.append(Proposal(tokens, seconds=time.perf_counter() - start, meta={"kind": kind}))
            else:
                out.append(None)
                rest.append(i)
        if rest:
            props = self.fallback.draft([requests[i] for i in rest], [lengths[i] for i in rest])
            for i, prop in zip(rest, props, strict=True):
                out[i] = prop
        return out  # type: ignore[return-value]

    def commit(self, key: int, proposal: Proposal, path: Sequence[int]) -> None:
        self.fallback.commit(key, proposal, path)
