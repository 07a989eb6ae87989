"""Hugging Face transformers backend: a causal LM plus a ``DynamicCache`` tracked token by token."""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel

from .base import common_prefix_len

__all__ = ["HFBackend"]


class HFBackend:
    """Scores blocks of tokens against a KV cache and truncates it exactly.

    ``tokens`` lists the tokens whose KV is in the cache; committed-but-not-yet-input tokens (a correction or
    bonus token) are not in it until they are fed next round (tutorial section 6).
    """

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model.eval()
        cfg = model.config
        self.vocab_size = int(cfg.vocab_size)
        self.max_context = int(getattr(cfg, "max_position_embeddings", 1 << 30))
        self.tokens: list[int] = []
        self.cache = DynamicCache()
        self.forward_calls = 0

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    def reset(self) -> None:
        self.tokens = []
        self.cache = DynamicCache()

    @torch.inference_mode()
    def extend(self, new_tokens: list[int], num_logits: int = 1) -> torch.Tensor:
        """Feed ``new_tokens`` after the cached ones; return float32 logits [num_logits, V] of the last positions."""
        if not new_tokens:
            raise ValueError("extend needs at least one new token")
        if len(self.tokens) + len(new_tokens) > self.max_context:
            raise ValueError(
                f"sequence of {len(self.tokens) + len(new_tokens)} tokens exceeds the model's context of "
                f"{self.max_context}"
            )
        ids = torch.tensor([new_tokens], dtype=torch.long)
        out = self.model(input_ids=ids, past_key_values=self.cache, use_cache=True, logits_to_keep=num_logits)
        self.cache = out.past_key_values
        self.tokens.extend(new_tokens)
        self.forward_calls += 1
        return out.logits[0, -num_logits:].float()

    def truncate(self, length: int) -> None:
        if length < len(self.tokens):
            self.cache.crop(length)
            del self.tokens[length:]

    def sync(self, ids: list[int]) -> list[int]:
        """Roll the cache back to the longest prefix it shares with ``ids[:-1]`` and return what to feed next.

        At least the last token of ``ids`` is always returned, so the caller gets logits for the next position.
        """
        keep = common_prefix_len(self.tokens, ids[:-1])
        self.truncate(keep)
        return ids[keep:]
