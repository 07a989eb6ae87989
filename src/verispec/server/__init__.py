"""An OpenAI-compatible HTTP server for verispec: ``verispec serve`` or :func:`serve` / :func:`create_app`.

Modules: :mod:`.app` (FastAPI endpoints), :mod:`.worker` (the thread that owns the engine and steps the
Scheduler), :mod:`.protocol` (request bodies -> verispec settings, errors), :mod:`.responses` (response bodies and
stream chunks), :mod:`.metrics` (Prometheus). Needs ``fastapi``, ``uvicorn`` and ``prometheus-client``.
"""

from __future__ import annotations

from typing import Any

from verispec.server.app import create_app
from verispec.server.protocol import Limits

__all__ = ["Limits", "create_app", "serve"]


def serve(engine: Any, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info", **options: Any) -> None:
    """Run the server on ``host:port`` with uvicorn until interrupted (``options``: :func:`create_app`'s)."""
    import uvicorn

    uvicorn.run(create_app(engine, **options), host=host, port=port, log_level=log_level)
