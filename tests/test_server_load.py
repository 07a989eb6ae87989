"""The server under concurrent streaming clients, a quarter of which hang up mid-stream: no 5xx, no broken or
incomplete stream among those read to the end, the engine holds no row afterwards, the server stays healthy.

A short version (8 clients, 2 disconnecting, 6 seconds, the toy engine); the long run (16 clients, 10 minutes, the
real pair, resident memory sampled) is ``benchmarks/load_server.py``."""

from __future__ import annotations

import re
import time
import urllib.request

from verispec.server import create_app
from verispec.server.background import BackgroundServer
from verispec.server.load import check_stream, load_test
from verispec.testing import toy_engine


def in_flight(url: str) -> float:
    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    return float(re.search(r"^verispec_requests_in_flight (\S+)$", text, re.M).group(1))


def test_check_stream_finds_what_is_missing():
    ok = ['data: {"choices":[{"delta":{"content":"a"},"finish_reason":null}]}',
          'data: {"choices":[{"delta":{},"finish_reason":"length"}]}',
          'data: {"choices":[],"usage":{"completion_tokens":1}}', "data: [DONE]"]
    facts, problem = check_stream(ok)
    assert problem is None and facts["text"] == "a" and facts["finish_reason"] == "length"
    assert "DONE" in check_stream(ok[:-1])[1]
    assert "finish_reason" in check_stream([ok[0], ok[2], ok[3]])[1]
    assert "usage" in check_stream([ok[0], ok[1], ok[3]])[1]
    assert "JSON" in check_stream([ok[0], "data: {oops", ok[3]])[1]
    assert "tokens" in check_stream([ok[0], ok[0], ok[1], ok[2], ok[3]])[1]  # 2 pieces, 1 token counted


def test_streaming_clients_that_hang_up_leave_the_server_whole():
    engine = toy_engine("model", cache=False)
    app = create_app(engine, model_name="toy", max_batch=4, max_concurrency=64)
    with BackgroundServer(app) as srv:
        report = load_test(srv.url, "toy", ["hello there", "write a function", "count to ten"], clients=8,
                           disconnecting=2, duration_s=6.0, max_tokens=24, timeout_s=120)
        deadline = time.monotonic() + 30
        while in_flight(srv.url) and time.monotonic() < deadline:  # cancelled jobs leave at the next round
            time.sleep(0.1)
        assert in_flight(srv.url) == 0
    assert report["server_errors"] == 0 and report["problems"] == [], report["problems"][:3]
    assert report["completed"] >= 6 and report["disconnected"] >= 2, report
    assert report["health"] == 200
