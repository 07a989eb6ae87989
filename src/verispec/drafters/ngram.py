"""Prompt-lookup / n-gram drafter: proposes the continuation of the latest earlier match of the last n tokens."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from verispec.drafters.base import BaseDrafter, DraftRequest, Proposal

__all__ = ["NgramDrafter", "ngram_lookup"]


def ngram_lookup(ids: list[int], gamma: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Continuation (up to ``gamma`` tokens) of the most recent earlier occurrence of the longest suffix n-gram.

    Tries n = max_ngram down to min_ngram; returns [] when nothing matches. Vectorized with numpy windows.
    """
    if gamma <= 0:
        return []
    arr = np.asarray(ids, dtype=np.int64)
    for n in range(min(max_ngram, len(arr) - 1), min_ngram - 1, -1):
        if n <= 0:
            break
        tail = arr[-n:]
        windows = np.lib.stride_tricks.sliding_window_view(arr[:-1], n)
        hits = np.flatnonzero((windows == tail).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return arr[start : start + gamma].tolist()
    return []


class NgramDrafter(BaseDrafter):
    """Token-only drafter (no model): q is one-hot on its guesses, so verification stays lossless."""

    name = "ngram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, gamma_max: int = 8) -> None:
        super().__init__(gamma_max)
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def draft(self, requests: Sequence[DraftRequest], lengths: Sequence[int]) -> list[Proposal]:
        out = []
        for req, g in zip(requests, lengths, strict=True):
            start = time.perf_counter()
            tokens = ngram_lookup(req.ids, g, self.max_ngram, self.min_ngram)
            out.append(Proposal(tokens, seconds=time.perf_counter() - start))
        return out
