"""Rerunnable sweeps: the same real-pair grid run several ways, every unit's tokens compared, and what
``deterministic = true`` costs in throughput.

The grid: the first PROBLEMS HumanEval problems x 3 seeds, lossless, T = 0.7, gamma 5, MAX_NEW_TOKENS new tokens,
transformers bf16 target with the llama.cpp draft, one thread, common random numbers (48 units by default). Runs,
each into its own directory by ``verispec bench run`` in a subprocess, one after the other:

- ``det-b1`` / ``det-b8``: ``deterministic = true`` at batch size 1 and 8;
- ``det-shards``: the same as two shards, the first stopped after a few units and then resumed;
- ``batched-b1`` / ``batched-b8``: ``deterministic = false`` (batched forwards) at batch size 1 and 8.

Reported: per pair of runs, how many units are token-identical and how many grades differ; per run, wall seconds
and units per hour; the cost of determinism as the ratio of ``det-b8`` to ``batched-b8`` wall time. Not a test:
nothing is asserted (tests/backends/test_isolated.py holds the checks).

    python benchmarks/determinism.py --out docs/results/determinism.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from schedule import cpu_name  # noqa: E402  the same CPU line as the other benchmarks

CONFIG = """name = "determinism"
seeds = [0, 1, 2]
temperature = 0.7
gamma = 5
max_new_tokens = {tokens}
coupling = "common"
deterministic = {det}

[models]
target = "qwen2.5-coder-1.5b-instruct"
draft = "qwen2.5-coder-0.5b-instruct"
drafter = "llamacpp"
dtype = "bfloat16"
threads = 1

[[tasks]]
name = "humaneval"
limit = {problems}

[[methods]]
rule = "lossless"
"""


def bench_run(config: Path, out: Path, *extra: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "verispec.cli.main", "bench", "run", str(config), "--out", str(out),
                    "--no-progress", *extra], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def load(run_dir: Path) -> dict[str, dict]:
    out = {}
    for f in sorted(run_dir.glob("results*.jsonl")):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            out[rec["key"]] = rec
    return out


def compare(a: dict[str, dict], b: dict[str, dict]) -> dict:
    keys = sorted(set(a) & set(b))
    same = sum(a[k]["token_ids"] == b[k]["token_ids"] for k in keys)
    grades = sum(a[k]["grade"]["passed"] != b[k]["grade"]["passed"] for k in keys)
    return {"units": len(keys), "token_identical": same, "grade_differs": grades}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default=None, help="directory for the run directories (default: a temporary one)")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="verispec-determinism-"))
    work.mkdir(parents=True, exist_ok=True)
    configs = {}
    for det in (True, False):
        p = work / f"det-{str(det).lower()}.toml"
        p.write_text(CONFIG.format(tokens=args.max_new_tokens, det=str(det).lower(), problems=args.problems))
        configs[det] = p
    seconds: dict[str, float] = {}
    runs = {}
    for name, det, extra in (("det-b1", True, ["--batch-size", "1"]), ("det-b8", True, ["--batch-size", "8"]),
                             ("batched-b1", False, ["--batch-size", "1"]),
                             ("batched-b8", False, ["--batch-size", "8"])):
        seconds[name] = bench_run(configs[True if det else False], work / name, *extra)
        runs[name] = load(work / name)
        print(name, f"{seconds[name]:.0f} s", flush=True)
    shard_dir = work / "det-shards"
    t = bench_run(configs[True], shard_dir, "--shard", "0/2", "--max-units", "3")
    t += bench_run(configs[True], shard_dir, "--shard", "1/2")
    t += bench_run(configs[True], shard_dir, "--shard", "0/2")  # the resume
    seconds["det-shards"] = t
    runs["det-shards"] = load(shard_dir)
    pairs = [("det-b1", "det-b8"), ("det-b1", "det-shards"), ("det-b8", "det-shards"),
             ("batched-b1", "batched-b8"), ("det-b1", "batched-b1"), ("det-b8", "batched-b8")]
    result = {
        "cpu": cpu_name(),
        "grid": {"task": "humaneval", "problems": args.problems, "seeds": 3, "method": "lossless",
                 "max_new_tokens": args.max_new_tokens, "temperature": 0.7, "gamma": 5,
                 "target": "qwen2.5-coder-1.5b-instruct (transformers, bf16)",
                 "draft": "qwen2.5-coder-0.5b-instruct (llama.cpp)", "threads": 1},
        "runs": {name: {"units": len(r), "wall_s": round(seconds[name], 1),
                        "units_per_hour": round(3600 * len(r) / seconds[name], 1),
                        "tokens": sum(x["new_tokens"] for x in r.values())} for name, r in runs.items()},
        "pairs": {f"{a} vs {b}": compare(runs[a], runs[b]) for a, b in pairs},
        "det_b8_over_batched_b8_wall": round(seconds["det-b8"] / seconds["batched-b8"], 3),
        "det_b8_over_det_b1_wall": round(seconds["det-b8"] / seconds["det-b1"], 3),
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
