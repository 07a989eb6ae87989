"""Row isolation: every row on a backend of its own, so that a row's numbers never depend on its batch.

A batched backend computes a row's logits in kernels whose shapes depend on the other rows (the batch's width,
its padded length, a llama.cpp batch mixing sequences); in bfloat16 on a CPU that moves the last bits of the
logits, and over a few hundred sampled tokens it can change a token. :class:`RowIsolated` gives each live row a
single-row backend from a pool, scored one row at a time and reset before it is reused, with no prefix shared
between rows. A seeded row then computes exactly what it computes alone: the same tokens whatever else is in
its batch, whichever shard, worker or resume runs it (``deterministic = true`` of a sweep; the cost is the
batching it gives up, docs/results/determinism.md).

It implements :class:`verispec.backends.base.Backend`; ``forward_calls`` counts its own :meth:`score` calls
(one per round, as a batched backend would), and everything else (tokenizer checks, block costs) is read from
the first backend of the pool.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from verispec.backends.base import Backend, ScoreRequest, plan_requests

__all__ = ["RowIsolated"]


class RowIsolated:
    """Rows on backends of their own, made by ``make`` (each holding one row at a time)."""

    def __init__(self, make: Callable[[], Backend]) -> None:
        self._make = make
        self._first: Any = make()
        self._idle: list[Any] = [self._first]
        self._rows: dict[int, tuple[Any, int]] = {}  # our row id -> (its backend, the row's id there)
        self._next_id = 0
        self.forward_calls = 0
        self.name = f"{getattr(self._first, 'name', 'backend')}-isolated"

    # -- what the loop reads ---------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return int(self._first.vocab_size)

    @property
    def max_context(self) -> int:
        return int(self._first.max_context)

    @property
    def supports_trees(self) -> bool:
        return bool(self._first.supports_trees)

    @property
    def device(self) -> torch.device:
        return self._first.device

    @property
    def max_rows(self) -> int | None:
        """No limit: every row gets a backend of its own (made on demand, pooled)."""
        return None

    @property
    def num_rows(self) -> int:
        return len(self._rows)

    def __getattr__(self, name: str) -> Any:  # dtype, block_cost, tokenize, eos_ids, ...: the model's, not a row's
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._first, name)

    # -- rows --------------------------------------------------------------------------------------------------
    def add_row(self) -> int:
        backend = self._idle.pop() if self._idle else self._make()
        rid = self._next_id
        self._next_id += 1
        self._rows[rid] = (backend, backend.add_row())
        return rid

    def remove_row(self, row: int) -> None:
        backend, _ = self._row(row)
        del self._rows[row]
        backend.reset()  # nothing of this row (cache slots, a retired prefix) may reach the next one
        self._idle.append(backend)

    def reset(self) -> None:
        for row in list(self._rows):
            self.remove_row(row)

    def _row(self, row: int) -> tuple[Any, int]:
        try:
            return self._rows[row]
        except KeyError:
            raise ValueError(f"row {row} does not exist (add_row first)") from None

    def cached_tokens(self, row: int) -> list[int]:
        backend, inner = self._row(row)
        return backend.cached_tokens(inner)

    # -- scoring -----------------------------------------------------------------------------------------------
    def score(self, requests: Sequence[ScoreRequest]) -> list[torch.Tensor]:
        """Each request scored on its row's own backend, one row at a time, in order."""
        plan_requests(requests, lambda q: self._row(q.row))  # each row exists and appears once, before any change
        out = []
        for req in requests:
            backend, inner = self._rows[req.row]
            out.append(backend.score([ScoreRequest(inner, req.ids, list(req.tokens), list(req.parents or []))])[0])
        self.forward_calls += 1
        return out

    def commit(self, row: int, path: Sequence[int]) -> None:
        backend, inner = self._row(row)
        backend.commit(inner, path)

    def forward_ids(self, row: int, ids: list[int], tokens: Sequence[int] = (), **kw: Any) -> torch.Tensor:
        """``score`` for one row (see the backends' ``forward_ids``)."""
        backend, inner = self._row(row)
        return backend.forward_ids(inner, ids, tokens, **kw)

    def kv(self, row: int) -> Any:
        backend, inner = self._row(row)
        return backend.kv(inner)
