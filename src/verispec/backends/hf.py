"""Hugging Face transformers backend: a causal LM plus a ``DynamicCache`` tracked token by token."""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel

from ..tree import tree_attention, tree_depths
from .base import SyncMixin

__all__ = ["HFBackend"]


class HFBackend(SyncMixin):
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

    # -- tree attention (tree drafting / verification) --------------------------------------------------
    # Pending tree nodes sit in the cache after the linear tokens, recorded in ``tokens`` as -1 so that
    # ``sync`` never mistakes them for history; ``commit_tree`` turns an accepted path into history.
    _TREE_SLOT = -1

    def _pending_tree(self) -> tuple[int, list[int], list[int]]:
        base = getattr(self, "_tree_base", 0)
        n = len(self.tokens) - base
        if base < 1 or n <= 0 or any(t != self._TREE_SLOT for t in self.tokens[base:]):
            return len(self.tokens), [], []
        return base, self._tree_parents[:n], self._tree_tokens[:n]

    @torch.inference_mode()
    def tree_forward(self, feed: list[int], tokens: list[int], parents: list[int]) -> torch.Tensor:
        """Feed linear tokens ``feed``, then tree nodes ``tokens`` (``parents`` index the pending tree's nodes,
        earlier calls' included; -1 = the last linear token) in one forward with a tree attention mask.

        Returns float32 logits [len(tokens) + (1 if feed else 0), V]: the last fed linear token's row first, then
        one row per new node. Linear tokens can only be fed while no tree is pending.
        """
        base, old_parents, old_tokens = self._pending_tree()
        if feed and old_parents:
            raise ValueError("commit_tree before feeding linear tokens")
        if not feed and not tokens:
            raise ValueError("tree_forward needs tokens")
        linear = len(self.tokens) - len(old_parents) + len(feed)
        depth = max(tree_depths(old_parents + list(parents)), default=0)
        if linear + depth > self.max_context:
            raise ValueError(f"tree reaches position {linear + depth} beyond the context of {self.max_context}")
        all_parents = old_parents + list(parents)
        mask, pos = tree_attention(all_parents, len(tokens), linear - len(feed), len(feed), self.dtype, self.device)
        ids = torch.tensor([list(feed) + list(tokens)], dtype=torch.long, device=self.device)
        keep = len(tokens) + (1 if feed else 0)
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=keep,
        )
        self.cache = out.past_key_values
        self.tokens.extend(feed)
        self.tokens.extend([self._TREE_SLOT] * len(tokens))
        self._tree_base, self._tree_parents = linear, all_parents
        self._tree_tokens = old_tokens + list(tokens)
        self.forward_calls += 1
        return out.logits[0, -keep:].float()

    @torch.inference_mode()
    def commit_tree(self, path: list[int]) -> None:
        """Keep the KV of the pending tree's nodes ``path`` (root-down) as history; drop the other nodes."""
        base, parents, tokens = self._pending_tree()
        prev = -1
        for node in path:
            if not 0 <= node < len(parents) or parents[node] != prev:
                raise ValueError(f"{path} is not a root-down path of the pending tree")
            prev = node
        if path:
            idx = torch.tensor([base + n for n in path], dtype=torch.long, device=self.device)
            for layer in self.cache.layers:
                layer.keys[..., base : base + len(path), :] = layer.keys[..., idx, :]
                layer.values[..., base : base + len(path), :] = layer.values[..., idx, :]
        self.cache.crop(base + len(path))
        del self.tokens[base:]
        self.tokens.extend(tokens[n] for n in path)
        self._tree_parents, self._tree_tokens = [], []

    @property
    def device(self) -> torch.device:
        return self.model.device
