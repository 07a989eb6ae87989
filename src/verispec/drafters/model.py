"""Chain drafter from a draft model: gamma tokens per row sampled from q under the target's own processors,
one batched draft forward per position for all rows."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from verispec.backends.base import Backend, ScoreRequest, common_prefix_len
from verispec.core.constraint import constrain_logits
from verispec.core.sampling import adjust_logits, process
from verispec.core.verify.chain import sample_categorical
from verispec.drafters.base import BaseDrafter, DraftRequest, Proposal

__all__ = ["ModelDrafter"]


class ModelDrafter(BaseDrafter):
    """Drafts with a causal LM backend (transformers or llama.cpp).

    At temperature > 0 each token is sampled from q (the draft's processed distribution, with the rule's draft
    transform) and the full q is returned for verification. At temperature 0, or with ``greedy=True``, the
    draft takes q's argmax and returns no q: the verifier treats the draft as one-hot (still lossless); with
    ``untempered_q`` it returns q at temperature 1 instead (deterministic greedy reading of a lossy rule).
    Each row's draft cache resumes from its committed history, never from a rejected guess.

    ``p_min`` (confidence gate, llama.cpp's ``--draft-p-min``): a row stops drafting at the first position where
    the draft's top probability (its processed distribution; at temperature 0 its distribution at temperature 1)
    is below ``p_min``, without drafting that token. The draft length then depends only on the draft's own
    distributions, so every rule stays as exact as at a fixed length. 0 turns it off.
    """

    name = "model"

    def __init__(self, backend: Backend, greedy: bool = False, gamma_max: int = 8, p_min: float = 0.0) -> None:
        super().__init__(gamma_max)
        if not 0.0 <= float(p_min) <= 1.0:
            raise ValueError(f"draft p_min must be in [0, 1], got {p_min}")
        self.backend = backend
        self.greedy = greedy
        self.p_min = float(p_min)
        self.gated = 0  # positions the gate left undrafted (a count for tests and benchmarks)
        self._brow: dict[int, int] = {}

    def add_row(self, key: int, gamma: int | str | None = None) -> None:
        super().add_row(key, gamma)
        if key in self._brow:
            self.backend.remove_row(self._brow[key])
        self._brow[key] = self.backend.add_row()

    def remove_row(self, key: int) -> None:
        super().remove_row(key)
        brow = self._brow.pop(key, None)
        if brow is not None:
            self.backend.remove_row(brow)

    def catch_up(self, requests: Sequence[DraftRequest]) -> int:
        """Tokens of each row's ``ids`` the draft backend has not seen (the most of any row)."""
        out = 0
        for r in requests:
            brow = self._brow.get(r.key)
            cached = self.backend.cached_tokens(brow) if brow is not None else None
            out = max(out, len(r.ids) - (common_prefix_len(cached, r.ids) if cached else 0))
        return out

    def within_context(self, requests: Sequence[DraftRequest], lengths: Sequence[int]) -> list[int]:
        """``lengths`` capped by the draft model's own context, which may be shorter than the target's: drafting
        gamma tokens after ``ids`` feeds it ``len(ids) + gamma - 1`` tokens (the last draft is never fed). A row with
        no room drafts nothing, which leaves the target's output law unchanged."""
        limit = int(self.backend.max_context)
        return [max(min(g, limit - len(r.ids) + 1), 0) for r, g in zip(requests, lengths, strict=True)]

    def _gate(self, dist: torch.Tensor | None, left: int) -> bool:
        """Whether the confidence gate stops a row here (``left`` positions it would still have drafted)."""
        if not self.p_min or dist is None or float(dist.max()) >= self.p_min:
            return False
        self.gated += left
        return True

    def draft(self, requests: Sequence[DraftRequest], lengths: Sequence[int]) -> list[Proposal]:
        start = time.perf_counter()
        calls0 = self.backend.forward_calls
        lengths = self.within_context(requests, lengths)
        n = len(requests)
        tokens: list[list[int]] = [[] for _ in range(n)]
        qs: list[list[torch.Tensor]] = [[] for _ in range(n)]
        hist = [
            r.history.extended([]) if r.history is not None and r.cfg.uses_history else None for r in requests
        ]
        stopped: set[int] = set()  # rows the confidence gate stopped
        for step in range(max(lengths, default=0)):
            live = [i for i in range(n) if lengths[i] > step and i not in stopped]
            if not live:
                break
            reqs = [ScoreRequest(self._brow[requests[i].key], requests[i].ids + tokens[i]) for i in live]
            for i, logits in zip(live, self.backend.score(reqs), strict=True):
                req, lg = requests[i], logits[0]
                if req.constraint is not None:
                    lg = constrain_logits(lg.unsqueeze(0), [req.constraint.allowed(tokens[i])])[0]
                if self.greedy or req.cfg.greedy:
                    # every processor and rule's draft transform keeps the argmax: q is needed only on request
                    tok = int((adjust_logits(lg, req.cfg, hist[i]) if req.cfg.adjusts_logits else lg).argmax())
                    q_t1 = process(lg, req.cfg.untempered(), hist[i]) if req.untempered_q or self.p_min else None
                    if self._gate(q_t1, lengths[i] - step):
                        stopped.add(i)
                        continue
                    if req.untempered_q:
                        qs[i].append(q_t1)
                else:
                    q = req.rule.draft(process(lg, req.cfg, hist[i]))
                    if self._gate(q, lengths[i] - step):
                        stopped.add(i)
                        continue
                    tok = int(sample_categorical(q, req.generator))
                    qs[i].append(q)
                tokens[i].append(tok)
                if hist[i] is not None:
                    hist[i].extend([tok])
        seconds, calls = time.perf_counter() - start, self.backend.forward_calls - calls0
        return [
            Proposal(tokens[i], q=torch.stack(qs[i]) if qs[i] else None, seconds=seconds, forward_calls=calls)
            for i in range(n)
        ]
