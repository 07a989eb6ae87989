"""The one speculative decoding loop, for a batch of independent rows: propose -> score -> process -> verify ->
commit / roll back -> stop checks -> metrics.

One round (tutorial sections 2, 5, 6; Appendix H.1 for trees): the drafter proposes, for every row, a chain or
a token tree of at most gamma levels; the target scores each row's uncommitted history plus its proposal in
ONE batched forward, giving p after the root and after every node; the row's rule accepts a root-down path
(chains: the vectorised :func:`~verispec.core.verify.chain.verify_block`; trees: the walk
:func:`~verispec.core.verify.tree.verify_tree`) and adds one correction or bonus token. Target and draft keep the KV of
the committed history and of the accepted path only; the new correction/bonus token gets its KV when it is
fed next round.

Rows are independent: each has its own rule, sampling settings, stop conditions, draft length and random
generator (seeded by the request), so a seeded row's output does not depend on which rows share its batch.
:class:`~verispec.runtime.scheduler.Scheduler` moves rows in and out between rounds; :meth:`Engine.generate` is the
convenience that runs one prompt or a list of prompts to completion through it.
"""

from __future__ import annotations

import inspect
import math
import operator
import time
from collections.abc import Sequence
from typing import Any

import torch

from verispec.backends.base import Backend, ScoreRequest
from verispec.core.constraint import constrain_logits
from verispec.core.rules import Rule, get
from verispec.core.rules.budget import Budget, PerPosition, budgeted, choose, family_of
from verispec.core.rules.lossless import Lossless
from verispec.core.sampling import SamplingConfig, adjust_logits, process
from verispec.core.verify.block import verify_chain_block
from verispec.core.verify.chain import verify_block, verify_greedy, verify_greedy_rule
from verispec.core.verify.hsd import verify_chain_hsd
from verispec.core.verify.tree import TokenTree, check_tree_rule, tree_path, verify_tree
from verispec.defaults import LOGPROB_FLOOR, check_verifier
from verispec.drafters.base import Drafter, DraftRequest, Proposal
from verispec.options import OPTIONS, options
from verispec.runtime.details import TokenDetail, check_token_details, round_details
from verispec.runtime.grammar import GrammarCompiler
from verispec.runtime.scheduler import Scheduler
from verispec.runtime.text import find_stop, tokens_in_text
from verispec.runtime.types import GenerationResult, Metrics, Request, Row, TokenLogprob

__all__ = ["Engine", "GenerationResult", "Metrics", "Request", "SpeculativeEngine"]

#: the verifiers of a whole chain under the lossless law, besides the rule's own token-by-token one
CHAIN_VERIFIERS = {"block": verify_chain_block, "hsd": verify_chain_hsd}


class Engine:
    """Holds a loaded target (and optionally a drafter) and decodes rows with them, one round at a time.

    ``drafter=None`` decodes with the target alone through the same code path (nothing proposed).
    """

    def __init__(
        self,
        target: Backend,
        drafter: Drafter | None = None,
        tokenizer: Any | None = None,
        eos_token_ids: Sequence[int] = (),
    ) -> None:
        self.target = target
        self.drafter = drafter
        self.tokenizer = tokenizer
        self.eos_token_ids = {int(t) for t in eos_token_ids}
        self._next_key = 0
        self._grammar: GrammarCompiler | None = None

    @property
    def backends(self) -> dict[str, str | None]:
        """What runs: the target's backend, the drafter, and the draft model's backend (None: no draft model)."""
        draft = getattr(self.drafter, "backend", None)
        return {"target_backend": getattr(self.target, "name", type(self.target).__name__),
                "drafter": None if self.drafter is None else self.drafter.name,
                "draft_backend": None if draft is None else getattr(draft, "name", type(draft).__name__)}

    @property
    def max_rows(self) -> int | None:
        """The most rows the engine can decode at once: the least of its backends' ``max_rows`` (a llama.cpp
        context's sequences); None where no backend has a limit (transformers)."""
        caps = [getattr(b, "max_rows", None) for b in (self.target, getattr(self.drafter, "backend", None))
                if b is not None]
        known = [int(c) for c in caps if c is not None]
        return min(known) if known else None

    @property
    def proposes_trees(self) -> bool:
        """Whether the drafter proposes token trees (then only tree-safe rules verify)."""
        return bool(getattr(self.drafter, "proposes_trees", False))

    # -- text ------------------------------------------------------------------------------------------------
    def decode(self, ids: Sequence[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def encode(self, prompt: str | Sequence[int], chat: bool = False) -> list[int]:
        """Token ids of a prompt (ids pass through); ``chat`` applies the tokenizer's chat template."""
        if not isinstance(prompt, str):
            try:  # int() would truncate 1.5 to token 1: a prompt of non-integers is refused, not rounded
                items = list(prompt)
                if any(isinstance(t, bool) for t in items):
                    raise TypeError
                return [operator.index(t) for t in items]
            except TypeError:
                raise ValueError("prompt must be text or a list of integer token ids") from None
        if self.tokenizer is None:
            raise ValueError("a text prompt needs a tokenizer")
        if chat:
            msgs = [{"role": "user", "content": prompt}]
            ids = self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
            if hasattr(ids, "keys"):  # a BatchEncoding: transformers 5 returns one by default (return_dict=True)
                ids = ids["input_ids"]
            return [int(t) for t in ids]
        return list(self.tokenizer(prompt)["input_ids"])

    # -- rows ------------------------------------------------------------------------------------------------
    def prepare(self, req: Request) -> tuple[Rule, SamplingConfig, list[int]]:
        """Validate a request without allocating anything: (rule, sampling config, prompt ids); raises
        ValueError naming the problem. A scheduler calls this at submission and :meth:`start` at admission."""
        cfg = req.sampling or SamplingConfig()
        if not isinstance(cfg, SamplingConfig):
            raise ValueError(f"sampling must be a SamplingConfig (e.g. SamplingConfig.of({{...}})), got "
                             f"{type(cfg).__name__}")
        rule = get(req.rule) if isinstance(req.rule, str) else req.rule
        if not isinstance(rule, Rule):
            raise ValueError(f"rule must be a rule name or a Rule, got {type(rule).__name__}")
        for opt in options("request"):  # every request option's type and range: the request schema's words
            if opt.name != "rule":
                value = opt.check(getattr(req, opt.name))
                if opt.name == "stop":
                    req.stop = value or []
        cfg.check_vocab(self.target.vocab_size)
        if self.proposes_trees:
            check_tree_rule(rule)
        check_verifier(req.verifier, rule.lossless, self.proposes_trees)
        if req.logprobs is not None:
            if self.proposes_trees and not rule.lossless and req.logprobs_mode == "emitted" and not cfg.greedy:
                raise ValueError("logprobs of the emitted law under a lossy rule are computed for chains; with a tree "
                                 "drafter ask for logprobs_mode 'target'")
        if req.token_details is not None:
            check_token_details(req.token_details)
            if self.proposes_trees:
                raise ValueError("token_details are reported for chains; the tree drafter proposes trees")
        if req.response_format is not None:
            self.grammar.grammar(req.response_format)  # ValueError naming response_format
        if req.budget is not None:
            self._check_budget(req, rule)
        return rule, cfg, self._check_prompt(req.prompt, req.chat)

    def _check_budget(self, req: Request, rule: Rule) -> Budget:
        """The request's budget, parsed; ValueError naming ``budget`` for a bad one or an unsupported setting."""
        try:
            budget = Budget.parse(req.budget)
            family_of(rule)
        except ValueError as exc:
            raise ValueError(f"budget: {exc}") from None
        if self.proposes_trees:
            raise ValueError("budget: a divergence budget verifies chains; the tree drafter proposes trees")
        assert budget is not None
        return budget

    @property
    def grammar(self) -> GrammarCompiler:
        """The tokenizer's grammar compiler for structured output (built on first use: about a second)."""
        if self._grammar is None:
            self._grammar = GrammarCompiler(self.tokenizer, self.target.vocab_size, sorted(self.eos_token_ids))
        return self._grammar

    def start(self, req: Request, prepared: tuple[Rule, SamplingConfig, list[int]] | None = None) -> Row:
        """Validate a request (unless ``prepared`` by :meth:`prepare`) and allocate its row in the target and the
        drafter: from now on the row takes part in every batched forward until :meth:`release`."""
        rule, cfg, prompt_ids = prepared if prepared is not None else self.prepare(req)
        scored = self.prompt_logprobs(prompt_ids, req.prompt_logprobs) if req.prompt_logprobs is not None else None
        key = self._next_key
        self._next_key += 1
        target_row, drafter = self.target.add_row(), None
        try:
            row = Row(key, req, rule, cfg, prompt_ids, self.target.vocab_size, target_row)
            row.prompt_logprobs = scored
            if req.budget is not None:
                row.budget = self._check_budget(req, rule)
                fam = family_of(rule)
                row.metrics.budget = {"budget": row.budget.to_dict(), "rule": fam.rule, "param": fam.param,
                                      "spent": 0.0, "theta": [], "tv": []}
                if cfg.greedy:
                    # temperature 0: the target's law is a point mass and any other token is at distance 1, so a
                    # budget below 1 leaves no relaxation: verify losslessly (the target's greedy decode)
                    row.rule = Lossless()
            if req.response_format is not None:
                row.constraint = self.grammar.constraint(req.response_format)
            if self.drafter is not None:
                drafter = self.drafter
                drafter.add_row(key, req.gamma)
        except BaseException:
            # a row that never started is never released: free what was allocated, or it rides along in every
            # batched forward from now on (a drafter's add_row may fail half-way: its remove_row takes what it holds)
            if drafter is not None:
                drafter.remove_row(key)
            self.target.remove_row(target_row)
            raise
        return row

    def release(self, row: Row) -> None:
        """Free a row's caches (finished or cancelled); the drafter's are freed even if the target's fail."""
        try:
            self.target.remove_row(row.target_row)
        finally:
            if self.drafter is not None:
                if row.metrics.schedule is None and hasattr(self.drafter, "schedule_summary"):
                    row.metrics.schedule = self.drafter.schedule_summary(row.key)
                self.drafter.remove_row(row.key)

    def result(self, row: Row) -> GenerationResult:
        m = row.metrics
        m.new_tokens = len(row.new)
        m.total_s = time.perf_counter() - row.start
        text = self.decode(row.new)
        n_logprobs = len(row.new)
        if row.stop_at is not None:
            text = text[: row.stop_at]
            n_logprobs = tokens_in_text(self.decode, row.new, row.stop_at)  # none for the stop string's own tokens
        logprobs = row.logprobs[:n_logprobs] if row.logprobs is not None else None
        details = row.details[: len(row.new)] if row.details is not None else None
        return GenerationResult(text, list(row.new), row.finish or "length", m, row.prompt_ids, logprobs=logprobs,
                                prompt_logprobs=row.prompt_logprobs, token_details=details)

    def prompt_logprobs(self, prompt_ids: Sequence[int], top: int = 0, chunk: int = 256) -> list[TokenLogprob]:
        """Each prompt token's log-probability given the tokens before it (None for the first), with ``top``
        alternatives, under the target's own distribution (log-softmax of its logits: temperature 1, no
        processors, as vLLM's prompt logprobs): what log-likelihood evaluation scores. Runs on a row of its own,
        ``chunk`` tokens per forward, and frees it."""
        return self.prompt_logprobs_batch([prompt_ids], top, chunk)[0]

    def prompt_logprobs_batch(self, prompts: Sequence[Sequence[int]], top: int = 0,
                              chunk: int = 256) -> list[list[TokenLogprob]]:
        """:meth:`prompt_logprobs` of several prompts, scored together: one batched target forward per ``chunk``
        tokens of every prompt still unfinished (at most :attr:`max_rows` prompts at a time)."""
        out: list[list[TokenLogprob]] = []
        width = self.max_rows or len(prompts) or 1
        for first in range(0, len(prompts), width):
            out += self._logprobs_rows([[int(t) for t in ids] for ids in prompts[first : first + width]], top, chunk)
        return out

    def _logprobs_rows(self, seqs: list[list[int]], top: int, chunk: int) -> list[list[TokenLogprob]]:
        out = [[TokenLogprob(ids[0], None)] for ids in seqs]
        rows = [self.target.add_row() for _ in seqs]
        try:
            for pos in range(1, max(len(ids) for ids in seqs), chunk):
                live = [i for i, ids in enumerate(seqs) if pos < len(ids)]
                toks = [seqs[i][pos : pos + chunk] for i in live]
                scored = self.target.score([ScoreRequest(rows[i], seqs[i][:pos], t) for i, t in zip(live, toks,
                                                                                                    strict=True)])
                for i, t, logits in zip(live, toks, scored, strict=True):
                    self.target.commit(rows[i], list(range(len(t))))
                    logp = torch.log_softmax(logits[: len(t)].double(), -1).clamp(min=LOGPROB_FLOOR)
                    for j, tok in enumerate(t):
                        alts = []
                        if top:
                            vals, idx = logp[j].topk(min(top, logp.shape[-1]))  # a vocabulary below ``top``
                            alts = [(int(a), float(v)) for v, a in zip(vals, idx, strict=True)]
                        out[i].append(TokenLogprob(tok, float(logp[j, tok]), alts))
        finally:
            for row in rows:
                self.target.remove_row(row)
        return out

    def _check_prompt(self, prompt: str | Sequence[int], chat: bool) -> list[int]:
        """Encode and validate a prompt: not empty, ids in the vocabulary, room left in the context."""
        prompt_ids = self.encode(prompt, chat)
        if not prompt_ids:
            raise ValueError("empty prompt")
        limit = self.target.max_context
        if len(prompt_ids) >= limit:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens leaves no room in the context of {limit} tokens")
        vocab = self.target.vocab_size
        if any(t < 0 or t >= vocab for t in prompt_ids):
            raise ValueError(f"prompt token id out of the vocabulary [0, {vocab})")
        return prompt_ids

    # -- the round -------------------------------------------------------------------------------------------
    def step(self, rows: Sequence[Row]) -> list[list[int]]:
        """One round for every unfinished row; returns the tokens each row committed this round."""
        everyone = list(rows)
        rows = [r for r in everyone if not r.done]
        if not rows:
            return [[] for _ in everyone]
        limit = self.target.max_context
        proposals = [Proposal() for _ in rows]
        draft_s = 0.0
        if self.drafter is not None:
            reqs = []
            for r in rows:
                max_len = max(min(r.request.max_new_tokens - len(r.new) - 1, limit - len(r.ids) - 1), 0)
                untempered = r.cfg.greedy and not r.rule.lossless and r.request.greedy_lossy == "reference"
                reqs.append(DraftRequest(r.key, r.ids, max_len, r.cfg, r.rule, r.generator, r.history, untempered,
                                         r.constraint))
            t0 = time.perf_counter()
            proposals = self.drafter.propose(reqs)
            draft_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        logits = self.target.score(
            [ScoreRequest(r.target_row, r.ids, list(p.tokens), list(p.parents)) for r, p in zip(rows, proposals,
                                                                                                 strict=True)]
        )
        target_s = time.perf_counter() - t0

        out: dict[int, list[int]] = {}
        for r, prop, lg in zip(rows, proposals, logits, strict=True):
            try:
                out[r.key] = self._finish_round(r, prop, lg, draft_s, target_s)
            except Exception as exc:  # e.g. its grammar allows no token: this row fails alone, the others go on
                r.finish, r.failure = "error", exc
        return [out.get(r.key, []) for r in everyone]

    def _finish_round(self, r: Row, prop: Proposal, lg: torch.Tensor, draft_s: float, target_s: float) -> list[int]:
        """Verify one row's proposal against its target logits, commit what it emits; returns the new tokens."""
        t1 = time.perf_counter()
        lg = self._constrain(r, prop, lg.cpu())
        path, emitted, reached = self._verify(r, prop, lg)
        lps = self._logprobs(r, prop, lg, path, emitted) if r.logprobs is not None else None
        dets = self._details(r, prop, lg, path, emitted) if r.details is not None else None
        self.target.commit(r.target_row, path)
        if self.drafter is not None:
            self.drafter.commit(r.key, prop, path)
        verify_s = time.perf_counter() - t1
        before = len(r.new)
        self._commit(r, emitted)
        appended = r.new[before:]
        if r.constraint is not None:
            r.constraint.commit(appended)
        if lps is not None:
            r.logprobs.extend(lps[: len(appended)])  # type: ignore[union-attr]
        if dets is not None:
            r.details.extend(dets[: len(appended)])  # type: ignore[union-attr]
        if r.budget is not None:
            thetas, tvs = r.round_budget or ([], [])
            k = len(appended)
            # 1 where the position was lossless: a bonus token, or no parameter fitted (NaN)
            r.metrics.record_budget([thetas[i] if i < len(thetas) and not math.isnan(thetas[i]) else 1.0
                                     for i in range(k)],
                                    [tvs[i] if i < len(tvs) else 0.0 for i in range(k)])
            r.round_budget = None
        m = r.metrics
        m.draft_s += draft_s
        m.draft_forward_calls += prop.forward_calls
        m.target_s += target_s
        m.verify_s += verify_s
        m.record_round(prop.depth, len(prop), len(path), min(len(path), len(appended)), reached)
        if m.time_to_first_token_s is None and appended:
            m.time_to_first_token_s = time.perf_counter() - r.start
        if self.drafter is not None:
            self.drafter.update(r.key, prop, len(path), target_s)
        return appended

    def _verify(self, r: Row, prop: Proposal, logits: torch.Tensor) -> tuple[list[int], list[int], int]:
        """Apply the row's rule: (accepted path, emitted tokens, depths reached)."""
        if prop.is_chain:
            y = list(prop.tokens)
            y_t = torch.tensor([y], dtype=torch.long)
            hist = r.history.prefixes(y) if r.history is not None else None
            if r.cfg.greedy and r.rule.lossless:
                if r.cfg.adjusts_logits:
                    logits = adjust_logits(logits, r.cfg, hist)
                res = verify_greedy(y_t, logits.argmax(-1).unsqueeze(0))
            elif r.cfg.greedy and r.request.greedy_lossy == "reference":
                p = process(logits, r.cfg.untempered(), hist)
                q = prop.q.unsqueeze(0) if prop.q is not None else None
                res = verify_greedy_rule(r.rule, y_t, p.unsqueeze(0), q)
            else:
                p = process(logits, r.cfg, hist)
                q = prop.q.unsqueeze(0) if prop.q is not None and not r.cfg.greedy else None
                if r.request.verifier in CHAIN_VERIFIERS:
                    # a chain verifier is lossless to the rule's target: p, or p_Theta for the truncation baselines
                    # (q is already the rule's draft law: the drafter applied rule.draft)
                    res = CHAIN_VERIFIERS[r.request.verifier](y_t, q, r.rule.target(p).unsqueeze(0), r.generator)
                elif r.budget is not None and y:
                    res = verify_block(self._budgeted(r, p, prop), y_t, q, p.unsqueeze(0), r.generator)
                else:
                    res = verify_block(r.rule, y_t, q, p.unsqueeze(0), r.generator)
            n = int(res.num_accepted[0])
            return list(range(n)), res.emitted(0), min(len(y), n + 1)
        tree = TokenTree(list(prop.tokens), list(prop.parents), prop.child_q() if not r.cfg.greedy else {})

        def dist(node: int) -> torch.Tensor:
            hist = r.history.extended(tree.path_tokens(node)) if r.history is not None else None
            return process(logits[node + 1], r.cfg, hist)

        res = verify_tree(r.rule, tree, dist, r.generator)
        return res.path, res.tokens, res.accepted + (1 if res.rejected else 0)

    def _budgeted(self, r: Row, p: torch.Tensor, prop: Proposal) -> Rule:
        """The row's family with each drafted position's parameter chosen within the budget (exact TV to the
        processed p; :mod:`verispec.core.rules.budget`); the round's (theta, TV) are kept on the row."""
        budget, fam = r.budget, family_of(r.rule)
        assert budget is not None
        gamma = len(prop.tokens)
        q = _draft_q(prop, p)
        if budget.tv_total is None:
            theta, tv = choose(r.rule, p[:gamma], q, budget.tv)  # type: ignore[arg-type]
        else:
            # an even share of what is left, position by position: position i is reached only after i accepted
            # drafts, which then have spent their distances (Budget.allowance)
            spent = r.metrics.budget["spent"] if r.metrics.budget else 0.0
            left = r.request.max_new_tokens - len(r.new)
            parts = []
            for i in range(gamma):
                eps = budget.allowance(spent, left - i)
                parts.append(choose(r.rule, p[i : i + 1], q[i : i + 1], eps))
                spent += float(parts[-1][1])
            theta, tv = torch.cat([t for t, _ in parts]), torch.cat([v for _, v in parts])
        r.round_budget = (theta.flatten().tolist(), tv.flatten().tolist())
        return PerPosition(fam.rule, theta.reshape(1, gamma, 1), r.rule)

    @staticmethod
    def _constrain(r: Row, prop: Proposal, logits: torch.Tensor) -> torch.Tensor:
        """The row's logits with each position's disallowed tokens at -inf (structured output): position i of a
        chain follows the drafts before it; a tree's root, then node k, follows the path to node k."""
        if r.constraint is None:
            return logits
        tokens = list(prop.tokens)
        if prop.is_chain:
            prefixes = [tokens[:i] for i in range(len(tokens) + 1)]
        else:
            paths = [[]] + [tree_path(list(prop.parents), k) for k in range(len(tokens))]  # type: ignore[arg-type]
            prefixes = [[tokens[n] for n in path] for path in paths]
        masks = [r.constraint.allowed(p) for p in prefixes]
        if any(m is not None and not bool(m.any()) for m in masks):
            # only where the tokenizer cannot write what the grammar requires next (a byte-level one always can)
            raise ValueError("response_format: the grammar allows no token after this output (no token of this "
                             "tokenizer continues it)")
        return constrain_logits(logits, masks)

    def _logprobs(self, r: Row, prop: Proposal, logits: torch.Tensor, path: list[int], emitted: list[int]
                  ) -> list[TokenLogprob]:
        """Each emitted token's log-probability (and the top alternatives) under the distribution it was emitted
        from (``logprobs_mode`` "emitted"): the rule's target law at the bonus position or under a lossless rule;
        the rule's exact induced law ``rule.induced(p, q)`` at a drafted position under a lossy one (q one-hot on a
        token-only draft), i.e. the law of that position's token marginal over the draft. "target": the processed
        target p. At temperature 0 both report p at temperature 1 with the same bias and penalties (the emitted
        law is a point mass). Position i conditions on the committed history plus ``emitted[:i]``."""
        n = len(emitted)
        if n == 0:
            return []
        cfg = r.cfg.untempered() if r.cfg.greedy else r.cfg
        # logits row of each emitted position: a chain's i-th; a tree's root, then the accepted nodes'
        rows = list(range(n)) if prop.is_chain else [0] + [node + 1 for node in path][: n - 1]
        hist = r.history.prefixes(emitted[:-1]) if r.history is not None else None
        p = process(logits[rows], cfg, hist)
        emitted_law = r.request.logprobs_mode == "emitted" and not r.cfg.greedy
        if emitted_law and not r.rule.lossless:
            gamma = len(prop.tokens)
            q_all = _draft_q(prop, p) if gamma else None
            thetas = r.round_budget[0] if r.round_budget is not None else None
            dist = []
            for i in range(n):
                if i < gamma:
                    rule = r.rule if thetas is None else \
                        budgeted(r.rule, torch.tensor(thetas[i], dtype=torch.float64))
                    dist.append(rule.induced(p[i], q_all[i].to(p.dtype)))  # type: ignore[index]
                else:
                    dist.append(r.rule.bonus(p[i]))
            p = torch.stack(dist)
        elif emitted_law:
            p = r.rule.target(p)
        logp = torch.where(p > 0, p.log(), torch.full_like(p, LOGPROB_FLOOR)).clamp(min=LOGPROB_FLOOR)
        k = int(r.request.logprobs or 0)
        out = []
        for i, tok in enumerate(emitted):
            top = []
            if k:
                vals, idx = logp[i].topk(min(k, logp.shape[-1]))
                top = [(int(t), float(v)) for v, t in zip(vals, idx, strict=True)]
            out.append(TokenLogprob(int(tok), float(logp[i, tok]), top))
        return out

    def _details(self, r: Row, prop: Proposal, logits: torch.Tensor, path: list[int], emitted: list[int]
                 ) -> list[TokenDetail]:
        """The round's per-token details (:mod:`verispec.runtime.details`) for a row that asked for them: p as the
        verification saw it (at temperature 0 the untempered p, as logprobs report), q as drafted (one-hot for a
        token-only draft) and each position's rule (a budget's per-position parameter)."""
        n = len(emitted)
        if n == 0:
            return []
        cfg = r.cfg.untempered() if r.cfg.greedy else r.cfg
        hist = r.history.prefixes(emitted[:-1]) if r.history is not None else None
        p = process(logits[:n], cfg, hist).to(torch.float64)
        gamma = len(prop.tokens)
        thetas = r.round_budget[0] if r.round_budget is not None else None
        rules = [r.rule if thetas is None or i >= gamma or math.isnan(thetas[i])
                 else budgeted(r.rule, torch.tensor(thetas[i], dtype=torch.float64)) for i in range(gamma + 1)]
        q = _draft_q(prop, p) if gamma else None
        return round_details(rules, p, q, list(prop.tokens), emitted, len(path), int(r.request.token_details or 0),
                             r.metrics.rounds)

    def _commit(self, r: Row, emitted: Sequence[int]) -> None:
        """Append a round's tokens one by one, stopping at EOS, a stop string, max_new_tokens or the context."""
        stop = r.request.stop
        for tok in emitted:
            r.ids.append(tok)
            r.new.append(tok)
            if r.history is not None:
                r.history.extend([tok])
            if tok in self.eos_token_ids:
                r.finish = "stop"
            elif stop and (hit := find_stop(self.decode(r.new), stop)) is not None:
                r.finish, r.stop_at = "stop", hit
            elif len(r.new) >= r.request.max_new_tokens or len(r.ids) >= self.target.max_context:
                r.finish = "length"
            if r.finish is not None:
                return

    # -- convenience ------------------------------------------------------------------------------------------
    def generate(
        self,
        prompt: str | Sequence[int] | Sequence[str | Sequence[int]],
        *,
        sampling: SamplingConfig | Sequence[SamplingConfig] | None = None,
        batch_size: int | None = None,
        **options: Any,
    ) -> GenerationResult | list[GenerationResult]:
        """Generate for one prompt (returns a result; bad input raises ValueError) or a list of prompts
        (returns a list in the same order; a bad request gets ``finish_reason="error"`` and its ``error``
        message without disturbing the others).

        ``options``: the request schema's options (:data:`verispec.options.OPTIONS`: the "request" ones, e.g.
        ``rule``, ``gamma``, ``max_new_tokens``, ``stop``, ``seed``, ``verifier``, ``logprobs``, ``budget``, and
        the "sampling" ones, e.g. ``temperature``, ``top_p``, which build a SamplingConfig; pass either those or
        ``sampling``). A scalar setting applies to every prompt; a list of the same length as the prompts gives
        per-row values (``stop``: a list of lists). Rows run ``batch_size`` at a time (default: all, up to
        :attr:`max_rows`), joining and leaving between rounds. Stops on EOS ids and ``stop`` strings, never
        overshooting ``max_new_tokens``.
        """
        single = isinstance(prompt, str) or len(prompt) == 0 or not isinstance(prompt[0], str | list | tuple)  # type: ignore[index]
        prompts = [prompt] if single else list(prompt)  # type: ignore[list-item]
        n = len(prompts)
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise TypeError(f"generate() got an unexpected keyword argument {unknown[0]!r}")
        sampling_opts = {k: v for k, v in options.items() if OPTIONS[k].group == "sampling"}
        if sampling_opts and sampling is not None:
            raise ValueError(f"give sampling or {', '.join(sampling_opts)}, not both")
        if sampling_opts:
            rows = {k: _per_row(k, v, n) for k, v in sampling_opts.items()}
            sampling = [SamplingConfig.of({k: v[i] for k, v in rows.items()}) for i in range(n)]
        settings = {"sampling": _per_row("sampling", sampling, n)}
        for k, v in options.items():
            if OPTIONS[k].group == "request":
                settings[k] = _per_row_stop(v, n) if k == "stop" else _per_row(k, v, n)
        requests = [Request(prompts[i], **{k: v[i] for k, v in settings.items()}) for i in range(n)]
        if single:
            sched = Scheduler(self, max_batch=1)
            handle = sched.submit(requests[0])  # raises on bad input
            sched.run()
            if handle.failure is not None:
                raise handle.failure  # one prompt: what failed it (its start or its row) is raised, as bad input is
            return handle.result  # type: ignore[return-value]
        sched = Scheduler(self, max_batch=batch_size or max(min(n, self.max_rows or n), 1))
        handles = []
        for req in requests:
            try:
                handles.append(sched.submit(req))
            except ValueError as exc:
                handles.append(str(exc))
        sched.run()
        return [
            h.result if not isinstance(h, str) else GenerationResult("", [], "error", Metrics(), [], error=h)
            for h in handles
        ]


def _generate_signature() -> inspect.Signature:
    """:meth:`Engine.generate`'s signature: the prompt, ``sampling`` and ``batch_size``, then every option of the
    request schema with its default (made from :data:`verispec.options.OPTIONS`)."""
    own = [p for p in inspect.signature(Engine.generate).parameters.values() if p.kind is not p.VAR_KEYWORD]
    schema = [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=o.default) for o in OPTIONS.values()]
    return inspect.Signature(own + schema, return_annotation="GenerationResult | list[GenerationResult]")


Engine.generate.__signature__ = _generate_signature()  # type: ignore[attr-defined]


def _draft_q(prop: Proposal, p: torch.Tensor) -> torch.Tensor:
    """[gamma, V] float64: the chain's draft distributions, one-hot on the drafted tokens of a token-only draft."""
    if prop.q is not None:
        return prop.q.to(torch.float64)
    return torch.nn.functional.one_hot(torch.tensor(list(prop.tokens)), p.shape[-1]).to(torch.float64)


def _per_row(name: str, value: object, n: int) -> list:
    """One value per prompt: a list or tuple of ``n`` values is per row (a mapping, a stop string or a scalar
    applies to every row)."""
    if isinstance(value, list | tuple) and not (name == "stop"):
        if len(value) != n:
            raise ValueError(f"{name} has {len(value)} values for {n} prompts")
        return list(value)
    return [value] * n


def _per_row_stop(stop: str | Sequence[str] | Sequence[Sequence[str]] | None, n: int) -> list:
    """Stop strings per prompt: a string or a list of strings for every row, a list of ``n`` lists per row."""
    if stop and not isinstance(stop, str) and all(isinstance(s, list | tuple) for s in stop):
        if len(stop) != n:
            raise ValueError(f"stop has {len(stop)} lists for {n} prompts")
        return [list(s) for s in stop]
    return [stop] * n


#: the name the chain loop had before chains and trees shared one engine
SpeculativeEngine = Engine
