"""The one thread that owns the engine: it admits requests into the Scheduler and steps it while work exists.

Every use of the engine (tokenizing a prompt, ``Engine.start`` inside ``Scheduler.submit``, rounds, releasing
rows, detokenizing in the listeners) happens on this thread, so the engine and its KV caches never see two
threads at once. HTTP handlers hand over a :class:`Job` (a ``build`` function that returns the
:class:`~verispec.runtime.engine.Request`, run here at once, plus a :class:`JobListener`) and are told what happens
through the listener, always from this thread:

- ``admitted()``: ``build`` and ``Scheduler.submit`` succeeded; the request waits for a batch slot or runs;
- ``rejected(exc)``: ``build`` or ``Scheduler.submit`` raised (bad input), the job was cancelled before it was
  built, or the server stopped first; nothing ran;
- ``tokens(ids, handle)``: the ids a round committed (streaming), and the request's handle (its row holds the
  logprob entries when the request asked for them);
- ``done(handle)``: the handle is finished (``handle.result``; ``handle.error`` when its round failed;
  ``finish_reason == "cancelled"`` when it was cancelled while waiting or running).

A built request goes straight into the Scheduler, the one queue: it holds no engine row while it waits (rows are
allocated at admission), so the worker keeps no queue of its own beyond the jobs not built yet.

An idle worker that receives a request waits ``gather_s`` (:data:`GATHER_S`, 20 ms) before its first round, so that
requests sent together start together (one prefill round, rows that finish together) instead of one joining per
round behind the first; a busy worker admits between rounds as they come. It waits only while requests have been
seen to come in bursts: an idle start whose requests (those gathered plus those that arrived during its first
round) were one alone turns the wait off, so that a client sending one request at a time never pays it; an idle
start that did not wait and saw others arrive during its first round turns it back on.

A round that raises fails only the rows of that round (the Scheduler marks them and re-raises); the worker
counts it and goes on. A listener that raises is logged and ignored.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from verispec.runtime.engine import Engine
from verispec.runtime.scheduler import Handle, Scheduler
from verispec.runtime.types import Request

__all__ = ["Job", "JobListener", "Worker"]

log = logging.getLogger(__name__)

#: seconds an idle worker waits after the first request arrives before its first round, so that requests sent
#: together (a burst of clients) share one prefill round instead of joining one round at a time
GATHER_S = 0.02


class JobListener(Protocol):
    """What a job's owner is told (on the worker thread; see the module docstring)."""

    def admitted(self) -> None: ...

    def rejected(self, exc: Exception) -> None: ...

    def tokens(self, ids: list[int], handle: Handle) -> None: ...

    def done(self, handle: Handle) -> None: ...


class Job:
    """A request on its way through the worker: ``build`` runs on the worker thread and returns the Request."""

    def __init__(self, build: Callable[[Engine], Request], listener: JobListener) -> None:
        self.build, self.listener = build, listener
        self.request: Request | None = None
        self.handle: Handle | None = None
        self.cancelled = False


class Worker:
    """Owns a :class:`~verispec.runtime.scheduler.Scheduler` over ``engine`` and steps it on a background thread.

    ``observe(worker)`` is called on the worker thread after every admission pass and round (metrics gauges);
    ``on_round_error(exc)`` after a round that raised.
    """

    def __init__(
        self,
        engine: Engine,
        max_batch: int = 8,
        observe: Callable[[Worker], None] | None = None,
        on_round_error: Callable[[Exception], None] | None = None,
        gather_s: float = GATHER_S,
    ) -> None:
        if gather_s < 0:
            raise ValueError(f"gather_s must be >= 0, got {gather_s}")
        self.gather_s = gather_s
        self.engine = engine
        self.scheduler = Scheduler(engine, max_batch=max_batch)
        self._observe, self._on_round_error = observe, on_round_error
        self._cv = threading.Condition()
        self._pending: deque[Job] = deque()  # handed over, not built yet
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.round_failures = 0
        #: whether the next idle start waits ``gather_s`` (see the module docstring)
        self.gathering = gather_s > 0
        self._burst: int | None = None  # requests of the current idle start, counted until its first round ended

    # -- called from any thread ----------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="verispec-worker", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop stepping: jobs still pending are rejected, running ones cancelled; waits for the thread."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def pending(self) -> int:
        """Jobs handed over but not yet built (the Scheduler's ``queue_depth`` counts those waiting for a slot)."""
        return len(self._pending)

    def submit(self, job: Job) -> None:
        """Hand a job over; its listener hears back on the worker thread."""
        with self._cv:
            if self._stopping:
                raise RuntimeError("the server is shutting down")
            self._pending.append(job)
            self._cv.notify_all()

    def cancel(self, job: Job) -> None:
        """Cancel a job (client gone): a pending job is rejected, a running row leaves at the next round."""
        with self._cv:
            job.cancelled = True
            if job.handle is not None:
                self.scheduler.cancel(job.handle)
            self._cv.notify_all()

    # -- the worker thread ---------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stopping and not self._pending and self.scheduler.idle:
                    self._cv.wait()
                if self._stopping:
                    break
                if self.scheduler.idle:
                    if self.gathering:
                        # requests of a burst (clients that send together) start in one prefill round
                        end = time.monotonic() + self.gather_s
                        while (not self._stopping and len(self._pending) < self.scheduler.max_batch
                               and (left := end - time.monotonic()) > 0):
                            self._cv.wait(left)
                    self._burst = len(self._pending)
                pending = list(self._pending)
                self._pending.clear()
            for job in pending:
                self._submit(job)
            self._call_observe()
            if not self.scheduler.idle:
                try:
                    # admitted before the gauges are read: the rows of a round count as running while it runs
                    self.scheduler.admit()
                    self._call_observe()
                    self.scheduler.step()
                except Exception as exc:  # the Scheduler already failed this round's rows
                    self.round_failures += 1
                    log.exception("an engine round failed; its requests get the error, the server goes on")
                    if self._on_round_error is not None:
                        self._safe(self._on_round_error, exc)
            if self._burst is not None:  # the first round after an idle start has run: who came meanwhile
                with self._cv:
                    self.gathering = self.gather_s > 0 and self._burst + len(self._pending) > 1
                self._burst = None
            self._call_observe()
        self._shutdown()

    def _submit(self, job: Job) -> None:
        """Build the request and hand it to the Scheduler; bad input is the listener's 4xx."""
        if job.cancelled:
            self._safe(job.listener.rejected, RuntimeError("cancelled before it started"))
            return
        try:
            job.request = job.build(self.engine)
            job.handle = self.scheduler.submit(
                job.request,
                on_tokens=lambda h, ids, j=job: self._safe(j.listener.tokens, ids, h),
                on_done=lambda h, j=job: self._safe(j.listener.done, h),
            )
        except Exception as exc:
            self._safe(job.listener.rejected, exc)
            return
        self._safe(job.listener.admitted)
        if job.cancelled:  # cancelled while it was being built
            self.scheduler.cancel(job.handle)

    def _shutdown(self) -> None:
        with self._cv:
            pending = list(self._pending)
            self._pending.clear()
        for job in pending:
            self._safe(job.listener.rejected, RuntimeError("the server is shutting down"))
        sched = self.scheduler
        for handle in list(sched.waiting) + list(sched.running):
            sched.cancel(handle)
        try:
            while not sched.idle:  # cancelled rows are retired without running a round; their listeners hear done
                sched.step()
        except Exception:
            log.exception("releasing rows at shutdown failed")
        self._call_observe()

    def _call_observe(self) -> None:
        if self._observe is not None:
            self._safe(self._observe, self)

    @staticmethod
    def _safe(fn: Callable, *args: object) -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("a worker callback raised (ignored)")
