"""Prompt-lookup / n-gram drafter: proposes the continuation of the latest earlier match of the last n tokens."""

from __future__ import annotations

import time

import numpy as np

from .base import Draft, DraftContext

__all__ = ["NgramDrafter", "ngram_lookup"]


def ngram_lookup(ids: list[int], gamma: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Continuation (up to ``gamma`` tokens) of the most recent earlier occurrence of the longest suffix n-gram.

    Tries n = max_ngram down to min_ngram; returns [] when nothing matches. Vectorized with numpy windows.
    """
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


class NgramDrafter:
    """Token-only drafter (no model): q is one-hot on its guesses, so verification stays lossless."""

    name = "ngram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def reset(self) -> None:
        pass

    def propose(self, ids: list[int], gamma: int, ctx: DraftContext) -> Draft:
        start = time.perf_counter()
        tokens = ngram_lookup(ids, gamma, self.max_ngram, self.min_ngram) if gamma > 0 else []
        return Draft(tokens, None, time.perf_counter() - start, 0)
