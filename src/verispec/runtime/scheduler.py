"""Continuous batching: requests wait, run as rows of one batch, and leave as they finish, between rounds.

The evaluation harness, :meth:`Engine.generate` and the HTTP server all drive the same object: ``submit``
requests (validated at once: bad input raises ValueError and never reaches the batch), call :meth:`step`
(admit waiting requests up to ``max_batch``, run one engine round for every running row, retire finished
rows) until :attr:`idle`. Each :class:`Handle` collects its tokens as they are committed and, when done, its
:class:`~verispec.runtime.types.GenerationResult`; an ``on_tokens`` callback sees every round's new tokens (streaming).
Thread-safe: one thread may step while others submit or cancel.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from verispec.runtime.types import GenerationResult, Metrics, Request, Row

__all__ = ["Handle", "RoundEngine", "Scheduler"]


class RoundEngine(Protocol):
    """What a scheduler drives (:class:`verispec.runtime.engine.Engine` is one): validate a request, give it a row,
    run one round for a batch of rows, and hand a finished row back. The engine sits above the scheduler (its
    ``generate`` runs prompts through one), so the scheduler names only this protocol."""

    max_rows: int | None

    def prepare(self, req: Request) -> Any: ...

    def start(self, req: Request, prepared: Any = None) -> Row: ...

    def step(self, rows: list[Row]) -> Any: ...

    def release(self, row: Row) -> None: ...

    def result(self, row: Row) -> GenerationResult: ...

TokenCallback = Callable[["Handle", list[int]], None]
DoneCallback = Callable[["Handle"], None]


@dataclass
class Handle:
    """A submitted request: ``tokens`` committed so far, ``result`` once done, ``error`` if it failed."""

    id: int
    request: Request
    on_tokens: TokenCallback | None = None
    on_done: DoneCallback | None = None
    tokens: list[int] = field(default_factory=list)
    result: GenerationResult | None = None
    error: str | None = None
    #: the exception behind ``error`` (what a one-prompt ``generate`` raises)
    failure: Exception | None = field(default=None, repr=False)
    cancelled: bool = False
    row: Row | None = None
    done_event: threading.Event = field(default_factory=threading.Event)
    prepared: tuple | None = field(default=None, repr=False)

    @property
    def done(self) -> bool:
        return self.done_event.is_set()


class Scheduler:
    """Waiting queue + running batch over a :class:`RoundEngine` (see the module docstring)."""

    def __init__(self, engine: RoundEngine, max_batch: int = 8) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        cap = getattr(engine, "max_rows", None)
        if cap is not None and max_batch > cap:
            raise ValueError(f"max_batch {max_batch} exceeds the {cap} rows the engine holds at once (a llama.cpp "
                             f"backend's sequences): load it with max_rows >= {max_batch}")
        self.engine, self.max_batch = engine, max_batch
        self.waiting: deque[Handle] = deque()
        self.running: list[Handle] = []
        self._lock = threading.Lock()
        self._next = 0
        self._finished: list[Handle] = []

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    @property
    def queue_depth(self) -> int:
        return len(self.waiting)

    def submit(self, request: Request, on_tokens: TokenCallback | None = None,
               on_done: DoneCallback | None = None) -> Handle:
        """Validate and enqueue; raises ValueError naming the problem for bad input. The request holds no cache
        row while it waits (waiting rows would otherwise ride along in every batched forward). ``on_done(handle)``
        runs on the stepping thread once the handle is finished (done, failed or cancelled)."""
        prepared = self.engine.prepare(request)
        with self._lock:
            h = Handle(self._next, request, on_tokens, on_done)
            h.prepared = prepared
            self._next += 1
            self.waiting.append(h)
        return h

    def cancel(self, handle: Handle) -> None:
        """Stop a request (e.g. its client disconnected): its row leaves at the next step."""
        with self._lock:
            handle.cancelled = True

    @staticmethod
    def _fail(h: Handle, exc: Exception) -> None:
        """Fail one request with ``exc`` (its start, its round, or releasing or reporting its row): finish_reason
        "error" with the message, and the tokens it committed before."""
        h.error, h.failure = f"{type(exc).__name__}: {exc}", exc
        row = h.row
        h.result = GenerationResult("", list(h.tokens), "error", row.metrics if row is not None else Metrics(),
                                    row.prompt_ids if row is not None else [], h.error)

    def _retire(self, h: Handle) -> None:
        """Finish a handle that left the batch (or never joined it). Never raises: its caller may be retiring a whole
        batch, and a handle left unfinished would keep its client waiting forever."""
        if h.row is not None:
            try:
                self.engine.release(h.row)
                if h.result is None and h.error is None:
                    h.result = self.engine.result(h.row)
            except Exception as exc:  # this request fails alone; a failure it already had is the one it reports
                if h.error is None:
                    self._fail(h, exc)
        elif h.result is None:  # cancelled while waiting: it never ran
            h.result = GenerationResult("", [], "cancelled", Metrics())
        finished_by_itself = h.row is not None and h.row.done
        if h.cancelled and h.error is None and not finished_by_itself:
            h.result.finish_reason = "cancelled"  # type: ignore[union-attr]
        h.done_event.set()
        self._finished.append(h)

    def _notify(self) -> None:
        """Run the ``on_done`` callbacks of the handles retired so far (outside the lock: they may submit)."""
        with self._lock:
            finished, self._finished = self._finished, []
        first: Exception | None = None
        for h in finished:  # every handle's callback runs even if another's raises; the first error is raised after
            if h.on_done is not None:
                try:
                    h.on_done(h)
                except Exception as exc:
                    first = first or exc
        if first is not None:
            raise first

    def admit(self) -> list[Handle]:
        """Retire the cancelled requests and give waiting ones rows up to ``max_batch``; returns the batch the next
        round runs. :meth:`step` does this first; a caller that reports the batch (a server's gauges) calls it
        before :meth:`step` to count the admitted requests as running during their round. The ``on_done``
        callbacks of the requests it retires run at the end of the next :meth:`step`."""
        with self._lock:
            for h in [h for h in self.waiting if h.cancelled]:
                self.waiting.remove(h)
                self._retire(h)
            for h in [h for h in self.running if h.cancelled]:
                self.running.remove(h)
                self._retire(h)
            while self.waiting and len(self.running) < self.max_batch:
                h = self.waiting.popleft()
                try:
                    h.row = self.engine.start(h.request, h.prepared)
                except Exception as exc:  # e.g. the context filled up meanwhile: this request fails alone
                    self._fail(h, exc)
                    self._retire(h)
                    continue
                self.running.append(h)
            return list(self.running)

    def step(self) -> list[tuple[Handle, list[int]]]:
        """Admit (:meth:`admit`), run one round, retire; returns (handle, new tokens) for every row that ran."""
        batch = self.admit()
        if not batch:
            self._notify()
            return []
        try:
            new = self.engine.step([h.row for h in batch])  # type: ignore[misc]
        except Exception as exc:  # a failing round fails its rows, never the scheduler
            for h in batch:
                self._fail(h, exc)
            with self._lock:
                for h in batch:
                    self.running.remove(h)
                    self._retire(h)
            self._notify()
            raise
        events = []
        for h, toks in zip(batch, new, strict=True):
            h.tokens.extend(toks)
            events.append((h, toks))
        # a callback that raises must not cost the other handles their tokens nor leave finished rows running:
        # every callback runs and every finished row retires first, then the first error is raised
        first: Exception | None = None
        for h, toks in events:
            if h.on_tokens is not None and toks:
                try:
                    h.on_tokens(h, toks)
                except Exception as exc:
                    first = first or exc
        with self._lock:
            for h in batch:
                if h.row.done:  # type: ignore[union-attr]
                    if h.row.failure is not None:  # type: ignore[union-attr]
                        self._fail(h, h.row.failure)  # type: ignore[union-attr]
                    self.running.remove(h)
                    self._retire(h)
        try:
            self._notify()
        except Exception as exc:
            first = first or exc
        if first is not None:
            raise first
        return events

    def run(self) -> None:
        """Step until every submitted request is done."""
        while not self.idle:
            self.step()
