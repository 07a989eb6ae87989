"""What the decoding loop needs from a model: score a block of tokens against a KV cache, and roll back."""

from __future__ import annotations

from typing import Protocol

import torch

__all__ = ["Backend", "common_prefix_len"]


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
