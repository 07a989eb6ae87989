"""What a divergence budget costs: the seconds spent choosing each position's parameter (the exact solve of
:mod:`verispec.core.rules.budget`), as a share of a round, on the real pair, with block efficiency beside the
fixed-parameter rule and lossless SD from the same prompts and seeds.

For each target backend (transformers bf16 with the model drafter, and llama.cpp with its drafter when installed),
at temperature 0.7 and gamma 5, every prompt runs ``lossless``, ``lenience(l=0.5)``, ``lenience`` under
``{"tv": 0.05}`` and under ``{"tv_total": 1.0}``, and ``cos-we``, the overshoot ceiling and the min-p cap
(p_base 0.5; both in the residual realization their budget needs) under ``{"tv": 0.05}``; the choice is timed by
its own clock (a wrapper around the engine's ``choose``). Reported per setting: median share of a round spent
choosing (choice seconds / total seconds), mean choice milliseconds per round, round milliseconds, block
efficiency, spent budget. Not a test: nothing is asserted.

    python benchmarks/budget.py --prompts 4 --max-new-tokens 96 --threads 2 --out docs/results/budget/cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
from schedule import cpu_name, reset_caches  # noqa: E402  the same CPU line and cache reset as the schedule benchmark

import verispec.runtime.engine as engine_module
from verispec import SamplingConfig, load_engine
from verispec.core import rules
from verispec.runtime.engine import Engine

PROMPTS = ["Write a Python function that returns the n-th Fibonacci number.",
           "Write a Python function that checks whether a string is a palindrome.",
           "Write a Python function that merges two sorted lists into one sorted list.",
           "Write a Python function that counts the words in a text file.",
           "Write a Python function that returns the prime factors of an integer.",
           "Write a Python function that flattens a nested list."]
SETTINGS = [("lossless", "lossless", None), ("lenience(l=0.5)", "lenience", None),
            ("lenience tv=0.05", "lenience", {"tv": 0.05}), ("lenience tv_total=1", "lenience", {"tv_total": 1.0}),
            ("cos-we tv=0.05", "cos-we", {"tv": 0.05}),
            ("overshoot-ceiling tv=0.05", rules.get("overshoot-ceiling", realization="residual"), {"tv": 0.05}),
            ("minp-cap tv=0.05", rules.get("minp-cap", p_base=0.5, realization="residual"), {"tv": 0.05})]


class _Clock:
    """Wraps the engine's ``choose`` to add up the seconds spent choosing parameters."""

    seconds = 0.0

    @classmethod
    def install(cls) -> None:
        inner = engine_module.choose

        def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                cls.seconds += time.perf_counter() - t0

        engine_module.choose = timed  # type: ignore[assignment]


def run(engine: Engine, ids: list[int], rule: str | rules.Rule, budget: dict | None, seed: int) -> dict:
    reset_caches(engine)
    _Clock.seconds = 0.0
    res = engine.generate(ids, rule=rule, budget=budget, sampling=SamplingConfig(temperature=0.7), gamma=ARGS.gamma,
                          max_new_tokens=ARGS.max_new_tokens, seed=seed)
    m = res.metrics
    return {"tokens": len(res.token_ids), "seconds": m.total_s, "choose_s": _Clock.seconds, "rounds": m.rounds,
            "be": m.block_efficiency, "spent": m.budget["spent"] if m.budget else None}


def summarize(runs: list[dict]) -> dict:
    rounds = sum(r["rounds"] for r in runs)
    spent = [r["spent"] for r in runs if r["spent"] is not None]
    return {
        "choose_share_median": statistics.median(r["choose_s"] / r["seconds"] for r in runs),
        "choose_ms_per_round": 1000 * sum(r["choose_s"] for r in runs) / rounds,
        "round_ms": 1000 * sum(r["seconds"] for r in runs) / rounds,
        "block_efficiency": sum(r["be"] * r["rounds"] for r in runs) / rounds,
        "tok_s_median": statistics.median(r["tokens"] / r["seconds"] for r in runs),
        "spent_mean": statistics.mean(spent) if spent else None,
    }


def main() -> None:
    torch.set_num_threads(ARGS.threads)
    _Clock.install()
    report: dict = {"config": {k: v for k, v in vars(ARGS).items() if k != "out"}, "cpu": cpu_name(),
                    "loadavg_start": os.getloadavg(), "results": {}}
    print(f"CPU: {report['cpu']}; {ARGS.threads} threads", flush=True)
    engines = {"transformers bf16": lambda: load_engine(drafter="model", dtype="bfloat16", threads=ARGS.threads,
                                                        cache=False)}
    try:
        import llama_cpp  # noqa: F401

        engines["llama.cpp"] = lambda: load_engine(drafter="llamacpp", target_backend="llamacpp",
                                                   threads=ARGS.threads, cache=False)
    except ImportError as exc:
        print(f"llama.cpp not installed, its target skipped: {exc}", file=sys.stderr)
    for name, make in engines.items():
        eng = make()
        prompts = [eng.encode(p, chat=True) for p in PROMPTS[: ARGS.prompts]]
        runs: dict[str, list[dict]] = {label: [] for label, _, _ in SETTINGS}
        for i, ids in enumerate(prompts):
            for label, rule, budget in SETTINGS:
                r = run(eng, list(ids), rule, budget, seed=i)
                runs[label].append(r)
                print(f"[{name}] prompt {i} {label:20s} BE {r['be']:.2f}, {r['rounds']} rounds, choose "
                      f"{1000 * r['choose_s'] / max(r['rounds'], 1):.2f} ms/round of "
                      f"{1000 * r['seconds'] / max(r['rounds'], 1):.1f}", file=sys.stderr, flush=True)
        report["results"][name] = {label: summarize(rs) for label, rs in runs.items()}
        print(f"{name}: {json.dumps(report['results'][name])}", flush=True)
        if ARGS.out:
            write(report)
        del eng
    report["loadavg_end"] = os.getloadavg()
    if ARGS.out:
        write(report)


def write(report: dict) -> None:
    os.makedirs(os.path.dirname(ARGS.out) or ".", exist_ok=True)
    with open(ARGS.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gamma", default=5, type=int)
    ap.add_argument("--out", default=None)
    ARGS = ap.parse_args()
    main()
