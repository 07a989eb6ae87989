"""Chain drafter from a draft model: gamma tokens sampled from q under the target's own processors."""

from __future__ import annotations

import time

import torch

from ..backends.hf import HFBackend
from ..processors import apply_penalties, process
from ..verify import sample_categorical
from .base import Draft, DraftContext

__all__ = ["ModelDrafter"]


class ModelDrafter:
    """Drafts with a causal LM backend.

    At temperature > 0 each token is sampled from q (the draft's processed distribution, with the rule's draft
    transform) and the full q is returned for verification. At temperature 0, or with ``greedy=True``, the
    draft takes q's argmax and returns no q: the verifier treats the draft as one-hot (still lossless).
    The cache resumes from the committed history, never from a rejected guess.
    """

    name = "model"

    def __init__(self, backend: HFBackend, greedy: bool = False) -> None:
        self.backend = backend
        self.greedy = greedy

    def reset(self) -> None:
        self.backend.reset()

    def propose(self, ids: list[int], gamma: int, ctx: DraftContext) -> Draft:
        start = time.perf_counter()
        calls0 = self.backend.forward_calls
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        greedy = self.greedy or ctx.cfg.greedy
        counts = ctx.counts.clone() if ctx.counts is not None and ctx.cfg.uses_history else None
        feed = self.backend.sync(ids)
        for _ in range(gamma):
            logits = self.backend.extend(feed, 1)[0]
            if greedy:
                # every processor and every rule's draft transform keeps the argmax: skip building q
                tok = int((apply_penalties(logits, counts, ctx.cfg) if counts is not None else logits).argmax())
            else:
                q = ctx.rule.draft(process(logits, ctx.cfg, counts))
                tok = int(sample_categorical(q, ctx.generator))
                qs.append(q)
            tokens.append(tok)
            if counts is not None:
                counts[tok] += 1
            feed = [tok]
        q_block = torch.stack(qs) if qs else None
        return Draft(tokens, q_block, time.perf_counter() - start, self.backend.forward_calls - calls0)
