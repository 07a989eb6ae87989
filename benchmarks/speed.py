"""Side-by-side decoding speed on the real pair: verispec vs llama.cpp alone vs transformers assisted generation.

One run, contenders alternated prompt by prompt on the same prompts (chat template), same models, same machine,
same threads. Two prompt sets: HumanEval (code) and a held-out set of chat prompts (never used to tune anything).
The anchor is llama.cpp's own target-only generation (llama-cpp-python's ``Llama.generate`` on the target's GGUF);
verispec runs on the llama.cpp target (``load_engine(..., target_backend="llamacpp")``) target-only and with the
n-gram, llama.cpp-draft and hybrid drafters (``gamma="auto"``: block-cost-aware, falls back to target-only when
drafting does not pay), and transformers' assisted generation (bf16, same draft, constant gamma) is the other
reference. Prints tokens/s (median over prompts), ratios to llama.cpp alone and to assisted generation,
acceptance, block efficiency and greedy agreement with llama.cpp's own output; the block-cost curve measured
here and the break-even acceptance per gamma. Writes JSON too. Not a test: nothing is asserted.

Prefix reuse is made equal: llama-cpp-python reuses the longest common prefix with its previous call (the chat
template's system part), and verispec's llama.cpp backends have a prefix cache; before each verispec run its
caches are reset and primed with the previous prompt (untimed), so every contender starts where llama.cpp alone
starts.

    python benchmarks/speed.py --prompts 3 --max-new-tokens 128 --threads 2 --out docs/results/speed_llamacpp.json
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

from verispec import SamplingConfig, load_engine, models
from verispec.api import build_drafter
from verispec.backends.base import ScoreRequest
from verispec.backends.llamacpp import LlamaCppBackend
from verispec.core.schedule import break_even_alpha
from verispec.eval.tasks import get_task
from verispec.runtime.engine import Engine

#: held-out chat prompts (general assistant requests, not code completion of a given stub); fixed, never tuned on
CHAT_PROMPTS = [
    "Explain in a short paragraph why the sky is blue.",
    "Give me three tips for writing clear emails at work.",
    "What is the difference between a list and a tuple in Python? Answer briefly.",
    "Summarize the plot of Romeo and Juliet in four sentences.",
    "How do I reverse a string in JavaScript? Show one example.",
]


@dataclass
class Run:
    tokens: list[int]
    seconds: float
    accepted: int = 0
    drafted: int = 0
    rounds: int = 0


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
    toks = out[0, len(ids) :].tolist()
    return Run(toks, dt)


def llamacpp_generate(llm, ids: list[int], cfg: SamplingConfig, seed: int, eos: set[int], n: int) -> Run:
    """llama.cpp's own target-only decode (its sampler: greedy, or temperature with no truncation)."""
    llm.set_seed(seed)
    temp = 0.0 if cfg.greedy else cfg.temperature
    out: list[int] = []
    t0 = time.perf_counter()
    for tok in llm.generate(ids, temp=temp, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
        out.append(int(tok))
        if tok in eos or len(out) >= n:
            break
    return Run(out, time.perf_counter() - t0)


def prime(engine: Engine, prev: list[int] | None) -> None:
    """Put the engine's llama.cpp caches where llama.cpp alone's context is when it starts a prompt: holding the
    PREVIOUS prompt (llama-cpp-python reuses the longest common prefix with its last call, e.g. the chat
    template's system part). verispec's contenders share one target, so without this a contender would reuse
    the whole prompt the contender before it just prefilled; outside the timed region."""
    drafter = engine.drafter
    backends = [engine.target, getattr(drafter, "backend", None), getattr(getattr(drafter, "fallback", None),
                                                                           "backend", None)]
    for b in backends:
        if isinstance(b, LlamaCppBackend):
            b.reset()
            if prev:
                row = b.add_row()
                b.score([ScoreRequest(row, list(prev))])
                b.remove_row(row)


#: the prompt run before the current one (what llama.cpp alone's context holds when the current one starts)
PREVIOUS: dict[str, list[int] | None] = {"ids": None}


def engine_run(engine: Engine, gamma: int | str | None) -> Callable[[list[int], SamplingConfig, int], Run]:
    def fn(ids: list[int], cfg: SamplingConfig, seed: int) -> Run:
        prime(engine, PREVIOUS["ids"])
        # no gamma for an engine without a drafter: the request schema takes none (it decodes plainly)
        kw = {} if gamma is None else {"gamma": gamma}
        res = engine.generate(ids, sampling=cfg, max_new_tokens=ARGS.max_new_tokens, seed=seed, **kw)
        m = res.metrics
        return Run(res.token_ids, m.total_s, m.accepted, m.drafted, m.rounds)

    return fn


def main() -> None:
    n, th = ARGS.max_new_tokens, ARGS.threads
    torch.set_num_threads(th)
    lc_base = load_engine(drafter="none", target_backend="llamacpp", threads=th, cache=False)
    tok, eos = lc_base.tokenizer, sorted(lc_base.eos_token_ids)
    target = lc_base.target
    report: dict = {"config": vars(ARGS), "machine": {"threads": th, "cpus": os.cpu_count(),
                                                      "loadavg_start": os.getloadavg()}}
    # the target's block-cost curve on this machine, now (and the break-even acceptance it implies)
    curve = target.measure_block_costs(ks=(1, 2, 3, 4, 5, 6, 8, 12), repeats=ARGS.cost_repeats)
    report["block_costs"] = curve
    print("block costs (single-step units): " + ", ".join(f"k={k}: {c:.2f}" for k, c in curve.items()))
    be = {g: break_even_alpha(g, target.block_cost) for g in range(1, 9)}
    report["break_even_alpha_free_draft"] = be
    print("break-even acceptance (free drafts): " + ", ".join(
        f"gamma {g}: {'-' if a is None else f'{a:.3f}'}" for g, a in be.items()))

    contenders: list[Contender] = []
    from llama_cpp import Llama

    llm = Llama(model_path=str(models.gguf_path(models.DEFAULT_TARGET)), n_ctx=4096, n_threads=th,
                n_threads_batch=th, n_batch=512, verbose=False)
    contenders.append(Contender("llamacpp-target-only",
                                lambda ids, cfg, s: llamacpp_generate(llm, ids, cfg, s, set(eos), n)))
    contenders.append(Contender("verispec-lc-target-only", engine_run(lc_base, 0)))
    for name in ARGS.drafters:
        d = build_drafter(name, models.DEFAULT_DRAFT, tok, target, draft_threads=th)
        d.target_cost = target.block_cost  # type: ignore[union-attr]
        eng = Engine(target, d, tok, eos)
        label = {"ngram+llamacpp": "hybrid"}.get(name, name)
        contenders.append(Contender(f"verispec-lc-{label}-auto", engine_run(eng, "auto")))
        if ARGS.fixed_gamma:
            contenders.append(Contender(f"verispec-lc-{label}-g{ARGS.fixed_gamma}", engine_run(eng, ARGS.fixed_gamma)))
    if ARGS.hf:
        hf = load_engine(drafter="model", dtype="bfloat16", threads=th, cache=False)
        t_model, draft_model = hf.target.model, hf.drafter.backend.model
        gc = draft_model.generation_config
        gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = (
            ARGS.gamma, "constant", 0.0)
        contenders.append(Contender("hf-assisted", lambda ids, cfg, s: hf_generate(t_model, ids, cfg, s, eos, n,
                                                                                   draft_model)))
        if ARGS.hf_chain:  # verispec on the transformers target (the default engine): the previous README contenders
            from verispec.drafters import NgramDrafter

            contenders.append(Contender("verispec-hf-chain", engine_run(hf, ARGS.gamma)))
            contenders.append(Contender("verispec-hf-ngram",
                                        engine_run(Engine(hf.target, NgramDrafter(), tok, eos), ARGS.gamma)))
        if ARGS.hf_target_only:
            contenders.append(Contender("hf-target-only", lambda ids, cfg, s: hf_generate(t_model, ids, cfg, s, eos,
                                                                                          n)))

    problems = get_task("humaneval").load(limit=ARGS.prompts)
    sets = {
        "humaneval": [tok.apply_chat_template(p.messages, add_generation_prompt=True, tokenize=True, return_dict=False)
                      for p in problems],
        "chat": [tok.apply_chat_template([{"role": "user", "content": c}], add_generation_prompt=True, tokenize=True,
                                         return_dict=False) for c in CHAT_PROMPTS[: ARGS.prompts]],
    }
    modes = {"greedy": SamplingConfig(temperature=0)}
    if ARGS.sampled:
        modes["T=0.7"] = SamplingConfig(temperature=0.7)
    for c in contenders:  # warm-up: first calls pay one-off allocation and kernel selection costs
        c.fn(list(sets["chat"][0][:24]), SamplingConfig(temperature=0), 0)
    PREVIOUS["ids"] = list(sets["chat"][0][:24])  # what llama.cpp alone's context holds after the warm-up
    report["results"] = {}
    for set_name, prompts in sets.items():
        for mode, cfg in modes.items():
            key = f"{set_name} / {mode}"
            for c in contenders:
                c.runs[key] = []
            for i, ids in enumerate(prompts):
                for c in contenders:  # alternate contenders on the same prompt
                    run = c.fn(list(ids), cfg, i)
                    c.runs[key].append(run)
                    print(f"[{key}] prompt {i} {c.name:32s} {len(run.tokens) / run.seconds:6.2f} tok/s "
                          f"({len(run.tokens)} tokens, {run.seconds:.1f} s)", file=sys.stderr, flush=True)
                PREVIOUS["ids"] = list(ids)
            report["results"][key] = table(key, contenders, cfg, len(prompts))
    report["peak_rss_mb"] = peak_rss_mb()
    report["machine"]["loadavg_end"] = os.getloadavg()
    print(f"\npeak RSS of the benchmark process: {report['peak_rss_mb']:.0f} MB; load average at start "
          f"{report['machine']['loadavg_start'][0]:.1f}, at end {report['machine']['loadavg_end'][0]:.1f}")
    if ARGS.out:
        os.makedirs(os.path.dirname(ARGS.out) or ".", exist_ok=True)
        with open(ARGS.out, "w") as f:
            json.dump(report, f, indent=2)


def table(key: str, contenders: list[Contender], cfg: SamplingConfig, n_prompts: int) -> dict:
    rows = {}
    anchor_runs = contenders[0].runs[key]
    for c in contenders:
        runs = c.runs[key]
        rows[c.name] = {
            "tokens_per_s_median": statistics.median(len(r.tokens) / r.seconds for r in runs),
            "tokens": sum(len(r.tokens) for r in runs),
            "acceptance": (sum(r.accepted for r in runs) / d) if (d := sum(r.drafted for r in runs)) else None,
            "block_efficiency": (sum(r.accepted for r in runs) / k) if (k := sum(r.rounds for r in runs)) else None,
            "greedy_same_as_llamacpp": (
                [r.tokens == a.tokens for r, a in zip(runs, anchor_runs, strict=True)] if cfg.greedy else None),
        }
    anchor = rows[contenders[0].name]["tokens_per_s_median"]
    assisted = rows["hf-assisted"]["tokens_per_s_median"] if "hf-assisted" in rows else None
    for r in rows.values():
        r["vs_llamacpp"] = r["tokens_per_s_median"] / anchor
        r["vs_hf_assisted"] = r["tokens_per_s_median"] / assisted if assisted else None
    print(f"\n## {key} ({n_prompts} prompts, {ARGS.max_new_tokens} new tokens, {ARGS.threads} threads)")
    print("| contender | tok/s (median) | vs llama.cpp alone | vs HF assisted | acceptance | BE |"
          " greedy == llama.cpp |")
    print("|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        same = r["greedy_same_as_llamacpp"]
        print(f"| {name} | {r['tokens_per_s_median']:.2f} | {r['vs_llamacpp']:.2f}x | {_f(r['vs_hf_assisted'], 'x')} | "
              f"{_f(r['acceptance'])} | {_f(r['block_efficiency'])} | "
              f"{'-' if same is None else f'{sum(same)}/{len(same)}'} |")
    return rows


def _f(x: float | None, suffix: str = "") -> str:
    return "-" if x is None else f"{x:.2f}{suffix}"


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=3, help="prompts per set (HumanEval, chat)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--gamma", type=int, default=5, help="HF assisted generation's constant draft length")
    ap.add_argument("--fixed-gamma", type=int, default=0, help="also run each drafter at this fixed gamma (0: no)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--drafters", nargs="+", default=["ngram", "llamacpp", "ngram+llamacpp"])
    ap.add_argument("--sampled", action=argparse.BooleanOptionalAction, default=True, help="also run T=0.7")
    ap.add_argument("--hf", action=argparse.BooleanOptionalAction, default=True,
                    help="transformers assisted generation (bf16) as the second reference")
    ap.add_argument("--hf-target-only", action=argparse.BooleanOptionalAction, default=False)
    ap.add_argument("--hf-chain", action=argparse.BooleanOptionalAction, default=False,
                    help="also verispec on the transformers target (draft model chain and n-gram, gamma --gamma)")
    ap.add_argument("--cost-repeats", type=int, default=5)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ARGS = ap.parse_args()
    main()
