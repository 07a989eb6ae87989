"""The one contract between the decoding loop and a model: score proposals for a batch of rows, commit paths.

A backend holds one KV cache per *row* (an independent sequence; a request being decoded). Each round the loop
asks it to score, for some rows, the committed history plus a proposal (a chain or a token tree, given by
parent indices); the backend syncs each row's cache to the history (exact rollback of anything not in it),
feeds what is missing, runs ONE forward over all rows, and returns raw logits. After verification the loop
commits the accepted root-down path of each row: its KV becomes history, the rest of the proposal is dropped.

Positions and shapes. For :class:`ScoreRequest` ``(ids, tokens, parents)`` the returned logits are
[1 + len(tokens), V] float32: row 0 is the next-token distribution after ``ids`` (the root), row k + 1 the one
after node k (its ancestors and itself appended to ``ids``). A chain of drafts is the tree with parents
``[-1, 0, 1, ...]``. With ``ids=None`` the request *continues* the row's pending proposal: ``tokens`` are added
as further nodes whose ``parents`` index the pending nodes (earlier calls' first), and the logits are
[len(tokens), V]. This is how a tree drafter expands a tree level by level.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

__all__ = ["Backend", "ScoreRequest", "chain_parents", "common_prefix_len", "is_chain", "plan_requests"]


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):
        return n
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def chain_parents(n: int) -> list[int]:
    """Parents of a chain of ``n`` nodes: [-1, 0, 1, ..., n - 2]."""
    return list(range(-1, n - 1))


def is_chain(parents: Sequence[int]) -> bool:
    return all(p == i - 1 for i, p in enumerate(parents))


@dataclass
class ScoreRequest:
    """Score ``tokens`` (a proposal, parents per node, -1 = the root) after the history ``ids`` of ``row``.

    ``ids=None`` continues the row's pending proposal (see the module docstring).
    """

    row: int
    ids: list[int] | None
    tokens: list[int] = field(default_factory=list)
    parents: list[int] | None = None

    def __post_init__(self) -> None:
        if self.parents is None:
            self.parents = chain_parents(len(self.tokens)) if self.ids is not None else []
        if len(self.parents) != len(self.tokens):
            raise ValueError(f"{len(self.tokens)} tokens but {len(self.parents)} parents")
        if self.ids is not None and not self.ids:
            raise ValueError("a score request needs at least one history token (the root)")
        if self.ids is None and not self.tokens:
            raise ValueError("continuing a proposal needs new tokens")


def plan_requests(requests: Sequence[ScoreRequest], plan: Callable[[ScoreRequest], Any]) -> list[Any]:
    """``plan(request)`` for every request of one score call, refusing a row that appears twice."""
    seen: set[int] = set()
    plans = []
    for req in requests:
        if req.row in seen:
            raise ValueError(f"row {req.row} appears twice in one score call")
        seen.add(req.row)
        plans.append(plan(req))
    return plans


@runtime_checkable
class Backend(Protocol):
    """Everything the decoding loop and the drafters call on a model."""

    vocab_size: int
    max_context: int
    forward_calls: int
    #: whether :meth:`score` accepts non-chain parents (tree attention)
    supports_trees: bool

    @property
    def device(self) -> torch.device: ...

    def add_row(self) -> int:
        """Allocate an empty row (a new sequence) and return its id."""
        ...

    def remove_row(self, row: int) -> None:
        """Free a row and its cache."""
        ...

    def score(self, requests: Sequence[ScoreRequest]) -> list[torch.Tensor]:
        """One forward for every request (at most one per row); float32 logits per request, in order."""
        ...

    def commit(self, row: int, path: Sequence[int]) -> None:
        """Keep the KV of the pending proposal's root-down ``path`` (node indices) as history; drop the rest."""
        ...

    def cached_tokens(self, row: int) -> list[int]:
        """The history tokens whose KV the row holds (pending proposal nodes excluded)."""
        ...
