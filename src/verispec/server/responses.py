"""OpenAI response bodies and stream chunks, plus verispec's ``verispec`` block next to ``usage``.

Non-streamed: ``text_completion`` / ``chat.completion`` objects with one choice, ``usage`` and ``verispec``.
Streamed (server-sent events, ``data: {json}\\n\\n``, then ``data: [DONE]\\n\\n``): a chat stream starts with a
chunk carrying the assistant role; every committed piece of text is one chunk; the last choice chunk has the
``finish_reason``; with ``stream_options.include_usage`` one more chunk follows with ``choices: []`` and
``usage``. The ``verispec`` block rides on the very last chunk (the usage chunk when there is one).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from verispec.core.rules import Rule
from verispec.runtime.details import TokenDetail
from verispec.runtime.types import GenerationResult, TokenLogprob

__all__ = ["LogprobFormatter", "Reply", "detail_entries", "sse", "verispec_block"]


def verispec_block(rule: Rule, gamma: int | str | None, result: GenerationResult,
                   backends: dict[str, str | None] | None = None, verifier: str = "token") -> dict[str, Any]:
    """The rule that ran, the backends that ran it and the request's speculative metrics."""
    m = result.metrics
    return {
        "backends": backends,
        "rule": rule.name,
        "rule_params": {k: v for k, v in rule.params.items()},
        "lossless": rule.lossless,
        "gamma": gamma,
        "verifier": verifier,
        "metrics": {
            "block_efficiency": m.block_efficiency,
            "accepted_fraction": m.accepted_fraction,
            "tokens_per_round": m.tokens_per_round,
            "drafted": m.drafted,
            "accepted": m.accepted,
            "rounds": m.rounds,
            "acceptance_per_position": m.acceptance_per_position,
            "gamma_counts": m.gamma_counts,
            "schedule": m.schedule,
            "budget": m.budget,
        },
        # the engine's own clock (seconds): from the row's start (its prompt tokenized) to its first token and to
        # its end; the target, draft and verification phases as in RequestMetrics (a batched forward counts fully)
        "timings": {
            "time_to_first_token_s": m.time_to_first_token_s,
            "total_s": m.total_s,
            "target_s": m.target_s,
            "draft_s": m.draft_s,
            "verify_s": m.verify_s,
        },
    }


def usage(results: Sequence[GenerationResult]) -> dict[str, int]:
    """Token counts of a response: the prompt once, the completion tokens of every choice."""
    p, c = len(results[0].prompt_ids), sum(len(r.token_ids) for r in results)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def sse(obj: dict[str, Any] | str) -> str:
    """One server-sent event (``[DONE]`` is passed as the string)."""
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n"


class LogprobFormatter:
    """A response's ``logprobs`` objects from the engine's :class:`TokenLogprob` entries, in the OpenAI shapes:
    chat ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}``; completions ``{"tokens",
    "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}``. A token's text is its own decoding
    (a piece of a multi-byte character decodes to U+FFFD; ``bytes`` are its UTF-8). Stream chunks are formatted
    one after another by the same formatter, so the completions' ``text_offset`` runs on across chunks."""

    def __init__(self, chat: bool, decode: Callable[[Sequence[int]], str]) -> None:
        self.chat, self._decode = chat, decode
        self.offset = 0

    def _piece(self, token: int, logprob: float) -> dict[str, Any]:
        text = self._decode([token])
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    def __call__(self, entries: Sequence[TokenLogprob]) -> dict[str, Any]:
        if self.chat:
            return {"content": [{**self._piece(e.token, e.logprob),
                                 "top_logprobs": [self._piece(t, lp) for t, lp in e.top]} for e in entries]}
        tokens = [self._decode([e.token]) for e in entries]
        offsets = []
        for t in tokens:
            offsets.append(self.offset)
            self.offset += len(t)
        # the chosen token is always listed too, so an entry holds up to logprobs + 1 tokens (as OpenAI's does)
        return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
                "top_logprobs": [None if e.logprob is None else
                                 {**{self._decode([t]): lp for t, lp in e.top}, text: e.logprob}
                                 for e, text in zip(entries, tokens, strict=True)], "text_offset": offsets}


def detail_entries(details: Sequence[TokenDetail], pieces: Sequence[str], decode: Callable[[Sequence[int]], str]
                   ) -> list[dict[str, Any]]:
    """A choice's ``token_details`` entries: each token's :class:`~verispec.runtime.details.TokenDetail` as JSON,
    with ``text`` (the piece of the response's text it added: the pieces of a response concatenate to its text,
    with "" for a token whose text is held back or cut by a stop string) and ``top_text`` (each listed token's own
    decoding)."""
    return [{**d.to_dict(), "text": piece, "top_text": [decode([t]) for t in d.top]}
            for d, piece in zip(details, pieces, strict=True)]


@dataclass
class Reply:
    """Builds the bodies of one response: ``chat`` selects chat.completion(.chunk) over text_completion."""

    chat: bool
    model: str
    id: str = field(default="")
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.id:
            self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def choice(self, index: int, text: str | None, finish_reason: str, logprobs: dict[str, Any] | None = None,
               tool_calls: list[dict[str, Any]] | None = None, token_details: list[dict[str, Any]] | None = None
               ) -> dict[str, Any]:
        """One choice of a non-streamed response (chat: with the tool calls read from the answer, if any; with
        ``token_details`` when the request asked for them)."""
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if tool_calls:
                message["tool_calls"] = tool_calls
            out = {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}
        else:
            out = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
        if token_details is not None:
            out["token_details"] = token_details
        return out

    def full(self, choices: list[dict[str, Any]], results: Sequence[GenerationResult], block: dict[str, Any]
             ) -> dict[str, Any]:
        """The non-streamed response: its choices (:meth:`choice`), usage over every choice, the verispec block."""
        body = self._head("chat.completion" if self.chat else "text_completion")
        return {**body, "choices": choices, "usage": usage(results), "verispec": block}

    def chunk(self, text: str | None = None, finish_reason: str | None = None, role: bool = False,
              logprobs: dict[str, Any] | None = None, index: int = 0,
              tool_calls: list[dict[str, Any]] | None = None, token_details: list[dict[str, Any]] | None = None
              ) -> dict[str, Any]:
        """A stream chunk of choice ``index``: a text delta (with its tokens' logprobs and, when asked for, their
        ``token_details``), the opening role (chat), tool calls (chat; each with its ``index`` among the choice's
        calls) or the finish reason."""
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            if tool_calls:
                delta["tool_calls"] = [{"index": k, **call} for k, call in enumerate(tool_calls)]
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
            head = self._head("chat.completion.chunk")
        else:
            choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
            head = self._head("text_completion")
        if token_details:
            choice["token_details"] = token_details
        return {**head, "choices": [choice]}

    def usage_chunk(self, results: Sequence[GenerationResult]) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._head(obj), "choices": [], "usage": usage(results)}
