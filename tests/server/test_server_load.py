"""The server under concurrent streaming clients, a quarter of which hang up mid-stream: no 5xx, no broken or
incomplete stream among those read to the end, the engine holds no row afterwards, the server stays healthy.

A short version (8 clients, 2 disconnecting, 6 seconds, the toy engine); the long run (16 clients, 10 minutes, the
real pair, resident memory sampled) is ``benchmarks/load_server.py``."""

from __future__ import annotations

import re
import threading
import time
import urllib.request

import pytest

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


class CountingWorker:
    """A worker over the toy engine whose rounds record how many rows they ran (each slowed by ``step_s``), and
    ``send(k)``: k requests handed over 50 ms apart, waiting until all are done."""

    def __init__(self, gather_s: float, step_s: float = 0.0, max_new_tokens: int = 40) -> None:
        from verispec.server.worker import Worker

        engine = toy_engine("model", cache=False)
        self.sizes: list[int] = []
        step = engine.step

        def counted(rows):
            self.sizes.append(len(rows))
            time.sleep(step_s)
            return step(rows)

        engine.step = counted  # type: ignore[method-assign]
        self.max_new_tokens = max_new_tokens
        self.finished = threading.Semaphore(0)
        self.worker = Worker(engine, max_batch=4, gather_s=gather_s)

    def send(self, k: int) -> None:
        from verispec.core.sampling import SamplingConfig
        from verispec.runtime.types import Request
        from verispec.server.worker import Job

        finished = self.finished

        class Listener:
            def admitted(self) -> None: ...
            def rejected(self, exc: Exception) -> None: raise AssertionError(exc)
            def tokens(self, ids, handle) -> None: ...
            def done(self, handle) -> None: finished.release()

        for i in range(k):
            self.worker.submit(Job(lambda e, i=i: Request([1 + i, 2, 3], sampling=SamplingConfig(temperature=0),
                                                          max_new_tokens=self.max_new_tokens, gamma=1), Listener()))
            time.sleep(0.05)
        for _ in range(k):
            assert finished.acquire(timeout=60)


@pytest.mark.parametrize("gather_s,first_round", [(0.5, 3), (0.0, 1)])
def test_an_idle_worker_gathers_a_burst_into_one_round(gather_s, first_round):
    """Three requests handed over 50 ms apart to an idle worker: with a gathering window longer than the burst
    they share the first round (one prefill round); without one, the first starts alone."""
    from verispec.server.worker import Worker

    w = CountingWorker(gather_s)
    w.worker.start()
    try:
        w.send(3)
    finally:
        w.worker.stop()
    assert w.sizes[0] == first_round, w.sizes
    with pytest.raises(ValueError, match="gather_s"):
        Worker(w.worker.engine, gather_s=-1)


def test_the_worker_waits_for_a_burst_only_after_seeing_one():
    """A lone request turns the gathering wait off (the next idle start runs at once); a request that starts alone
    and sees two more arrive during its first round turns it back on, and the next burst shares its first round.
    Rounds are slowed to 0.3 s so that the 50 ms-apart arrivals land inside the first round."""
    from verispec.server.worker import Worker

    w = CountingWorker(gather_s=0.5, step_s=0.3, max_new_tokens=4)
    assert w.worker.gathering
    w.worker.start()
    try:
        w.send(1)
        assert not w.worker.gathering  # one request alone: nothing was gained by waiting
        w.sizes.clear()
        w.send(3)
        assert w.sizes[0] == 1 and w.worker.gathering, w.sizes  # started at once; two more came during its round
        w.sizes.clear()
        w.send(3)
        assert w.sizes[0] == 3, w.sizes  # gathered again
    finally:
        w.worker.stop()
    assert not Worker(w.worker.engine, gather_s=0).gathering
