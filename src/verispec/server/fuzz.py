"""Fuzzing a running server from its own OpenAPI document (schemathesis): generated bodies within the request
schemas (``positive``) and outside them (``negative``) on both generation endpoints, counting what comes back.

:func:`fuzz` is what the short test and ``benchmarks/fuzz_server.py`` run; it talks HTTP only (loopback), so the
server under test is any ``verispec serve``. Needs ``schemathesis`` (a test dependency)."""

from __future__ import annotations

import json
import time
import urllib.request
from collections import Counter
from typing import Any

__all__ = ["ENDPOINTS", "fuzz"]

#: the generation endpoints fuzzed
ENDPOINTS = ("/v1/completions", "/v1/chat/completions")


def _error_body_ok(text: str) -> bool:
    """An error answered in the OpenAI shape: {"error": {"message", "type", "param", "code"}} with a message."""
    try:
        err = json.loads(text)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(err, dict) and bool(err.get("message")) and {"message", "type", "param", "code"} <= set(err)


def fuzz(base_url: str, examples: int = 100, seed: int = 0, modes: tuple[str, ...] = ("positive", "negative"),
         timeout: float = 60.0) -> dict[str, Any]:
    """Send ``examples`` generated requests per endpoint and mode to the server at ``base_url``; return counts by
    status, the requests answered with a 5xx (or no answer), errors not in the OpenAI shape, and whether
    ``/health`` still answers ok afterwards."""
    import schemathesis
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_url(base_url + "/openapi.json")
    statuses: Counter[str] = Counter()
    server_errors: list[dict[str, Any]] = []
    bad_bodies: list[dict[str, Any]] = []
    start = time.perf_counter()
    for path in ENDPOINTS:
        for mode in modes:
            _send_all(schema[path]["POST"], path, GenerationMode(mode), base_url, examples, seed, timeout, statuses,
                      server_errors, bad_bodies)
    try:
        with urllib.request.urlopen(base_url + "/health", timeout=timeout) as resp:
            healthy = resp.status == 200 and json.loads(resp.read())["status"] == "ok"
    except Exception:
        healthy = False
    return {"requests": sum(statuses.values()), "by_status": dict(sorted(statuses.items())),
            "server_errors": server_errors, "bad_error_bodies": bad_bodies, "healthy_after": healthy,
            "seconds": time.perf_counter() - start}


def _send_all(operation: Any, path: str, mode: Any, base_url: str, examples: int, seed: int, timeout: float,
              statuses: Counter[str], server_errors: list[dict[str, Any]], bad_bodies: list[dict[str, Any]]) -> None:
    """``examples`` cases of one operation in one generation mode, each sent and its answer recorded."""
    import hypothesis

    @hypothesis.settings(max_examples=examples, deadline=None, database=None, derandomize=False,
                         suppress_health_check=list(hypothesis.HealthCheck), phases=[hypothesis.Phase.generate])
    @hypothesis.seed(seed)
    @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
    def send(case: Any) -> None:
        body = case.body
        try:
            resp = case.call(base_url=base_url, timeout=timeout)
        except Exception as exc:  # no answer at all counts as a server failure
            statuses["no answer"] += 1
            server_errors.append({"path": path, "body": body, "error": repr(exc)})
            return
        statuses[str(resp.status_code)] += 1
        if resp.status_code >= 500:
            server_errors.append({"path": path, "body": body, "status": resp.status_code, "answer": resp.text[:500]})
        elif resp.status_code >= 400 and not _error_body_ok(resp.text):
            bad_bodies.append({"path": path, "body": body, "status": resp.status_code, "answer": resp.text[:500]})

    send()
