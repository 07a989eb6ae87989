"""Load test of ``verispec serve`` on the real pair: concurrent streaming clients, a quarter of them hanging up
mid-stream, for ten minutes; counts server errors and incomplete responses and samples the server process's resident
memory. Not a test: nothing is asserted (the short version is tests/server/test_server_load.py).

The server runs as its own process (``verispec serve``, the defaults of this machine unless --serve-args), so the
memory sampled is the server's alone. Writes JSON (every sample, every problem) and a markdown summary.

    python benchmarks/load_server.py --clients 16 --disconnecting 4 --duration 600 --max-tokens 32 \\
        --out docs/results/load.json --md docs/results/load.md
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
import urllib.request

from verispec.server.background import free_port
from verispec.server.load import load_test, rss_mib

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Write a Python function that reverses a linked list.",
    "Explain in two sentences what a hash map is.",
    "Write a Python function that merges two sorted lists.",
    "What is the difference between a list and a tuple in Python?",
    "Write a Python function that flattens a nested list.",
    "Write a haiku about compilers.",
    "Write a Python function that converts a Roman numeral to an integer.",
]


def slope_mib_per_min(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of resident memory over time, MiB per minute."""
    xs, ys = [t / 60 for t, _ in samples], [m for _, m in samples]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0


def cpu() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    flags = fields.get("Flags", "")
    isa = "AMX" if "amx_tile" in flags else "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "-"
    return (f"{fields.get('Model name', '?').strip()}, family {fields.get('CPU family', '?').strip()} model "
            f"{fields.get('Model', '?').strip()}, {os.cpu_count()} cores, {isa}")


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float, path: str = "/health") -> None:
    """Poll ``url + path`` until it answers 200; raise if ``proc`` exits first or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + path, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError(f"the server did not answer {path} within {timeout_s} s")


def stop(proc: subprocess.Popen) -> None:
    """Terminate a server process, killing it if it has not exited within a minute."""
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()


def main() -> None:
    port = free_port()
    cmd = ["verispec", "serve", "--port", str(port), "--max-batch", str(ARGS.max_batch), "--threads",
           str(ARGS.threads), "--served-model-name", "pair", "--log-level", "warning", *shlex.split(ARGS.serve_args)]
    proc = subprocess.Popen(cmd, stdout=sys.stderr, stderr=sys.stderr)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, 900)
        warm = json.dumps({"model": "pair", "messages": [{"role": "user", "content": PROMPTS[0]}],
                           "max_tokens": ARGS.max_tokens}).encode()
        urllib.request.urlopen(urllib.request.Request(url + "/v1/chat/completions", data=warm,  # weights in
                                                      headers={"Content-Type": "application/json"}), timeout=900).read()
        loaded_mib = rss_mib(proc.pid)
        print(f"server up (pid {proc.pid}, {loaded_mib:.0f} MiB); load for {ARGS.duration} s", file=sys.stderr)
        report = load_test(url, "pair", PROMPTS, clients=ARGS.clients, disconnecting=ARGS.disconnecting,
                           duration_s=ARGS.duration, max_tokens=ARGS.max_tokens, seed=ARGS.seed,
                           sample=lambda: rss_mib(proc.pid), sample_every_s=ARGS.sample_every)
        alive = proc.poll() is None
    finally:
        stop(proc)
    samples = report["samples"]
    half = [s for s in samples if s[0] >= samples[-1][0] / 2]
    lat = sorted(report["latencies_s"])
    report.update(config=vars(ARGS), command=cmd, cpu=cpu(), loaded_mib=round(loaded_mib, 1), server_alive=alive,
                  rss_first_mib=samples[0][1], rss_last_mib=samples[-1][1], rss_max_mib=max(m for _, m in samples),
                  rss_slope_second_half_mib_per_min=round(slope_mib_per_min(half), 3),
                  latency_p50_s=lat[len(lat) // 2] if lat else None,
                  finished=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    summary = {k: v for k, v in report.items() if k not in ("latencies_s", "samples", "problems")}
    print(json.dumps(summary, indent=1))
    if ARGS.out:
        with open(ARGS.out, "w") as f:
            json.dump(report, f, indent=1)
    if ARGS.md:
        with open(ARGS.md, "w") as f:
            f.write(render(report))


def render(r: dict) -> str:
    c = r["config"]
    rerun = (f"python benchmarks/load_server.py --clients {r['clients']} --disconnecting {r['disconnecting']} "
             f"--duration {r['duration_s']:.0f} --max-tokens {c['max_tokens']} "
             "--out docs/results/load.json --md docs/results/load.md")
    counts = [r["requests"], r["completed"], r["disconnected"], r["server_errors"], len(r["problems"]),
              f"{'yes' if r['server_alive'] else 'no'}, {r['health']}"]
    memory = ["server process", f"{r['loaded_mib']:.0f}", f"{r['rss_first_mib']:.0f}", f"{r['rss_last_mib']:.0f}",
              f"{r['rss_max_mib']:.0f}", f"{r['rss_slope_second_half_mib_per_min']:+.2f} MiB/min"]
    row = lambda cells: "| " + " | ".join(str(x) for x in cells) + " |"  # noqa: E731
    return "\n".join([
        "# Load test: streaming clients that hang up", "",
        f"Machine: {r['cpu']}; no GPU. `verispec serve` ({' '.join(r['command'][2:])}) as its own process, with "
        f"this machine's defaults for everything else; {r['clients']} client threads for {r['duration_s']:.0f} s, "
        f"each sending streamed chat completions one after another ({c['max_tokens']} tokens at most, temperature "
        f"0 or 0.7, a random seed, eight short prompts); {r['disconnecting']} of them close the connection after "
        "1-3 tokens (text chunks) of every response, mid-stream. The others read each stream to the end and check it: "
        "every event JSON, a "
        "`finish_reason`, a usage chunk that counts the tokens that arrived, `[DONE]` last. Regenerate with", "",
        f"    {rerun}", "",
        f"Raw numbers (every memory sample, every latency): [load.json](load.json). Finished {r['finished']}.", "",
        row(["requests", "read to the end, complete", "hung up mid-stream", "responses >= 500",
             "incomplete or broken", "server alive, /health after"]), row(["---"] * 6), row(counts), "",
        row(["resident memory (MiB)", "loaded, after one request", "first sample under load", "last", "max",
             "slope over the second half"]), row(["---"] * 6), row(memory), "",
        f"Statuses: {r['statuses']}. Median latency of a complete response: {r['latency_p50_s']} s.", ""])


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--disconnecting", type=int, default=4)
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--sample-every", type=float, default=5.0, help="seconds between memory samples")
    ap.add_argument("--serve-args", default="", help="more arguments for verispec serve")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    ap.add_argument("--md", default=None)
    ARGS = ap.parse_args()
    main()
