"""Prompt lookup first, a draft model when the history has no match: the cheapest good guess each round."""

from __future__ import annotations

import time

from .base import Draft, DraftContext, Drafter
from .ngram import ngram_lookup

__all__ = ["HybridDrafter"]


class HybridDrafter:
    """Proposes the n-gram continuation when the last ``min_ngram``..``max_ngram`` tokens occurred before
    (token-only, q one-hot), otherwise drafts with ``fallback`` (which returns its exact q). Either way the
    verifier gets the distribution each token was drawn from, so every rule keeps its law."""

    name = "hybrid"

    def __init__(self, fallback: Drafter, max_ngram: int = 3, min_ngram: int = 2) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.fallback, self.max_ngram, self.min_ngram = fallback, max_ngram, min_ngram
        self.lookups = 0

    def reset(self) -> None:
        self.fallback.reset()
        self.lookups = 0

    def propose(self, ids: list[int], gamma: int, ctx: DraftContext) -> Draft:
        start = time.perf_counter()
        tokens = ngram_lookup(ids, gamma, self.max_ngram, self.min_ngram) if gamma > 0 else []
        if tokens:
            self.lookups += 1
            return Draft(tokens, None, time.perf_counter() - start, 0)
        return self.fallback.propose(ids, gamma, ctx)
