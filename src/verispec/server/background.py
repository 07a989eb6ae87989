"""Run an app with uvicorn on a thread of this process, on 127.0.0.1 and a free port (tests, benchmarks)."""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType
from typing import Any

__all__ = ["BackgroundServer", "free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class BackgroundServer:
    """``with BackgroundServer(app) as srv:`` serves ``app`` at ``srv.url`` (``http://127.0.0.1:PORT``) until the
    block ends; the app's lifespan (the worker thread) starts and stops with it. Start and stop are bounded by
    ``timeout_s``."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int | None = None, timeout_s: float = 30.0,
                 log_level: str = "warning") -> None:
        import uvicorn

        self.host, self.port, self.timeout_s = host, port or free_port(host), timeout_s
        self.server = uvicorn.Server(uvicorn.Config(app, host=self.host, port=self.port, log_level=log_level,
                                                    lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, name="verispec-uvicorn", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> BackgroundServer:
        self.thread.start()
        deadline = time.monotonic() + self.timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start on {self.url} within {self.timeout_s} s")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(self.timeout_s)
        if self.thread.is_alive():  # connections that do not close: force the exit
            self.server.force_exit = True
            self.thread.join(self.timeout_s)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
