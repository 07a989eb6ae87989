"""lm-evaluation-harness two ways: through ``verispec serve`` and with verispec as an lm-eval model; the same scores
both ways as through the engine directly.

Two tasks defined over local data files (the dataset hub is not reachable; the data are the installed GSM8K test
questions, written as JSON lines):

- ``vs_gsm_loglik`` (log-likelihood): the reference solution as the continuation of "Question: ...\\nAnswer:";
  metrics ``perplexity`` and ``acc`` (the continuation is the greedy one).
- ``vs_gsm_gen`` (generation): greedy, at most --max-gen-toks tokens, until a blank line or "Question:"; metric
  ``exact_match`` after a regex that keeps the last number (lm-eval's GSM8K "flexible-extract").

lm-eval runs as its stock ``lm_eval`` command, twice: ``--model local-completions`` (token-id prompts, ``echo``
with ``logprobs`` for log-likelihoods, ``stop`` for generations) against verispec's OpenAI server, serving the
default pair in this process as ``verispec serve --deterministic`` does (``--shared-backends`` measures without
it); and ``--model verispec`` (registered by verispec's install, no extra flag) on the same pair with
``deterministic=True``. Then every request lm-eval made is recomputed through the engine directly, with
lm-eval's own tokenization: ``Engine.prompt_logprobs`` for the log-likelihoods and ``Engine.generate``
(temperature 0, the same stops, the same constant gamma) for the generations; per request the log-likelihood
difference and whether the greedy flag and the generated text are identical, and each task's score all ways.

    python benchmarks/lm_eval.py --limit 12 --out docs/results/lm_eval.json --md docs/results/lm_eval.md

Not a test: it records what it measures (``tests/integrations/test_lmeval.py`` runs a short version).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GAMMA = 4
#: lm-eval's GSM8K "flexible-extract": the last number in the output
NUMBER = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
UNTIL = ["\n\n", "Question:"]
#: what exact_match ignores (lm-eval's GSM8K task options)
IGNORE = [",", "\\$", "(?s).*#### ", "\\.$"]


def question(problem) -> str:
    """The GSM8K question without the project's chat instruction."""
    return problem.messages[-1]["content"].split("\n\n", 1)[-1].strip()


def write_tasks(root: Path, problems: list, max_gen_toks: int) -> None:
    """Two lm-eval task YAMLs over a local JSON-lines file of ``problems``."""
    data = root / "gsm.jsonl"
    with data.open("w") as f:
        for p in problems:
            f.write(json.dumps({"question": question(p), "solution": p.reference["solution"],
                                "answer": p.reference["answer"]}) + "\n")
    common = (f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
              'doc_to_text: "Question: {{question}}\\nAnswer:"\n')
    (root / "vs_gsm_loglik.yaml").write_text(
        "task: vs_gsm_loglik\n" + common + "output_type: loglikelihood\n"
        'doc_to_target: " {{solution}}"\nmetric_list:\n  - metric: perplexity\n  - metric: acc\n')
    (root / "vs_gsm_gen.yaml").write_text(
        "task: vs_gsm_gen\n" + common + "output_type: generate_until\n"
        'doc_to_target: "{{answer}}"\n'
        f"generation_kwargs:\n  until: {json.dumps(UNTIL)}\n  max_gen_toks: {max_gen_toks}\n  do_sample: false\n"
        f"  temperature: 0\n  speculative:\n    gamma: {GAMMA}\n"
        "filter_list:\n  - name: flexible-extract\n    filter:\n      - function: regex\n        group_select: -1\n"
        f"        regex_pattern: {json.dumps(NUMBER.pattern)}\n      - function: take_first\n"
        "metric_list:\n  - metric: exact_match\n    ignore_case: true\n    ignore_punctuation: false\n"
        f"    regexes_to_ignore: {json.dumps(IGNORE)}\n")


def run_lm_eval(model: str, model_args: str, root: Path, out: Path) -> dict[str, list[dict]]:
    """Run the stock ``lm_eval`` command; return each task's logged samples, its results and the config."""
    cmd = [shutil.which("lm_eval") or "lm_eval", "--model", model, "--model_args", model_args, "--tasks",
           "vs_gsm_loglik,vs_gsm_gen", "--include_path", str(root), "--output_path", str(out), "--log_samples"]
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode:
        raise SystemExit(f"lm-eval failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    samples = {}
    for task in ("vs_gsm_loglik", "vs_gsm_gen"):
        (f,) = out.rglob(f"samples_{task}_*.jsonl")
        samples[task] = [json.loads(line) for line in f.read_text().splitlines()]
    (res,) = out.rglob("results_*.json")
    data = json.loads(res.read_text())
    return {"samples": samples, "results": data["results"], "config": data.get("config", {})}


def encode_pair(tok, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's ``_encode_pair``: trailing spaces of the context move to the continuation; the continuation's ids
    are those of the whole string after the context's."""
    n = len(context) - len(context.rstrip())
    if n:
        continuation, context = context[-n:] + continuation, context[:-n]
    whole = tok.encode(context + continuation, add_special_tokens=False)
    ctx = tok.encode(context, add_special_tokens=False)
    return ctx, whole[len(ctx):]


def exact_match(pred: str, target: str) -> float:
    """lm-eval's exact_match with this task's options (ignore case, the regexes above removed)."""
    for r in IGNORE:
        pred, target = re.sub(r, "", pred), re.sub(r, "", target)
    return float(pred.lower().strip() == target.lower().strip())


def flexible_extract(text: str) -> str:
    found = NUMBER.findall(text)
    if not found:
        return "[invalid]"
    m = found[-1]
    return next((g for g in m if g), m[0]).strip() if isinstance(m, tuple) else m


def direct(engine, tok, runs: dict[str, dict], max_gen_toks: int) -> dict:
    """Every lm-eval request recomputed through the engine directly and compared with each run's answers
    (``runs``: the label of a way through lm-eval -> its samples and results)."""
    from verispec.core.sampling import SamplingConfig

    rows = []
    ll_engine, em_engine = {}, {}
    scored = {label: {"ll": [], "em": []} for label in runs}
    for label, lm in runs.items():
        for s in lm["samples"]["vs_gsm_loglik"]:
            a = s["arguments"]["gen_args_0"]
            key = (a["arg_0"], a["arg_1"])
            if key not in ll_engine:
                ctx, cont = encode_pair(tok, *key)
                lps = engine.prompt_logprobs(ctx + cont, top=1)[len(ctx):]
                greedy = all(t.logprob == max(v for _, v in t.top) for t in lps)  # as lm-eval decides it
                ll_engine[key] = (sum(t.logprob for t in lps), len(cont), greedy)
            ll, n, greedy = ll_engine[key]
            got, got_greedy = float(s["resps"][0][0][0]), s["resps"][0][0][1] in (True, "True")
            rows.append({"way": label, "task": "vs_gsm_loglik", "doc": s["doc_id"], "tokens": n, "lm_eval": got,
                         "direct": ll, "abs_diff": abs(ll - got), "same_greedy": greedy == got_greedy})
            scored[label]["ll"].append((got, n, got_greedy))
        for s in lm["samples"]["vs_gsm_gen"]:
            a = s["arguments"]["gen_args_0"]
            if a["arg_0"] not in em_engine:
                ids = tok.encode(a["arg_0"], add_special_tokens=False)
                r = engine.generate(ids, sampling=SamplingConfig(temperature=0.0), gamma=GAMMA,
                                    max_new_tokens=max_gen_toks, stop=UNTIL)
                em_engine[a["arg_0"]] = (r.text, exact_match(flexible_extract(r.text), s["target"]))
            text, em = em_engine[a["arg_0"]]
            got = s["resps"][0][0]
            rows.append({"way": label, "task": "vs_gsm_gen", "doc": s["doc_id"], "same_text": text == got,
                         "lm_eval": got[:80], "direct": text[:80]})
            scored[label]["em"].append(exact_match(flexible_extract(got), s["target"]))

    def ppl(xs: list) -> float:  # lm-eval's perplexity: exp of minus the mean log-likelihood per document
        return math.exp(-sum(x[0] for x in xs) / len(xs))

    engine_ll = list(ll_engine.values())
    scores = {"vs_gsm_loglik": {"perplexity": {}, "acc": {}}, "vs_gsm_gen": {"exact_match": {}}}
    for label, lm in runs.items():
        res = lm["results"]
        scores["vs_gsm_loglik"]["perplexity"][label] = res["vs_gsm_loglik"]["perplexity,none"]
        scores["vs_gsm_loglik"]["acc"][label] = res["vs_gsm_loglik"]["acc,none"]
        scores["vs_gsm_gen"]["exact_match"][label] = res["vs_gsm_gen"]["exact_match,flexible-extract"]
    scores["vs_gsm_loglik"]["perplexity"]["engine"] = ppl(engine_ll)
    scores["vs_gsm_loglik"]["acc"]["engine"] = sum(x[2] for x in engine_ll) / len(engine_ll)
    scores["vs_gsm_gen"]["exact_match"]["engine"] = sum(v[1] for v in em_engine.values()) / len(em_engine)
    return {"rows": rows, "scores": scores}


def markdown(out: dict) -> str:
    ways = list(out["ways"])
    lines = ["# lm-evaluation-harness through `verispec serve` and as `lm_eval --model verispec`", "",
             f"lm-eval {out['lm_eval_version']}, its stock `lm_eval` command, two ways: `local-completions` "
             f"(token-id prompts, one request at a time) against `verispec serve` on the default pair "
             f"({out['backends']}{', --deterministic' if out['deterministic'] else ', backends shared across requests'}"
             f"), and `--model verispec --model_args {out['model_args']}`. CPU: {out['cpu']}. Two tasks over local "
             f"data files: the first {out['limit']} GSM8K test questions; greedy generation at most "
             f"{out['max_gen_toks']} tokens, gamma {GAMMA}. Every request then recomputed through the engine directly "
             f"with lm-eval's tokenization. lm-eval's wall time: "
             + ", ".join(f"{w} {out['seconds'][w]:.0f} s" for w in ways) + ".", "",
             "| task | metric | " + " | ".join(ways) + " | engine directly |", "|---|---|" + "---|" * (len(ways) + 1)]
    for task, metrics in out["scores"].items():
        for metric, v in metrics.items():
            lines.append(f"| {task} | {metric} | " + " | ".join(f"{v[w]:.6g}" for w in ways)
                         + f" | {v['engine']:.6g} |")
    lines.append("")
    for w in ways:
        ll = [r for r in out["rows"] if r["way"] == w and r["task"] == "vs_gsm_loglik"]
        gen = [r for r in out["rows"] if r["way"] == w and r["task"] == "vs_gsm_gen"]
        lines.append(f"- {w}: log-likelihoods of {len(ll)} requests, largest difference from the engine "
                     f"{max(r['abs_diff'] for r in ll):.2e} nats, greedy flags equal on "
                     f"{sum(r['same_greedy'] for r in ll)} of {len(ll)}; generations identical on "
                     f"{sum(r['same_text'] for r in gen)} of {len(gen)}.")
    spec = out.get("speculation") or {}
    if spec:
        lines += ["", "Speculation as `--model verispec` reports it in lm-eval's results (`config.verispec`): "
                  + "; ".join(f"{t}: BE {v['block_efficiency']:.2f}, accepted {v['accepted_fraction']:.2f} of "
                              f"{v['drafted']} drafted" for t, v in spec.items()) + "."]
    lines += ["", f"Rerun: `python benchmarks/lm_eval.py --limit {out['limit']}"
              f"{'' if out['deterministic'] else ' --shared-backends'} --out JSON --md MD`.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, default=12, help="GSM8K questions per task")
    ap.add_argument("--max-gen-toks", type=int, default=96)
    ap.add_argument("--shared-backends", action="store_true",
                    help="serve without --deterministic: requests share the model backends (and their prefix caches)")
    ap.add_argument("--ways", default="server,model", help="server, model or both (comma-separated)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--md", default=None)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    from importlib import metadata

    from vllm_cpu import cpu

    from verispec import models
    from verispec.api import load_engine
    from verispec.defaults import AUTO, resolve_backends
    from verispec.eval.tasks import get_task
    from verispec.server import create_app
    from verispec.server.background import BackgroundServer

    backend, drafter = resolve_backends(AUTO, AUTO)  # what `verispec serve` runs by default here
    engine = load_engine(drafter=drafter, target_backend=backend, deterministic=not args.shared_backends)
    tok = engine.tokenizer
    problems = get_task("gsm").load(limit=args.limit)
    model_args = f"drafter={drafter},target_backend={backend},gamma={GAMMA},deterministic={not args.shared_backends}"
    runs, seconds = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_tasks(root, problems, args.max_gen_toks)
        if "server" in args.ways:
            with BackgroundServer(create_app(engine, model_name="verispec", max_batch=1), timeout_s=120) as srv:
                t0 = time.perf_counter()
                tokenizer = models.converted_dir(models.DEFAULT_TARGET)
                runs["lm-eval via server"] = run_lm_eval(
                    "local-completions", f"base_url={srv.url}/v1/completions,model=verispec,tokenizer={tokenizer},"
                    "tokenizer_backend=huggingface,num_concurrent=1,max_retries=1", root, root / "out-server")
                seconds["lm-eval via server"] = time.perf_counter() - t0
        if "model" in args.ways:
            t0 = time.perf_counter()
            runs["lm-eval --model verispec"] = run_lm_eval("verispec", model_args, root, root / "out-model")
            seconds["lm-eval --model verispec"] = time.perf_counter() - t0
    speculation = runs.get("lm-eval --model verispec", {}).get("config", {}).get("verispec", {}).get("speculation")
    out = {"cpu": cpu(), "lm_eval_version": metadata.version("lm-eval"), "limit": args.limit,
           "max_gen_toks": args.max_gen_toks, "deterministic": not args.shared_backends, "gamma": GAMMA,
           "model_args": model_args, "ways": list(runs), "seconds": seconds, "speculation": speculation,
           "backends": ", ".join(f"{k} {v}" for k, v in engine.backends.items()),
           **direct(engine, tok, runs, args.max_gen_toks)}
    text = markdown(out)
    print(text)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    if args.md:
        Path(args.md).write_text(text)


if __name__ == "__main__":
    main()
