"""What a request is and what it gives back: :class:`Request` (one generation's settings), :class:`Row` (its state
while it is decoded), :class:`Metrics` (per-request counters) and :class:`GenerationResult`. Shared by the engine,
the scheduler, the server and the harness, so none of them needs another to name these."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, make_dataclass

import torch

from verispec.core.constraint import Constraint
from verispec.core.rules import Rule
from verispec.core.rules.budget import Budget
from verispec.core.sampling import History, SamplingConfig
from verispec.options import OPTIONS, options
from verispec.runtime.details import TokenDetail

__all__ = ["GenerationResult", "Metrics", "Request", "Row", "TokenLogprob"]


@dataclass
class TokenLogprob:
    """One emitted token's log-probability and the ``top`` most probable alternatives, as (id, logprob), under
    the distribution named by the request's ``logprobs_mode`` (see :data:`verispec.defaults.LOGPROBS_MODES`).
    ``logprob`` is None for a prompt's first token, which nothing predicts."""

    token: int
    logprob: float | None
    top: list[tuple[int, float]] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"token": self.token, "logprob": self.logprob, "top": [list(t) for t in self.top]}


@dataclass
class Metrics:
    """Per-request counters, with the same meaning for chains and trees.

    ``drafted``: drafted tokens, i.e. the proposal depth summed over rounds (a chain's length; a tree's longest
    path: the most tokens a round could accept). ``proposed_nodes``: nodes scored by the target (equal to
    ``drafted`` for chains). ``accepted``: accepted drafted tokens; ``emitted_accepted``: those that were also
    emitted (not cut by EOS, a stop string, max_new_tokens or the context). ``block_efficiency`` is the
    paper's BE: emitted accepted drafted tokens per target step (bonus excluded). ``accepted_fraction`` =
    accepted / drafted (not the tutorial's acceptance A = sum_x min(p, q), which needs p and q: see the
    estimator). ``acceptance_per_position[i]``: of the rounds whose verification reached depth i + 1, the
    fraction that accepted a token there. Time: the wall time of the shared phases (a batched forward counts
    fully for every row it served) and of the row's own verification.
    """

    rounds: int = 0
    drafted: int = 0
    proposed_nodes: int = 0
    accepted: int = 0
    emitted_accepted: int = 0
    new_tokens: int = 0
    reached_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    per_round: list[tuple[int, int]] = field(default_factory=list)  # (drafted, accepted) per round
    per_round_nodes: list[int] = field(default_factory=list)
    per_round_emitted: list[int] = field(default_factory=list)  # emitted accepted drafts per round
    draft_s: float = 0.0
    target_s: float = 0.0
    verify_s: float = 0.0
    total_s: float = 0.0
    draft_forward_calls: int = 0
    time_to_first_token_s: float | None = None
    #: ``gamma="auto"``: the schedule's final beliefs (acceptance, draft and block costs, probes) when the row ended
    schedule: dict | None = None
    #: a divergence budget: what was asked, the family's parameter name, the spent TV (sum over the emitted
    #: positions) and, per emitted token, the parameter it was verified with (1: lossless, a bonus token or no
    #: parameter fitted) and its position's exact TV to the target
    budget: dict | None = None

    def record_budget(self, thetas: Sequence[float], tvs: Sequence[float]) -> None:
        """Append emitted positions' parameters and distances (the budget must have been started)."""
        b = self.budget
        assert b is not None
        b["theta"].extend(thetas)
        b["tv"].extend(tvs)
        b["spent"] = b["spent"] + float(sum(tvs))

    def record_round(self, drafted: int, nodes: int, accepted: int, emitted_accepted: int, reached: int) -> None:
        """One verified round: ``reached`` = depths the verification examined (accepted, +1 on a rejection)."""
        self.rounds += 1
        self.drafted += drafted
        self.proposed_nodes += nodes
        self.accepted += accepted
        self.emitted_accepted += emitted_accepted
        self.per_round.append((drafted, accepted))
        self.per_round_nodes.append(nodes)
        self.per_round_emitted.append(emitted_accepted)
        while len(self.reached_per_position) < reached:
            self.reached_per_position.append(0)
            self.accepted_per_position.append(0)
        for i in range(reached):
            self.reached_per_position[i] += 1
            if i < accepted:
                self.accepted_per_position[i] += 1

    @property
    def block_efficiency(self) -> float:
        return self.emitted_accepted / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_round(self) -> float:
        return self.new_tokens / self.rounds if self.rounds else 0.0

    @property
    def accepted_fraction(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def nodes_per_round(self) -> float:
        return self.proposed_nodes / self.rounds if self.rounds else 0.0

    @property
    def acceptance_per_position(self) -> list[float]:
        return [a / r if r else 0.0 for a, r in zip(self.accepted_per_position, self.reached_per_position, strict=True)]

    @property
    def other_s(self) -> float:
        return max(self.total_s - self.draft_s - self.target_s - self.verify_s, 0.0)

    @property
    def gamma_counts(self) -> dict[int, int]:
        """How many rounds drafted each depth (0: a plain round), the gamma the schedule chose per round."""
        out: dict[int, int] = {}
        for drafted, _ in self.per_round:
            out[drafted] = out.get(drafted, 0) + 1
        return dict(sorted(out.items()))

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.total_s if self.total_s > 0 else 0.0

    def to_dict(self, per_round: bool = False) -> dict:
        d = asdict(self)
        if not per_round:
            for k in ("per_round", "per_round_nodes", "per_round_emitted"):
                d.pop(k)
        d.update(
            block_efficiency=self.block_efficiency,
            tokens_per_round=self.tokens_per_round,
            accepted_fraction=self.accepted_fraction,
            nodes_per_round=self.nodes_per_round,
            acceptance_per_position=self.acceptance_per_position,
            gamma_counts=self.gamma_counts,
            other_s=self.other_s,
            tokens_per_s=self.tokens_per_s,
        )
        return d


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop", "length", or "error" (a request of a batch that was refused; see ``error``)
    metrics: Metrics
    prompt_ids: list[int] = field(default_factory=list)
    error: str | None = None
    #: per generated token, when the request asked for ``logprobs``
    logprobs: list[TokenLogprob] | None = None
    #: per prompt token (the first one's logprob None: nothing predicts it), when the request asked for them
    prompt_logprobs: list[TokenLogprob] | None = None
    #: per generated token, when the request asked for ``token_details`` (:mod:`verispec.runtime.details`)
    token_details: list[TokenDetail] | None = None

    def to_dict(self, per_round: bool = False) -> dict:
        d = {
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "metrics": self.metrics.to_dict(per_round),
        }
        if self.error is not None:
            d["error"] = self.error
        if self.logprobs is not None:
            d["logprobs"] = [t.to_dict() for t in self.logprobs]
        if self.prompt_logprobs is not None:
            d["prompt_logprobs"] = [t.to_dict() for t in self.prompt_logprobs]
        if self.token_details is not None:
            d["token_details"] = [t.to_dict() for t in self.token_details]
        return d


def _request_class() -> type:
    """:class:`Request`, derived from the request schema (:data:`verispec.options.OPTIONS`): the prompt, the rule
    (a name or a :class:`~verispec.core.rules.Rule`), the sampling settings (a
    :class:`~verispec.core.sampling.SamplingConfig`, the schema's "sampling" options) and every "request" option
    with its declared default."""
    fields: list[tuple] = [("prompt", "str | Sequence[int]"),
                           ("rule", "Rule | str", field(default=OPTIONS["rule"].default)),
                           ("sampling", "SamplingConfig | None", field(default=None))]
    for o in options("request"):
        if o.name == "rule":
            continue
        default = field(default_factory=lambda d=o.default: list(d)) if isinstance(o.default, list | tuple) \
            else field(default=o.default)
        fields.append((o.name, "Any", default))
    doc = ("What one generation asks for: ``prompt`` (text or token ids), ``rule`` (a name or a Rule), "
           "``sampling`` (a SamplingConfig; None: its defaults) and the request options of "
           ":data:`verispec.options.OPTIONS`:\n\n" + "\n".join(f"- ``{o.name}`` (default {o.default!r}): {o.help}"
                                                                  for o in options("request") if o.name != "rule"))
    cls = make_dataclass("Request", fields, namespace={"__doc__": doc, "__module__": __name__})
    return cls


#: one generation's settings; its fields are the request schema's (see :func:`_request_class`)
Request = _request_class()


class Row:
    """The state of one request being decoded: its settings, committed ids, history, generator, metrics."""

    def __init__(self, key: int, req: Request, rule: Rule, cfg: SamplingConfig, prompt_ids: list[int],
                 vocab: int, target_row: int) -> None:
        self.key, self.request, self.rule, self.cfg = key, req, rule, cfg
        self.prompt_ids = prompt_ids
        self.ids, self.new = list(prompt_ids), []
        self.history = History.of(prompt_ids, [], vocab) if cfg.uses_history else None
        self.generator = torch.Generator().manual_seed(int(req.seed))
        self.target_row = target_row
        self.finish: str | None = None
        #: what failed this row alone in a round (finish "error"; the scheduler reports it on the row's handle)
        self.failure: Exception | None = None
        self.stop_at: int | None = None
        self.metrics = Metrics()
        self.start = time.perf_counter()
        self.logprobs: list[TokenLogprob] | None = [] if req.logprobs is not None else None
        self.prompt_logprobs: list[TokenLogprob] | None = None
        self.details: list[TokenDetail] | None = [] if req.token_details is not None else None
        self.constraint: Constraint | None = None
        self.budget: Budget | None = None
        #: this round's (theta, TV) per drafted position under a budget, set by the verification
        self.round_budget: tuple[list[float], list[float]] | None = None

    @property
    def done(self) -> bool:
        return self.finish is not None
