"""Load-testing a running server: concurrent streaming clients, some of which hang up mid-stream, for a fixed time.

:func:`load_test` is what the short test and ``benchmarks/load_server.py`` run. It talks HTTP only (loopback), so
the server under test is any ``verispec serve``. Each client sends streamed chat completions one after another
until the time is up; a client marked as a disconnecter closes its connection after a few tokens have arrived
(a user who stops reading), every other client reads to the end and checks that the response is complete: every
event parses, the last choice chunk carries a ``finish_reason``, the usage chunk (``stream_options.include_usage``)
counts the tokens that arrived, and the stream ends with ``[DONE]``. Status codes >= 500, broken streams and
failed requests are collected; a ``sample`` callback (e.g. the server process's resident memory) is called every
``sample_every_s``.
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["check_stream", "load_test", "rss_mib"]


def rss_mib(pid: int) -> float:
    """Resident memory of process ``pid`` in MiB (Linux: /proc/PID/status)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def _has_text(line: str) -> bool:
    """Whether an event line carries generated text."""
    if not line.startswith("data:") or line.endswith("[DONE]"):
        return False
    try:
        choices = json.loads(line[len("data:"):]).get("choices") or []
    except ValueError:
        return False
    return any((ch.get("delta") or {}).get("content") for ch in choices)


def check_stream(lines: Sequence[str]) -> tuple[dict[str, Any], str | None]:
    """Read a finished chat-completions event stream (its ``data:`` lines); return (facts, problem or None).

    Complete means: every event is JSON, one choice chunk ends with a ``finish_reason``, a usage chunk counts as
    many completion tokens as content pieces arrived (at most one token a piece) and not fewer than one, and the
    last event is ``[DONE]``."""
    events = [ln[len("data:"):].strip() for ln in lines if ln.startswith("data:")]
    if not events or events[-1] != "[DONE]":
        return {}, "the stream did not end with [DONE]"
    finish, usage, pieces, text = None, None, 0, []
    for ev in events[:-1]:
        try:
            obj = json.loads(ev)
        except ValueError:
            return {}, f"an event is not JSON: {ev[:80]!r}"
        if "error" in obj:
            return {}, f"an error event: {obj['error']}"
        if obj.get("usage"):
            usage = obj["usage"]
        for ch in obj.get("choices") or []:
            content = (ch.get("delta") or {}).get("content")
            if content:
                pieces += 1
                text.append(content)
            if ch.get("finish_reason"):
                finish = ch["finish_reason"]
    facts = {"finish_reason": finish, "pieces": pieces, "text": "".join(text),
             "completion_tokens": (usage or {}).get("completion_tokens")}
    if finish is None:
        return facts, "no chunk carried a finish_reason"
    if usage is None:
        return facts, "no usage chunk"
    if not 1 <= usage["completion_tokens"] or pieces > usage["completion_tokens"]:
        return facts, f"usage counts {usage['completion_tokens']} tokens for {pieces} content pieces"
    return facts, None


def load_test(base_url: str, model: str, prompts: Sequence[str], clients: int = 16, disconnecting: int = 4,
              duration_s: float = 600.0, max_tokens: int = 32, seed: int = 0, timeout_s: float = 600.0,
              sample: Callable[[], float] | None = None, sample_every_s: float = 5.0,
              extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run ``clients`` streaming clients against ``base_url`` for ``duration_s`` seconds (requests in flight at
    the end run to their end); the first ``disconnecting`` of them hang up after 1-3 tokens (text chunks) of every
    response. Returns counts (requests, completed, disconnected, by status), every problem found, the latencies of the
    completed responses, and the samples of ``sample`` as (seconds since the start, value)."""
    url = urllib.parse.urlsplit(base_url)
    if not 0 <= disconnecting <= clients or clients < 1:
        raise ValueError(f"need 0 <= disconnecting <= clients and clients >= 1, got {disconnecting}, {clients}")
    lock = threading.Lock()
    statuses: Counter[str] = Counter()
    problems: list[dict[str, Any]] = []
    latencies: list[float] = []
    counts = Counter[str]()
    t0 = time.monotonic()
    deadline = t0 + duration_s
    samples: list[tuple[float, float]] = []
    done = threading.Event()

    def record(kind: str, **info: Any) -> None:
        with lock:
            problems.append({"kind": kind, **info})

    def client(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        hang_up = i < disconnecting
        while time.monotonic() < deadline:
            body = {"model": model, "messages": [{"role": "user", "content": rng.choice(list(prompts))}],
                    "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True},
                    "temperature": rng.choice([0.0, 0.7]), "seed": rng.randrange(2**31), **(extra or {})}
            start = time.monotonic()
            conn = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout_s)
            try:
                conn.request("POST", "/v1/chat/completions", json.dumps(body),
                             {"Content-Type": "application/json"})
                resp = conn.getresponse()
                with lock:
                    statuses[str(resp.status)] += 1
                    counts["requests"] += 1
                if resp.status >= 500:
                    record("status", client=i, status=resp.status, body=resp.read().decode()[:300])
                    continue
                if resp.status != 200:  # 429 under a full queue is the server's answer, not a fault
                    resp.read()
                    continue
                lines: list[str] = []
                stop_after = rng.randint(1, 3) if hang_up else None  # tokens read before hanging up
                while raw := resp.readline():
                    if line := raw.decode().strip():
                        lines.append(line)
                    if stop_after is not None and _has_text(line):
                        stop_after -= 1
                        if stop_after == 0:
                            break  # closing the connection below hangs up mid-stream
                if stop_after is not None and lines[-1:] != ["data: [DONE]"]:
                    with lock:
                        counts["disconnected"] += 1
                    continue
                facts, problem = check_stream(lines)
                if problem:
                    record("incomplete", client=i, problem=problem, facts=facts)
                else:
                    with lock:
                        counts["completed"] += 1
                        latencies.append(time.monotonic() - start)
            except (OSError, http.client.HTTPException) as exc:
                with lock:
                    counts["requests"] += 1
                record("transport", client=i, error=repr(exc)[:300])
            finally:
                conn.close()

    def sampler() -> None:
        while not done.is_set():
            if sample is not None:
                samples.append((round(time.monotonic() - t0, 2), sample()))
            done.wait(sample_every_s)

    threads = [threading.Thread(target=client, args=(i,), name=f"load-client-{i}") for i in range(clients)]
    watcher = threading.Thread(target=sampler, name="load-sampler", daemon=True)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    watcher.join()
    if sample is not None:
        samples.append((round(time.monotonic() - t0, 2), sample()))
    health = None
    try:
        with urllib.request.urlopen(base_url + "/health", timeout=30) as resp:
            health = resp.status
    except OSError as exc:
        record("health", error=repr(exc)[:300])
    return {"clients": clients, "disconnecting": disconnecting, "duration_s": duration_s,
            "wall_s": round(time.monotonic() - t0, 2), "max_tokens": max_tokens, "statuses": dict(statuses),
            "requests": counts["requests"], "completed": counts["completed"],
            "disconnected": counts["disconnected"], "server_errors": sum(v for k, v in statuses.items()
                                                                        if k.startswith("5")),
            "problems": problems, "latencies_s": [round(x, 3) for x in latencies], "samples": samples,
            "health": health}
