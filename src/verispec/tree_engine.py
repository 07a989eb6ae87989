"""The tree speculative decoding loop: draft a token tree -> score it in ONE target forward (tree attention)
-> walk it (Appendix H.1, :func:`verispec.tree.verify_tree`) -> commit the accepted path's KV in target and
draft, drop the rest -> the same stop checks as :class:`verispec.engine.SpeculativeEngine`.

Usage::

    engine = TreeEngine(HFBackend(target_model), TreeDrafter(HFBackend(draft_model)), tokenizer, eos_ids)
    engine.generate(prompt, rule="lossless", sampling=SamplingConfig(temperature=0.7), depth=4, top_k=2)
    engine.generate(prompt, depth=4, top_k=2, budget=12)   # dynamic tree of at most 12 nodes
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from .backends.hf import HFBackend
from .drafters.base import DraftContext
from .drafters.tree import TreeDrafter
from .engine import GenerationResult, Metrics, SpeculativeEngine, _Progress
from .processors import SamplingConfig, process
from .rules import Rule, get
from .tree import TokenTree, TreeVerifyResult, TypicalMode, check_tree_rule, verify_tree

__all__ = ["TreeEngine", "TreeMetrics"]

_UNSET = object()


@dataclass
class TreeMetrics(Metrics):
    """:class:`Metrics` for trees. ``drafted`` counts tree nodes (all scored by the target), ``accepted`` the
    accepted drafted tokens (L of H.1, bonus excluded), so ``block_efficiency`` is E[L] per target call.
    ``reached_per_position[d - 1]`` counts rounds whose walk examined candidates at depth d and
    ``accepted_per_position[d - 1]`` those that accepted one (per-depth acceptance)."""

    max_depth: list[int] = field(default_factory=list)

    def record_tree_round(self, tree: TokenTree, res: TreeVerifyResult) -> None:
        self.rounds += 1
        self.drafted += len(tree)
        self.accepted += res.accepted
        self.per_round.append((len(tree), res.accepted))
        self.max_depth.append(tree.depth)
        reached = res.accepted + (1 if res.rejected else 0)
        while len(self.reached_per_position) < reached:
            self.reached_per_position.append(0)
            self.accepted_per_position.append(0)
        for d in range(reached):
            self.reached_per_position[d] += 1
            if d < res.accepted:
                self.accepted_per_position[d] += 1

    @property
    def target_calls(self) -> int:
        return self.rounds

    @property
    def nodes_per_target_call(self) -> float:
        return self.drafted / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_target_call(self) -> float:
        return self.tokens_per_round

    def to_dict(self, per_round: bool = False) -> dict:
        d = super().to_dict(per_round)
        if not per_round:
            d.pop("max_depth")
        d.update(
            target_calls=self.target_calls,
            nodes_per_target_call=self.nodes_per_target_call,
            tokens_per_target_call=self.tokens_per_target_call,
        )
        return d


class TreeEngine(SpeculativeEngine):
    """Tree drafting + tree verification with a loaded target and draft (reused across requests)."""

    def __init__(
        self,
        target: HFBackend,
        drafter: TreeDrafter | HFBackend,
        tokenizer: object | None = None,
        eos_token_ids: Sequence[int] = (),
    ) -> None:
        if isinstance(drafter, HFBackend):
            drafter = TreeDrafter(drafter)
        super().__init__(target, drafter, tokenizer, eos_token_ids)  # type: ignore[arg-type]
        self.drafter: TreeDrafter = drafter

    @classmethod
    def from_engine(cls, engine: SpeculativeEngine, **drafter_settings: object) -> TreeEngine:
        """A tree engine sharing a chain engine's loaded target, draft model, tokenizer and EOS ids
        (e.g. ``TreeEngine.from_engine(load_engine(), depth=4, top_k=2, budget=None)``)."""
        backend = getattr(engine.drafter, "backend", None)
        if not isinstance(backend, HFBackend):
            raise ValueError("tree drafting needs a draft model (load the engine with drafter='model')")
        return cls(engine.target, TreeDrafter(backend, **drafter_settings), engine.tokenizer, engine.eos_token_ids)

    def generate(  # type: ignore[override]
        self,
        prompt: str | Sequence[int],
        *,
        rule: Rule | str = "lossless",
        sampling: SamplingConfig | None = None,
        depth: int | None = None,
        top_k: int | None = None,
        budget: int | None = _UNSET,  # type: ignore[assignment]
        width: int | None = _UNSET,  # type: ignore[assignment]
        sample: bool | None = None,
        gamma: int | None = None,
        max_new_tokens: int = 128,
        stop: Sequence[str] = (),
        seed: int = 0,
        chat: bool = False,
        typical: TypicalMode = "indicator",
    ) -> GenerationResult:
        """Generate up to ``max_new_tokens`` tokens; stops on EOS ids and ``stop`` strings, never overshooting.

        ``depth`` (``gamma`` is an alias), ``top_k``, ``budget`` (None: static tree; N: dynamic tree of at most
        N nodes), ``width`` and ``sample`` default to the drafter's settings. The tree's depth is capped by the
        tokens still allowed and the context. ``typical`` selects the reading of Eq. 28 (see
        :mod:`verispec.tree`).
        """
        cfg = sampling or SamplingConfig()
        rule = get(rule) if isinstance(rule, str) else rule
        dr = self.drafter
        depth = depth if depth is not None else gamma if gamma is not None else dr.depth
        top_k = dr.top_k if top_k is None else top_k
        budget = dr.budget if budget is _UNSET else budget
        width = dr.width if width is _UNSET else width
        sample = dr.sample if sample is None else sample
        TreeDrafter._check(depth, top_k, budget, width, sample)
        check_tree_rule(rule)
        prompt_ids = self._check_prompt(prompt, chat, max_new_tokens)
        limit = self.target.max_context

        start = time.perf_counter()
        m = TreeMetrics()
        gen = torch.Generator().manual_seed(seed)
        self.target.reset()
        dr.reset()
        st = _Progress(prompt_ids, cfg, self.target.vocab_size)
        counts, ids, new = st.counts, st.ids, st.new
        ctx = DraftContext(cfg=cfg, rule=rule, generator=gen, counts=counts)

        while st.finish is None:
            room = limit - len(ids)
            d = max(min(depth, max_new_tokens - len(new) - 1, room - 1), 0)
            tree = TokenTree()
            if d > 0:
                tree = dr.propose(ids, ctx, depth=d, top_k=top_k, budget=budget, width=width, sample=sample)
                m.draft_s += tree.meta["seconds"]
                m.draft_forward_calls += tree.meta["forward_calls"]

            t0 = time.perf_counter()
            logits = self.target.tree_forward(self.target.sync(ids), tree.tokens, tree.parents)
            t1 = time.perf_counter()

            def dist(node: int, tree: TokenTree = tree, logits: torch.Tensor = logits) -> torch.Tensor:
                rows = None
                if cfg.uses_history:
                    rows = counts.clone()
                    for tok in tree.path_tokens(node):
                        rows[tok] += 1
                return process(logits[node + 1], cfg, rows)

            res = verify_tree(rule, tree, dist, gen, typical)
            self.target.commit_tree(res.path)
            if d > 0:
                dr.commit(tree, res.path)
            t2 = time.perf_counter()
            m.target_s += t1 - t0
            m.verify_s += t2 - t1
            m.record_tree_round(tree, res)

            self._commit(st, res.tokens, stop, max_new_tokens)
        return self._result(st, m, start)
