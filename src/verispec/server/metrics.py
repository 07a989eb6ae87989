"""Prometheus metrics of one server (its own registry, so several apps in one process never collide).

Names (all prefixed ``verispec_``):

- ``requests_total{endpoint, status}``: HTTP requests answered, by path and status code (4xx included);
- ``requests_finished_total{finish_reason}``: generations that ended (stop, length, cancelled, error);
- ``prompt_tokens_total``, ``completion_tokens_total``: tokens of finished generations;
- ``drafted_tokens_total{rule}``, ``accepted_tokens_total{rule}``: speculative counters by verification rule;
- ``block_efficiency{rule}``, ``acceptance_fraction{rule}``: per-request histograms (BE: emitted accepted drafted
  tokens per target step; accepted / drafted);
- ``queue_depth`` (requests waiting for a batch slot), ``running`` (rows in the batch), ``requests_in_flight``
  (admitted requests not yet finished: what ``--max-concurrency`` bounds);
- ``time_to_first_token_seconds``, ``request_latency_seconds``: from the request's arrival at the server to its
  first committed token / its end;
- ``engine_round_failures_total``: engine rounds that raised (their requests failed, the server went on).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from verispec.runtime.types import GenerationResult

__all__ = ["ServerMetrics"]

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
BE_BUCKETS = (0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 12.0, 16.0)
FRACTION_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)


class ServerMetrics:
    """The server's counters, gauges and histograms (see the module docstring)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("verispec_requests", "HTTP requests answered", ["endpoint", "status"], registry=r)
        self.finished = Counter("verispec_requests_finished", "Generations ended", ["finish_reason"], registry=r)
        self.prompt_tokens = Counter("verispec_prompt_tokens", "Prompt tokens of finished generations", registry=r)
        self.completion_tokens = Counter("verispec_completion_tokens", "Generated tokens", registry=r)
        self.drafted = Counter("verispec_drafted_tokens", "Drafted tokens", ["rule"], registry=r)
        self.accepted = Counter("verispec_accepted_tokens", "Accepted drafted tokens", ["rule"], registry=r)
        self.block_efficiency = Histogram("verispec_block_efficiency", "Block efficiency per request", ["rule"],
                                          buckets=BE_BUCKETS, registry=r)
        self.acceptance = Histogram("verispec_acceptance_fraction", "Accepted / drafted per request", ["rule"],
                                    buckets=FRACTION_BUCKETS, registry=r)
        self.queue_depth = Gauge("verispec_queue_depth", "Requests waiting for a batch slot", registry=r)
        self.running = Gauge("verispec_running", "Rows in the running batch", registry=r)
        self.in_flight = Gauge("verispec_requests_in_flight", "Admitted requests not yet finished", registry=r)
        self.ttft = Histogram("verispec_time_to_first_token_seconds", "Arrival to first committed token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.latency = Histogram("verispec_request_latency_seconds", "Arrival to end of generation",
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.round_failures = Counter("verispec_engine_round_failures", "Engine rounds that raised", registry=r)

    def record_result(self, rule: str, result: GenerationResult, latency_s: float) -> None:
        """Count one finished generation (any finish reason)."""
        m = result.metrics
        self.finished.labels(result.finish_reason).inc()
        self.prompt_tokens.inc(len(result.prompt_ids))
        self.completion_tokens.inc(len(result.token_ids))
        self.drafted.labels(rule).inc(m.drafted)
        self.accepted.labels(rule).inc(m.accepted)
        if m.rounds:
            self.block_efficiency.labels(rule).observe(m.block_efficiency)
        if m.drafted:
            self.acceptance.labels(rule).observe(m.accepted_fraction)
        self.latency.observe(latency_s)

    def exposition(self) -> bytes:
        """The Prometheus text format of everything above."""
        return generate_latest(self.registry)
