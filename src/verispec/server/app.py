"""The FastAPI application: OpenAI-compatible endpoints over one engine, one worker thread, one Scheduler.

``create_app(engine, ...)`` returns the app; its lifespan starts and stops the :class:`~.worker.Worker`.
Endpoints: ``GET /`` (a page for browsers, :mod:`~.page`), ``GET /v1/models`` (and ``/v1/models/{id}``),
``POST /v1/completions``, ``POST /v1/chat/completions`` (streamed with ``"stream": true`` as server-sent events,
else one JSON object), ``GET /health``, ``GET /metrics``.

Request path: the handler parses and validates the body on the event loop (400 naming the field), takes a
concurrency slot (429 when ``max_concurrency`` requests are already admitted, running or waiting) and hands a
:class:`~.worker.Job` to the worker, which tokenizes the prompt, checks the length limits and submits it to the
Scheduler. A :class:`Generation` listener carries the worker's events (admitted / rejected / text deltas /
done) to the handler's event loop. A streamed request whose client goes away is cancelled at once (its row
leaves the batch at the next round); a waiting non-streamed one is cancelled within half a second.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from verispec.defaults import MAX_SEED
from verispec.runtime.engine import Engine
from verispec.runtime.scheduler import Handle
from verispec.runtime.text import TextStream
from verispec.runtime.types import GenerationResult, Row, TokenLogprob
from verispec.server.metrics import ServerMetrics
from verispec.server.page import page_html, static_file
from verispec.server.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    Limits,
    Settings,
    parse_body,
    prompt_builder,
)
from verispec.server.responses import LogprobFormatter, Reply, detail_entries, sse, verispec_block
from verispec.server.worker import Job, Worker

__all__ = ["Generation", "ServerState", "create_app"]

log = logging.getLogger(__name__)

ENDPOINTS = ("/", "/v1/models", "/v1/models/{model}", "/v1/completions", "/v1/chat/completions", "/health", "/metrics")
DISCONNECT_POLL_S = 0.5


class ServerState:
    """What the handlers share: engine, worker, metrics, limits and the concurrency count."""

    def __init__(self, engine: Engine, model_name: str, max_batch: int, max_concurrency: int, limits: Limits) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.engine, self.model_name, self.limits = engine, model_name, limits
        self.max_concurrency = max_concurrency
        self.metrics = ServerMetrics()
        self.worker = Worker(engine, max_batch=max_batch, observe=self._observe,
                             on_round_error=lambda _exc: self.metrics.round_failures.inc())
        self.created = int(time.time())
        self._lock = threading.Lock()
        self.active = 0

    def try_acquire(self, n: int = 1) -> bool:
        """Take ``n`` concurrency slots (one per choice), or none when fewer are free."""
        with self._lock:
            if self.active + n > self.max_concurrency:
                return False
            self.active += n
            self.metrics.in_flight.set(self.active)
            return True

    def release(self) -> None:
        with self._lock:
            self.active -= 1
            self.metrics.in_flight.set(self.active)

    def _observe(self, worker: Worker) -> None:
        self.metrics.queue_depth.set(worker.pending + worker.scheduler.queue_depth)
        self.metrics.running.set(len(worker.scheduler.running))


class Generation:
    """The listener of one job: runs the worker's callbacks (on the worker thread) and forwards them as events to
    the request's event loop: ("admitted",), ("rejected", exc), ("text", delta, logprobs, details), ("done", handle,
    tail, logprobs, details). With logprobs asked for, a text event carries those of the tokens since the last event
    (tokens whose text is still held back wait for the next one) and the done event the rest (streamed) or all (not
    streamed), formatted here on the worker thread, where the tokenizer lives. With ``echo`` the prompt's text (and its
    tokens' logprobs, the first one null) comes first: in the first text event, or in the full response. With
    ``token_details`` asked for, the ids are detokenized one at a time so that each token's entry carries the piece
    of text it added (:func:`~.responses.detail_entries`); a text event carries the entries of its tokens, the
    done event of a full response all of them."""

    def __init__(self, state: ServerState, settings: Settings, arrival: float, chat: bool = False,
                 echo: str | None = None) -> None:
        self.state, self.settings, self.arrival = state, settings, arrival
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple] = asyncio.Queue()
        self.text = TextStream(state.engine.decode, settings.stop)
        self.logprobs = LogprobFormatter(chat, state.engine.decode) if settings.logprobs is not None else None
        #: logprob entries not sent yet, each with where its token's text starts in the output (-1: sent with the
        #: next event whatever it holds: the echoed prompt's, or a full response's, already cut at a stop string)
        self._held: list[tuple[int, TokenLogprob]] = []
        #: echo: the prompt's text ("" for a prompt of token ids: decoded here), until it is sent
        self.echo = echo
        self.echo_text = ""  # the echoed prompt of a full (not streamed) response
        self.first_token_s: float | None = None
        self.finished = False
        self.details = settings.token_details is not None

    def _put(self, *event: object) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the event loop is gone (server stopping); nobody is listening
            pass

    # -- worker thread ---------------------------------------------------------------------------------------
    def admitted(self) -> None:
        self._put("admitted")

    def rejected(self, exc: Exception) -> None:
        self.finished = True
        self.state.release()
        self._put("rejected", exc)

    def _echo(self, source: Row | GenerationResult | None) -> str:
        """The prompt's text, with its logprob entries held, once; "" without echo, once sent, or before the row
        exists."""
        if self.echo is None or source is None:
            return ""
        text = self.echo or self.state.engine.decode(source.prompt_ids)
        self.echo = None
        if self.logprobs is not None:
            self._held.extend((-1, e) for e in source.prompt_logprobs or [])
        return text

    def tokens(self, ids: list[int], handle: Handle | None = None) -> None:
        if self.first_token_s is None:
            self.first_token_s = time.perf_counter() - self.arrival
            self.state.metrics.ttft.observe(self.first_token_s)
        row = handle.row if handle is not None else None
        prefix = self._echo(row) if self.settings.stream else ""
        streamed_lps = (self.logprobs is not None and self.settings.stream and row is not None
                        and row.logprobs is not None and bool(ids))
        # where each new token's text starts: its entry is sent once that text is (never for a stop string's tokens)
        starts = [len(self.state.engine.decode(self.text.ids + ids[:k])) for k in range(len(ids))] \
            if streamed_lps else []
        details = None
        if self.details and self.settings.stream and row is not None and row.details is not None and ids:
            pieces = [self.text.push([t]) for t in ids]
            delta = "".join(pieces)
            details = detail_entries(row.details[len(row.details) - len(ids):], pieces, self.state.engine.decode)
        else:
            delta = self.text.push(ids)
        if streamed_lps:
            self._held.extend(zip(starts, row.logprobs[len(row.logprobs) - len(ids):], strict=True))  # type: ignore[union-attr]
        if prefix or delta or details:
            self._put("text", prefix + delta, self._release(), details)

    def _release(self, final: bool = False) -> dict | None:
        """The held entries whose token's text has been sent, formatted; at the end every entry but those of a stop
        string's tokens (a token that adds no text, e.g. EOS, is sent then)."""
        if self.logprobs is None or not self._held:
            return None
        upto = math.inf if final and not self.text.stopped else self.text.sent
        k = next((i for i, (start, _) in enumerate(self._held) if start >= upto), len(self._held))
        ready, self._held = self._held[:k], self._held[k:]
        return self.logprobs([e for _, e in ready]) if ready else None

    def done(self, handle: Handle) -> None:
        self.finished = True
        logprobs = details = None
        try:
            if handle.result is not None:
                self.state.metrics.record_result(self.settings.rule.name, handle.result,
                                                 time.perf_counter() - self.arrival)
            if not self.settings.stream and handle.result is not None:
                result = handle.result
                self.echo_text = self._echo(result)
                if self.logprobs is not None:
                    self._held.extend((-1, e) for e in result.logprobs or [])
                if self.details and result.token_details is not None:
                    replay = TextStream(self.state.engine.decode, self.settings.stop)
                    pieces = [replay.push([t]) for t in result.token_ids]
                    pieces[-1:] = [pieces[-1] + replay.finish()] if pieces else []
                    details = detail_entries(result.token_details, pieces, self.state.engine.decode)
        finally:
            tail = self.text.finish()
            try:
                logprobs = self._release(final=True)
                if logprobs is None and self.logprobs is not None and not self.settings.stream \
                        and handle.result is not None:  # asked for, and nothing to list: empty, not null
                    logprobs = self.logprobs([])
            finally:
                self.state.release()
                self._put("done", handle, tail, logprobs, details)


class _CountRequests:
    """ASGI middleware: ``verispec_requests_total{endpoint, status}`` for every HTTP request."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = [500]

        async def send_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            path = scope.get("path", "")
            if path.startswith("/v1/models/"):  # one model's card: counted under the route, not per model id
                path = "/v1/models/{model}"
            self.metrics.requests.labels(path if path in ENDPOINTS else "other", str(status[0])).inc()


class _EventStream(StreamingResponse):
    """A server-sent-event response that always closes its generator, whichever way the stream ends."""

    media_type = "text/event-stream"

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(send)
        finally:
            try:
                await self.body_iterator.aclose()  # type: ignore[attr-defined]
            except Exception:  # already closed by the exception that ended the stream
                pass


def _finish(result: GenerationResult, calls: list[dict[str, Any]]) -> str:
    """A chat answer's finish reason: ``tool_calls`` when it ended by itself with calls."""
    return "tool_calls" if calls and result.finish_reason == "stop" else result.finish_reason


def _error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


def _rejection(exc: Exception) -> APIError:
    """The error answered for a job the worker refused."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ValueError):
        return APIError(400, str(exc), code="invalid_value")
    return APIError(503, str(exc), code="unavailable")


def _failure(handle: Handle) -> APIError | None:
    """The error of a handle whose round failed, or None."""
    if handle.error is None and (handle.result is None or handle.result.finish_reason != "error"):
        return None
    return APIError(500, f"generation failed: {handle.error or 'unknown error'}", code="engine_error")


async def _next_event(gen: Generation, request: Request, job: Job, state: ServerState) -> tuple | None:
    """The next event, or None when the client disconnected (the job is then cancelled)."""
    while True:
        try:
            return await asyncio.wait_for(gen.queue.get(), DISCONNECT_POLL_S)
        except TimeoutError:
            if await request.is_disconnected():
                state.worker.cancel(job)
                return None


def _openapi(app: FastAPI) -> dict[str, Any]:
    """The OpenAPI document with the request bodies the endpoints parse themselves (they read the raw body to
    answer OpenAI-style errors), so clients and fuzzers see every field."""
    if app.openapi_schema:
        return app.openapi_schema
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
    components = doc.setdefault("components", {}).setdefault("schemas", {})
    for path, model in (("/v1/completions", CompletionRequest), ("/v1/chat/completions", ChatCompletionRequest)):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(schema.pop("$defs", {}))
        components[model.__name__] = schema
        ref = {"$ref": f"#/components/schemas/{model.__name__}"}
        doc["paths"][path]["post"]["requestBody"] = {"required": True, "content": {"application/json": {"schema": ref}}}
    app.openapi_schema = doc
    return doc


def create_app(
    engine: Engine,
    model_name: str = "verispec",
    max_batch: int = 8,
    max_concurrency: int = 64,
    limits: Limits | None = None,
) -> FastAPI:
    """The OpenAI-compatible server over ``engine`` (see the module docstring).

    ``max_batch``: rows per engine round; ``max_concurrency``: admitted requests (running + waiting) before
    429; ``limits``: prompt / max_tokens limits (:class:`~.protocol.Limits`).
    """
    state = ServerState(engine, model_name, max_batch, max_concurrency, limits or Limits())

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        state.worker.start()
        try:
            yield
        finally:
            await asyncio.to_thread(state.worker.stop)

    app = FastAPI(title="verispec", lifespan=lifespan)
    app.state.verispec = state
    app.add_middleware(_CountRequests, metrics=state.metrics)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]

    @app.exception_handler(APIError)
    async def _api_error(_request: Request, exc: APIError) -> JSONResponse:
        return _error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else None
        return _error_response(APIError(exc.status_code, str(exc.detail), code=code))

    @app.exception_handler(Exception)
    async def _internal(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return _error_response(APIError(500, f"internal error: {type(exc).__name__}: {exc}", code="internal_error"))

    @app.get("/", include_in_schema=False)
    async def page() -> HTMLResponse:
        """The page (:mod:`verispec.server.page`): a browser's view of verification through this API."""
        return HTMLResponse(page_html(app.openapi(), state.model_name, engine.backends))

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> Response:
        return Response(status_code=204)

    @app.get("/static/{name}", include_in_schema=False)
    async def static(name: str) -> Response:
        found = static_file(name)
        if found is None:
            raise APIError(404, f"no static file {name!r}", code="not_found")
        return Response(found[0], media_type=found[1], headers={"Cache-Control": "no-cache"})

    @app.get("/health")
    async def health() -> JSONResponse:
        ok = state.worker.alive
        return JSONResponse({"status": "ok" if ok else "worker stopped"}, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    def card() -> dict[str, Any]:
        return {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "verispec"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        """One model's card (OpenAI's retrieve; a model id may hold slashes)."""
        if model_id != state.model_name:
            raise APIError(404, f"model {model_id!r} does not exist; this server serves {state.model_name!r}",
                           param="model", code="model_not_found")
        return card()

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _generate(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _generate(request, chat=True)

    async def _generate(request: Request, chat: bool) -> Response:
        arrival = time.perf_counter()
        body = parse_body(await request.body(), ChatCompletionRequest if chat else CompletionRequest)
        if body.model is not None and body.model != state.model_name:
            raise APIError(404, f"model {body.model!r} does not exist; this server serves {state.model_name!r}",
                           param="model", code="model_not_found")
        settings = Settings.of(body)
        prompt_builder(body, settings, state.limits)  # the prompt's own checks, before a slot is taken
        if settings.n > state.max_concurrency:  # each choice takes a slot: such a request could never run
            raise APIError(400, f"n: {settings.n} choices, over this server's {state.max_concurrency} concurrent "
                           "requests (--max-concurrency)", param="n", code="invalid_value")
        if not state.try_acquire(settings.n):
            raise APIError(429, f"the server is at its limit of {state.max_concurrency} concurrent requests "
                           "(--max-concurrency); retry later", code="too_many_requests", type_="rate_limit_error")
        echo = None if not settings.echo else body.prompt if isinstance(body.prompt, str) else ""  # type: ignore[attr-defined]
        choices: list[tuple[Generation, Job]] = []
        for i in range(settings.n):  # choice i: its own row and seed
            own = replace(settings, seed=(settings.seed + i) % MAX_SEED) if i else settings  # wraps at the top
            gen = Generation(state, own, arrival, chat, echo)
            choices.append((gen, Job(prompt_builder(body, own, state.limits), gen)))
        for k, (_gen, job) in enumerate(choices):
            try:
                state.worker.submit(job)
            except RuntimeError as exc:
                for _ in choices[k:]:
                    state.release()
                _cancel(choices[:k])
                raise APIError(503, str(exc), code="shutting_down") from None
        for gen, job in choices:
            if await _wait(request, choices, gen, job, ("admitted", "text", "done")) is None:
                return Response(status_code=499)
        reply = Reply(chat, state.model_name)
        if settings.stream:
            return _EventStream(_stream(choices, reply, settings), headers={"Cache-Control": "no-cache"})
        return await _complete(request, choices, reply, settings)

    async def _wait(request: Request, choices: list[tuple[Generation, Job]], gen: Generation, job: Job,
                    kinds: tuple[str, ...]) -> tuple | None:
        """The next event of ``gen`` of one of ``kinds`` (None: the client left); a rejection cancels every choice
        and raises its error."""
        while True:
            event = await _next_event(gen, request, job, state)
            if event is None or event[0] == "rejected":
                _cancel(choices)
                if event is None:
                    return None
                raise _rejection(event[1])
            if event[0] in kinds:
                return event

    def _cancel(choices: list[tuple[Generation, Job]]) -> None:
        for gen, job in choices:
            if not gen.finished:
                state.worker.cancel(job)

    def _block(settings: Settings, results: list[GenerationResult]) -> dict[str, Any]:
        """The ``verispec`` block: the first choice's, with every choice's metrics when there are several."""
        block = verispec_block(settings.rule, settings.gamma, results[0], engine.backends, settings.verifier)
        if len(results) > 1:
            block["per_choice"] = [verispec_block(settings.rule, settings.gamma, r)["metrics"] for r in results]
        return block

    async def _complete(request: Request, choices: list[tuple[Generation, Job]], reply: Reply,
                        settings: Settings) -> Response:
        results, bodies = [], []
        for index, (gen, job) in enumerate(choices):
            event = await _wait(request, choices, gen, job, ("done",))
            if event is None:
                return Response(status_code=499)
            handle: Handle = event[1]
            if (err := _failure(handle)) is not None:
                _cancel(choices)
                raise err
            result: GenerationResult = handle.result  # type: ignore[assignment]
            results.append(result)
            if settings.tools is not None:
                content, calls = settings.tools.split(result.text)
                bodies.append(reply.choice(index, content, _finish(result, calls), event[3], calls, event[4]))
            else:
                bodies.append(reply.choice(index, gen.echo_text + result.text, result.finish_reason, event[3],
                                           token_details=event[4]))
        return JSONResponse(reply.full(bodies, results, _block(settings, results)))

    async def _stream(choices: list[tuple[Generation, Job]], reply: Reply, settings: Settings
                      ) -> AsyncIterator[str]:
        merged: asyncio.Queue[tuple[int, tuple]] = asyncio.Queue()

        async def pump(index: int, gen: Generation) -> None:
            while True:
                event = await gen.queue.get()
                await merged.put((index, event))
                if event[0] in ("done", "rejected"):
                    return

        tasks = [asyncio.create_task(pump(i, gen)) for i, (gen, _job) in enumerate(choices)]
        held: dict[int, list[dict[str, Any]]] = {}  # with tools: each choice's logprobs, sent with its whole answer
        held_details: dict[int, list[dict[str, Any]]] = {}  # and its token details
        try:
            if reply.chat:
                for i in range(len(choices)):
                    yield sse(reply.chunk(role=True, index=i))
            results: list[GenerationResult | None] = [None] * len(choices)
            last: dict[str, Any] | None = None  # the last finish chunk, held to carry the verispec block
            while any(r is None for r in results):
                index, event = await merged.get()
                if event[0] == "text" and settings.tools is not None:
                    held.setdefault(index, []).extend((event[2] or {}).get("content") or [])
                    held_details.setdefault(index, []).extend(event[3] or [])
                    continue
                if event[0] == "text":
                    yield sse(reply.chunk(text=event[1], logprobs=event[2], index=index, token_details=event[3]))
                    continue
                if event[0] == "rejected":
                    yield sse(_rejection(event[1]).body())
                    yield sse("[DONE]")
                    return
                if event[0] != "done":
                    continue
                handle, tail, logprobs = event[1], event[2], event[3]
                if settings.tools is None and (tail or logprobs):
                    yield sse(reply.chunk(text=tail, logprobs=logprobs, index=index))
                if (err := _failure(handle)) is not None:
                    yield sse(err.body())
                    yield sse("[DONE]")
                    return
                results[index] = handle.result
                if last is not None:
                    yield sse(last)
                finish = handle.result.finish_reason
                if settings.tools is not None:  # the whole answer: its text, then its calls
                    content, calls = settings.tools.split(handle.result.text)
                    entries = held.pop(index, []) + ((logprobs or {}).get("content") or [])
                    lps = {"content": entries} if entries else None
                    details = held_details.pop(index, None)
                    # the logprobs and details ride on the first chunk of the answer: the calls' when it has no text
                    if content or (not calls and (lps or details)):
                        yield sse(reply.chunk(text=content or "", logprobs=lps, index=index, token_details=details))
                        lps = details = None
                    if calls:
                        yield sse(reply.chunk(tool_calls=calls, logprobs=lps, index=index, token_details=details))
                    finish = _finish(handle.result, calls)
                last = reply.chunk(finish_reason=finish, index=index)
            done = [r for r in results if r is not None]
            block = _block(settings, done)
            if settings.include_usage:
                yield sse(last)  # type: ignore[arg-type]
                last = reply.usage_chunk(done)
            last["verispec"] = block  # type: ignore[index]
            yield sse(last)  # type: ignore[arg-type]
            yield sse("[DONE]")
        finally:
            for t in tasks:
                t.cancel()
            _cancel(choices)

    return app
