"""lm-evaluation-harness against ``verispec serve``: the same scores through the server as through the engine directly.

lm-eval (its ``local-completions`` model: token-id prompts, ``echo`` with ``logprobs`` for log-likelihoods, ``stop``
for generations) runs in a virtual environment of its own (``bash scripts/install_lmeval.sh`` makes
``.venv-lmeval``: lm-eval needs a newer huggingface_hub than the project's transformers pin allows) against
verispec's OpenAI server, serving the default pair in this process as ``verispec serve --deterministic`` does
(each request on model backends of its own; ``--shared-backends`` measures without it). Two tasks defined over
local data files (the dataset hub is not reachable; the data are the installed GSM8K test questions, written as
JSON lines):

- ``vs_gsm_loglik`` (log-likelihood): the reference solution as the continuation of "Question: ...\\nAnswer:";
  metrics ``perplexity`` and ``acc`` (the continuation is the greedy one).
- ``vs_gsm_gen`` (generation): greedy, at most --max-gen-toks tokens, until a blank line or "Question:"; metric
  ``exact_match`` after a regex that keeps the last number (lm-eval's GSM8K "flexible-extract").

Then every request lm-eval made is recomputed through the engine directly, with lm-eval's own tokenization
(context and continuation encoded as its ``_encode_pair`` does): ``Engine.prompt_logprobs`` for the log-likelihoods
and ``Engine.generate`` (temperature 0, the same stops, the same constant gamma) for the generations; per request
the log-likelihood difference and whether the greedy flag and the generated text are identical, and each task's
score both ways (the engine's scored with the same metric definitions as lm-eval's).

    bash scripts/install_lmeval.sh
    python benchmarks/lm_eval_server.py --limit 12 --out docs/results/lm_eval_server.json \
        --md docs/results/lm_eval_server.md

Not a test: it records what it measures (``tests/eval/test_lm_eval.py`` runs a short version where .venv-lmeval exists).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LMEVAL = Path(os.environ.get("LMEVAL_PYTHON", ".venv-lmeval/bin/python"))
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


def run_lm_eval(url: str, model: str, tokenizer_dir: str, root: Path) -> dict[str, list[dict]]:
    """Run lm-eval's CLI from its environment; return each task's logged samples."""
    out = root / "out"
    cmd = [str(LMEVAL), "-m", "lm_eval", "--model", "local-completions", "--model_args",
           f"base_url={url}/v1/completions,model={model},tokenizer={tokenizer_dir},tokenizer_backend=huggingface,"
           "num_concurrent=1,max_retries=1", "--tasks", "vs_gsm_loglik,vs_gsm_gen", "--include_path", str(root),
           "--output_path", str(out), "--log_samples"]
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode:
        raise SystemExit(f"lm-eval failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    samples = {}
    for task in ("vs_gsm_loglik", "vs_gsm_gen"):
        (f,) = out.rglob(f"samples_{task}_*.jsonl")
        samples[task] = [json.loads(line) for line in f.read_text().splitlines()]
    (res,) = out.rglob("results_*.json")
    return {"samples": samples, "results": json.loads(res.read_text())["results"]}


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


def direct(engine, tok, lm: dict, max_gen_toks: int) -> dict:
    """Every lm-eval request recomputed through the engine directly, compared with the server's answers."""
    from verispec.core.sampling import SamplingConfig

    rows, ll_server, ll_direct = [], [], []
    for s in lm["samples"]["vs_gsm_loglik"]:
        a = s["arguments"]["gen_args_0"]
        ctx, cont = encode_pair(tok, a["arg_0"], a["arg_1"])
        lps = engine.prompt_logprobs(ctx + cont, top=1)[len(ctx):]
        ll = sum(t.logprob for t in lps)
        greedy = all(t.logprob == max(v for _, v in t.top) for t in lps)  # as lm-eval decides it
        srv_ll, srv_greedy = float(s["resps"][0][0][0]), s["resps"][0][0][1] in (True, "True")
        rows.append({"task": "vs_gsm_loglik", "doc": s["doc_id"], "tokens": len(cont), "server": srv_ll,
                     "direct": ll, "abs_diff": abs(ll - srv_ll), "same_greedy": greedy == srv_greedy})
        ll_server.append((srv_ll, len(cont), srv_greedy))
        ll_direct.append((ll, len(cont), greedy))
    em_server, em_direct = [], []
    for s in lm["samples"]["vs_gsm_gen"]:
        a = s["arguments"]["gen_args_0"]
        ids = tok.encode(a["arg_0"], add_special_tokens=False)
        r = engine.generate(ids, sampling=SamplingConfig(temperature=0.0), gamma=GAMMA, max_new_tokens=max_gen_toks,
                            stop=UNTIL)
        srv_text = s["resps"][0][0]
        rows.append({"task": "vs_gsm_gen", "doc": s["doc_id"], "tokens": len(r.token_ids), "same_text":
                     r.text == srv_text, "server": srv_text[:80], "direct": r.text[:80]})
        em_server.append(exact_match(flexible_extract(srv_text), s["target"]))
        em_direct.append(exact_match(flexible_extract(r.text), s["target"]))

    def ppl(xs: list) -> float:  # lm-eval's perplexity: exp of minus the mean log-likelihood per document
        return math.exp(-sum(x[0] for x in xs) / len(xs))

    res = lm["results"]
    return {"rows": rows, "scores": {
        "vs_gsm_loglik": {"perplexity": {"lm-eval via server": res["vs_gsm_loglik"]["perplexity,none"],
                                         "recomputed from server answers": ppl(ll_server), "engine": ppl(ll_direct)},
                          "acc": {"lm-eval via server": res["vs_gsm_loglik"]["acc,none"],
                                  "recomputed from server answers": sum(x[2] for x in ll_server) / len(ll_server),
                                  "engine": sum(x[2] for x in ll_direct) / len(ll_direct)}},
        "vs_gsm_gen": {"exact_match": {"lm-eval via server": res["vs_gsm_gen"]["exact_match,flexible-extract"],
                                       "recomputed from server answers": sum(em_server) / len(em_server),
                                       "engine": sum(em_direct) / len(em_direct)}}}}


def markdown(out: dict) -> str:
    rows = out["rows"]
    ll = [r for r in rows if r["task"] == "vs_gsm_loglik"]
    gen = [r for r in rows if r["task"] == "vs_gsm_gen"]
    lines = ["# lm-evaluation-harness through `verispec serve`", "",
             f"lm-eval {out['lm_eval_version']} (`local-completions`, token-id prompts, one request at a time) against "
             f"`verispec serve` on the default pair ({out['backends']}"
             f"{', --deterministic' if out['deterministic'] else ', backends shared across requests'}), "
             f"CPU: {out['cpu']}. Two tasks over local data "
             f"files: the first {out['limit']} GSM8K test questions; greedy generation at most "
             f"{out['max_gen_toks']} tokens, gamma {GAMMA}. Every request then recomputed through the engine directly "
             f"with lm-eval's tokenization. lm-eval's wall time: {out['lm_eval_s']:.0f} s.", "",
             "| task | metric | lm-eval via the server | recomputed from the server's answers | engine directly |",
             "|---|---|---|---|---|"]
    for task, metrics in out["scores"].items():
        for metric, v in metrics.items():
            lines.append(f"| {task} | {metric} | {v['lm-eval via server']:.6g} | "
                         f"{v['recomputed from server answers']:.6g} | {v['engine']:.6g} |")
    lines += ["", f"Log-likelihoods: {len(ll)} requests, largest difference server vs engine "
              f"{max(r['abs_diff'] for r in ll):.2e} nats; greedy flags equal on "
              f"{sum(r['same_greedy'] for r in ll)} of {len(ll)}. Generations: identical text on "
              f"{sum(r['same_text'] for r in gen)} of {len(gen)}.", "",
              "Rerun: `bash scripts/install_lmeval.sh`, then `python benchmarks/lm_eval_server.py --limit "
              f"{out['limit']}{'' if out['deterministic'] else ' --shared-backends'} --out JSON --md MD`.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, default=12, help="GSM8K questions per task")
    ap.add_argument("--max-gen-toks", type=int, default=96)
    ap.add_argument("--shared-backends", action="store_true",
                    help="serve without --deterministic: requests share the model backends (and their prefix caches)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--md", default=None)
    args = ap.parse_args()
    if not LMEVAL.exists():
        raise SystemExit(f"{LMEVAL} not found: run `bash scripts/install_lmeval.sh` first")
    sys.path.insert(0, str(Path(__file__).parent))
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
    version = subprocess.run([str(LMEVAL), "-c", "import lm_eval; print(lm_eval.__version__)"], capture_output=True,
                             text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_tasks(root, problems, args.max_gen_toks)
        with BackgroundServer(create_app(engine, model_name="verispec", max_batch=1), timeout_s=120) as srv:
            t0 = time.perf_counter()
            lm = run_lm_eval(srv.url, "verispec", str(models.converted_dir(models.DEFAULT_TARGET)), root)
            seconds = time.perf_counter() - t0
    out = {"cpu": cpu(), "lm_eval_version": version, "limit": args.limit, "max_gen_toks": args.max_gen_toks,
           "deterministic": not args.shared_backends,
           "gamma": GAMMA, "backends": ", ".join(f"{k} {v}" for k, v in engine.backends.items()),
           "lm_eval_s": seconds, **direct(engine, tok, lm, args.max_gen_toks)}
    text = markdown(out)
    print(text)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    if args.md:
        Path(args.md).write_text(text)


if __name__ == "__main__":
    main()
