"""Incremental detokenization: committed token ids in, text deltas out, never past a stop string.

Used by ``verispec generate`` (printing as tokens are committed) and by the HTTP server (server-sent events).
Each push decodes the whole output so far (the tokenizer's own decode, exactly what the final result uses) and
releases only text that cannot change any more:

- a trailing U+FFFD is held back: byte-level tokenizers decode the first bytes of a multi-byte character to
  the replacement character until the token with its last byte arrives;
- a suffix that could be the beginning of a stop string is held back until it is resolved;
- once a stop string appears, the text is cut before its first occurrence and nothing more is released.

The engine cuts its final text at the same place (the earliest occurrence of any stop string in the decoded
output), so the concatenated deltas plus :meth:`TextStream.finish` equal ``GenerationResult.text``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["TextStream", "find_stop", "tokens_in_text"]

REPLACEMENT = "\ufffd"


def find_stop(text: str, stop: Sequence[str]) -> int | None:
    """Index in ``text`` where the earliest stop string begins, or None: the one stop matcher of the engine (which
    ends a row there) and of :class:`TextStream` (which releases text up to there)."""
    hits = [i for s in stop if s and (i := text.find(s)) >= 0]
    return min(hits) if hits else None


def tokens_in_text(decode: Callable[[Sequence[int]], str], ids: Sequence[int], n_chars: int) -> int:
    """How many leading tokens of ``ids`` start before character ``n_chars`` of their decoded text: the tokens a
    text cut at ``n_chars`` (before a stop string) keeps any of; the others lie wholly in or after the stop string,
    so they get no logprob entry."""
    k = len(ids)
    while k and len(decode(ids[: k - 1])) >= n_chars:
        k -= 1
    return k


class TextStream:
    """Turns token ids, pushed as they are committed, into text deltas (see the module docstring)."""

    def __init__(self, decode: Callable[[Sequence[int]], str], stop: Sequence[str] = ()) -> None:
        self._decode = decode
        self.stop = [s for s in stop if s]
        self.ids: list[int] = []
        self.text = ""  # the decoded output so far, cut before a stop string once one appeared
        self.sent = 0  # characters of ``text`` already released
        self.stopped = False

    def push(self, ids: Sequence[int]) -> str:
        """Add newly committed ids; return the text that became final (possibly empty)."""
        if self.stopped or not ids:
            return ""
        self.ids.extend(int(t) for t in ids)
        text = self._decode(self.ids)
        if (hit := find_stop(text, self.stop)) is not None:
            self.stopped = True
            self.text = text[:hit]
            return self._release(len(self.text))
        self.text = text
        ready = len(text)
        while ready > self.sent and text[ready - 1] == REPLACEMENT:
            ready -= 1
        ready -= self._stop_prefix(text[:ready])
        return self._release(ready)

    def finish(self) -> str:
        """The generation ended: release whatever was held back."""
        return self._release(len(self.text))

    def _release(self, upto: int) -> str:
        if upto <= self.sent:
            return ""
        delta = self.text[self.sent : upto]
        self.sent = upto
        return delta

    def _stop_prefix(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        best = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:k]):
                    best = k
                    break
        return best
