"""Side-by-side decoding speed on the real pair: verispec vs transformers (target-only and assisted generation).

One run, contenders alternated prompt by prompt on the same HumanEval prompts (chat template), same models,
same machine. Prints tokens/s (median over prompts), each contender's ratio to target-only and verispec's
ratio to assisted generation, acceptance, block efficiency, peak RSS, and whether greedy outputs equal the
target-only output. Writes the results as JSON too. Not a test: nothing is asserted.

    python benchmarks/speed.py --prompts 5 --max-new-tokens 128 --threads 2 --out docs/results/speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from verispec.tree_engine import TreeEngine

from verispec import SamplingConfig, load_engine, models
from verispec.api import _llamacpp_backend
from verispec.drafters import HybridDrafter, ModelDrafter, NgramDrafter
from verispec.engine import SpeculativeEngine
from verispec.eval.tasks import get_task


@dataclass
class Run:
    tokens: list[int]
    seconds: float
    accepted: int = 0
    drafted: int = 0
    rounds: int = 0
    verify_s: float = 0.0


@dataclass
class Contender:
    name: str
    fn: Callable[[list[int], SamplingConfig, int], Run]
    runs: dict[str, list[Run]] = field(default_factory=dict)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def hf_generate(model, ids: list[int], cfg: SamplingConfig, seed: int, eos: list[int], n: int, assistant=None) -> Run:
    torch.manual_seed(seed)
    kwargs: dict = dict(max_new_tokens=n, eos_token_id=eos, pad_token_id=eos[0])
    if cfg.greedy:
        kwargs.update(do_sample=False)
    else:
        kwargs.update(do_sample=True, temperature=cfg.temperature, top_k=0, top_p=1.0)
    if assistant is not None:
        kwargs.update(assistant_model=assistant)
    x = torch.tensor([ids])
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(x, attention_mask=torch.ones_like(x), **kwargs)
    dt = time.perf_counter() - t0
    return Run(out[0, len(ids) :].tolist(), dt)


def engine_run(engine: SpeculativeEngine, gamma: int | str) -> Callable[[list[int], SamplingConfig, int], Run]:
    def fn(ids: list[int], cfg: SamplingConfig, seed: int) -> Run:
        res = engine.generate(ids, sampling=cfg, gamma=gamma, max_new_tokens=ARGS.max_new_tokens, seed=seed)
        m = res.metrics
        return Run(res.token_ids, m.total_s, m.accepted, m.drafted, m.rounds, m.verify_s)

    return fn


def main() -> None:
    base = load_engine(drafter="model", dtype=ARGS.dtype, threads=ARGS.threads)
    target, tok, eos = base.target, base.tokenizer, sorted(base.eos_token_ids)
    draft_model = base.drafter.backend.model
    # transformers' assisted generation with the same draft and the same constant gamma
    gc = draft_model.generation_config
    gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = (
        ARGS.gamma, "constant", 0.0)
    n = ARGS.max_new_tokens
    contenders = [
        Contender("hf-target-only", lambda ids, cfg, s: hf_generate(target.model, ids, cfg, s, eos, n)),
        Contender("hf-assisted", lambda ids, cfg, s: hf_generate(target.model, ids, cfg, s, eos, n, draft_model)),
        Contender("verispec-chain", engine_run(base, ARGS.gamma)),
        Contender("verispec-ngram", engine_run(SpeculativeEngine(target, NgramDrafter(), tok, eos), ARGS.gamma)),
    ]
    if ARGS.tree:
        # dynamic tree (EAGLE-2 style): the best tokens per target call in the tree measurements
        tree = TreeEngine.from_engine(base, depth=ARGS.gamma, top_k=3, budget=12)
        contenders.append(Contender("verispec-tree-dynamic12", engine_run(tree, ARGS.gamma)))
    if ARGS.llamacpp_draft:
        try:
            lc = ModelDrafter(_llamacpp_backend(models.DEFAULT_DRAFT, target.vocab_size, ARGS.threads))
            lc_engine = SpeculativeEngine(target, lc, tok, eos)
            contenders.append(Contender("verispec-chain-llamacpp", engine_run(lc_engine, ARGS.gamma)))
            contenders.append(Contender("verispec-chain-llamacpp-auto", engine_run(lc_engine, "auto")))
            hy_engine = SpeculativeEngine(target, HybridDrafter(lc), tok, eos)
            contenders.append(Contender("verispec-ngram+llamacpp", engine_run(hy_engine, ARGS.gamma)))
        except (ImportError, OSError, ValueError) as exc:  # optional contender: report and go on
            print(f"(llama.cpp draft unavailable: {exc})", file=sys.stderr)

    problems = get_task("humaneval").load(limit=ARGS.prompts)
    prompts = [tok.apply_chat_template(p.messages, add_generation_prompt=True, tokenize=True) for p in problems]
    modes = {"greedy": SamplingConfig(temperature=0)}
    if ARGS.sampled:
        modes["T=0.7"] = SamplingConfig(temperature=0.7)

    report: dict = {"config": vars(ARGS), "machine": {"threads": torch.get_num_threads(), "cpus": os.cpu_count()},
                    "modes": {}}
    for c in contenders:  # warm-up: first calls pay one-off allocation and kernel selection costs
        c.fn(list(prompts[0][:32]), SamplingConfig(temperature=0), 0)
    for mode, cfg in modes.items():
        for c in contenders:
            c.runs[mode] = []
        for i, ids in enumerate(prompts):
            for c in contenders:  # alternate contenders on the same prompt
                run = c.fn(list(ids), cfg, i)
                c.runs[mode].append(run)
                print(f"[{mode}] prompt {i} {c.name:32s} {len(run.tokens) / run.seconds:6.2f} tok/s "
                      f"({len(run.tokens)} tokens, {run.seconds:.1f} s)", file=sys.stderr, flush=True)
        rows = {}
        for c in contenders:
            runs = c.runs[mode]
            rows[c.name] = {
                "tokens_per_s_median": statistics.median(len(r.tokens) / r.seconds for r in runs),
                "tokens": sum(len(r.tokens) for r in runs),
                "acceptance": (sum(r.accepted for r in runs) / d) if (d := sum(r.drafted for r in runs)) else None,
                "block_efficiency": (sum(r.accepted for r in runs) / k) if (k := sum(r.rounds for r in runs)) else None,
                "verify_share": (
                    sum(r.verify_s for r in runs) / sum(r.seconds for r in runs) if runs[0].rounds else None),
                "identical_to_target_only": (
                    [r.tokens == t.tokens for r, t in zip(runs, contenders[0].runs[mode], strict=True)]
                    if cfg.greedy else None),
            }
        ref, assisted = rows["hf-target-only"]["tokens_per_s_median"], rows["hf-assisted"]["tokens_per_s_median"]
        for r in rows.values():
            r["vs_target_only"] = r["tokens_per_s_median"] / ref
            r["vs_assisted"] = r["tokens_per_s_median"] / assisted
        report["modes"][mode] = rows
        print(f"\n## {mode} ({len(prompts)} HumanEval prompts, {n} new tokens, {ARGS.dtype}, "
              f"{torch.get_num_threads()} threads)")
        print("| contender | tok/s (median) | vs target-only | vs HF assisted | acceptance | BE | verify share |"
              " greedy == target-only |")
        print("|---|---|---|---|---|---|---|---|")
        for name, r in rows.items():
            same = r["identical_to_target_only"]
            print(f"| {name} | {r['tokens_per_s_median']:.2f} | {r['vs_target_only']:.2f}x | {r['vs_assisted']:.2f}x | "
                  f"{_f(r['acceptance'])} | {_f(r['block_efficiency'])} | {_f(r['verify_share'], pct=True)} | "
                  f"{'-' if same is None else f'{sum(same)}/{len(same)}'} |")
    report["peak_rss_mb"] = peak_rss_mb()
    print(f"\npeak RSS of the benchmark process: {report['peak_rss_mb']:.0f} MB")
    if ARGS.out:
        os.makedirs(os.path.dirname(ARGS.out) or ".", exist_ok=True)
        with open(ARGS.out, "w") as f:
            json.dump(report, f, indent=2)


def _f(x: float | None, pct: bool = False) -> str:
    if x is None:
        return "-"
    return f"{100 * x:.1f}%" if pct else f"{x:.2f}"


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--gamma", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--sampled", action=argparse.BooleanOptionalAction, default=True, help="also run T=0.7")
    ap.add_argument("--llamacpp-draft", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--tree", action=argparse.BooleanOptionalAction, default=True,
                    help="dynamic tree: depth gamma, top-3, 12 nodes")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ARGS = ap.parse_args()
    main()
