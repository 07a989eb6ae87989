"""GPU check in at most 5 minutes, with nothing brought in: torch and transformers only, no vLLM wheel, no model file.

Randomly initialised models of the default pair's shapes (Qwen2.5-Coder 1.5B target, 0.5B draft; the shapes are
written below, so no config is downloaded) in bfloat16 on one GPU. Random weights say nothing about acceptance;
the check times the parts whose cost does not depend on the weights:

- ``verify``: the plug-in's verification routine (:func:`verispec.integrations.vllm.sampler.verify_requests`, what
  runs inside vLLM's rejection sampler) on vLLM-shaped tensors (batch B, gamma 4, the full 151,936-token vocabulary,
  float32 probabilities on the GPU) for lossless and lenience, next to a plain vectorised rejection sampler written
  here (accept u < p/q, residual max(0, p - q) renormalised, bonus from p: the textbook rule, standing in for vLLM's
  own sampler), and next to one target forward of the same batch (gamma + 1 query tokens per row over a 512-token
  context): the plug-in's share of a verify step.
- ``engine``: verispec's own engine on the GPU (transformers backend, batched rows): tokens/s of the target alone
  and of speculative decoding (lossless, lenience l = 0.5, gamma 4, temperature 0.7) at batch 1 and 8.

    python benchmarks/gpu_shapes.py --out gpu_shapes.json          # on a GPU machine
    python benchmarks/gpu_shapes.py --device cpu --smoke            # a 30-second run of the code path on a CPU

Prints a markdown table and writes JSON. Not a test: nothing is asserted, nothing depends on it.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable

import torch
from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM

from verispec.backends.hf import HFBackend
from verispec.core import rules
from verispec.core.sampling import SamplingConfig
from verispec.drafters.model import ModelDrafter
from verispec.integrations.vllm.sampler import verify_requests
from verispec.runtime.engine import Engine

VOCAB = 151936
#: the default pair's shapes (their config.json files)
TARGET = {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
          "num_key_value_heads": 2}
DRAFT = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
         "num_key_value_heads": 2}
GAMMA = 4
CONTEXT = 512


def random_model(shape: dict, device: str, smoke: bool) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2 model of ``shape`` (2 layers with ``smoke``) in bfloat16 on ``device``."""
    cfg = Qwen2Config(vocab_size=VOCAB, max_position_embeddings=32768, rope_theta=1e6, tie_word_embeddings=False,
                      **{**shape, **({"num_hidden_layers": 2} if smoke else {})})
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    return model.eval()


def timed(fn: Callable[[], object], device: str, iters: int) -> float:
    """Median seconds of ``fn`` over ``iters`` calls after two warm-up calls (synchronised on a GPU)."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for _ in range(2):
        fn()
    sync()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def textbook_rejection(drafts: torch.Tensor, q: torch.Tensor, p: torch.Tensor, bonus: torch.Tensor) -> torch.Tensor:
    """The standard lossless rule, vectorised over a batch: ``drafts`` [B, g], ``q`` / ``p`` [B, g, V], ``bonus``
    [B, V]; returns [B, g + 1] with -1 after the first rejection's correction token."""
    b, g, _ = q.shape
    pd = p.gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
    qd = q.gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
    accept = torch.rand(b, g, device=p.device) * qd < pd
    n_acc = accept.int().cumprod(1).sum(1)  # accepted prefix length per row
    r = (p - q).clamp_min(0)
    r = torch.cat([r, bonus.unsqueeze(1)], 1)
    r[:, :g][r[:, :g].sum(-1) == 0] = 1.0
    nxt = torch.multinomial(r[torch.arange(b, device=p.device), n_acc.clamp(max=g)], 1).squeeze(1)
    out = torch.full((b, g + 1), -1, dtype=torch.long, device=p.device)
    keep = torch.arange(g, device=p.device).unsqueeze(0) < n_acc.unsqueeze(1)
    out[:, :g] = torch.where(keep, drafts, out[:, :g])
    out[torch.arange(b, device=p.device), n_acc] = nxt
    return out


def part_verify(target: Qwen2ForCausalLM, device: str, batches: list[int], iters: int) -> list[dict]:
    rows = []
    gen = torch.Generator(device=device).manual_seed(0)
    for b in batches:
        p = torch.softmax(3 * torch.randn(b, GAMMA + 1, VOCAB, device=device, generator=gen), -1)
        q = torch.softmax(3 * torch.randn(b, GAMMA, VOCAB, device=device, generator=gen), -1)
        drafts = torch.multinomial(q.view(-1, VOCAB), 1).view(b, GAMMA)
        flat = dict(draft_token_ids=drafts.reshape(-1), num_draft_tokens=[GAMMA] * b,
                    draft_probs=q.reshape(-1, VOCAB), target_probs=p[:, :GAMMA].reshape(-1, VOCAB),
                    bonus_probs=p[:, GAMMA], greedy=[False] * b)
        ctx = torch.randint(0, VOCAB, (b, CONTEXT), device=device, generator=gen)
        with torch.no_grad():
            cache = DynamicCache()
            target(ctx, past_key_values=cache, use_cache=True)
            new = torch.randint(0, VOCAB, (b, GAMMA + 1), device=device, generator=gen)

            def forward(new: torch.Tensor = new, cache: DynamicCache = cache) -> None:
                target(new, past_key_values=cache, use_cache=True)
                cache.crop(CONTEXT)

            step = timed(forward, device, iters)
        row = {"batch": b, "target_forward_s": step,
               "textbook_s": timed(lambda a=(drafts, q, p[:, :GAMMA], p[:, GAMMA]): textbook_rejection(*a), device,
                                   iters)}
        for name, rule in (("lossless", rules.get("lossless")), ("lenience", rules.from_request(
                {"rule": "lenience", "params": {"l": 0.5}}))):
            row[f"plugin_{name}_s"] = timed(lambda r=rule, b=b, f=flat: verify_requests([r] * b, **f), device, iters)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def part_engine(target: Qwen2ForCausalLM, draft: Qwen2ForCausalLM, batches: list[int], new_tokens: int) -> list[dict]:
    rows = []
    cfg = SamplingConfig(temperature=0.7)
    prompts = [[int(t) for t in torch.randint(0, VOCAB, (64,), generator=torch.Generator().manual_seed(i))]
               for i in range(max(batches))]
    for b in batches:
        for name, rule, spec in (("target alone", "lossless", False), ("lossless", "lossless", True),
                                 ("lenience l=0.5", rules.from_request({"rule": "lenience", "params": {"l": 0.5}}),
                                  True)):
            engine = Engine(HFBackend(target), ModelDrafter(HFBackend(draft)) if spec else None)
            kw = dict(rule=rule, sampling=cfg, gamma=GAMMA if spec else None, max_new_tokens=new_tokens,
                      seed=list(range(b)), batch_size=b)
            engine.generate(prompts[:b], **{**kw, "max_new_tokens": 4})  # warm-up
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            res = engine.generate(prompts[:b], **kw)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            sec = time.perf_counter() - t0
            tokens = sum(len(r.token_ids) for r in res)
            rounds = sum(r.metrics.rounds for r in res)
            row = {"batch": b, "contender": name, "tokens": tokens, "seconds": sec,
                   "tokens_per_s": tokens / sec, "tokens_per_round": tokens / rounds if rounds else None}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def markdown(res: dict) -> str:
    lines = [f"Device: {res['device']}; torch {res['torch']}.", "",
             "| batch | target forward (ms) | textbook rejection (ms) | plug-in lossless (ms) | plug-in lenience (ms) "
             "| plug-in lossless / forward |", "|---|---|---|---|---|---|"]
    for r in res["verify"]:
        lines.append(f"| {r['batch']} | {1e3 * r['target_forward_s']:.2f} | {1e3 * r['textbook_s']:.2f} | "
                     f"{1e3 * r['plugin_lossless_s']:.2f} | {1e3 * r['plugin_lenience_s']:.2f} | "
                     f"{r['plugin_lossless_s'] / r['target_forward_s']:.3f} |")
    lines += ["", "| batch | contender | tokens | seconds | tokens/s | tokens per round |", "|---|---|---|---|---|---|"]
    for r in res["engine"]:
        tpr = f"{r['tokens_per_round']:.2f}" if r["tokens_per_round"] else ""
        lines.append(f"| {r['batch']} | {r['contender']} | {r['tokens']} | {r['seconds']:.2f} | "
                     f"{r['tokens_per_s']:.1f} | {tpr} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--smoke", action="store_true", help="2-layer models, small batches: checks the code path")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    batches = [1, 2] if args.smoke else [1, 8, 64]
    iters = 3 if args.smoke else 20
    device_name = (torch.cuda.get_device_name(0) if args.device.startswith("cuda")
                   else platform.processor() or "cpu")
    t0 = time.perf_counter()
    target = random_model(TARGET, args.device, args.smoke)
    draft = random_model(DRAFT, args.device, args.smoke)
    res = {"device": device_name, "torch": torch.__version__, "gamma": GAMMA, "context": CONTEXT,
           "smoke": args.smoke, "verify": part_verify(target, args.device, batches, iters),
           "engine": part_engine(target, draft, [1, 2] if args.smoke else [1, 8], 8 if args.smoke else 128)}
    res["seconds"] = time.perf_counter() - t0
    print(markdown(res))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
