"""Tree drafter from a draft model: a token tree per row and round (EAGLE-style), one batched draft forward per
depth level for all rows.

Static tree (``budget=None``): every node up to the depth gets its ``top_k`` most probable children under q,
examined in descending q (a greedy, token-only candidate set, as in Appendix H.1). With ``sample=True`` (and
temperature > 0) children are instead drawn one after another without replacement from q, and q is kept for
the recursive rejection sampling of :mod:`verispec.core.verify.tree`.

Dynamic tree (``budget=N``, EAGLE-2 style): at each depth only the ``width`` most probable nodes of the level
(by path probability, the product of q along the path) are expanded, each into its ``top_k`` most probable
children; at the end the ``N`` most probable nodes overall are kept (ancestor-closed, since a path's
probability never exceeds its prefix's). Token-only.

The depth is the row's gamma (``depth`` here is its default), so ``gamma="auto"`` adapts the depth; for a static
tree it adapts the width too: each round's tree has ``w`` children per node for one w in 1..``top_k`` (w = 1 is a
chain), chosen with the depth to maximise expected tokens per second (:meth:`TreeDrafter.decide`). The acceptance
of every width up to the one that ran is measured from one round: a tree with w children per node would have
accepted the same path down to the first accepted node whose rank among its siblings is w or more (the same
coupling holds for sampled children, tried in draw order), so a wide round measures all narrower widths at
once; a width wider than any run since keeps its last estimate. At
temperature 0 candidates are ranked by the draft's temperature-1 distribution (under the same penalties and
truncations): at temperature 0 q would be one-hot and only its argmax could be drafted. The draft cache keeps
the KV of the nodes it forwarded until :meth:`TreeDrafter.commit` keeps the accepted ones.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from verispec.backends.base import Backend, ScoreRequest
from verispec.core.constraint import constrain_logits
from verispec.core.sampling import History, process
from verispec.core.schedule import AdaptiveGamma, BlockLen
from verispec.core.verify.chain import sample_categorical
from verispec.core.verify.tree import tree_path
from verispec.defaults import DRAFTERS
from verispec.drafters.base import DraftRequest, Proposal
from verispec.drafters.model import ModelDrafter

__all__ = ["TreeDrafter"]


@dataclass
class _Tree:
    """A row's tree under construction."""

    req: DraftRequest
    depth: int
    width: int
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    logp: list[float] = field(default_factory=list)
    q: list[torch.Tensor | None] = field(default_factory=list)
    slot: dict[int, int] = field(default_factory=dict)  # node -> its index among the draft's pending nodes
    level: list[tuple[int, torch.Tensor]] = field(default_factory=list)  # (node, logits after it)

    def path(self, node: int) -> list[int]:
        return tree_path(self.parents, node)


class TreeDrafter(ModelDrafter):
    name = "tree"
    proposes_trees = DRAFTERS["tree"].proposes_trees  # stated once, on the drafter spec

    def __init__(
        self,
        backend: Backend,
        depth: int = 4,
        top_k: int = 2,
        budget: int | None = None,
        width: int | None = None,
        sample: bool = False,
        gamma_max: int | None = None,
    ) -> None:
        super().__init__(backend, gamma_max=depth if gamma_max is None else gamma_max)
        if not getattr(backend, "supports_trees", False):
            raise ValueError(f"tree drafting needs a backend with tree attention; {type(backend).__name__} has none")
        self._check(depth, top_k, budget, width, sample)
        self.default_gamma = depth
        self.depth, self.top_k, self.budget, self.width, self.sample = depth, top_k, budget, width, sample
        #: children per node an auto round may choose (static trees; a dynamic tree keeps its configured shape)
        self.widths = list(range(1, top_k + 1)) if budget is None else [top_k]
        self._alpha_w: dict[int, dict[int, AdaptiveGamma]] = {}  # auto row -> width -> its acceptance
        self._round_width: dict[int, int] = {}  # row -> children per node this round
        self._path: dict[int, list[int]] = {}  # row -> accepted path of its last round
        self.last_width: int | None = None

    def nodes(self, depth: int, width: int | None = None) -> int:
        """Most nodes a tree of this depth holds (static: sum of w^i for w = ``width`` children per node, default
        ``top_k``; dynamic: ``width`` nodes expanded per level, capped by ``budget``): the adaptive schedule's
        block size for that depth."""
        kids = self.top_k if width is None or self.budget is not None else width
        width = self.top_k if self.width is None or self.budget is None else self.width
        level, total = 1, 0
        for _ in range(depth):
            level *= kids
            total += level
            if self.budget is not None:
                level = min(level, width)
        return total if self.budget is None else min(total, self.budget)

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

    @staticmethod
    def _dist(logits: torch.Tensor, req: DraftRequest, hist: History | None) -> torch.Tensor:
        cfg = req.cfg.with_(temperature=1.0) if req.cfg.greedy else req.cfg
        return req.rule.draft(process(logits, cfg, hist))

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

    # -- rows and the width decision -------------------------------------------------------------------------
    def add_row(self, key: int, gamma: int | str | None = None) -> None:
        super().add_row(key, gamma)
        if isinstance(self._gamma[key], AdaptiveGamma) and len(self.widths) > 1:
            self._alpha_w[key] = {w: self.new_estimate(f"width {w}") for w in self.widths}

    def remove_row(self, key: int) -> None:
        super().remove_row(key)
        for w, est in self._alpha_w.pop(key, {}).items():
            self.retire_estimate(est, f"width {w}")
        self._round_width.pop(key, None)
        self._path.pop(key, None)

    def _block_len(self, width: int) -> BlockLen:
        return lambda g: self.nodes(g, width) + 1

    def decide(self, schedule: AdaptiveGamma, keys: Sequence[int]) -> int:
        """Depth and width of the auto rows' trees: for each width w, the rows' acceptances at w and a block of
        ``nodes(g, w) + 1`` tokens; the width whose best depth >= 1 is fastest, then the schedule's decision
        (possibly 0) at that width. Before the costs are measured: the widest tree (it measures every width)."""
        rows = [self._alpha_w[k] for k in keys if k in self._alpha_w]
        if len(rows) != len(keys):
            self._round_width = {}
            return super().decide(schedule, keys)
        width = self.widths[-1]
        if schedule.c_draft is not None and schedule.c_target is not None:
            best = -1.0
            for w in self.widths:
                alphas = [r[w].alpha for r in rows]
                rate = max(schedule.rate(g, alphas, self._block_len(w)) for g in range(1, schedule.gamma_max + 1)) \
                    if schedule.gamma_max > 0 else 0.0
                if rate > best * (1 + 1e-12):
                    width, best = w, rate
        self._round_width = dict.fromkeys(keys, width)
        self.last_width = width
        return schedule.choose([r[width].alpha for r in rows], self._block_len(width))

    def commit(self, key: int, proposal: Proposal, path: Sequence[int]) -> None:
        """Keep the draft KV of the accepted nodes it computed (a root-down prefix of ``path``); drop the rest."""
        if key in self._alpha_w:
            self._path[key] = list(path)
        slots = proposal.meta.get("slots", {})
        kept = []
        for n in path:
            if n not in slots:
                break
            kept.append(slots[n])
        self.backend.commit(self._brow[key], kept)

    def update(self, key: int, proposal: Proposal, accepted: int, target_s: float) -> None:
        """As every drafter, plus the acceptance of each width up to the one that ran (module docstring)."""
        super().update(key, proposal, accepted, target_s)
        path, alphas = self._path.pop(key, None), self._alpha_w.get(key)
        if path is None or alphas is None or not len(proposal):
            return
        ran = proposal.meta.get("width", self.top_k)
        rank, seen = [], {}  # a node's rank among its siblings (children are appended best / first drawn first)
        for par in proposal.parents:  # type: ignore[union-attr]
            rank.append(seen.get(par, 0))
            seen[par] = rank[-1] + 1
        for w, est in alphas.items():
            if w <= ran:
                kept = next((i for i, n in enumerate(path) if rank[n] >= w), len(path))
                est.observe_acceptance(proposal.depth, kept)

    def schedule_summary(self, key: int) -> dict | None:
        out = super().schedule_summary(key)
        if out is not None and key in self._alpha_w:
            out["width"] = self.last_width
            out["alpha_by_width"] = {w: a.alpha for w, a in self._alpha_w[key].items()}
        return out

    def _expand(self, t: _Tree) -> list[int]:
        """Children of every node of the current level; returns the new nodes."""
        req, new = t.req, []
        sample = self.sample and not req.cfg.greedy
        for node, logits in t.level:
            hist = None
            if req.history is not None and req.cfg.uses_history:
                hist = req.history.extended([t.tokens[n] for n in t.path(node)])
            if req.constraint is not None:
                mask = req.constraint.allowed([t.tokens[n] for n in t.path(node)])
                logits = constrain_logits(logits.unsqueeze(0), [mask])[0]
            q = self._dist(logits, req, hist)
            kids = self._draw(q, t.width, req.generator) if sample else self._top(q, t.width)
            base_lp = t.logp[node] if node >= 0 else 0.0
            for x in kids:
                t.tokens.append(x)
                t.parents.append(node)
                t.logp.append(base_lp + math.log(float(q[x])))
                t.q.append(q if sample else None)
                new.append(len(t.tokens) - 1)
        return new

    def draft(self, requests: Sequence[DraftRequest], lengths: Sequence[int]) -> list[Proposal]:
        start, calls0 = time.perf_counter(), self.backend.forward_calls
        widths = self._round_width
        self._round_width = {}
        lengths = self.within_context(requests, lengths)  # a tree of depth d feeds the draft as a chain of d does
        trees = [_Tree(req, d, widths.get(req.key, self.top_k)) for req, d in zip(requests, lengths, strict=True)]
        roots = [t for t in trees if t.depth > 0]
        if roots:
            logits = self.backend.score([ScoreRequest(self._brow[t.req.key], t.req.ids) for t in roots])
            for t, lg in zip(roots, logits, strict=True):
                t.level = [(-1, lg[0])]
        width = self.top_k if self.width is None else self.width
        active = roots
        for d in range(1, max((t.depth for t in trees), default=0) + 1):
            grow = []
            for t in active:
                new = self._expand(t)
                if d == t.depth or not new:
                    t.level = []
                    continue
                if self.budget is not None:  # dynamic: expand the most probable nodes of this level only
                    new = sorted(sorted(new, key=lambda n: (-t.logp[n], n))[:width])
                grow.append((t, new))
            if not grow:
                break
            reqs = [
                ScoreRequest(self._brow[t.req.key], None, [t.tokens[n] for n in new],
                             [t.slot.get(t.parents[n], -1) for n in new])
                for t, new in grow
            ]
            for (t, new), out in zip(grow, self.backend.score(reqs), strict=True):
                for n in new:
                    t.slot[n] = len(t.slot)
                t.level = list(zip(new, out, strict=True))
            active = [t for t, _ in grow]
        seconds, calls = time.perf_counter() - start, self.backend.forward_calls - calls0
        return [self._finish(t, seconds, calls) for t in trees]

    def _finish(self, t: _Tree, seconds: float, calls: int) -> Proposal:
        tokens, parents, qs, slot = t.tokens, t.parents, t.q, t.slot
        if self.budget is not None and len(tokens) > self.budget:
            best = sorted(range(len(tokens)), key=lambda n: (-t.logp[n], len(t.path(n)), n))[: self.budget]
            keep = sorted({a for n in best for a in t.path(n)})  # ancestor-closed (it already is)
            remap = {old: new for new, old in enumerate(keep)}
            remap[-1] = -1
            tokens = [tokens[n] for n in keep]
            parents = [remap[parents[n]] for n in keep]
            qs = [qs[n] for n in keep]
            slot = {remap[n]: s for n, s in slot.items() if n in remap}
        q = torch.stack(qs) if qs and all(x is not None for x in qs) else None  # type: ignore[misc]
        return Proposal(tokens, parents, q, seconds, calls, meta={"slots": slot, "width": t.width})
