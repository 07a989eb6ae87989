"""Serving overhead on the real pair: the HTTP server (official openai client, streamed) vs the same engine called
directly, at several concurrency levels, in one run. Not a test: nothing is asserted.

For each concurrency level C (the paths run one after another per level, so that load drift on a shared machine
hits all of them):

- generate (only where there are more requests than C): ``Engine.generate(prompts, batch_size=C)``; its latency
  and TTFT (the engine's own metrics) count from submission, i.e. they include waiting for a batch slot;
- direct: the engine through its Scheduler, closed loop: C requests in the batch, the next one submitted when one
  ends (what the server does, minus HTTP), with the server's default gamma; latency and TTFT from submission;
- server: ``create_app`` served by uvicorn on 127.0.0.1 (max_batch: the highest level) on a thread of this
  process, or with ``--server-process`` ``verispec serve`` with the same settings as a process of its own; C client
  threads each sending its share of the requests one after another (streamed chat completions); latency from
  sending to the last chunk, time to first token to the first chunk with text.

With ``--repeats R`` both paths run R times per level, their order alternated; the ratio is given per repeat.
The engine runs on a thread other than the main one on every path (the server's worker thread; one long-lived
thread for the direct path, ``on_thread``). Backends and drafter as ``verispec serve`` chooses them unless
--target-backend / --drafter. Same prompts (short chat prompts), same settings (greedy unless --temperature,
--max-new-tokens, seed 0). Prints requests/s, generated tokens/s, time to first token (median) and latency p50 /
p99 per level and path, and each path's requests/s relative to direct side by side; writes JSON and a markdown
table.

    python3 benchmarks/serving.py --levels 1,4,16 --requests 16 --repeats 2 --max-new-tokens 32 --threads 2 \\
        --skip-generate --server-process --out docs/results/serving.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from types import SimpleNamespace

import torch
from load_server import stop, wait_healthy  # noqa: E402  (benchmarks/)
from openai import OpenAI

from verispec import models
from verispec.api import load_engine
from verispec.core.sampling import SamplingConfig
from verispec.defaults import AUTO, DRAFTERS, SERVING_GAMMA, resolve_backends
from verispec.runtime.engine import Engine
from verispec.runtime.scheduler import Handle, Scheduler
from verispec.runtime.types import Request
from verispec.server import create_app
from verispec.server.background import BackgroundServer, free_port

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Write a Python function that reverses a linked list.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Write a Python function that merges two sorted lists.",
    "Write a Python function that counts the words in a string.",
    "Write a Python function that flattens a nested list.",
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a Python function that computes the greatest common divisor of two integers.",
    "Write a Python function that removes duplicates from a list while keeping order.",
    "Write a Python function that converts a Roman numeral to an integer.",
    "Write a Python function that returns the transpose of a matrix.",
    "Write a Python function that finds the longest common prefix of a list of strings.",
    "Write a Python function that performs binary search on a sorted list.",
    "Write a Python function that computes the factorial of n iteratively.",
    "Write a Python function that checks whether brackets in a string are balanced.",
    "Write a Python function that returns the k most frequent elements of a list.",
]


@dataclass
class Sample:
    text: str
    tokens: int
    ttft_s: float
    latency_s: float
    rounds: int | None = None  # engine rounds the request took (server: from the response's verispec block)
    gamma_counts: dict | None = None  # rounds per drafted depth (0: a plain round), the schedule's choices
    engine_s: float | None = None  # the engine's own clock from admission to the end (server: verispec.timings)


@dataclass
class Level:
    path: str
    concurrency: int
    requests: int
    wall_s: float
    samples: list[Sample]

    def summary(self) -> dict:
        lat = sorted(s.latency_s for s in self.samples)
        rounds = [s.rounds for s in self.samples]
        return {
            "path": self.path,
            "concurrency": self.concurrency,
            "requests": self.requests,
            "requests_per_s": self.requests / self.wall_s,
            "tokens_per_s": sum(s.tokens for s in self.samples) / self.wall_s,
            "ttft_p50_s": statistics.median(s.ttft_s for s in self.samples),
            "latency_p50_s": statistics.median(lat),
            "latency_p99_s": percentile(lat, 0.99),
            # the paths' engines keep their own gamma schedules: equal tokens per round means equal speculation
            "tokens_per_round": (sum(s.tokens for s in self.samples) / sum(rounds)  # type: ignore[arg-type]
                                 if None not in rounds else None),
            # latency minus engine time = what lies outside the engine (HTTP, streaming, the client)
            "engine_p50_s": (statistics.median(s.engine_s for s in self.samples)  # type: ignore[type-var]
                             if all(s.engine_s is not None for s in self.samples) else None),
        }


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile (with few samples p99 is the maximum)."""
    return sorted_values[min(len(sorted_values) - 1, math.ceil(q * len(sorted_values)) - 1)]


_ENGINE_THREAD = ThreadPoolExecutor(1, thread_name_prefix="direct-engine")


def on_thread(fn: Callable[..., Level], *args: object) -> Level:
    """Run ``fn`` on one long-lived thread other than the main one, as the server's worker runs the engine: the
    same torch work ran slower on the main thread than on another thread once, and on a fresh thread than on one
    that had run before (see docs/results/serving.md), so every direct run uses the same thread."""
    return _ENGINE_THREAD.submit(fn, *args).result()


def run_direct(engine: Engine, prompts: list[str], c: int, cfg: SamplingConfig, n: int,
               gamma: int | str = SERVING_GAMMA) -> Level:
    """The engine through its Scheduler, closed loop: c requests in the batch, the next submitted when one ends
    (what the server does, minus HTTP); latency and TTFT from submission."""
    sched = Scheduler(engine, max_batch=c)
    first: dict[int, float] = {}
    start: dict[int, float] = {}
    finished: dict[int, float] = {}

    def on_tokens(h: Handle, ids: list[int]) -> None:
        first.setdefault(h.id, time.perf_counter())

    def submit(p: str) -> Handle:
        h = sched.submit(Request(p, sampling=cfg, max_new_tokens=n, seed=0, chat=True, gamma=gamma),
                         on_tokens=on_tokens)
        start[h.id] = time.perf_counter()
        return h

    t0 = time.perf_counter()
    queue = list(prompts)
    handles = [submit(queue.pop(0)) for _ in range(min(c, len(queue)))]
    while not sched.idle:
        sched.step()
        now = time.perf_counter()
        for h in handles:
            if h.done and h.id not in finished:
                finished[h.id] = now
                if queue:
                    handles.append(submit(queue.pop(0)))
    wall = time.perf_counter() - t0
    samples = [Sample(h.result.text, len(h.result.token_ids), first[h.id] - start[h.id],
                      finished[h.id] - start[h.id], h.result.metrics.rounds, h.result.metrics.gamma_counts,
                      h.result.metrics.total_s)
               for h in handles]
    return Level("direct", c, len(prompts), wall, samples)


class DirectProcess:
    """The direct path in a process of its own (``--direct-process``): this script with ``--direct-worker`` loads the
    engine as ``verispec serve`` does and runs :func:`run_direct` for each JSON line it reads, answering with the
    Level as one JSON line. With the server in its own process too, both engines live in processes set up alike
    and this one only sends requests and keeps time."""

    def __init__(self, args: argparse.Namespace, target_backend: str, drafter: str) -> None:
        cmd = [sys.executable, __file__, "--direct-worker", "--levels", ",".join(map(str, args.levels)), "--threads",
               str(args.threads), "--dtype", args.dtype, "--target-backend", target_backend, "--drafter", drafter]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()
        if not ready.startswith("ready "):
            raise RuntimeError("the direct worker did not start")
        self.backends: dict = json.loads(ready[len("ready "):])

    def run(self, prompts: list[str], c: int, temperature: float, n: int, gamma: int | str) -> Level:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        job = {"prompts": prompts, "c": c, "temperature": temperature, "n": n, "gamma": gamma}
        self.proc.stdin.write(json.dumps(job) + "\n")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the direct worker exited")
        d = json.loads(line)
        return Level(d["path"], d["concurrency"], d["requests"], d["wall_s"], [Sample(**x) for x in d["samples"]])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def direct_worker(args: argparse.Namespace) -> None:
    """The child of :class:`DirectProcess`: one engine, one run of the closed loop per request line."""
    torch.set_num_threads(args.threads)
    engine = make_engine(args, args.target_backend, args.drafter)
    out = sys.stdout
    sys.stdout = sys.stderr  # only the protocol's lines go to the parent
    out.write(f"ready {json.dumps(engine.backends)}\n")
    out.flush()
    for line in sys.stdin:
        job = json.loads(line)
        level = on_thread(run_direct, engine, job["prompts"], job["c"], SamplingConfig(temperature=job["temperature"]),
                          job["n"], job["gamma"])
        out.write(json.dumps(asdict(level)) + "\n")
        out.flush()


def make_engine(args: argparse.Namespace, target_backend: str, drafter: str) -> Engine:
    """The engine as ``verispec serve`` loads it (rows for the highest level)."""
    return load_engine(models.DEFAULT_TARGET, models.DEFAULT_DRAFT if DRAFTERS[drafter].uses_draft_model else None,
                       drafter, args.dtype, args.threads, target_backend=target_backend, max_rows=max(args.levels))


def run_generate(engine: Engine, prompts: list[str], c: int, cfg: SamplingConfig, n: int,
                 gamma: int | str = SERVING_GAMMA) -> Level:
    """Engine.generate on the list of prompts with batch_size = c (every prompt submitted at once); its metrics'
    latency and TTFT count from submission, so they include waiting for a batch slot."""
    t0 = time.perf_counter()
    results = engine.generate(prompts, sampling=cfg, max_new_tokens=n, seed=0, chat=True, batch_size=c,
                              gamma=gamma)
    wall = time.perf_counter() - t0
    samples = [Sample(r.text, len(r.token_ids), r.metrics.time_to_first_token_s or 0.0, r.metrics.total_s,
                      r.metrics.rounds, r.metrics.gamma_counts, r.metrics.total_s) for r in results]
    return Level("generate", c, len(prompts), wall, samples)


def run_server(url: str, model: str, prompts: list[str], c: int, temperature: float, n: int,
               gamma: int | str = SERVING_GAMMA) -> Level:
    """c closed-loop clients (threads), each streaming its share of the prompts one after another."""
    results: list[Sample | None] = [None] * len(prompts)

    clients = [OpenAI(base_url=url + "/v1", api_key="unused", timeout=600, max_retries=0) for _ in range(c)]
    start = threading.Barrier(c)  # clients built beforehand send their first requests together, as direct submits

    def client_loop(k: int) -> None:
        client = clients[k]
        start.wait()
        for i in range(k, len(prompts), c):
            t0 = time.perf_counter()
            ttft, parts, tokens, metrics, timings = None, [], 0, {}, {}
            stream = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": prompts[i]}], max_tokens=n,
                temperature=temperature, seed=0, stream=True, stream_options={"include_usage": True},
                extra_body={"speculative": {"gamma": gamma}})
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    ttft = ttft if ttft is not None else time.perf_counter() - t0
                    parts.append(chunk.choices[0].delta.content)
                if chunk.usage is not None:
                    tokens = chunk.usage.completion_tokens
                if (block := (chunk.model_extra or {}).get("verispec")) is not None:
                    metrics, timings = block["metrics"], block["timings"]
            results[i] = Sample("".join(parts), tokens, ttft or 0.0, time.perf_counter() - t0,
                                metrics.get("rounds"), metrics.get("gamma_counts"), timings.get("total_s"))

    t0 = time.perf_counter()
    with ThreadPoolExecutor(c) as pool:
        for f in [pool.submit(client_loop, k) for k in range(c)]:
            f.result(timeout=3600)
    wall = time.perf_counter() - t0
    return Level("server", c, len(prompts), wall, [s for s in results if s is not None])


def report(level: Level, rows: list[dict], raw: list[dict]) -> Level:
    """Print one path's numbers at once and keep them."""
    r = level.summary()
    rows.append(r)
    raw.append(asdict(level))
    print(f"C={r['concurrency']:<3} {r['path']:<8} {r['requests']} req  {r['requests_per_s']:.3f} req/s  "
          f"{r['tokens_per_s']:.2f} tok/s  ttft p50 {r['ttft_p50_s']:.2f} s  "
          f"latency p50 {r['latency_p50_s']:.2f} s  p99 {r['latency_p99_s']:.2f} s  "
          f"engine p50 {fmt(r['engine_p50_s'])} s  tokens/round {fmt(r['tokens_per_round'])}", flush=True)
    return level


def combine(levels: list[Level]) -> Level:
    """The repeats of one path at one level as one: their requests over their summed wall time."""
    return Level(levels[0].path, levels[0].concurrency, sum(lv.requests for lv in levels),
                 sum(lv.wall_s for lv in levels), [s for lv in levels for s in lv.samples])


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def markdown(rows: list[dict], args: argparse.Namespace, equal: dict[int, str], ratios: dict[int, list[float]],
             load: list[float], backends: dict) -> str:
    lines = [
        "| concurrency | path | requests | req/s | tok/s | req/s vs direct (per repeat) | TTFT p50 (s) | "
        "latency p50 (s) | latency p99 (s) | engine time p50 (s) | tokens per round | same text as direct |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    by = {(r["concurrency"], r["path"]): r for r in rows}
    for c in args.levels:
        d = by[(c, "direct")]
        for path in ("generate", "direct", "server"):
            if (c, path) not in by:
                continue
            r = by[(c, path)]
            vs = f"{r['requests_per_s'] / d['requests_per_s']:.2f}x"
            if path == "server" and len(ratios[c]) > 1:
                vs += f" ({', '.join(f'{x:.2f}' for x in ratios[c])})"
            lines.append(f"| {c} | {path} | {r['requests']} | {r['requests_per_s']:.3f} | {r['tokens_per_s']:.2f} | "
                         f"{vs} | {r['ttft_p50_s']:.2f} | {r['latency_p50_s']:.2f} | {r['latency_p99_s']:.2f} | "
                         f"{fmt(r['engine_p50_s'])} | {fmt(r['tokens_per_round'])} | "
                         f"{equal[c] if path == 'server' else '-'} |")
    head = (f"Real pair ({models.DEFAULT_TARGET} / {models.DEFAULT_DRAFT}; target backend "
            f"{backends['target_backend']}, drafter {backends['drafter']}, {args.threads} threads), "
            f"gamma {args.gamma}, "
            f"{args.max_new_tokens} new tokens, temperature {args.temperature}, short chat prompts, {args.repeats} "
            f"repeat(s) per level with the paths' order alternated; load average (1 min) before / after: "
            f"{load[0]:.2f} / {load[1]:.2f}.")
    return head + "\n\n" + "\n".join(lines) + "\n"


@contextlib.contextmanager
def serve(engine: Engine | None, args: argparse.Namespace, target_backend: str,
          drafter: str) -> Iterator[SimpleNamespace]:
    """The server under test at ``.url``: ``create_app`` on this process's engine under uvicorn on a thread, or with
    ``--server-process`` ``verispec serve`` with the same settings as a process of its own (its own engine: the
    clients' and the direct path's Python then do not share the server's interpreter lock)."""
    if not args.server_process:
        assert engine is not None
        app = create_app(engine, model_name=models.DEFAULT_TARGET, max_batch=max(args.levels), max_concurrency=64)
        with BackgroundServer(app, timeout_s=120) as srv:
            yield SimpleNamespace(url=srv.url)
        return
    port = free_port()
    cmd = ["verispec", "serve", "--port", str(port), "--max-batch", str(max(args.levels)), "--threads",
           str(args.threads), "--dtype", args.dtype, "--target-backend", target_backend, "--drafter", drafter,
           "--served-model-name", models.DEFAULT_TARGET, "--log-level", "warning"]
    proc = subprocess.Popen(cmd)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc, 900)
        yield SimpleNamespace(url=f"http://127.0.0.1:{port}")
    finally:
        stop(proc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--levels", default="1,4,16", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--requests", default=4, type=int, help="requests per level (at least the concurrency)")
    ap.add_argument("--repeats", default=1, type=int, help="runs of both paths per level, their order alternated")
    ap.add_argument("--max-new-tokens", default=48, type=int)
    ap.add_argument("--temperature", default=0.0, type=float)
    ap.add_argument("--threads", default=2, type=int)
    ap.add_argument("--gamma", default=SERVING_GAMMA, type=lambda v: v if v == "auto" else int(v),
                    help="draft length on both paths (default: the server's, the adaptive schedule; a number takes "
                         "the two engines' schedules, which learn apart, out of the comparison)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--target-backend", default=AUTO, help="as verispec serve (auto: llama.cpp when installed)")
    ap.add_argument("--drafter", default=AUTO, help="as verispec serve")
    ap.add_argument("--skip-generate", action="store_true", help="leave out the Engine.generate path")
    ap.add_argument("--server-process", action="store_true",
                    help="run the server as a process of its own (verispec serve), not on a thread of this one")
    ap.add_argument("--direct-process", action="store_true",
                    help="run the direct path's engine in a process of its own too (with --server-process: this "
                         "process then holds no engine and only sends requests and keeps time)")
    ap.add_argument("--direct-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None)
    ap.add_argument("--md", default=None)
    args = ap.parse_args()

    if args.direct_worker:
        direct_worker(args)
        return
    if args.direct_process and not args.server_process:
        ap.error("--direct-process needs --server-process (the in-process server runs on this process's engine)")
    import os

    load0 = os.getloadavg()[0]
    torch.set_num_threads(args.threads)
    target_backend, drafter = resolve_backends(args.target_backend, args.drafter)
    cfg = SamplingConfig(temperature=args.temperature)
    engine: Engine | None = None
    if args.direct_process:
        child = DirectProcess(args, target_backend, drafter)
        backends = child.backends

        def direct_path(prompts: list[str], c: int, n: int) -> Level:
            return child.run(prompts, c, args.temperature, n, args.gamma)
    else:
        engine = make_engine(args, target_backend, drafter)
        backends = engine.backends

        def direct_path(prompts: list[str], c: int, n: int) -> Level:
            return on_thread(run_direct, engine, prompts, c, cfg, n, args.gamma)
    print(f"engine: {backends}", flush=True)
    rows, equal, raw, ratios = [], {}, [], {}
    with serve(engine, args, target_backend, drafter) as srv:
        # warm-up (not measured): one request on each path
        direct_path(PROMPTS[:1], 1, 8)
        run_server(srv.url, models.DEFAULT_TARGET, PROMPTS[:1], 1, args.temperature, 8, args.gamma)
        for c in args.levels:
            prompts = [PROMPTS[i % len(PROMPTS)] for i in range(max(args.requests, c))]
            # Engine.generate differs from the closed loop only when requests wait for a slot
            if len(prompts) > c and not args.skip_generate and engine is not None:
                report(on_thread(run_generate, engine, prompts, c, cfg, args.max_new_tokens, args.gamma), rows, raw)
            runs: dict[str, list[Level]] = {"direct": [], "server": []}
            for rep in range(args.repeats):
                for path in (("direct", "server") if rep % 2 == 0 else ("server", "direct")):
                    if path == "direct":
                        lv = direct_path(prompts, c, args.max_new_tokens)
                    else:
                        lv = run_server(srv.url, models.DEFAULT_TARGET, prompts, c, args.temperature,
                                        args.max_new_tokens, args.gamma)
                    runs[path].append(lv)
                    raw.append({"repeat": rep, **asdict(lv)})
            direct, served = combine(runs["direct"]), combine(runs["server"])
            report(direct, rows, [])
            report(served, rows, [])
            ratios[c] = [s.requests / s.wall_s / (d.requests / d.wall_s)
                         for d, s in zip(runs["direct"], runs["server"], strict=True)]
            same = sum(a.text == b.text for a, b in zip(direct.samples, served.samples, strict=True))
            equal[c] = f"{same}/{len(direct.samples)}"
            ratio = served.summary()["requests_per_s"] / direct.summary()["requests_per_s"]
            print(f"C={c:<3} server / direct: {ratio:.2f}x req/s (per repeat {[round(x, 3) for x in ratios[c]]}); "
                  f"same text as direct {equal[c]}", flush=True)
            if args.out:  # after every level, so that an interrupted run keeps what it measured
                with open(args.out, "w") as f:
                    json.dump({"args": vars(args), "backends": backends, "rows": rows, "ratios": ratios,
                               "levels": raw}, f, indent=1)
    if args.direct_process:
        child.close()
    load = [load0, os.getloadavg()[0]]
    table = markdown(rows, args, equal, ratios, load, backends)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "backends": backends, "load_avg_1min": load, "rows": rows,
                       "ratios": ratios, "levels": raw}, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(table)


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    main()
