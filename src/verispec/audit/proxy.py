"""An HTTP proxy in front of an OpenAI-compatible server that rewrites each request body: the audit's negative
controls (an engine with a known defect, met exactly as a deployed one would be) and its bad-input cases. It binds
127.0.0.1 only and serves from a daemon thread until :meth:`RewritingProxy.stop` (or the ``with`` block's end)."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType

__all__ = ["RewritingProxy"]


class RewritingProxy:
    """``with RewritingProxy(upstream, rewrite) as proxy:`` serves ``proxy.url``; each POST body is passed through
    ``rewrite(body) -> body`` before it goes to ``upstream`` (a base URL). ``respond(body) -> (status, bytes) |
    None`` may answer instead of the upstream (refusals, malformed answers)."""

    def __init__(self, upstream: str, rewrite: Callable[[dict], dict] | None = None,
                 respond: Callable[[dict], tuple[int, bytes] | None] | None = None, timeout: float = 120.0) -> None:
        self.upstream = upstream.rstrip("/")
        rewrite_fn = rewrite or (lambda body: body)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _send(self, status: int, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                if isinstance(body, dict) and respond is not None and (answer := respond(body)) is not None:
                    self._send(*answer)
                    return
                data = json.dumps(rewrite_fn(body)).encode() if isinstance(body, dict) else raw
                req = urllib.request.Request(outer.upstream + self.path, data=data,
                                             headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=timeout) as resp:
                        self._send(resp.status, resp.read())
                except urllib.error.HTTPError as err:
                    self._send(err.code, err.read())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        # shutdown() waits for serve_forever to poll: every 50 ms, not its default 0.5 s
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       name="verispec-audit-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> RewritingProxy:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)

    def __enter__(self) -> RewritingProxy:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
