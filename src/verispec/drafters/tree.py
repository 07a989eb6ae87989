"""Tree drafter from a draft model: a token tree per round (EAGLE-style), one draft forward per depth level.

Static tree (``budget=None``): every node up to ``depth`` gets its ``top_k`` most probable children under q,
examined in descending q (a greedy, token-only candidate set, as in Appendix H.1). With ``sample=True`` (and
temperature > 0) children are instead drawn one after another without replacement from q, and q is kept for
the recursive rejection sampling of :mod:`verispec.tree`.

Dynamic tree (``budget=N``, EAGLE-2 style): at each depth only the ``width`` most probable nodes of the level
(by path probability, the product of q along the path) are expanded, each into its ``top_k`` most probable
children; at the end the ``N`` most probable nodes overall are kept (ancestor-closed, since a path's
probability never exceeds its prefix's). Token-only.

At temperature 0 candidates are ranked by the draft's temperature-1 distribution (under the same penalties
and truncations): at temperature 0 q would be one-hot and only its argmax could be drafted. The draft
cache keeps the KV of the nodes it forwarded until :meth:`TreeDrafter.commit` keeps the accepted ones.
"""

from __future__ import annotations

import math
import time

import torch

from ..backends.hf import HFBackend
from ..processors import process
from ..tree import TokenTree
from ..verify import sample_categorical
from .base import DraftContext

__all__ = ["TreeDrafter"]


class TreeDrafter:
    name = "tree"

    def __init__(
        self,
        backend: HFBackend,
        depth: int = 4,
        top_k: int = 2,
        budget: int | None = None,
        width: int | None = None,
        sample: bool = False,
    ) -> None:
        self.backend = backend
        self.depth, self.top_k, self.budget, self.width, self.sample = depth, top_k, budget, width, sample
        self._check(depth, top_k, budget, width, sample)

    @staticmethod
    def _check(depth: int, top_k: int, budget: int | None, width: int | None, sample: bool) -> None:
        if depth < 0:
            raise ValueError(f"depth must be >= 0, got {depth}")
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        if budget is not None and budget < 1:
            raise ValueError(f"budget must be >= 1 (or None for a static tree), got {budget}")
        if width is not None and width < 1:
            raise ValueError(f"width must be >= 1, got {width}")
        if sample and budget is not None:
            raise ValueError("sampled children are supported for static trees only (budget=None)")

    def reset(self) -> None:
        self.backend.reset()

    def _dist(self, logits: torch.Tensor, ctx: DraftContext, counts: torch.Tensor | None) -> torch.Tensor:
        cfg = ctx.cfg.with_(temperature=1.0) if ctx.cfg.greedy else ctx.cfg
        return ctx.rule.draft(process(logits, cfg, counts))

    @staticmethod
    def _top(q: torch.Tensor, k: int) -> list[int]:
        vals, idx = torch.topk(q, min(k, q.shape[-1]))
        ranked = sorted(zip(vals.tolist(), idx.tolist(), strict=True), key=lambda t: (-t[0], t[1]))
        return [i for v, i in ranked if v > 0]

    @staticmethod
    def _draw(q: torch.Tensor, k: int, generator: torch.Generator | None) -> list[int]:
        cur, out = q.clone(), []
        for _ in range(k):
            if not cur.sum() > 0:
                break
            x = int(sample_categorical(cur, generator))
            out.append(x)
            cur[x] = 0.0
        return out

    def propose(
        self,
        ids: list[int],
        ctx: DraftContext,
        depth: int | None = None,
        top_k: int | None = None,
        budget: int | None = ...,  # type: ignore[assignment]
        width: int | None = ...,  # type: ignore[assignment]
        sample: bool | None = None,
    ) -> TokenTree:
        """A token tree continuing ``ids`` (arguments left out take the drafter's settings)."""
        depth = self.depth if depth is None else depth
        top_k = self.top_k if top_k is None else top_k
        budget = self.budget if budget is ... else budget
        width = self.width if width is ... else width
        sample = self.sample if sample is None else sample
        self._check(depth, top_k, budget, width, sample)
        sample = sample and not ctx.cfg.greedy
        width = top_k if width is None else width
        start, calls0 = time.perf_counter(), self.backend.forward_calls
        base_counts = ctx.counts if ctx.counts is not None and ctx.cfg.uses_history else None

        tokens: list[int] = []
        parents: list[int] = []
        logp: list[float] = []
        child_q: dict[int, torch.Tensor] = {}
        slot: dict[int, int] = {}  # tree node -> index of its KV in the draft's pending tree
        if depth > 0:
            feed = self.backend.sync(ids)
            level = [(-1, self.backend.extend(feed, 1)[0])]
        else:
            level = []
        for d in range(1, depth + 1):
            new: list[int] = []
            for node, logits in level:
                counts = None
                if base_counts is not None:
                    counts = base_counts.clone()
                    for n in self._path(parents, node):
                        counts[tokens[n]] += 1
                q = self._dist(logits, ctx, counts)
                kids = self._draw(q, top_k, ctx.generator) if sample else self._top(q, top_k)
                if sample and kids:
                    child_q[node] = q
                base_lp = logp[node] if node >= 0 else 0.0
                for x in kids:
                    tokens.append(x)
                    parents.append(node)
                    logp.append(base_lp + math.log(float(q[x])))
                    new.append(len(tokens) - 1)
            if d == depth or not new:
                break
            if budget is not None:  # dynamic: expand the most probable nodes of this level only
                new = sorted(sorted(new, key=lambda n: (-logp[n], n))[:width])
            out = self.backend.tree_forward([], [tokens[n] for n in new], [slot.get(parents[n], -1) for n in new])
            for n in new:
                slot[n] = len(slot)
            level = list(zip(new, out, strict=True))

        if budget is not None and len(tokens) > budget:
            best = sorted(range(len(tokens)), key=lambda n: (-logp[n], _depth(parents, n), n))[:budget]
            keep = sorted({a for n in best for a in self._path(parents, n)})  # ancestor-closed (it already is)
            remap = {old: new for new, old in enumerate(keep)}
            remap[-1] = -1
            tokens = [tokens[n] for n in keep]
            parents = [remap[parents[n]] for n in keep]
            slot = {remap[n]: s for n, s in slot.items() if n in remap}
        tree = TokenTree(tokens, parents, child_q)
        tree.meta.update(
            slots=slot, seconds=time.perf_counter() - start, forward_calls=self.backend.forward_calls - calls0
        )
        return tree

    @staticmethod
    def _path(parents: list[int], node: int) -> list[int]:
        out = []
        while node >= 0:
            out.append(node)
            node = parents[node]
        return out

    def commit(self, tree: TokenTree, path: list[int]) -> None:
        """Keep the draft KV of the accepted nodes it computed (a root-down prefix of ``path``); drop the rest."""
        slots = tree.meta.get("slots", {})
        kept = []
        for n in path:
            if n not in slots:
                break
            kept.append(slots[n])
        self.backend.commit_tree(kept)


def _depth(parents: list[int], node: int) -> int:
    d = 0
    while node >= 0:
        d += 1
        node = parents[node]
    return d
