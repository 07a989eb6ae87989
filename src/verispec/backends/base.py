"""What the decoding loop needs from a model: score a block of tokens against a KV cache, and roll back."""

from __future__ import annotations

from typing import Protocol

import torch

__all__ = ["Backend", "SyncMixin", "common_prefix_len"]


def common_prefix_len(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class Backend(Protocol):
    """A causal LM with a KV cache over ``tokens`` (the tokens whose KV is computed)."""

    tokens: list[int]
    vocab_size: int
    max_context: int

    def extend(self, new_tokens: list[int], num_logits: int) -> torch.Tensor:
        """Append ``new_tokens`` to the cache and return logits [num_logits, V] of the last positions."""
        ...

    def truncate(self, length: int) -> None:
        """Keep the KV of the first ``length`` cached tokens only (exact rollback)."""
        ...

    def reset(self) -> None: ...


class SyncMixin:
    """``sync`` for any backend with ``tokens`` and an exact ``truncate``."""

    tokens: list[int]

    def truncate(self, length: int) -> None:  # pragma: no cover - provided by the backend
        raise NotImplementedError

    def sync(self, ids: list[int]) -> list[int]:
        """Roll the cache back to the longest prefix it shares with ``ids[:-1]`` and return what to feed next.

        At least the last token of ``ids`` is always returned, so the caller gets logits for the next position.
        """
        keep = common_prefix_len(self.tokens, ids[:-1])
        self.truncate(keep)
        return ids[keep:]
