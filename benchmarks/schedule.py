"""Never slower than plain decoding: the adaptive schedule (``gamma="auto"``, the default of ``verispec generate``,
the API and the server) against verispec's own target-only path, side by side in one run.

For each target backend (transformers bf16, and llama.cpp when it is installed), each prompt set (held-out chat
prompts, HumanEval) and each temperature (0 and 0.7), the contenders run alternated prompt by prompt on the same
target weights and the same threads:

- ``target-only``: the engine without a drafter (the path ``--no-draft`` takes), the anchor of every ratio;
  ``target-only-again`` runs the same work once more: its ratio is the noise of the measurement;
- ``<draft>-auto``: the pair's draft (the 0.5B model: transformers for the transformers target, its GGUF in
  llama.cpp for the llama.cpp target) under the adaptive schedule;
- ``ngram-auto``: prompt lookup under the schedule (free drafts that pay on code);
- ``<draft>-g5``: the same draft at the constant gamma 5 (what the default was);
- ``<draft>-auto-pmin``: the draft under the schedule with the confidence gate (``--draft-p-min``, default 0.75:
  a chain stops where the draft's top probability falls below it);
- llama.cpp target only: ``hybrid-auto`` (prompt lookup, else the llama.cpp draft: the default drafter there) and
  ``llamacpp-alone``, llama-cpp-python's own greedy/temperature loop on the same GGUF (not verispec: the anchor
  of "as fast as llama.cpp itself").

With ``--repeats R`` every prompt runs R times per contender, the contenders' order rotated each time (a
contender's ratio is then the median over prompts x repeats). Every backend cache is reset before each run, so
no contender reuses a prefill another one paid for. Prints tokens/s (median over runs), the ratio to target-only
(median of the per-run ratios, which cancels the prompts' lengths), acceptance, and the gammas the schedule chose;
writes JSON. Not a test: nothing is asserted.

    python benchmarks/schedule.py --prompts 3 --max-new-tokens 128 --threads 2 --out docs/results/schedule.json
    python benchmarks/schedule.py --render docs/results/schedule.json > docs/results/schedule_tables.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable

import torch
from speed import CHAT_PROMPTS  # noqa: E402  the held-out chat prompts (benchmarks/speed.py), never tuned on

from verispec import SamplingConfig, load_engine, models
from verispec.drafters import ModelDrafter, NgramDrafter
from verispec.eval.tasks import get_task
from verispec.runtime.engine import Engine


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        name = next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), "?")
        flags = next((ln for ln in out.splitlines() if ln.startswith("Flags")), "")
        isa = "AMX" if "amx_tile" in flags else "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "?"
        return f"{name} ({isa}, {os.cpu_count()} cores)"
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor() or "?"


def reset_caches(engine: Engine) -> None:
    for b in (engine.target, getattr(engine.drafter, "backend", None)):
        if b is not None and hasattr(b, "reset"):
            b.reset()


def probe_spent(engine: Engine) -> float:
    """Seconds the drafter's single-row schedules (model drafts, and look-ups for the hybrid) have spent on probes
    beyond the plain rounds they replaced, so far (cumulative: a run's share is the difference)."""
    d = engine.drafter
    return sum(sched.probe_spent_s for costs in (getattr(d, "_costs", {}), getattr(d, "_lookup_costs", {}))
               if (sched := costs.get(1)) is not None)


def contender(engine: Engine, gamma: int | str | None) -> Callable[[list[int], SamplingConfig, int], dict]:
    def fn(ids: list[int], cfg: SamplingConfig, seed: int) -> dict:
        reset_caches(engine)
        spent = probe_spent(engine)
        # no gamma for an engine without a drafter: the request schema takes none (it decodes plainly)
        kw = {} if gamma is None else {"gamma": gamma}
        res = engine.generate(ids, sampling=cfg, max_new_tokens=ARGS.max_new_tokens, seed=seed, **kw)
        m = res.metrics
        return {"tokens": len(res.token_ids), "seconds": m.total_s, "accepted": m.accepted, "drafted": m.drafted,
                "gammas": dict(m.gamma_counts), "ids": res.token_ids, "probe_s": probe_spent(engine) - spent,
                "draft_s": m.draft_s}

    return fn


def backends(th: int) -> dict[str, dict[str, Callable]]:
    """Per target backend, its contenders (all sharing one target)."""
    out: dict[str, dict[str, Callable]] = {}
    hf = load_engine(drafter="model", dtype="bfloat16", threads=th, cache=False)
    tok, eos = hf.tokenizer, sorted(hf.eos_token_ids)
    out["transformers bf16"] = {
        "target-only": contender(Engine(hf.target, None, tok, eos), None),
        "target-only-again": contender(Engine(hf.target, None, tok, eos), None),  # A/A: the noise
        "model-auto": contender(hf, "auto"),
        "ngram-auto": contender(Engine(hf.target, NgramDrafter(), tok, eos), "auto"),
        "model-g5": contender(hf, 5),
        "model-auto-pmin": contender(Engine(hf.target, ModelDrafter(hf.drafter.backend, p_min=ARGS.draft_p_min),
                                            tok, eos), "auto"),
    }
    try:
        lc = load_engine(drafter="llamacpp", target_backend="llamacpp", threads=th, cache=False)
    except ImportError as exc:
        print(f"llama.cpp not installed, its target skipped: {exc}", file=sys.stderr)
        return out
    ng = NgramDrafter()
    ng.target_cost = lc.target.block_cost  # type: ignore[union-attr]
    gated = ModelDrafter(lc.drafter.backend, p_min=ARGS.draft_p_min)  # type: ignore[union-attr]
    gated.target_cost = lc.target.block_cost  # type: ignore[union-attr]
    hy = load_engine(drafter="ngram+llamacpp", target_backend="llamacpp", threads=th, cache=False)
    from llama_cpp import Llama

    llm = Llama(model_path=str(models.gguf_path(models.DEFAULT_TARGET)), n_ctx=4096, n_threads=th,
                n_threads_batch=th, n_batch=512, verbose=False)
    out["llama.cpp"] = {
        "target-only": contender(Engine(lc.target, None, lc.tokenizer, eos), None),
        # the same work again: its ratio to target-only is the measurement's own noise (an A/A comparison)
        "target-only-again": contender(Engine(lc.target, None, lc.tokenizer, eos), None),
        "llamacpp-auto": contender(lc, "auto"),
        "ngram-auto": contender(Engine(lc.target, ng, lc.tokenizer, eos), "auto"),
        "hybrid-auto": contender(hy, "auto"),
        "llamacpp-g5": contender(lc, 5),
        "llamacpp-auto-pmin": contender(Engine(lc.target, gated, lc.tokenizer, eos), "auto"),
        "llamacpp-alone": lambda ids, cfg, seed: llamacpp_alone(llm, ids, cfg, seed, set(eos)),
    }
    return out


def llamacpp_alone(llm, ids: list[int], cfg: SamplingConfig, seed: int, eos: set[int]) -> dict:
    """llama-cpp-python's own decode of the target GGUF (its sampler; no verispec), from an empty cache."""
    llm.reset()
    llm.set_seed(seed)
    out: list[int] = []
    t0 = time.perf_counter()
    for tok in llm.generate(ids, temp=0.0 if cfg.greedy else cfg.temperature, top_k=0, top_p=1.0, min_p=0.0,
                            repeat_penalty=1.0, reset=True):
        out.append(int(tok))
        if tok in eos or len(out) >= ARGS.max_new_tokens:
            break
    return {"tokens": len(out), "seconds": time.perf_counter() - t0, "accepted": 0, "drafted": 0, "gammas": {},
            "ids": out}


def main() -> None:
    th = ARGS.threads
    torch.set_num_threads(th)
    report: dict = {"config": {k: v for k, v in vars(ARGS).items() if k != "out"}, "cpu": cpu_name(),
                    "loadavg_start": os.getloadavg(), "results": {}}
    print(f"CPU: {report['cpu']}; {th} threads")
    tok = models.load_tokenizer(models.DEFAULT_TARGET)
    problems = get_task("humaneval").load(limit=ARGS.prompts)
    sets = {
        "chat": [tok.apply_chat_template([{"role": "user", "content": c}], add_generation_prompt=True, tokenize=True,
                                         return_dict=False) for c in CHAT_PROMPTS[: ARGS.prompts]],
        "code": [tok.apply_chat_template(p.messages, add_generation_prompt=True, tokenize=True, return_dict=False)
                 for p in problems],
    }
    modes = {"T=0": SamplingConfig(temperature=0), "T=0.7": SamplingConfig(temperature=0.7)}
    if ARGS.out and ARGS.only and os.path.exists(ARGS.out):  # rerun some cells, keep the others
        with open(ARGS.out) as f:
            old = json.load(f)
        report["results"] = old["results"]
        report["cells"] = old.get("cells", {})
        report["earlier_runs"] = old.get("earlier_runs", []) + [{k: old.get(k) for k in ("config", "cpu",
                                                                                         "loadavg_start")}]
    for backend, cons in backends(th).items():
        if ARGS.contenders:  # a subset (the anchor always runs: every ratio is to it)
            cons = {k: v for k, v in cons.items() if k == "target-only" or k in ARGS.contenders}
        cells = [(s, m) for s in sets for m in modes if not ARGS.only or f"{backend} / {s} / {m}" in ARGS.only]
        if not cells:
            continue
        for fn in cons.values():  # warm-up: one-off allocation and kernel selection
            fn(list(sets["chat"][0][:24]), modes["T=0"], 0)
        for set_name, mode in cells:
            prompts, cfg = sets[set_name], modes[mode]
            key = f"{backend} / {set_name} / {mode}"
            runs: dict[str, list[dict]] = {name: [] for name in cons}
            names = list(cons)
            for rep in range(ARGS.repeats):
                order = names[rep % len(names):] + names[: rep % len(names)]  # who goes first rotates
                for i, ids in enumerate(prompts):
                    for name in order:  # alternated on the same prompt
                        r = cons[name](list(ids), cfg, i)
                        runs[name].append(r)
                        print(f"[{key}] repeat {rep} prompt {i} {name:14s} {r['tokens'] / r['seconds']:6.2f} tok/s "
                              f"({r['tokens']} tokens, {r['seconds']:.1f} s) gammas {r['gammas']}",
                              file=sys.stderr, flush=True)
            report["results"][key] = table(key, runs, cfg)
            report.setdefault("cells", {})[key] = {"prompts": ARGS.prompts, "repeats": ARGS.repeats,
                                                   "max_new_tokens": ARGS.max_new_tokens, "threads": th,
                                                   "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
            if ARGS.out:
                write(report)
    report["loadavg_end"] = os.getloadavg()
    if ARGS.out:
        write(report)


def render(report: dict) -> str:
    """The JSON's tables as markdown (what the run printed, regenerated from the file)."""
    cfg = report["config"]
    out = [f"CPU: {report['cpu']}; {cfg['threads']} threads; {cfg['prompts']} prompts per set, "
           f"{cfg['max_new_tokens']} new tokens.", ""]
    for key, rows in report["results"].items():
        c = report.get("cells", {}).get(key)
        run = f" ({c['prompts']} prompts x {c['repeats']} repeats, finished {c['finished']})" if c else ""
        both = any(r.get("vs_both_target_only_median") is not None for r in rows.values())
        out += [f"### {key}{run}", "",
                "| contender | tok/s (median) | vs target-only (median, min) | "
                + ("vs both target-only runs (median) | " if both else "")
                + "acceptance | rounds per gamma | probes' share of the time | greedy = target-only |",
                "|---|---|---|" + ("---|" if both else "") + "---|---|---|---|"]
        for name, r in rows.items():
            same = r["greedy_same_as_target_only"]
            acc = "-" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
            gam = ", ".join(f"{g}: {n}" for g, n in r["gamma_counts"].items()) or "-"
            extra = f"{r['vs_both_target_only_median']:.2f}x | " if both else ""
            share = "-" if r.get("probe_share") is None else f"{100 * r['probe_share']:.1f}%"
            out.append(f"| {name} | {r['tokens_per_s_median']:.2f} | {r['vs_target_only_median']:.2f}x, "
                       f"{r['vs_target_only_min']:.2f}x | {extra}{acc} | {gam} | {share} | "
                       f"{'-' if same is None else f'{sum(same)}/{len(same)}'} |")
        out.append("")
    return "\n".join(out)


def write(report: dict) -> None:
    os.makedirs(os.path.dirname(ARGS.out) or ".", exist_ok=True)
    with open(ARGS.out, "w") as f:
        json.dump(report, f, indent=1)


def gamma_auto(name: str) -> bool:
    return name.endswith("-auto") or name.endswith("-auto-pmin")


def table(key: str, runs: dict[str, list[dict]], cfg: SamplingConfig) -> dict:
    anchor = runs["target-only"]
    again = runs.get("target-only-again")
    rows = {}
    for name, rs in runs.items():
        gammas: Counter = Counter()
        for r in rs:
            gammas.update({int(k): v for k, v in r["gammas"].items()})
        drafted = sum(r["drafted"] for r in rs)
        rows[name] = {
            "tokens_per_s_median": statistics.median(r["tokens"] / r["seconds"] for r in rs),
            "vs_target_only_median": statistics.median(
                (r["tokens"] / r["seconds"]) / (a["tokens"] / a["seconds"]) for r, a in zip(rs, anchor, strict=True)),
            "vs_target_only_min": min(
                (r["tokens"] / r["seconds"]) / (a["tokens"] / a["seconds"]) for r, a in zip(rs, anchor, strict=True)),
            # with the A/A contender: the ratio to the mean rate of the two target-only runs of the same prompt
            "vs_both_target_only_median": None if again is None else statistics.median(
                (r["tokens"] / r["seconds"]) / ((a["tokens"] / a["seconds"] + b["tokens"] / b["seconds"]) / 2)
                for r, a, b in zip(rs, anchor, again, strict=True)),
            "runs": [{"tokens": r["tokens"], "seconds": r["seconds"], "draft_s": r.get("draft_s")} for r in rs],
            # what the schedule's probes cost beyond the plain rounds they replaced, as a share of the time
            "probe_share": (sum(r.get("probe_s", 0.0) for r in rs) / sum(r["seconds"] for r in rs)
                            if gamma_auto(name) else None),
            "acceptance": sum(r["accepted"] for r in rs) / drafted if drafted else None,
            "gamma_counts": dict(sorted(gammas.items())),
            "greedy_same_as_target_only": ([r["ids"] == a["ids"] for r, a in zip(rs, anchor, strict=True)]
                                           if cfg.greedy else None),
        }
    print(f"\n## {key} ({len(anchor)} runs: {ARGS.prompts} prompts x {ARGS.repeats} repeats, {ARGS.max_new_tokens} "
          f"new tokens, {ARGS.threads} threads)")
    print("| contender | tok/s (median) | vs target-only (median, min) | acceptance | rounds per gamma | greedy = |")
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        same = r["greedy_same_as_target_only"]
        acc = "-" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
        print(f"| {name} | {r['tokens_per_s_median']:.2f} | {r['vs_target_only_median']:.2f}x, "
              f"{r['vs_target_only_min']:.2f}x | {acc} | {r['gamma_counts']} | "
              f"{'-' if same is None else f'{sum(same)}/{len(same)}'} |", flush=True)
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=3, help="prompts per set (chat, code)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs of every prompt per contender, the contenders' order rotated each time; the ratios "
                         "pair each run with target-only's run of the same prompt and repeat")
    ap.add_argument("--draft-p-min", type=float, default=0.75, help="the gate of the *-auto-pmin contenders")
    ap.add_argument("--out", default=None, help="write the results as JSON here (after every cell)")
    ap.add_argument("--only", nargs="+", default=None, metavar="CELL",
                    help='rerun only these cells ("<backend> / <set> / <mode>"), keeping the others in --out')
    ap.add_argument("--contenders", nargs="+", default=None, metavar="NAME",
                    help="run only these contenders (and target-only, the anchor), e.g. model-auto llamacpp-alone")
    ap.add_argument("--render", default=None, metavar="JSON", help="print a results file's tables as markdown")
    ARGS = ap.parse_args()
    if ARGS.render:
        with open(ARGS.render) as f:
            print(render(json.load(f)))
    else:
        main()
