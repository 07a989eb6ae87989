"""Prompt lookup first, a draft model when the history has no match: the cheapest good guess each round."""

from __future__ import annotations

import time
from collections.abc import Sequence

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

    @property
    def backend(self) -> object:
        return getattr(self.fallback, "backend", None)

    def add_row(self, key: int, gamma: int | str | None = None) -> None:
        super().add_row(key, gamma)
        self.fallback.add_row(key, 0 if gamma == "auto" else gamma)  # lengths come from this drafter

    def remove_row(self, key: int) -> None:
        super().remove_row(key)
        self.fallback.remove_row(key)

    def draft(self, requests: Sequence[DraftRequest], lengths: Sequence[int]) -> list[Proposal]:
        out: list[Proposal | None] = []
        rest: list[int] = []
        for i, (req, g) in enumerate(zip(requests, lengths, strict=True)):
            start = time.perf_counter()
            tokens = ngram_lookup(req.ids, g, self.max_ngram, self.min_ngram)
            if tokens or g == 0:
                self.lookups += bool(tokens)
                out.append(Proposal(tokens, seconds=time.perf_counter() - start))
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
