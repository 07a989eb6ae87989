"""What structured output costs: tokens/s with a JSON-schema ``response_format`` against the same requests without
one, side by side in one run on the real pair.

For each target backend (transformers bf16, and llama.cpp when installed) and each temperature (0 and 0.7), the
prompts (asking for JSON describing a person, a book, a city, ...) run alternated: ``free`` (no response_format)
and ``schema`` (a JSON schema for the answer), with the same drafter and gamma, every cache reset before each run.
A constrained run emits different tokens than a free one, so the comparison is tokens per second; the share of
the time spent computing grammar masks is measured directly (the constraint's own clock). Also reported: how
many constrained outputs parse as JSON and carry the schema's required keys. Not a test: nothing is asserted.

    python benchmarks/structured.py --prompts 4 --max-new-tokens 96 --threads 2 --out docs/results/structured.json
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

from verispec import SamplingConfig, load_engine
from verispec.runtime.engine import Engine
from verispec.runtime.grammar import GrammarConstraint

SUBJECTS = ["a fictional programmer", "a made-up science fiction book", "an imaginary city", "a fictional chef",
            "a made-up board game", "an imaginary planet"]
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "summary", "year", "tags"],
          "properties": {"name": {"type": "string"}, "summary": {"type": "string"}, "year": {"type": "integer"},
                         "tags": {"type": "array", "items": {"type": "string"}}}}
FORMAT = {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA}}


class _Clock:
    """Wraps GrammarConstraint.allowed to add up the seconds spent computing masks."""

    seconds = 0.0

    @classmethod
    def install(cls) -> None:
        inner = GrammarConstraint.allowed

        def timed(self, prefix):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            try:
                return inner(self, prefix)
            finally:
                cls.seconds += time.perf_counter() - t0

        GrammarConstraint.allowed = timed  # type: ignore[method-assign]


def run(engine: Engine, ids: list[int], cfg: SamplingConfig, seed: int, fmt: dict | None) -> dict:
    reset_caches(engine)
    _Clock.seconds = 0.0
    res = engine.generate(ids, sampling=cfg, gamma=ARGS.gamma, max_new_tokens=ARGS.max_new_tokens, seed=seed,
                          response_format=fmt)
    m = res.metrics
    ok = None
    if fmt is not None:
        try:
            obj = json.loads(res.text)
            ok = isinstance(obj, dict) and set(SCHEMA["required"]) <= set(obj)
        except json.JSONDecodeError:
            ok = False
    return {"tokens": len(res.token_ids), "seconds": m.total_s, "mask_s": _Clock.seconds, "finish": res.finish_reason,
            "accepted": m.accepted, "drafted": m.drafted, "valid": ok}


def main() -> None:
    torch.set_num_threads(ARGS.threads)
    _Clock.install()
    report: dict = {"config": {k: v for k, v in vars(ARGS).items() if k != "out"}, "cpu": cpu_name(),
                    "loadavg_start": os.getloadavg(), "results": {}}
    print(f"CPU: {report['cpu']}; {ARGS.threads} threads", flush=True)
    engines = {"transformers bf16": load_engine(drafter="model", dtype="bfloat16", threads=ARGS.threads, cache=False)}
    try:
        engines["llama.cpp"] = load_engine(drafter="llamacpp", target_backend="llamacpp", threads=ARGS.threads,
                                           cache=False)
    except ImportError as exc:
        print(f"llama.cpp not installed, its target skipped: {exc}", file=sys.stderr)
    for name, eng in engines.items():
        prompts = [eng.encode(f"Describe {s} as a JSON object with name, summary, year and tags.", chat=True)
                   for s in SUBJECTS[: ARGS.prompts]]
        eng.grammar.constraint(FORMAT)  # compile once outside the timings (the tokenizer's trie: about a second)
        for label, cfg in (("T=0", SamplingConfig(temperature=0)), ("T=0.7", SamplingConfig(temperature=0.7))):
            key = f"{name} / {label}"
            runs: dict[str, list[dict]] = {"free": [], "schema": []}
            for i, ids in enumerate(prompts):
                order = ["free", "schema"] if i % 2 == 0 else ["schema", "free"]
                for who in order:
                    r = run(eng, list(ids), cfg, i, FORMAT if who == "schema" else None)
                    runs[who].append(r)
                    print(f"[{key}] prompt {i} {who:6s} {r['tokens'] / r['seconds']:6.2f} tok/s ({r['tokens']} "
                          f"tokens, {r['seconds']:.1f} s, masks {r['mask_s']:.2f} s, {r['finish']}, valid "
                          f"{r['valid']})", file=sys.stderr, flush=True)
            report["results"][key] = summarize(runs)
            print(f"{key}: {json.dumps(report['results'][key])}", flush=True)
            if ARGS.out:
                write(report)
    report["loadavg_end"] = os.getloadavg()
    if ARGS.out:
        write(report)


def summarize(runs: dict[str, list[dict]]) -> dict:
    rate = {k: [r["tokens"] / r["seconds"] for r in v] for k, v in runs.items()}
    schema = runs["schema"]
    return {
        "free_tok_s_median": statistics.median(rate["free"]),
        "schema_tok_s_median": statistics.median(rate["schema"]),
        "schema_vs_free_median": statistics.median(s / f for s, f in zip(rate["schema"], rate["free"], strict=True)),
        "mask_share_median": statistics.median(r["mask_s"] / r["seconds"] for r in schema),
        "valid": f"{sum(bool(r['valid']) for r in schema)}/{len(schema)}",
        "finished": f"{sum(r['finish'] == 'stop' for r in schema)}/{len(schema)}",
        "acceptance_free": _acc(runs["free"]), "acceptance_schema": _acc(schema),
    }


def _acc(rs: list[dict]) -> float | None:
    drafted = sum(r["drafted"] for r in rs)
    return sum(r["accepted"] for r in rs) / drafted if drafted else None


def write(report: dict) -> None:
    os.makedirs(os.path.dirname(ARGS.out) or ".", exist_ok=True)
    with open(ARGS.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gamma", default="auto", type=lambda s: s if s == "auto" else int(s))
    ap.add_argument("--out", default=None)
    ARGS = ap.parse_args()
    main()
