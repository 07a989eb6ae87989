"""Many requests at once on the real pair: aggregate tokens/s and per-request latency vs batch size.

One run, one process, same models: for each drafter (the draft model, prompt lookup) and temperature (greedy,
0.7), ``max(B, 4)`` requests (HumanEval prompts via the chat template) go through the continuous-batching
scheduler ``B`` rows at a time, for B in --batch-sizes. Prints aggregate tokens/s, its ratio to B = 1, the mean
per-request latency and time to first token, and the mean padded width of the target's forwards; writes JSON.
With ``--harness N`` it also runs N units of ``configs/paper_small.toml`` (lossless, seed 0) through
``verispec bench run`` at batch size 1 and 8 into temporary directories and reports units/hour. Not a test:
nothing is asserted.

    python3 benchmarks/batching.py --threads 2 --max-new-tokens 64 --out docs/results/batching.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from verispec import SamplingConfig, load_engine
from verispec.drafters import NgramDrafter
from verispec.eval.tasks import get_task
from verispec.runtime.engine import Engine
from verispec.runtime.scheduler import Scheduler
from verispec.runtime.types import Request


def run_batch(engine: Engine, prompts: list[list[int]], cfg: SamplingConfig, batch: int, new: int) -> dict:
    sched = Scheduler(engine, max_batch=batch)
    widths: list[int] = []
    score = engine.target.score

    def spy(requests):  # the padded width of every target forward (rows x widest row)
        widths.append(max(len(r.tokens) + 1 for r in requests))
        return score(requests)

    engine.target.score = spy  # type: ignore[method-assign]
    try:
        t0 = time.perf_counter()
        handles = [sched.submit(Request(p, sampling=cfg, gamma=5, max_new_tokens=new, seed=i))
                   for i, p in enumerate(prompts)]
        sched.run()
        wall = time.perf_counter() - t0
    finally:
        del engine.target.score
    res = [h.result for h in handles]
    tokens = sum(len(r.token_ids) for r in res)
    return {
        "batch": batch,
        "requests": len(prompts),
        "tokens": tokens,
        "wall_s": wall,
        "tok_s": tokens / wall,
        "latency_s": statistics.mean(r.metrics.total_s for r in res),
        "ttft_s": statistics.mean(r.metrics.time_to_first_token_s or 0.0 for r in res),
        "be": statistics.mean(r.metrics.block_efficiency for r in res),
        "target_forwards": len(widths),
        "mean_width": statistics.mean(widths) if widths else 0.0,
        "outputs": [r.token_ids for r in res],
    }


def harness(n_units: int, threads: int) -> list[dict]:
    from verispec.eval.run import run_sweep

    out = []
    for batch in (1, 8):
        with tempfile.TemporaryDirectory() as d:
            cfg = Path(d) / "cfg.toml"
            text = Path("configs/paper_small.toml").read_text()
            cfg.write_text(text)
            t0 = time.perf_counter()
            s = run_sweep(cfg, Path(d) / "run", seeds=[0], max_units=n_units, progress=False, batch_size=batch)
            wall = time.perf_counter() - t0
            out.append({"batch": batch, "units": s.completed, "failed": s.failed, "wall_s": wall,
                        "units_per_hour": 3600 * s.completed / wall})
            print(f"harness batch {batch}: {s.completed} units in {wall:.0f} s -> {out[-1]['units_per_hour']:.0f}/h",
                  flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-sizes", default="1,2,4,8,16")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--drafters", default="model,ngram")
    ap.add_argument("--temperatures", default="0,0.7")
    ap.add_argument("--harness", type=int, default=0, help="also run N paper_small units at batch 1 and 8")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sizes = [int(x) for x in args.batch_sizes.split(",")]
    base = load_engine(drafter="model", threads=args.threads)
    engines = {"model": base, "ngram": Engine(base.target, NgramDrafter(), base.tokenizer, base.eos_token_ids)}
    problems = get_task("humaneval").load(limit=max(max(sizes), 4))
    tok = base.tokenizer
    prompts = [list(tok.apply_chat_template(p.messages, add_generation_prompt=True, tokenize=True, return_dict=False))
               for p in problems]
    rows = []
    for name in args.drafters.split(","):
        for temp in (float(t) for t in args.temperatures.split(",")):
            cfg = SamplingConfig(temperature=temp)
            ref = None
            for b in sizes:
                r = run_batch(engines[name], prompts[: max(b, 4)], cfg, b, args.max_new_tokens)
                r.update(drafter=name, temperature=temp)
                if ref is None:
                    ref = r
                r["vs_b1"] = r["tok_s"] / ref["tok_s"]
                same = [o == a for o, a in zip(r["outputs"], ref["outputs"], strict=False)]
                r["same_as_b1"] = f"{sum(same)}/{len(same)}"
                rows.append(r)
                print(f"{name:6s} T={temp:<4} B={b:2d}: {r['tok_s']:6.1f} tok/s ({r['vs_b1']:.2f}x B=1), latency "
                      f"{r['latency_s']:.1f} s, TTFT {r['ttft_s']:.2f} s, BE {r['be']:.2f}, forwards "
                      f"{r['target_forwards']}, outputs equal to B=1 on {r['same_as_b1']}", flush=True)
    print("\n| drafter | T | batch | requests | tok/s | vs batch 1 | latency s | TTFT s | BE | same as B=1 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['drafter']} | {r['temperature']} | {r['batch']} | {r['requests']} | {r['tok_s']:.1f} | "
              f"{r['vs_b1']:.2f}x | {r['latency_s']:.1f} | {r['ttft_s']:.2f} | {r['be']:.2f} | {r['same_as_b1']} |")
    result = {"rows": [{k: v for k, v in r.items() if k != "outputs"} for r in rows], "args": vars(args)}
    if args.harness:
        result["harness"] = harness(args.harness, args.threads)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
