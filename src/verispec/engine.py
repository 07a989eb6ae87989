"""The speculative decoding loop: draft -> score -> process -> verify -> commit / roll back -> stop checks.

One round (tutorial sections 2, 5, 6): the drafter proposes up to gamma tokens; the target scores the
uncommitted history plus the drafts in ONE forward pass, giving p_1..p_{gamma+1}; the rule accepts a prefix
and adds one correction or bonus token. The target's cache keeps the KV of the committed history and of the
accepted drafts only; the new correction/bonus token gets its KV when it is fed next round. The draft's
cache is rolled back to the committed history the same way (see ``HFBackend.sync``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch

from .backends.hf import HFBackend
from .drafters.base import Draft, DraftContext, Drafter
from .processors import SamplingConfig, apply_penalties, history_counts, process
from .rules import Rule, get
from .schedule import AdaptiveGamma
from .verify import verify_block, verify_greedy

__all__ = ["GenerationResult", "Metrics", "SpeculativeEngine"]


@dataclass
class Metrics:
    """Per-request counters.

    ``block_efficiency`` is the paper's BE: accepted drafted tokens per target step (bonus excluded).
    ``tokens_per_round`` includes the correction/bonus token. ``acceptance_per_position[i]`` is the fraction of
    rounds that reached draft position i and accepted it.
    """

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    new_tokens: int = 0
    reached_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    per_round: list[tuple[int, int]] = field(default_factory=list)  # (drafted, accepted) per round
    draft_s: float = 0.0
    target_s: float = 0.0
    verify_s: float = 0.0
    total_s: float = 0.0
    draft_forward_calls: int = 0

    def record_round(self, drafted: int, accepted: int) -> None:
        self.rounds += 1
        self.drafted += drafted
        self.accepted += accepted
        self.per_round.append((drafted, accepted))
        while len(self.reached_per_position) < drafted:
            self.reached_per_position.append(0)
            self.accepted_per_position.append(0)
        for i in range(min(drafted, accepted + 1)):
            self.reached_per_position[i] += 1
            if i < accepted:
                self.accepted_per_position[i] += 1

    @property
    def block_efficiency(self) -> float:
        return self.accepted / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_round(self) -> float:
        return self.new_tokens / self.rounds if self.rounds else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def acceptance_per_position(self) -> list[float]:
        return [a / r if r else 0.0 for a, r in zip(self.accepted_per_position, self.reached_per_position, strict=True)]

    @property
    def other_s(self) -> float:
        return max(self.total_s - self.draft_s - self.target_s - self.verify_s, 0.0)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.total_s if self.total_s > 0 else 0.0

    def to_dict(self, per_round: bool = False) -> dict:
        d = asdict(self)
        if not per_round:
            d.pop("per_round")
        d.update(
            block_efficiency=self.block_efficiency,
            tokens_per_round=self.tokens_per_round,
            acceptance_rate=self.acceptance_rate,
            acceptance_per_position=self.acceptance_per_position,
            other_s=self.other_s,
            tokens_per_s=self.tokens_per_s,
        )
        return d


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str
    metrics: Metrics
    prompt_ids: list[int] = field(default_factory=list)

    def to_dict(self, per_round: bool = False) -> dict:
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "metrics": self.metrics.to_dict(per_round),
        }


class _Progress:
    """The committed state of one request: ids (prompt + output), the output, token counts, how it ended."""

    def __init__(self, prompt_ids: list[int], cfg: SamplingConfig, vocab: int) -> None:
        self.prompt_ids, self.cfg = prompt_ids, cfg
        self.ids, self.new = list(prompt_ids), []
        self.counts = torch.zeros(vocab, dtype=torch.long)
        if cfg.uses_history:
            self.counts.index_add_(0, torch.tensor(prompt_ids), torch.ones(len(prompt_ids), dtype=torch.long))
        self.finish: str | None = None
        self.stop_at: int | None = None


class SpeculativeEngine:
    """Holds a loaded target (and optionally a drafter) for reuse across requests.

    ``drafter=None`` decodes with the target alone through the same code path (gamma = 0 every round).
    """

    def __init__(
        self,
        target: HFBackend,
        drafter: Drafter | None = None,
        tokenizer: object | None = None,
        eos_token_ids: Sequence[int] = (),
    ) -> None:
        self.target = target
        self.drafter = drafter
        self.tokenizer = tokenizer
        self.eos_token_ids = set(int(t) for t in eos_token_ids)

    # -- helpers -------------------------------------------------------------------------------------------
    def _decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def encode(self, prompt: str | Sequence[int], chat: bool = False) -> list[int]:
        """Token ids of a prompt (ids pass through); ``chat`` applies the tokenizer's chat template."""
        if not isinstance(prompt, str):
            return [int(t) for t in prompt]
        if self.tokenizer is None:
            raise ValueError("a text prompt needs a tokenizer")
        if chat:
            msgs = [{"role": "user", "content": prompt}]
            return list(self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True))
        return list(self.tokenizer(prompt)["input_ids"])

    # -- the loop ------------------------------------------------------------------------------------------
    def generate(
        self,
        prompt: str | Sequence[int],
        *,
        rule: Rule | str = "lossless",
        sampling: SamplingConfig | None = None,
        gamma: int | str = 5,
        max_new_tokens: int = 128,
        stop: Sequence[str] = (),
        seed: int = 0,
        chat: bool = False,
        gamma_max: int = 8,
    ) -> GenerationResult:
        """Generate up to ``max_new_tokens`` tokens; stops on EOS ids and ``stop`` strings, never overshooting.

        ``gamma="auto"`` picks the draft length each round (up to ``gamma_max``) from measured acceptance and
        costs (:class:`~verispec.schedule.AdaptiveGamma`).
        """
        cfg = sampling or SamplingConfig()
        rule = get(rule) if isinstance(rule, str) else rule
        schedule = AdaptiveGamma(gamma_max) if gamma == "auto" else None
        if schedule is None and (not isinstance(gamma, int) or gamma < 0):
            raise ValueError(f"gamma must be an integer >= 0 or 'auto', got {gamma!r}")
        prompt_ids = self._check_prompt(prompt, chat, max_new_tokens)
        limit = self.target.max_context
        start = time.perf_counter()
        m = Metrics()
        gen = torch.Generator().manual_seed(seed)
        self.target.reset()
        if self.drafter is not None:
            self.drafter.reset()
        st = _Progress(prompt_ids, cfg, self.target.vocab_size)
        counts, ids, new = st.counts, st.ids, st.new
        ctx = DraftContext(cfg=cfg, rule=rule, generator=gen, counts=counts)
        greedy_path = cfg.greedy and rule.lossless

        while st.finish is None:
            room = limit - len(ids)
            wanted = schedule.choose() if schedule is not None else gamma
            g = max(min(wanted, max_new_tokens - len(new) - 1, room - 1), 0)
            draft = Draft([])
            if self.drafter is not None and g > 0:
                draft = self.drafter.propose(ids, g, ctx)
                m.draft_s += draft.seconds
                m.draft_forward_calls += draft.forward_calls
            y = draft.tokens[:g]

            t0 = time.perf_counter()
            logits = self.target.extend(self.target.sync(ids) + y, len(y) + 1)
            t1 = time.perf_counter()
            y_t = torch.tensor([y], dtype=torch.long)
            rows = history_counts(counts, y_t[0]) if cfg.uses_history else None
            if greedy_path:
                if rows is not None:
                    logits = apply_penalties(logits, rows.to(logits.device), cfg)
                res = verify_greedy(y_t, logits.argmax(-1, keepdim=False).unsqueeze(0))
            else:
                p = process(logits, cfg, rows)
                q = draft.q[: len(y)].unsqueeze(0) if draft.q is not None else None
                res = verify_block(rule, y_t, q, p.unsqueeze(0), gen)
            n = int(res.num_accepted[0])
            emitted = res.emitted(0)
            # KV kept: committed history + accepted drafts; the new last token is fed next round.
            self.target.truncate(len(ids) + n)
            t2 = time.perf_counter()
            m.target_s += t1 - t0
            m.verify_s += t2 - t1
            m.record_round(len(y), n)
            if schedule is not None:
                schedule.update(len(y), n, draft.seconds, t1 - t0)

            self._commit(st, emitted, stop, max_new_tokens)
        return self._result(st, m, start)

    # -- pieces shared with the tree loop ------------------------------------------------------------------
    def _check_prompt(self, prompt: str | Sequence[int], chat: bool, max_new_tokens: int) -> list[int]:
        """Encode and validate a prompt: not empty, ids in the vocabulary, room left in the context."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
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

    def _commit(self, st: _Progress, emitted: Sequence[int], stop: Sequence[str], max_new_tokens: int) -> None:
        """Append a round's tokens one by one, stopping at EOS, a stop string, max_new_tokens or the context."""
        for tok in emitted:
            st.ids.append(tok)
            st.new.append(tok)
            if st.cfg.uses_history:
                st.counts[tok] += 1
            if tok in self.eos_token_ids:
                st.finish = "stop"
            elif stop and (hit := self._find_stop(st.new, stop)) is not None:
                st.finish, st.stop_at = "stop", hit
            elif len(st.new) >= max_new_tokens or len(st.ids) >= self.target.max_context:
                st.finish = "length"
            if st.finish is not None:
                return

    def _result(self, st: _Progress, m: Metrics, start: float) -> GenerationResult:
        m.new_tokens = len(st.new)
        m.total_s = time.perf_counter() - start
        text = self._decode(st.new)
        if st.stop_at is not None:
            text = text[: st.stop_at]
        return GenerationResult(text, st.new, st.finish or "length", m, st.prompt_ids)

    def _find_stop(self, new: list[int], stop: Sequence[str]) -> int | None:
        """Index in the decoded output where the earliest stop string begins, or None."""
        text = self._decode(new)
        hits = [i for s in stop if s and (i := text.find(s)) >= 0]
        return min(hits) if hits else None
