"""Structured output through llguidance: JSON Schema, any JSON object, regular expressions and Lark grammars.

Why llguidance: MIT licence; a small wheel with no dependency (no torch pin to fight, unlike xgrammar); masks
computed on the fly by an Earley parser over a token trie, about 50 microseconds per mask on a 128k vocabulary
(so a speculative round's gamma + 1 masks cost far less than its forward); one matcher covers JSON Schema,
``json_object``, regex and context-free (Lark) grammars; and it rolls back, which a speculative verifier needs
(a matcher is advanced along a candidate prefix, asked for its mask, and rolled back).

:class:`GrammarCompiler` wraps the tokenizer once per engine; :meth:`GrammarCompiler.constraint` turns a
``response_format`` into a :class:`GrammarConstraint`, the :class:`verispec.core.constraint.Constraint` of one row.
Formats (the OpenAI shapes plus two extensions):

- ``{"type": "text"}``: no constraint;
- ``{"type": "json_object"}``: any JSON object;
- ``{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}``;
- ``{"type": "regex", "regex": "..."}`` and ``{"type": "grammar", "grammar": "<Lark grammar>"}``.

End tokens: the engine's end-of-sequence ids are the grammar's end tokens, allowed exactly where the grammar may
end; a grammar that cannot go on allows only them. A grammar the library cannot compile, or one that no token of
the tokenizer can start, is a ValueError naming ``response_format``; a row whose grammar later allows no token (the
tokenizer cannot write what it requires next) fails alone with such an error.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["CACHED", "GrammarCompiler", "GrammarConstraint", "RESPONSE_FORMATS", "check_response_format"]

#: the ``response_format`` types understood here
RESPONSE_FORMATS = ("text", "json_object", "json_schema", "regex", "grammar")
#: validated grammars kept per compiler (least recently used dropped first)
CACHED = 64


def check_response_format(fmt: Mapping[str, Any] | None) -> None:
    """ValueError naming the problem with a ``response_format``'s shape (not its grammar: see
    :meth:`GrammarCompiler.grammar`)."""
    if fmt is None:
        return
    if not isinstance(fmt, Mapping):
        raise ValueError(f"response_format must be an object, got {type(fmt).__name__}")
    kind = fmt.get("type")
    if kind not in RESPONSE_FORMATS:
        raise ValueError(f"response_format.type must be one of {', '.join(RESPONSE_FORMATS)}, got {kind!r}")
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, Mapping) or not isinstance(spec.get("schema", {}), Mapping):
            raise ValueError("response_format.json_schema must be an object with a 'schema' object")
    if kind in ("regex", "grammar") and not isinstance(fmt.get(kind), str):
        raise ValueError(f"response_format.{kind} must be a string")


def _error(matcher: Any) -> str:
    """A matcher's error, its first line (llguidance appends a dump of the parser's state)."""
    return str(matcher.get_error()).strip().split("\n", 1)[0]


class _TokenList:
    """The token strings of a tokenizer that is not a Hugging Face fast one (llguidance's TokenizerWrapper)."""

    def __init__(self, tokens: Sequence[bytes], eos: int, encode: Any) -> None:
        self.tokens, self.eos_token_id, self.bos_token_id = list(tokens), eos, None
        self.special_token_ids: list[int] = []
        self._encode = encode

    def __call__(self, text: str | bytes) -> list[int]:
        return list(self._encode(text.decode("utf-8", "replace") if isinstance(text, bytes) else text))


class GrammarCompiler:
    """One tokenizer's grammar support: compiles ``response_format`` objects into row constraints.

    ``tokenizer``: a Hugging Face fast tokenizer, or any object with ``token_bytes()`` (the bytes of every id)
    and ``encode``; ``vocab_size``: the model's (ids past the tokenizer's are never allowed); ``eos_ids``: the
    engine's end tokens (for a tokenizer-less toy, the tokenizer's ``grammar_end_id``).
    """

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: Sequence[int]) -> None:
        try:
            import llguidance
        except ImportError as exc:  # a declared dependency; this is for a broken install
            raise ImportError("structured output needs llguidance (pip install llguidance)") from exc
        self._ll = llguidance
        self._grammars: OrderedDict[str, str | None] = OrderedDict()
        self.vocab_size = vocab_size
        eos = [int(t) for t in eos_ids] or [int(getattr(tokenizer, "grammar_end_id", vocab_size - 1))]
        self.eos_ids = eos
        if hasattr(tokenizer, "backend_tokenizer"):
            import llguidance.hf

            self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=eos)
        elif hasattr(tokenizer, "token_bytes"):
            wrapper = llguidance.TokenizerWrapper(_TokenList(tokenizer.token_bytes(), eos[0], tokenizer.encode))
            self.tokenizer = llguidance.LLTokenizer(wrapper, n_vocab=vocab_size, eos_token=eos)
        else:
            raise ValueError(f"structured output needs a Hugging Face fast tokenizer; {type(tokenizer).__name__} "
                             "is not one")

    def grammar(self, fmt: Mapping[str, Any]) -> str | None:
        """llguidance's grammar for a ``response_format`` (None for text); ValueError naming what is wrong.
        Validated grammars are kept (the last :data:`CACHED` formats), so a schema sent again compiles once."""
        check_response_format(fmt)
        try:
            key = json.dumps(fmt, sort_keys=True)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"response_format is not JSON: {exc}") from None
        if key in self._grammars:
            self._grammars.move_to_end(key)
            return self._grammars[key]
        grammar = self._compile(fmt)
        self._grammars[key] = grammar
        if len(self._grammars) > CACHED:
            self._grammars.popitem(last=False)
        return grammar

    def _compile(self, fmt: Mapping[str, Any]) -> str | None:
        m, kind = self._ll.LLMatcher, fmt["type"]
        try:
            if kind == "text":
                return None
            if kind == "json_object":
                grammar = m.grammar_from_json_schema({"type": "object"})
            elif kind == "json_schema":
                grammar = m.grammar_from_json_schema(json.dumps(fmt["json_schema"].get("schema", {})))
            elif kind == "regex":
                grammar = m.grammar_from_regex(fmt["regex"])
            else:
                grammar = m.grammar_from_lark(fmt["grammar"])
        except (ValueError, TypeError) as exc:
            raise ValueError(f"response_format: {exc}") from None
        is_error, messages = m.validate_grammar_with_warnings(grammar, self.tokenizer)
        if is_error:
            raise ValueError(f"response_format: the grammar does not compile: {messages[0]}")
        # a grammar whose first mask is empty (no text of this tokenizer's tokens starts it, and it cannot end at
        # once) would leave nothing to sample: refused here rather than failing mid-generation
        start = self._ll.LLMatcher(self.tokenizer, grammar, log_level=0)
        if start.is_error():
            raise ValueError(f"response_format: {_error(start)}")
        if not bool(GrammarConstraint(start, self.vocab_size, self.eos_ids).allowed([]).any()):
            raise ValueError("response_format: no text matches it (no token of this tokenizer can start it)")
        return grammar

    def literal(self, text: str) -> str:
        """A Lark expression matching ``text`` as this tokenizer writes it: the token lexeme ``<[id]>`` where ``text``
        is one token that llguidance holds special, else the string literal. llguidance (1.7.6 and 1.9.1 alike) holds
        every added token of a Hugging Face tokenizer special, Qwen2.5's ``<tool_call>`` among them, and matches no
        string literal against one: its mask offers the token for the literal, then its parser refuses the token.
        A tokenizer given as a list of token strings (the toy's) declares no special token and gets the literal."""
        ids = self.tokenizer.tokenize_str(text)
        if len(ids) == 1 and self.tokenizer.is_special_token(ids[0]):
            return f"<[{ids[0]}]>"
        return json.dumps(text)

    def constraint(self, fmt: Mapping[str, Any] | None) -> GrammarConstraint | None:
        """A fresh row constraint for ``fmt`` (None for no format or text)."""
        grammar = self.grammar(fmt) if fmt is not None else None
        if grammar is None:
            return None
        matcher = self._ll.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(f"response_format: {_error(matcher)}")
        return GrammarConstraint(matcher, self.vocab_size, self.eos_ids)


class GrammarConstraint:
    """One row's grammar state (see :class:`verispec.core.constraint.Constraint`). Masks are cached per prefix
    until the next :meth:`commit`, so the drafter's and the verifier's masks of one round are computed once."""

    def __init__(self, matcher: Any, vocab_size: int, eos_ids: Sequence[int]) -> None:
        self.matcher, self.vocab_size = matcher, vocab_size
        self.eos = torch.tensor(sorted(set(eos_ids)), dtype=torch.long)
        self._eos_set = {int(t) for t in eos_ids}
        self._cache: dict[tuple[int, ...], torch.Tensor | None] = {}
        self.ended = False  # an end token was emitted

    def _mask(self) -> torch.Tensor:
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        mask = torch.from_numpy(np.unpackbits(bits, bitorder="little")[: self.vocab_size].astype(bool))
        if mask.numel() < self.vocab_size:
            mask = torch.cat([mask, torch.zeros(self.vocab_size - mask.numel(), dtype=torch.bool)])
        mask[self.eos] = bool(self.matcher.is_accepting())
        return mask

    def allowed(self, prefix: Sequence[int]) -> torch.Tensor | None:
        key = tuple(int(t) for t in prefix)
        if key in self._cache:
            return self._cache[key]
        eos = self._eos_set
        end = next((i for i, t in enumerate(key) if t in eos), None)
        body = key if end is None else key[:end]
        if self.ended and end is None:
            end = 0
        if self.matcher.validate_tokens(list(body)) < len(body):
            out = None  # unreachable: a disallowed token is never drafted nor emitted
        elif end is not None:  # past an end token only end tokens follow (for engines that do not stop there)
            out = torch.zeros(self.vocab_size, dtype=torch.bool)
            out[self.eos] = True
        else:
            if body and not self.matcher.consume_tokens(list(body)):
                raise RuntimeError(f"grammar matcher refused a validated prefix: {_error(self.matcher)}")
            out = self._mask()
            if body:
                self.matcher.rollback(len(body))
        self._cache[key] = out
        return out

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        eos = self._eos_set
        toks = [int(t) for t in tokens]
        if self.ended:  # only end tokens remain allowed
            return next((i for i, t in enumerate(toks) if t not in eos), len(toks))
        end = next((i for i, t in enumerate(toks) if t in eos), len(toks))
        n = int(self.matcher.validate_tokens(toks[:end]))
        if n < end or end == len(toks):
            return n
        if end and not self.matcher.consume_tokens(toks[:end]):
            raise RuntimeError(f"grammar matcher refused a validated prefix: {_error(self.matcher)}")
        accepting = self.matcher.is_accepting()  # an end token is allowed where the grammar may end
        if end:
            self.matcher.rollback(end)
        if not accepting:
            return end
        return next((i for i in range(end + 1, len(toks)) if toks[i] not in eos), len(toks))

    def commit(self, tokens: Sequence[int]) -> None:
        self._cache.clear()
        eos = self._eos_set
        for t in tokens:
            if self.ended or int(t) in eos:
                self.ended = True
                continue
            if not self.matcher.consume_token(int(t)):
                raise RuntimeError(f"grammar matcher refused an emitted token {int(t)}: {_error(self.matcher)}")
